//! [`ConnectionArgs`]: the flags of `posgate serve` bounding the HTTP listener's client
//! connections, resolved into [`ConnectionLimits`], with `--max-connections` defaulting
//! to a share of the process's file descriptor limit.
//!
//! Why a share: every client connection and every terminal session is a file
//! descriptor of the same process. The listener may take a quarter of the limit (at
//! most [`MAX_DEFAULT_CONNECTIONS`]); the rest is for terminal sessions, peers and the
//! store, so no flood of clients can keep the pod from dialing its terminals.
//!
//! Not for: what the limits do (`crate::http::serve`), raising the limit (the binary).

use std::time::Duration;

use super::{invalid, parse_duration, ConfigError};
use crate::http::ConnectionLimits;

/// `--max-connections`' default never exceeds this, however high the fd limit: each
/// connection also costs buffers.
pub(super) const MAX_DEFAULT_CONNECTIONS: u64 = 10_000;
/// Fewer connections than this cannot serve probes, peers and pushes side by side.
const MIN_CONNECTIONS: u64 = 16;

/// Connection flags of `posgate serve`.
#[derive(Clone, clap::Args)]
pub struct ConnectionArgs {
    /// How long a new client connection may take to send its first request head;
    /// closed after
    #[arg(long, env = "POSGATE_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// How long a client connection may stay without a request in flight after its
    /// first (HTTP/1.1 keep-alive and HTTP/2); must exceed 90 s, how long peers keep an
    /// idle connection to reuse (and should exceed a load balancer's idle timeout)
    #[arg(long, env = "POSGATE_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Client connections held at once; when full, the one waiting longest without a
    /// request is closed for a new one [default: a quarter of the open-file limit, at
    /// most 10000]
    #[arg(long, env = "POSGATE_MAX_CONNECTIONS")]
    pub max_connections: Option<u64>,
    /// Concurrent requests on one HTTP/2 connection
    #[arg(
        long,
        env = "POSGATE_MAX_STREAMS_PER_CONNECTION",
        default_value_t = 200
    )]
    pub max_streams_per_connection: u32,
}

/// The peer client's pool forgets a connection idle this long (`crate::peer`); the
/// listener must keep one longer, or a peer could send on a connection being closed.
const PEER_POOL_IDLE: Duration = Duration::from_secs(90);
/// The longest header read or idle timeout accepted.
const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl ConnectionArgs {
    /// Checks the flags against `fd_limit`, the process's open-file (soft) limit.
    pub(super) fn resolve(&self, fd_limit: u64) -> Result<ConnectionLimits, ConfigError> {
        if self.header_read_timeout.is_zero() {
            return Err(invalid("header-read-timeout", "must be greater than zero"));
        }
        // An instant this far ahead is computed for every connection; a value near the
        // end of time would overflow it.
        for (flag, value) in [
            ("header-read-timeout", self.header_read_timeout),
            ("idle-timeout", self.idle_timeout),
        ] {
            if value > MAX_CONNECTION_TIMEOUT {
                return Err(invalid(
                    flag,
                    format!("must be at most {MAX_CONNECTION_TIMEOUT:?} (one day)"),
                ));
            }
        }
        if self.idle_timeout <= PEER_POOL_IDLE {
            return Err(invalid(
                "idle-timeout",
                format!(
                    "must be longer than {PEER_POOL_IDLE:?}, how long peers keep an idle \
                     connection"
                ),
            ));
        }
        if self.max_streams_per_connection == 0 {
            return Err(invalid(
                "max-streams-per-connection",
                "must be greater than zero",
            ));
        }
        let share = fd_limit / 2;
        let max_connections = match self.max_connections {
            Some(n) if n < MIN_CONNECTIONS || n > share => {
                return Err(invalid(
                    "max-connections",
                    format!(
                        "must be {MIN_CONNECTIONS}..={share} (half the open-file limit of \
                         {fd_limit}; the rest is for terminal sessions), got {n}"
                    ),
                ));
            }
            Some(n) => n,
            None if fd_limit / 4 < MIN_CONNECTIONS => {
                return Err(invalid(
                    "max-connections",
                    format!(
                        "the open-file limit ({fd_limit}) leaves too few for client \
                         connections; raise it (ulimit -n)"
                    ),
                ));
            }
            None => (fd_limit / 4).min(MAX_DEFAULT_CONNECTIONS),
        };
        Ok(ConnectionLimits {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            max_streams: self.max_streams_per_connection,
        })
    }
}

/// The process's open-file soft limit (`u64::MAX` if it cannot be read).
pub(super) fn fd_limit() -> u64 {
    rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(u64::MAX, |(soft, _)| soft)
}
