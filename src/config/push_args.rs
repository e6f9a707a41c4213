//! [`PushArgs`]: the flags of `posgate serve` about the push API (tokens, size and
//! concurrency limits, idempotency cache, the terminals' push path), resolved into
//! [`PushConfig`] and the [`ApiTokens`].
//!
//! Tokens are a secret, so they come from `--api-tokens-file` or `POSGATE_API_TOKENS`
//! (never a flag value); whether missing tokens are an error (`--insecure`) is decided
//! by `ServeArgs::resolve`.

use std::path::PathBuf;
use std::time::Duration;

use super::secrets::{secret_from, Origin};
use super::{invalid, parse_duration, ConfigError};
use crate::credentials::ApiTokens;
use std::num::NonZeroU32;

use crate::http::MAX_TTL_S;
use crate::push::broadcast::BroadcastConfig;
use crate::push::queue::{QueueConfig, CLOCK_SKEW, COPY_TIMEOUT};
use crate::push::PushConfig;
use crate::store::queue::{charge_of, Limits};

/// Environment variable with the API tokens (`tenant:token`, comma-separated).
pub const API_TOKENS_ENV: &str = "POSGATE_API_TOKENS";
/// Largest `--queue-max-per-terminal` accepted.
pub const MAX_PER_TERMINAL: u32 = 10_000;
/// Largest `--max-push-bytes` accepted: pushes are buffered in memory.
pub const MAX_PUSH_BYTES: usize = 16 * 1024 * 1024;
/// Largest `--max-batch-bytes` accepted: a batch is buffered whole, and its share for
/// one owner travels base64 in one peer request.
pub const MAX_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// Push API flags of `posgate serve`.
#[derive(Clone, clap::Args)]
pub struct PushArgs {
    /// File with the API bearer tokens, one `tenant:token` per line (alternatively set
    /// POSGATE_API_TOKENS, comma-separated)
    #[arg(long, env = "POSGATE_API_TOKENS_FILE", value_name = "PATH")]
    pub api_tokens_file: Option<PathBuf>,
    /// Largest push body in bytes; larger ones get 413 before they are read
    #[arg(long, env = "POSGATE_MAX_PUSH_BYTES", default_value_t = 64 * 1024)]
    pub max_push_bytes: usize,
    /// Largest batch request body in bytes (`POST /v1/pushes`, at most 1,000 pushes,
    /// each within --max-push-bytes); larger ones get 413 before they are read
    #[arg(long, env = "POSGATE_MAX_BATCH_BYTES", default_value_t = 4 << 20)]
    pub max_batch_bytes: usize,
    /// Pushes this pod handles at once (received or forwarded to it); beyond: 503
    #[arg(long, env = "POSGATE_MAX_INFLIGHT", default_value_t = 10_000)]
    pub max_inflight: usize,
    /// Of those, at most this many of one tenant; beyond: 503 for that tenant only
    /// [default: half of --max-inflight; a single-tenant pod sets it to --max-inflight]
    #[arg(long, env = "POSGATE_MAX_INFLIGHT_PER_TENANT")]
    pub max_inflight_per_tenant: Option<usize>,
    /// Pushes that may wait for one terminal's session; beyond: 503
    #[arg(long, env = "POSGATE_MAX_WAITING_PER_TERMINAL", default_value_t = 64)]
    pub max_waiting_per_terminal: usize,
    /// Path terminals take pushes on
    #[arg(long, env = "POSGATE_POS_PUSH_PATH", default_value = crate::pos::wire::DEFAULT_PUSH_PATH)]
    pub pos_push_path: String,
    /// How long the owner remembers an idempotency key's answer
    #[arg(long, env = "POSGATE_IDEMPOTENCY_TTL", default_value = "10m", value_parser = parse_duration)]
    pub idempotency_ttl: Duration,
    /// Most idempotency keys remembered per pod (oldest forgotten first)
    #[arg(long, env = "POSGATE_IDEMPOTENCY_CAPACITY", default_value_t = 100_000)]
    pub idempotency_capacity: usize,
    /// How long a request body (a push, a peer request) may take to arrive whole; 408
    /// after
    #[arg(long, env = "POSGATE_BODY_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub body_read_timeout: Duration,
    /// Longest TTL a push may ask for (`?ttl_s=`)
    #[arg(long, env = "POSGATE_QUEUE_MAX_TTL", default_value = "7d", value_parser = parse_duration)]
    pub queue_max_ttl: Duration,
    /// Pushes with a TTL not yet final per terminal; beyond: 429 queue_full
    #[arg(long, env = "POSGATE_QUEUE_MAX_PER_TERMINAL", default_value_t = 100)]
    pub queue_max_per_terminal: u32,
    /// Bytes of pushes with a TTL one tenant may have stored (each charged what Redis
    /// spends on it: its body plus a quarter, plus 1536; final ones 1536 during their
    /// retention); beyond: 429 queue_full
    #[arg(long, env = "POSGATE_QUEUE_MAX_TENANT_BYTES", default_value_t = 64 << 20)]
    pub queue_max_tenant_bytes: u64,
    /// Bytes of pushes with a TTL the whole cluster may have stored; keep it well below
    /// Redis maxmemory; beyond: 429 queue_full
    #[arg(long, env = "POSGATE_QUEUE_MAX_BYTES", default_value_t = 256 << 20)]
    pub queue_max_bytes: u64,
    /// How long a push with a TTL is kept after its final state, for status lookups
    #[arg(long, env = "POSGATE_QUEUE_RETENTION", default_value = "1h", value_parser = parse_duration)]
    pub queue_retention: Duration,
    /// Queued pushes this pod sends per second at most (live pushes are not counted)
    #[arg(long, env = "POSGATE_QUEUE_DRAIN_RATE", default_value_t = 500)]
    pub queue_drain_rate: u32,
    /// Broadcast copies this pod sends per second at most (apart from live pushes and
    /// queued ones)
    #[arg(long, env = "POSGATE_BROADCAST_RATE", default_value_t = 200)]
    pub broadcast_rate: u32,
    /// Unexpired broadcasts the cluster runs at once; beyond: 429 queue_full
    #[arg(long, env = "POSGATE_BROADCAST_MAX_ACTIVE", default_value_t = crate::store::broadcast::MAX_ACTIVE)]
    pub broadcast_max_active: usize,
    /// Tenants whose tokens may broadcast, comma-separated (none by default; without
    /// tokens, anyone)
    #[arg(long, env = "POSGATE_BROADCAST_TENANTS", value_delimiter = ',')]
    pub broadcast_tenants: Vec<String>,
}

impl PushArgs {
    /// Checks the flags and reads the tokens (`None` when none are configured).
    pub(super) fn resolve(
        self,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<(Option<ApiTokens>, PushConfig), ConfigError> {
        if self.max_push_bytes == 0 || self.max_push_bytes > MAX_PUSH_BYTES {
            return Err(invalid(
                "max-push-bytes",
                format!("must be 1..={MAX_PUSH_BYTES}, got {}", self.max_push_bytes),
            ));
        }
        if self.max_batch_bytes == 0 || self.max_batch_bytes > MAX_BATCH_BYTES {
            return Err(invalid(
                "max-batch-bytes",
                format!(
                    "must be 1..={MAX_BATCH_BYTES}, got {}",
                    self.max_batch_bytes
                ),
            ));
        }
        for (flag, value) in [
            ("max-inflight", self.max_inflight),
            ("max-waiting-per-terminal", self.max_waiting_per_terminal),
            ("idempotency-capacity", self.idempotency_capacity),
        ] {
            if value == 0 {
                return Err(invalid(flag, "must be greater than zero"));
            }
        }
        let per_tenant = self
            .max_inflight_per_tenant
            .unwrap_or(self.max_inflight.div_ceil(2));
        if per_tenant == 0 || per_tenant > self.max_inflight {
            return Err(invalid(
                "max-inflight-per-tenant",
                format!("must be 1..=--max-inflight ({})", self.max_inflight),
            ));
        }
        for (flag, value) in [
            ("idempotency-ttl", self.idempotency_ttl),
            ("body-read-timeout", self.body_read_timeout),
        ] {
            if value.is_zero() {
                return Err(invalid(flag, "must be greater than zero"));
            }
        }
        let path_ok = self.pos_push_path.starts_with('/')
            && self
                .pos_push_path
                .parse::<http::uri::PathAndQuery>()
                .is_ok();
        if !path_ok {
            return Err(invalid(
                "pos-push-path",
                "must be an absolute URL path like /push",
            ));
        }
        let tokens = match secret_from(
            "api-tokens-file",
            self.api_tokens_file.as_deref(),
            API_TOKENS_ENV,
            env,
        )? {
            None => None,
            Some((origin, bytes)) => {
                let text = String::from_utf8(bytes).map_err(|_| origin.error("not UTF-8"))?;
                let parsed = match origin {
                    Origin::Flag(_) => ApiTokens::from_file_text(&text),
                    Origin::Env(_) => ApiTokens::from_env_value(&text),
                };
                Some(parsed.map_err(|e| origin.error(e.to_string()))?)
            }
        };
        let queue = self.queue()?;
        let broadcast = BroadcastConfig {
            rate: NonZeroU32::new(self.broadcast_rate)
                .ok_or_else(|| invalid("broadcast-rate", "must be greater than zero"))?,
            max_active: match self.broadcast_max_active {
                0 => return Err(invalid("broadcast-max-active", "must be greater than zero")),
                n => n,
            },
            tenants: self
                .broadcast_tenants
                .iter()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect(),
        };
        let settings = PushConfig {
            max_push_bytes: self.max_push_bytes,
            max_batch_bytes: self.max_batch_bytes,
            max_inflight: self.max_inflight,
            max_inflight_per_tenant: per_tenant,
            max_waiting_per_terminal: self.max_waiting_per_terminal,
            push_path: self.pos_push_path,
            idempotency_ttl: self.idempotency_ttl,
            idempotency_capacity: self.idempotency_capacity,
            body_read_timeout: self.body_read_timeout,
            queue,
            broadcast,
        };
        Ok((tokens, settings))
    }

    /// The `--queue-*` flags, checked against each other and `--max-push-bytes`.
    fn queue(&self) -> Result<QueueConfig, ConfigError> {
        let max_ttl = self.queue_max_ttl;
        if max_ttl < Duration::from_secs(1) || max_ttl.as_secs() > MAX_TTL_S {
            return Err(invalid(
                "queue-max-ttl",
                format!("must be 1s..={MAX_TTL_S}s"),
            ));
        }
        // After a lost answer a queued push is sent again only while the terminal's
        // dedup window (at least --idempotency-ttl) still covers the next copy.
        let resend = CLOCK_SKEW + COPY_TIMEOUT;
        if self.idempotency_ttl <= resend {
            return Err(invalid(
                "idempotency-ttl",
                format!("must be longer than {resend:?} (a queued copy's answer time and the clock skew allowance)"),
            ));
        }
        let one_push = charge_of(self.max_push_bytes as u64);
        // Each step of a terminal's drain reads its whole queue, and a purge cancels it
        // in one call: bounded.
        if !(1..=MAX_PER_TERMINAL).contains(&self.queue_max_per_terminal) {
            return Err(invalid(
                "queue-max-per-terminal",
                format!("must be 1..={MAX_PER_TERMINAL}"),
            ));
        }
        if self.queue_max_tenant_bytes < one_push {
            return Err(invalid(
                "queue-max-tenant-bytes",
                format!("must hold one push of --max-push-bytes: at least {one_push}"),
            ));
        }
        if self.queue_max_bytes < self.queue_max_tenant_bytes {
            return Err(invalid(
                "queue-max-bytes",
                "must be at least --queue-max-tenant-bytes",
            ));
        }
        if self.queue_retention.is_zero() {
            return Err(invalid("queue-retention", "must be greater than zero"));
        }
        let drain_rate = NonZeroU32::new(self.queue_drain_rate)
            .ok_or_else(|| invalid("queue-drain-rate", "must be greater than zero"))?;
        Ok(QueueConfig {
            max_ttl,
            limits: Limits {
                per_terminal: self.queue_max_per_terminal,
                tenant_bytes: self.queue_max_tenant_bytes,
                cluster_bytes: self.queue_max_bytes,
                retention_ms: self.queue_retention.as_millis() as u64,
            },
            drain_rate,
            copy_timeout: COPY_TIMEOUT,
        })
    }
}
