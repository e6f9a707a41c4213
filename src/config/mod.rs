//! The flags of `posgate serve` and their validation into the settings a pod runs with.
//!
//! Every flag can also come from an environment variable `POSGATE_<FLAG>`. Secrets never
//! travel as flag values (they would show in `ps` and in the pod spec): the cluster
//! secret comes from `POSGATE_CLUSTER_SECRET` or `--cluster-secret-file`, the Redis
//! password from the URL, `POSGATE_REDIS_PASSWORD` or `--redis-password-file`. Types that
//! hold a secret redact it in `Debug`.
//!
//! [`ServeArgs::resolve`] checks everything once, before anything starts; each error is
//! one line naming the flag. Layout: this file holds the resolved settings and the error
//! type, `serve_args.rs` the clap flags and their resolution, `pos_args.rs` the POS
//! connection flags (flattened into `ServeArgs`) and their [`PosConfig`], `push_args.rs`
//! the push API flags (tokens, limits), `connection_args.rs` the limits of the HTTP
//! listener's client connections, `tls_args.rs` the HTTPS flags (listener
//! certificate, peer CA), `redis_args.rs` the Redis connection flags (shared with
//! the operator commands' `store_args.rs`: `posgate terminals`, `terminals_args.rs`, and
//! `posgate init`, `init_args.rs`), `secrets.rs` where
//! secrets come from and how a Redis URL carries or hides one. The `rediss://` TLS files
//! (`--redis-ca-file`, `--redis-client-cert` with `--redis-client-key`) are passed on as
//! paths: the store reads and checks them when it is created, still before anything runs.
//!
//! What this module does not do: logging setup or connecting (that is the binary,
//! `src/bin/posgate/`), or the timing rules themselves ([`CoreConfig::validate`]).

pub mod conformance_args;
mod connection_args;
pub mod init_args;
mod pos_args;
mod push_args;
mod redis_args;
mod secrets;
mod serve_args;
pub mod status_args;
pub mod store_args;
pub mod terminals_args;
#[cfg(test)]
mod tests;
mod tls_args;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::core::{CoreConfig, PodId};
use crate::credentials::{ApiTokens, ClusterSecret, Credentials};
use crate::driver::DriverConfig;
use crate::http::tls::ServerTlsFiles;
use crate::http::ConnectionLimits;
use crate::peer::tls::PeerVerify;
use crate::push::PushConfig;
use crate::store::redis::{ClientCert, RedisOptions, Wait};

pub use self::connection_args::ConnectionArgs;
pub use self::pos_args::{
    PosArgs, PosConfig, DEFAULT_DRAIN_BUDGET, MAX_DIRECTORY_POLL, MAX_DRAIN_BUDGET,
};
pub use self::push_args::{PushArgs, API_TOKENS_ENV, MAX_PUSH_BYTES};
use self::secrets::redact_url;
pub use self::serve_args::ServeArgs;
pub use self::tls_args::TlsArgs;

/// Environment variable holding the cluster secret.
pub const CLUSTER_SECRET_ENV: &str = "POSGATE_CLUSTER_SECRET";
/// Environment variable holding the Redis password.
pub const REDIS_PASSWORD_ENV: &str = "POSGATE_REDIS_PASSWORD";
/// The environment variable that may hold the sentinels' own password (instead of
/// `--redis-sentinel-password-file`).
pub const REDIS_SENTINEL_PASSWORD_ENV: &str = "POSGATE_REDIS_SENTINEL_PASSWORD";
/// Cluster name used when `--cluster` is not given.
pub const DEFAULT_CLUSTER: &str = "default";
/// Redis response timeout used when `--store-timeout` is not given.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// Log line format of the binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Everything a pod needs besides its store and its listener.
#[derive(Clone, Debug)]
pub struct PodConfig {
    pub core: CoreConfig,
    pub pod_id: PodId,
    pub cluster: String,
    /// How peers reach this pod's HTTP listener.
    pub advertise_url: String,
    /// `None` is insecure mode: peer requests go and are accepted unsigned.
    pub cluster_secret: Option<ClusterSecret>,
    /// Redis command response timeout.
    pub store_timeout: Duration,
    /// How the pod connects to POS terminals (used by `Pod::start_with_terminals`).
    pub pos: PosConfig,
    /// Bearer tokens of the `/v1/*` API; `None` is insecure mode (no authentication).
    pub api_tokens: Option<ApiTokens>,
    /// Limits of the push API.
    pub push: PushConfig,
    /// `--tls-cert`/`--tls-key`: the HTTP listener serves TLS with these files; `None`
    /// is plain HTTP.
    pub tls: Option<ServerTlsFiles>,
    /// How `https://` peers are verified (`--peer-ca-file`, `--peer-tls-name`).
    pub peers: PeerVerify,
    /// How long and how many client connections the HTTP listener holds.
    pub connections: ConnectionLimits,
    /// `--otlp-endpoint`: where spans of pushes are exported; `None` exports nothing.
    pub otlp_endpoint: Option<String>,
}

impl PodConfig {
    /// The pod's secrets as a reloadable value.
    pub fn credentials(&self) -> Credentials {
        Credentials::new(self.api_tokens.clone(), self.cluster_secret.clone())
    }

    /// The driver's part of the configuration.
    pub fn driver(&self) -> DriverConfig {
        DriverConfig {
            pod: self.pod_id.clone(),
            advertise_url: self.advertise_url.clone(),
            core: self.core.clone(),
            store_timeout: self.store_timeout,
        }
    }

    /// A pod of cluster [`DEFAULT_CLUSTER`] with the default store timeout, POS and push
    /// settings, no API tokens and plain HTTP, for pods built in-process (tests, demo).
    /// Nothing is validated; call `core.validate()` if needed.
    pub fn new(
        pod_id: PodId,
        advertise_url: impl Into<String>,
        core: CoreConfig,
        cluster_secret: Option<ClusterSecret>,
    ) -> Self {
        PodConfig {
            core,
            pod_id,
            cluster: DEFAULT_CLUSTER.to_string(),
            advertise_url: advertise_url.into(),
            cluster_secret,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            pos: PosConfig::default(),
            api_tokens: None,
            push: PushConfig::default(),
            tls: None,
            peers: PeerVerify::default(),
            connections: ConnectionLimits::default(),
            otlp_endpoint: None,
        }
    }
}

/// How to reach the coordination store.
#[derive(Clone)]
pub struct StoreConfig {
    /// May contain a password; `Debug` redacts it.
    pub redis_url: String,
    pub cluster: String,
    pub store_timeout: Duration,
    /// CA certificates for `rediss://` instead of the system store.
    pub redis_ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS. Only paths: `Debug` may show them.
    pub redis_client_cert: Option<ClientCert>,
    /// The sentinels' own password (`redis+sentinel://` only); `Debug` hides it.
    pub redis_sentinel_password: Option<String>,
    /// Replicas that must acknowledge lease and placement writes (0: none).
    pub redis_wait_replicas: u32,
}

impl StoreConfig {
    /// The options to create the Redis store with: these settings' timeout and TLS files,
    /// the other options at their defaults. (The URL and cluster are passed separately.)
    pub fn redis_options(&self) -> RedisOptions {
        RedisOptions {
            response_timeout: self.store_timeout,
            ca_file: self.redis_ca_file.clone(),
            client_cert: self.redis_client_cert.clone(),
            sentinel_password: self.redis_sentinel_password.clone(),
            // A quarter of the call's deadline, so a call whose replicas are slow still
            // answers (not acknowledged) within it.
            wait: (self.redis_wait_replicas > 0).then(|| Wait {
                replicas: self.redis_wait_replicas,
                timeout: self.store_timeout / 4,
            }),
            ..RedisOptions::default()
        }
    }
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("redis_url", &redact_url(&self.redis_url))
            .field("cluster", &self.cluster)
            .field("store_timeout", &self.store_timeout)
            .field("redis_ca_file", &self.redis_ca_file)
            .field("redis_client_cert", &self.redis_client_cert)
            .field(
                "redis_sentinel_password",
                &self.redis_sentinel_password.as_ref().map(|_| "***"),
            )
            .field("redis_wait_replicas", &self.redis_wait_replicas)
            .finish()
    }
}

/// A configuration `posgate serve` refuses to start with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `flag` is the flag at fault, without the dashes (`lease-ttl`).
    #[error("invalid --{flag}: {reason}")]
    Invalid { flag: &'static str, reason: String },
    #[error("invalid {var}: {reason}")]
    InvalidEnv { var: &'static str, reason: String },
    #[error(
        "no cluster secret: set {CLUSTER_SECRET_ENV} or --cluster-secret-file (at least 16 \
         bytes), or pass --insecure to run without peer authentication"
    )]
    MissingSecret,
    #[error(
        "no API tokens: set {API_TOKENS_ENV} or --api-tokens-file (tenant:token), or pass \
         --insecure to serve the push API without authentication"
    )]
    MissingTokens,
}

/// The value parser of every duration flag: humantime, with an example on error.
/// `--otlp-endpoint`: an absolute `http://` URL (the exporter speaks plain HTTP to a
/// collector next to the pod).
fn parse_otlp_endpoint(s: &str) -> Result<String, String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(_)) => Ok(s.to_string()),
        (Some("https"), _) => Err(
            "https is not supported: export to a collector over plain HTTP (an agent on the node or a sidecar), which may forward over TLS"
                .into(),
        ),
        _ => Err("an absolute http:// URL is expected, e.g. http://otel-collector:4318/v1/traces".into()),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("not a duration ({e}); use e.g. 500ms, 5s, 1m"))
}

/// The cluster name rule of `--cluster` (every command): 1-64 characters of
/// `[A-Za-z0-9._-]`.
fn valid_cluster(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        reason: reason.into(),
    }
}
