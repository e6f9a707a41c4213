//! [`PosArgs`]: the flags of `posgate serve` about connections to POS terminals (TLS
//! material, keep-alive, dial pacing and backoff, directory polling), and their
//! resolution into [`PosConfig`].
//!
//! What it does not do: read the TLS files (the pod does, when it starts, so a bad file
//! fails the start naming the file) or dial anything.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use super::{invalid, parse_duration, ConfigError};
use crate::pos::backoff::BackoffPolicy;
use crate::pos::dialer::Keepalive;
pub use crate::pos::handover::DEFAULT_DRAIN_BUDGET;
use crate::pos::tls::{ClientIdentity, TlsFiles};

/// Owners must pick up directory changes within this long, so `--directory-poll` may not
/// be longer.
pub const MAX_DIRECTORY_POLL: Duration = Duration::from_secs(5);

/// Longest `--drain-budget`: a draining session delivers only what a new owner relays to
/// it, so it must not last.
pub const MAX_DRAIN_BUDGET: Duration = Duration::from_secs(120);

/// How a pod connects to POS terminals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PosConfig {
    /// CA bundle and client identity for terminal TLS (paths only).
    pub tls: TlsFiles,
    pub keepalive: Keepalive,
    /// Dials per second, pod-wide.
    pub dial_rate: NonZeroU32,
    /// Handshakes in flight at once.
    pub dial_concurrency: usize,
    /// Hellos per second, pod-wide, re-sent on live connections when a shard's epoch
    /// changes (after a re-claim).
    pub hello_rate: NonZeroU32,
    /// Bounds the TCP connect and each handshake step.
    pub dial_timeout: Duration,
    pub backoff: BackoffPolicy,
    /// How often the directory versions are polled.
    pub directory_poll: Duration,
    /// How long a shard handed over keeps its sessions open for the new owner to ask
    /// for each terminal before it dials it; zero turns the per-terminal handover off.
    pub drain_budget: Duration,
}

impl Default for PosConfig {
    /// The flag defaults, trusting the system roots and without a client certificate.
    fn default() -> Self {
        PosConfig {
            tls: TlsFiles::default(),
            keepalive: Keepalive::default(),
            dial_rate: NonZeroU32::new(200).expect("non-zero"),
            dial_concurrency: 64,
            hello_rate: NonZeroU32::new(1000).expect("non-zero"),
            dial_timeout: Duration::from_secs(5),
            backoff: BackoffPolicy::default(),
            directory_poll: Duration::from_secs(4),
            drain_budget: DEFAULT_DRAIN_BUDGET,
        }
    }
}

/// POS connection flags of `posgate serve`. The client certificate and its key go
/// together (the group: either both or neither).
#[derive(Clone, clap::Args)]
#[command(group(
    clap::ArgGroup::new("pos_client_identity")
        .args(["pos_client_cert", "pos_client_key"])
        .multiple(true)
        .requires_all(["pos_client_cert", "pos_client_key"])
))]
pub struct PosArgs {
    /// PEM file with the CA certificates terminals are verified against, instead of the
    /// system store
    #[arg(long, env = "POSGATE_POS_CA", value_name = "FILE")]
    pub pos_ca: Option<PathBuf>,
    /// PEM certificate chain presented to terminals for mutual TLS (with --pos-client-key)
    #[arg(long, env = "POSGATE_POS_CLIENT_CERT", value_name = "FILE")]
    pub pos_client_cert: Option<PathBuf>,
    /// PEM private key of --pos-client-cert
    #[arg(long, env = "POSGATE_POS_CLIENT_KEY", value_name = "FILE")]
    pub pos_client_key: Option<PathBuf>,
    /// Interval of HTTP/2 PING keep-alives on terminal connections
    #[arg(long, env = "POSGATE_POS_KEEPALIVE", default_value = "10s", value_parser = parse_duration)]
    pub pos_keepalive: Duration,
    /// A terminal connection whose keep-alive PING is unanswered this long is dead
    #[arg(long, env = "POSGATE_POS_KEEPALIVE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub pos_keepalive_timeout: Duration,
    /// Terminal dials per second, pod-wide (> 0)
    #[arg(long, env = "POSGATE_DIAL_RATE", default_value_t = 200)]
    pub dial_rate: u32,
    /// Terminal handshakes in flight at once (> 0)
    #[arg(long, env = "POSGATE_DIAL_CONCURRENCY", default_value_t = 64)]
    pub dial_concurrency: usize,
    /// Hellos per second, pod-wide, re-sent on live terminal connections when a shard
    /// gets a new epoch (> 0); terminals with a push waiting go first
    #[arg(long, env = "POSGATE_HELLO_RATE", default_value_t = 1000)]
    pub hello_rate: u32,
    /// Bound of the TCP connect and of each handshake step (TLS, HTTP/2, hello)
    #[arg(long, env = "POSGATE_DIAL_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub dial_timeout: Duration,
    /// Redial backoff ceiling after the first failure (grows exponentially, full jitter)
    #[arg(long, env = "POSGATE_DIAL_BACKOFF_BASE", default_value = "1s", value_parser = parse_duration)]
    pub dial_backoff_base: Duration,
    /// Largest redial backoff ceiling (>= --dial-backoff-base)
    #[arg(long, env = "POSGATE_DIAL_BACKOFF_CAP", default_value = "60s", value_parser = parse_duration)]
    pub dial_backoff_cap: Duration,
    /// How often the terminal directory is checked for changes (at most 5s)
    #[arg(long, env = "POSGATE_DIRECTORY_POLL", default_value = "4s", value_parser = parse_duration)]
    pub directory_poll: Duration,
    /// Planned moves: how long a shard handed over keeps its terminal sessions open
    /// (delivering only what the new owner relays) for the new owner to close each one
    /// right before it dials it; the rest close then. 0 closes whole shards before
    /// release instead (at most 120s)
    #[arg(long, env = "POSGATE_DRAIN_BUDGET", default_value = "15s", value_parser = parse_duration)]
    pub drain_budget: Duration,
}

impl PosArgs {
    /// Checks the flags and turns them into [`PosConfig`]. The TLS files are only
    /// paths here; they are read when the pod starts.
    pub fn resolve(self) -> Result<PosConfig, ConfigError> {
        let dial_rate = NonZeroU32::new(self.dial_rate)
            .ok_or_else(|| invalid("dial-rate", "must be greater than zero"))?;
        if self.dial_concurrency == 0 {
            return Err(invalid("dial-concurrency", "must be greater than zero"));
        }
        let hello_rate = NonZeroU32::new(self.hello_rate)
            .ok_or_else(|| invalid("hello-rate", "must be greater than zero"))?;
        for (flag, d) in [
            ("pos-keepalive", self.pos_keepalive),
            ("pos-keepalive-timeout", self.pos_keepalive_timeout),
            ("dial-timeout", self.dial_timeout),
            ("dial-backoff-base", self.dial_backoff_base),
            ("directory-poll", self.directory_poll),
        ] {
            if d.is_zero() {
                return Err(invalid(flag, "must be greater than zero"));
            }
        }
        if self.dial_backoff_cap < self.dial_backoff_base {
            return Err(invalid(
                "dial-backoff-cap",
                format!(
                    "must be at least --dial-backoff-base ({:?}), got {:?}",
                    self.dial_backoff_base, self.dial_backoff_cap
                ),
            ));
        }
        if self.directory_poll > MAX_DIRECTORY_POLL {
            return Err(invalid(
                "directory-poll",
                format!(
                    "must be at most {MAX_DIRECTORY_POLL:?} so directory changes reach the \
                     owners in time, got {:?}",
                    self.directory_poll
                ),
            ));
        }
        if self.drain_budget > MAX_DRAIN_BUDGET {
            return Err(invalid(
                "drain-budget",
                format!(
                    "must be at most {MAX_DRAIN_BUDGET:?}: a draining session delivers \
                     nothing, got {:?}",
                    self.drain_budget
                ),
            ));
        }
        // clap's `requires` makes the two come together.
        let client = self
            .pos_client_cert
            .zip(self.pos_client_key)
            .map(|(cert_file, key_file)| ClientIdentity {
                cert_file,
                key_file,
            });
        Ok(PosConfig {
            tls: TlsFiles {
                ca_file: self.pos_ca,
                client,
            },
            keepalive: Keepalive {
                interval: self.pos_keepalive,
                timeout: self.pos_keepalive_timeout,
            },
            dial_rate,
            dial_concurrency: self.dial_concurrency,
            hello_rate,
            dial_timeout: self.dial_timeout,
            backoff: BackoffPolicy {
                base: self.dial_backoff_base,
                cap: self.dial_backoff_cap,
            },
            drain_budget: self.drain_budget,
            directory_poll: self.directory_poll,
        })
    }
}
