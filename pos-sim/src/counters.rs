//! Farm-wide counters: lock-free atomics bumped by the connection code, and the
//! [`FarmCounters`] snapshot served as JSON (`GET /counters`, `counters.json`).
//!
//! The counters are totals since start (plus five gauges). They are what a load test
//! asserts on; per-terminal details live in [`super::record`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Live counters; see [`FarmCounters`] for what each means.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        /// A snapshot of the farm's counters.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct FarmCounters {
            /// Number of terminals this farm serves.
            pub terminals: u64,
            $($(#[$doc])* pub $name: u64,)*
        }

        impl FarmCounters {
            /// What changed since `before`, as `name +n` (a gauge may go `-n`), for the
            /// figures a test or harness prints; every counter that did not change is
            /// left out.
            pub fn changes_since(&self, before: &FarmCounters) -> String {
                let mut out = Vec::new();
                $(
                    let d = i128::from(self.$name) - i128::from(before.$name);
                    if d != 0 {
                        out.push(format!("{} {d:+}", stringify!($name)));
                    }
                )*
                if out.is_empty() {
                    "no change".to_string()
                } else {
                    out.join(", ")
                }
            }
        }

        impl Counters {
            pub(crate) fn snapshot(&self, terminals: u64) -> FarmCounters {
                FarmCounters {
                    terminals,
                    $($name: self.$name.load(Relaxed),)*
                }
            }
        }
    };
}

counters! {
    /// TCP connections accepted by the listeners.
    tcp_accepted,
    /// TCP connections closed at once because of the `refuse_connections` fault.
    tcp_refused,
    /// TLS handshakes that failed or timed out (after the SNI was accepted), or that did not
    /// negotiate ALPN `h2`.
    handshakes_failed,
    /// Connections refused because their SNI names no terminal of this farm (or none).
    unknown_sni_refused,
    /// Connections refused because their terminal is offline (fault).
    offline_refused,
    /// TLS connections established to a terminal.
    connections_opened,
    /// TLS connections to a terminal that ended.
    connections_closed,
    /// Gauge: TLS connections to terminals open now.
    connections_open,
    /// Gauge: terminals with at least one open connection now.
    terminals_connected,
    /// Gauge: terminals with no open connection now that had one before (dark; the
    /// terminals never connected are neither this nor `terminals_connected`).
    terminals_dark,
    /// Dark intervals that ended: a connection opened while its terminal, connected
    /// before, had none open (`GET /dark` lists them with their times).
    dark_intervals,
    /// Connections that opened while the same terminal already had another open.
    raw_overlaps,
    /// Connections closed by the terminal on purpose (fault: drop, offline).
    connections_dropped,
    /// Hellos answered 200.
    sessions_accepted,
    /// Older sessions the terminal closed because a newer hello was accepted.
    sessions_superseded,
    /// Superseded sessions whose connection stayed open longer than the session-overlap
    /// threshold (1 s by default) after the newer hello was accepted.
    session_overlaps,
    /// Gauge: superseded sessions whose connection has not closed yet.
    session_overlaps_open,
    /// Longest time, in ms, a superseded session's connection stayed open.
    max_session_overlap_ms,
    /// Hellos answered 409 because their epoch was below the highest seen.
    stale_hellos_refused,
    /// Pushes answered 409 because their epoch was below the highest seen.
    stale_pushes_refused,
    /// Pushes answered 428: no current session with that epoch on the connection.
    pushes_without_session,
    /// Requests answered 400 (missing or malformed headers, wrong terminal id), 404, 413 or
    /// 421.
    requests_rejected,
    /// Pushes answered 200, duplicates (answered with the marker) included.
    pushes_accepted,
    /// Idempotency keys that reached one terminal again within its dedup window (each key
    /// counted once); the repeats were answered as duplicates, not taken again.
    keys_delivered_twice,
    /// Pushes answered 200 with the duplicate marker: their key had been accepted within
    /// the window (every repeat counted).
    duplicate_deliveries,
    /// Gauge: keys the terminals remember now (within their dedup window).
    keys_remembered,
    /// Keys forgotten before their dedup window ended because a terminal reached its
    /// `dedup_capacity`: a repeat of one of them would be taken again. 0 unless one
    /// terminal takes pushes faster than the capacity allows.
    keys_forgotten_early,
    /// Pushes that carried `posgate-expires-at` (pushes that waited in posgate's queue),
    /// whatever the answer.
    queued_pushes,
    /// Of those, pushes that arrived after the time their `posgate-expires-at` named
    /// (by this farm's clock): a gateway that sends late. Answered as usual.
    pushes_after_expiry,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Moves a gauge that stood at `from` (for this caller's share) to `to`.
    pub(crate) fn set_share(counter: &AtomicU64, from: u64, to: u64) {
        if to >= from {
            counter.fetch_add(to - from, Relaxed);
        } else {
            counter.fetch_sub(from - to, Relaxed);
        }
    }

    pub(crate) fn drop_one(counter: &AtomicU64) {
        counter.fetch_sub(1, Relaxed);
    }

    pub(crate) fn raise_to(counter: &AtomicU64, value: u64) {
        counter.fetch_max(value, Relaxed);
    }
}
