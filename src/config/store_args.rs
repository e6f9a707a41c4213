//! [`StoreArgs`]: the flags of the operator commands that talk to a cluster's Redis
//! directly (`posgate terminals`, `posgate init`): where Redis is, which cluster, how
//! many shards, how long one call may take.
//!
//! The store flags are those of `posgate serve`, with the same environment variables
//! (`POSGATE_REDIS_URL`, `POSGATE_REDIS_PASSWORD[_FILE]`, `POSGATE_REDIS_CA_FILE`,
//! `POSGATE_REDIS_CLIENT_CERT`/`_KEY`, `POSGATE_CLUSTER`, `POSGATE_SHARDS`), so a command
//! run in a pod's environment reaches that pod's cluster. `--shards` is checked against
//! the cluster's pinned metadata.
//!
//! Not for: the pod's own flags (`serve_args`), or connecting (the caller does).

use std::time::Duration;

use super::redis_args::RedisArgs;
use super::{invalid, valid_cluster, ConfigError, StoreConfig, DEFAULT_CLUSTER};

/// The store flags of an operator command.
#[derive(Clone, clap::Args)]
pub struct StoreArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Name of the cluster ([A-Za-z0-9._-], 1-64)
    #[arg(long, env = "POSGATE_CLUSTER", default_value = DEFAULT_CLUSTER)]
    pub cluster: String,
    /// Number of shards of the cluster (decides each terminal's shard)
    #[arg(long, env = "POSGATE_SHARDS", default_value_t = 64)]
    pub shards: u32,
    /// Redis response timeout per call (a call writes at most 1,000 terminals)
    #[arg(long, default_value = "5s", value_parser = parse_timeout)]
    pub store_timeout: Duration,
}

impl StoreArgs {
    /// Validates the flags: the settings to connect with.
    pub fn resolve(&self) -> Result<StoreConfig, ConfigError> {
        self.resolve_with(|name| std::env::var(name).ok())
    }

    /// [`Self::resolve`] with environment variables read through `env`.
    pub fn resolve_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<StoreConfig, ConfigError> {
        if self.shards == 0 || self.shards > 4096 {
            return Err(invalid(
                "shards",
                format!("must be between 1 and 4096, got {}", self.shards),
            ));
        }
        if !valid_cluster(&self.cluster) {
            return Err(invalid(
                "cluster",
                "must be 1-64 characters of [A-Za-z0-9._-]",
            ));
        }
        self.redis
            .clone()
            .resolve(self.cluster.clone(), self.store_timeout, &env)
    }
}

/// A duration above zero.
pub(super) fn parse_timeout(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be greater than zero".to_string()),
        Err(e) => Err(format!("not a duration ({e}); use e.g. 500ms, 5s, 1m")),
    }
}
