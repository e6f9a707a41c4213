//! [`ServeArgs`]: the clap flags of `posgate serve`, and their resolution into a
//! [`PodConfig`] and [`StoreConfig`], with the defaults that depend on the machine
//! (hostname, pod id, advertise URL), and the list of files a reload re-reads.
//!
//! What it does not do: read secrets itself (`secrets.rs`) or check timings beyond the
//! store timeout (`CoreConfig::validate` does).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::connection_args::{fd_limit, ConnectionArgs};
use super::push_args::PushArgs;
use super::redis_args::RedisArgs;
use super::secrets::secret_from;
use super::tls_args::TlsArgs;
use super::{
    invalid, parse_duration, valid_cluster, ConfigError, LogFormat, PodConfig, PosArgs,
    StoreConfig, CLUSTER_SECRET_ENV, DEFAULT_CLUSTER,
};
use crate::core::config::InvalidTimings;
use crate::core::{CoreConfig, PodId};
use crate::credentials::ClusterSecret;
use rand::Rng;

/// Flags of `posgate serve`. Half a Redis client certificate is refused while parsing,
/// like half of any other certificate pair (`terminals` refuses it when resolving).
// The field docs are `--help` text (clap prints them as written), not Markdown:
// placeholders like `<hostname>` and `[user[:password]@]` are meant literally.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Clone, clap::Args)]
#[command(mut_arg("redis_client_cert", |a| a.requires("redis_client_key")))]
#[command(mut_arg("redis_client_key", |a| a.requires("redis_client_cert")))]
pub struct ServeArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Name of the cluster; pods of one cluster share keys in Redis ([A-Za-z0-9._-], 1-64)
    #[arg(long, env = "POSGATE_CLUSTER", default_value = DEFAULT_CLUSTER, value_parser = parse_cluster)]
    pub cluster: String,
    /// Identity of this pod [default: <hostname>-<pid>-<random>]
    #[arg(long, env = "POSGATE_POD_ID", value_parser = |s: &str| PodId::new(s))]
    pub pod_id: Option<PodId>,
    /// Address the HTTP listener binds
    #[arg(
        long,
        env = "POSGATE_LISTEN",
        default_value = "0.0.0.0:8080",
        value_name = "ADDR"
    )]
    pub listen: SocketAddr,
    /// How peers reach this pod, e.g. http://$(POD_IP):8080; https:// with --tls-cert
    /// [default: http(s)://<listen address>, or http(s)://<hostname>:<port> when
    /// listening on all interfaces]
    #[arg(long, env = "POSGATE_ADVERTISE_URL", value_name = "URL", value_parser = parse_advertise_url)]
    pub advertise_url: Option<String>,
    /// Number of shards; every pod of a cluster must use the same
    #[arg(long, env = "POSGATE_SHARDS", default_value_t = 64)]
    pub shards: u32,
    /// Lease time-to-live in the store
    #[arg(long, env = "POSGATE_LEASE_TTL", default_value = "15s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
    /// How often held leases are renewed
    #[arg(long, env = "POSGATE_RENEW_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub renew_interval: Duration,
    /// Safety margin subtracted from the lease TTL for the local deadline
    #[arg(long, env = "POSGATE_LEASE_MARGIN", default_value = "1s", value_parser = parse_duration)]
    pub lease_margin: Duration,
    /// Membership registration time-to-live
    #[arg(long, env = "POSGATE_MEMBER_TTL", default_value = "15s", value_parser = parse_duration)]
    pub member_ttl: Duration,
    /// How often the registration is refreshed [default: --member-ttl / 3]
    #[arg(long, env = "POSGATE_HEARTBEAT_INTERVAL", value_parser = parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// How often the store is polled when no change notification arrives
    #[arg(long, env = "POSGATE_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// A membership change is applied once the view was stable this long
    #[arg(long, env = "POSGATE_REBALANCE_DEBOUNCE", default_value = "1s", value_parser = parse_duration)]
    pub rebalance_debounce: Duration,
    /// At most this many shards in motion across the cluster (assigned to a pod that
    /// does not hold them yet); more planned moves wait for a slot. Shards of crashed or
    /// drained pods never wait [default: an eighth of --shards, at least 1]
    #[arg(long, env = "POSGATE_MAX_MOVING_SHARDS", value_name = "N")]
    pub max_moving_shards: Option<u32>,
    /// Time a shard's connections get to close after it stops being served
    #[arg(long, env = "POSGATE_CLOSE_BUDGET", default_value = "2s", value_parser = parse_duration)]
    pub close_budget: Duration,
    /// Upper bound for a graceful shutdown
    #[arg(long, env = "POSGATE_SHUTDOWN_BUDGET", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_budget: Duration,
    /// Redis command response timeout; must be below --lease-ttl minus --renew-interval
    #[arg(long, env = "POSGATE_STORE_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub store_timeout: Duration,
    /// File with the cluster secret pods sign peer requests with, at least 16 bytes
    /// (alternatively set POSGATE_CLUSTER_SECRET)
    #[arg(long, env = "POSGATE_CLUSTER_SECRET_FILE", value_name = "PATH")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Allow starting without a cluster secret and without API tokens: peer endpoints and
    /// the push API are then unauthenticated (local experiments only)
    #[arg(long, env = "POSGATE_INSECURE", value_parser = clap::builder::BoolishValueParser::new())]
    pub insecure: bool,
    /// How often the secret and certificate files are checked for changed content, which
    /// reloads them like SIGHUP does; 0 turns the check off
    #[arg(long, env = "POSGATE_RELOAD_POLL_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub reload_poll_interval: Duration,
    /// Log format [default: json when stderr is not a terminal, else text]
    #[arg(long, env = "POSGATE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter directives, e.g. info or posgate=debug [default: $RUST_LOG, else info]
    #[arg(long, env = "POSGATE_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,
    /// OTLP/HTTP endpoint the spans of pushes are exported to, e.g.
    /// http://otel-collector:4318/v1/traces [default: none, nothing is exported]
    #[arg(long, env = "POSGATE_OTLP_ENDPOINT", value_name = "URL", value_parser = super::parse_otlp_endpoint)]
    pub otlp_endpoint: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub pos: PosArgs,
    #[command(flatten)]
    pub push: PushArgs,
    #[command(flatten)]
    pub connections: ConnectionArgs,
}

impl ServeArgs {
    /// Validates the flags and derives the defaults that depend on the environment
    /// (hostname, secrets from environment variables).
    pub fn resolve(self) -> Result<(PodConfig, StoreConfig, SocketAddr), ConfigError> {
        self.resolve_with(|name| std::env::var(name).ok())
    }

    /// [`Self::resolve`] with environment variables read through `env`.
    pub(super) fn resolve_with(
        self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(PodConfig, StoreConfig, SocketAddr), ConfigError> {
        let core = CoreConfig {
            shards: self.shards,
            lease_ttl: self.lease_ttl,
            renew_interval: self.renew_interval,
            lease_margin: self.lease_margin,
            member_ttl: self.member_ttl,
            heartbeat_interval: self.heartbeat_interval.unwrap_or(self.member_ttl / 3),
            poll_interval: self.poll_interval,
            debounce: self.rebalance_debounce,
            close_budget: self.close_budget,
            shutdown_budget: self.shutdown_budget,
            max_moving_shards: self.max_moving_shards.unwrap_or((self.shards / 8).max(1)),
        };
        core.validate()
            .map_err(|e| invalid(core_error_flag(&e), e.to_string()))?;
        // A Redis call may hang for the whole timeout; renewals must still land before
        // the lease expires, so a hung renewal is noticed in time for one more try.
        let renew_window = self.lease_ttl.saturating_sub(self.renew_interval);
        if self.store_timeout.is_zero() || self.store_timeout >= renew_window {
            return Err(invalid(
                "store-timeout",
                format!(
                    "must be greater than zero and less than --lease-ttl minus --renew-interval \
                     ({renew_window:?}), got {:?}",
                    self.store_timeout
                ),
            ));
        }

        let pos = self.pos.resolve()?;
        let connections = self.connections.resolve(fd_limit())?;
        let (tls, peers) = self.tls.resolve()?;
        let scheme = if tls.is_some() { "https" } else { "http" };

        let hostname = hostname(&env);
        let pod_id = match self.pod_id {
            Some(id) => id,
            None => default_pod_id(hostname.as_deref()),
        };
        let advertise_url = match self.advertise_url {
            // Peers would speak h2c to a TLS port and fail every forwarded push. (The
            // other way round can work: a sidecar terminating TLS in front of the pod.)
            Some(url) if tls.is_some() && !url.starts_with("https://") => {
                return Err(invalid(
                    "advertise-url",
                    "must start with https:// when the listener serves TLS (--tls-cert)",
                ));
            }
            Some(url) => url,
            None => default_advertise_url(scheme, self.listen, hostname.as_deref())?,
        };

        let secret = secret_from(
            "cluster-secret-file",
            self.cluster_secret_file.as_deref(),
            CLUSTER_SECRET_ENV,
            &env,
        )?;
        let cluster_secret = match secret {
            Some((origin, bytes)) => {
                Some(ClusterSecret::new(bytes).map_err(|e| origin.error(e.to_string()))?)
            }
            None if self.insecure => None,
            None => return Err(ConfigError::MissingSecret),
        };

        let (api_tokens, push) = self.push.resolve(&env)?;
        if api_tokens.is_none() && !self.insecure {
            return Err(ConfigError::MissingTokens);
        }

        let store = self
            .redis
            .resolve(self.cluster.clone(), self.store_timeout, &env)?;

        let config = PodConfig {
            core,
            pod_id,
            cluster: self.cluster.clone(),
            advertise_url,
            cluster_secret,
            store_timeout: self.store_timeout,
            pos,
            api_tokens,
            push,
            tls,
            peers,
            connections,
            otlp_endpoint: self.otlp_endpoint.clone(),
        };
        Ok((config, store, self.listen))
    }

    /// The files a reload reads again (secrets, POS, listener and peer TLS material),
    /// whose content the reload poller watches. Redis settings are not among them: the
    /// store connection is set up once.
    pub fn reloadable_files(&self) -> Vec<PathBuf> {
        let tls = &self.tls;
        let pos = &self.pos;
        [
            self.push.api_tokens_file.as_deref(),
            self.cluster_secret_file.as_deref(),
            pos.pos_ca.as_deref(),
            pos.pos_client_cert.as_deref(),
            pos.pos_client_key.as_deref(),
            tls.tls_cert.as_deref(),
            tls.tls_key.as_deref(),
            tls.peer_ca_file.as_deref(),
        ]
        .into_iter()
        .flatten()
        .map(Path::to_path_buf)
        .collect()
    }
}

/// The flag a core validation error is about.
fn core_error_flag(err: &InvalidTimings) -> &'static str {
    match err {
        InvalidTimings::Shards(_) => "shards",
        InvalidTimings::Zero { flag } => flag,
        InvalidTimings::TtlTooShort { .. } => "lease-ttl",
        InvalidTimings::Heartbeat { .. } => "heartbeat-interval",
        InvalidTimings::MemberTtlTooShort { .. } => "member-ttl",
    }
}

/// The machine's hostname: `/proc/sys/kernel/hostname`, else `$HOSTNAME`.
fn hostname(env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| env("HOSTNAME"))
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// `<hostname>-<pid>-<6 random lowercase alphanumerics>`: readable in logs, and unique per
/// process lifetime even when a restarted container gets the same hostname and pid.
fn default_pod_id(hostname: Option<&str>) -> PodId {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let host: String = hostname
        .unwrap_or("posgate")
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut rng = rand::rng();
    let suffix: String = (0..6)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    let id = format!("{host}-{}-{suffix}", std::process::id());
    // At most 100 + 1 + 10 + 1 + 6 characters, all from the PodId charset.
    PodId::new(id).expect("sanitized default pod id is valid")
}

fn default_advertise_url(
    scheme: &str,
    listen: SocketAddr,
    hostname: Option<&str>,
) -> Result<String, ConfigError> {
    if !listen.ip().is_unspecified() {
        return Ok(format!("{scheme}://{listen}"));
    }
    // 0.0.0.0 is not an address peers can dial; the hostname usually is (or set the flag).
    let host = hostname.ok_or_else(|| {
        invalid(
            "advertise-url",
            "no hostname to derive a default from; set --advertise-url",
        )
    })?;
    parse_advertise_url(&format!("{scheme}://{host}:{}", listen.port())).map_err(|reason| {
        invalid(
            "advertise-url",
            format!("default from the hostname: {reason}; set --advertise-url"),
        )
    })
}

fn parse_cluster(s: &str) -> Result<String, String> {
    if valid_cluster(s) {
        Ok(s.to_string())
    } else {
        Err("must be 1-64 characters of [A-Za-z0-9._-]".to_string())
    }
}

/// An `http(s)://host[:port][/prefix]` URL, returned without a trailing slash.
fn parse_advertise_url(s: &str) -> Result<String, String> {
    let uri: http::Uri = s.parse().map_err(|_| "not a URL".to_string())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("must start with http:// or https://".to_string());
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("must name a host".to_string());
    }
    if uri.query().is_some() {
        return Err("must not have a query".to_string());
    }
    Ok(s.trim_end_matches('/').to_string())
}
