//! The Redis connection flags that `posgate serve` and `posgate terminals` share, turned
//! into [`StoreSettings`] by one function so both commands accept exactly the same
//! settings and report the same errors.
//!
//! What it does not do: declare the clap flags (each command declares its own, since
//! `terminals` makes them global to its subcommands) or open a connection.

use std::path::PathBuf;
use std::time::Duration;

use redis::IntoConnectionInfo;

use super::secrets::{inject_password, secret_from};
use super::{invalid, ConfigError, StoreSettings, REDIS_PASSWORD_ENV};
use crate::store::redis::ClientCert;

/// The Redis flags as given on the command line.
pub(super) struct RedisFlags {
    pub url: String,
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl RedisFlags {
    /// Validates the flags (password from file or environment injected into the URL;
    /// URL parsed; TLS files only with `rediss://`; client cert and key together).
    pub(super) fn resolve(
        self,
        cluster: String,
        store_timeout: Duration,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<StoreSettings, ConfigError> {
        let password = secret_from(
            "redis-password-file",
            self.password_file.as_deref(),
            REDIS_PASSWORD_ENV,
            env,
        )?;
        let redis_url = match password {
            Some((origin, bytes)) => {
                let password = String::from_utf8(bytes)
                    .map_err(|_| origin.error("the Redis password must be UTF-8"))?;
                inject_password(&self.url, &password).map_err(|reason| origin.error(reason))?
            }
            None => self.url,
        };
        // Parse now so a typo fails at start, naming the flag. The redis crate's messages
        // never echo the URL, so no password leaks into the error.
        redis_url
            .as_str()
            .into_connection_info()
            .map_err(|e| invalid("redis-url", format!("not a valid Redis URL: {e}")))?;
        let redis_client_cert = match (self.client_cert, self.client_key) {
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
        if !redis_url.starts_with("rediss://") {
            let tls_flag = if self.ca_file.is_some() {
                Some("redis-ca-file")
            } else {
                redis_client_cert.as_ref().map(|_| "redis-client-cert")
            };
            if let Some(flag) = tls_flag {
                return Err(invalid(
                    flag,
                    "TLS files need a rediss:// --redis-url, or they would be ignored",
                ));
            }
        }
        Ok(StoreSettings {
            redis_url,
            cluster,
            store_timeout,
            redis_ca_file: self.ca_file,
            redis_client_cert,
        })
    }
}
