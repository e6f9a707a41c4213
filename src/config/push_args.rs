//! [`PushArgs`]: the flags of `posgate serve` about the push API (tokens, size and
//! concurrency limits, idempotency cache, the terminals' push path), resolved into
//! [`PushSettings`] and the [`ApiTokens`].
//!
//! Tokens are a secret, so they come from `--api-tokens-file` or `POSGATE_API_TOKENS`
//! (never a flag value); whether missing tokens are an error (`--insecure`) is decided
//! by `ServeArgs::resolve`.

use std::path::PathBuf;
use std::time::Duration;

use super::secrets::{secret_from, Origin};
use super::{invalid, parse_duration, ConfigError};
use crate::credentials::ApiTokens;
use crate::push::PushSettings;

/// Environment variable with the API tokens (`tenant:token`, comma-separated).
pub const API_TOKENS_ENV: &str = "POSGATE_API_TOKENS";
/// Largest `--max-push-bytes` accepted: pushes are buffered in memory.
pub const MAX_PUSH_BYTES: usize = 16 * 1024 * 1024;

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
}

impl PushArgs {
    /// Checks the flags and reads the tokens (`None` when none are configured).
    pub(super) fn resolve(
        self,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<(Option<ApiTokens>, PushSettings), ConfigError> {
        if self.max_push_bytes == 0 || self.max_push_bytes > MAX_PUSH_BYTES {
            return Err(invalid(
                "max-push-bytes",
                format!("must be 1..={MAX_PUSH_BYTES}, got {}", self.max_push_bytes),
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
        let settings = PushSettings {
            max_push_bytes: self.max_push_bytes,
            max_inflight: self.max_inflight,
            max_inflight_per_tenant: per_tenant,
            max_waiting_per_terminal: self.max_waiting_per_terminal,
            push_path: self.pos_push_path,
            idempotency_ttl: self.idempotency_ttl,
            idempotency_capacity: self.idempotency_capacity,
            body_read_timeout: self.body_read_timeout,
        };
        Ok((tokens, settings))
    }
}
