//! [`RedisArgs`]: the Redis connection flags that `posgate serve` and `posgate terminals`
//! share, declared once and turned into [`StoreConfig`] by one function, so both
//! commands accept exactly the same flags and environment variables and report the same
//! errors.
//!
//! Each command adds its own parsing rules: `terminals` makes every flag global (before
//! or after its action), `serve` refuses half a client certificate while parsing. Here,
//! at resolution, half a certificate is refused for both.
//!
//! What it does not do: the cluster name and store timeout (each command has its own
//! default and help), or open a connection.

use std::path::PathBuf;
use std::time::Duration;

use redis::IntoConnectionInfo;

use super::secrets::{inject_password, secret_from};
use super::{invalid, ConfigError, StoreConfig, REDIS_PASSWORD_ENV, REDIS_SENTINEL_PASSWORD_ENV};
use crate::store::redis::sentinel_url::SentinelUrl;
use crate::store::redis::ClientCert;

/// The Redis connection flags (flattened into `ServeArgs` and `TerminalsArgs`).
// The field docs are `--help` text (clap prints them as written), not Markdown:
// placeholders like `<hostname>` and `[user[:password]@]` are meant literally.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Clone, clap::Args)]
pub struct RedisArgs {
    /// Redis URL of the coordination store: redis://[user[:password]@]host:port[/db],
    /// rediss:// for TLS, or the master of Redis Sentinels:
    /// redis+sentinel://[user[:password]@]host:port[,host:port...]/<master-name>[/<db>]
    /// (rediss+sentinel:// for TLS)
    #[arg(
        long,
        env = "POSGATE_REDIS_URL",
        hide_env_values = true,
        value_name = "URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// File with the Redis password, injected into --redis-url (alternatively set
    /// POSGATE_REDIS_PASSWORD)
    #[arg(long, env = "POSGATE_REDIS_PASSWORD_FILE", value_name = "PATH")]
    pub redis_password_file: Option<PathBuf>,
    /// PEM file with the CA certificates to trust for rediss:// instead of the system
    /// store, e.g. a private CA
    #[arg(long, env = "POSGATE_REDIS_CA_FILE", value_name = "PATH")]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to Redis for mutual TLS (with --redis-client-key)
    #[arg(long, env = "POSGATE_REDIS_CLIENT_CERT", value_name = "PATH")]
    pub redis_client_cert: Option<PathBuf>,
    /// PEM private key of --redis-client-cert
    #[arg(long, env = "POSGATE_REDIS_CLIENT_KEY", value_name = "PATH")]
    pub redis_client_key: Option<PathBuf>,
    /// File with the sentinels' own password, when it is not the master's (a
    /// redis+sentinel:// URL; alternatively set POSGATE_REDIS_SENTINEL_PASSWORD)
    #[arg(
        long,
        env = "POSGATE_REDIS_SENTINEL_PASSWORD_FILE",
        value_name = "PATH"
    )]
    pub redis_sentinel_password_file: Option<PathBuf>,
    /// Replicas that must acknowledge every lease and placement write (Redis WAIT, a
    /// quarter of --store-timeout at most) before it counts; fewer make the pod treat the
    /// write as failed. 0: off
    #[arg(
        long,
        env = "POSGATE_REDIS_WAIT_REPLICAS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u32).range(0..=16)
    )]
    pub redis_wait_replicas: u32,
}

impl RedisArgs {
    /// Validates the flags (password from file or environment injected into the URL;
    /// URL parsed; TLS files only with `rediss://`; client cert and key together).
    pub(super) fn resolve(
        self,
        cluster: String,
        store_timeout: Duration,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<StoreConfig, ConfigError> {
        let password = secret_from(
            "redis-password-file",
            self.redis_password_file.as_deref(),
            REDIS_PASSWORD_ENV,
            env,
        )?;
        let redis_url = match password {
            Some((origin, bytes)) => {
                let password = String::from_utf8(bytes)
                    .map_err(|_| origin.error("the Redis password must be UTF-8"))?;
                inject_password(&self.redis_url, &password)
                    .map_err(|reason| origin.error(reason))?
            }
            None => self.redis_url,
        };
        // Parse now so a typo fails at start, naming the flag. Neither parser's messages
        // echo the password.
        let sentinel = SentinelUrl::is_sentinel(&redis_url);
        if sentinel {
            SentinelUrl::parse(&redis_url).map_err(|why| {
                invalid(
                    "redis-url",
                    format!("not a valid Redis Sentinel URL: {why}"),
                )
            })?;
        } else {
            redis_url
                .as_str()
                .into_connection_info()
                .map_err(|e| invalid("redis-url", format!("not a valid Redis URL: {e}")))?;
        }
        let redis_sentinel_password = secret_from(
            "redis-sentinel-password-file",
            self.redis_sentinel_password_file.as_deref(),
            REDIS_SENTINEL_PASSWORD_ENV,
            env,
        )?
        .map(|(origin, bytes)| {
            String::from_utf8(bytes)
                .map_err(|_| origin.error("the sentinel password must be UTF-8"))
        })
        .transpose()?;
        if redis_sentinel_password.is_some() && !sentinel {
            return Err(invalid(
                "redis-sentinel-password-file",
                "a sentinel password needs a redis+sentinel:// --redis-url",
            ));
        }
        let redis_client_cert = match (self.redis_client_cert, self.redis_client_key) {
            (Some(cert_file), Some(key_file)) => Some(ClientCert {
                cert_file,
                key_file,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(invalid("redis-client-cert", "needs --redis-client-key"))
            }
            (None, Some(_)) => {
                return Err(invalid("redis-client-key", "needs --redis-client-cert"))
            }
        };
        // The files themselves are read and checked when the store is created, at start.
        if !redis_url.starts_with("rediss://") && !redis_url.starts_with("rediss+sentinel://") {
            let tls_flag = if self.redis_ca_file.is_some() {
                Some("redis-ca-file")
            } else {
                redis_client_cert.as_ref().map(|_| "redis-client-cert")
            };
            if let Some(flag) = tls_flag {
                return Err(invalid(
                    flag,
                    "TLS files need a rediss:// or rediss+sentinel:// --redis-url, or they would be ignored",
                ));
            }
        }
        Ok(StoreConfig {
            redis_url,
            cluster,
            store_timeout,
            redis_ca_file: self.redis_ca_file,
            redis_client_cert,
            redis_sentinel_password,
            redis_wait_replicas: self.redis_wait_replicas,
        })
    }
}
