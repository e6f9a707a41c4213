//! The bounded label values of the labelled families, and their series created at zero
//! when a pod starts, so dashboards and `rate()` see every series before its first event.
//!
//! Not for: anything that changes a value after the start (`super`, `super::sampler`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::{Hist, Labels2, Metrics};

/// The `op` values of the store metrics.
const STORE_OPS: [&str; 7] = [
    "snapshot",
    "heartbeat",
    "acquire",
    "renew",
    "release",
    "deregister",
    "place",
];

/// The `outcome` values of `posgate_lease_ops_total` per `op`.
const LEASE_OUTCOMES: [(&str, &[&str]); 3] = [
    (
        "acquire",
        &[
            "acquired",
            "already_mine",
            "held_by_other",
            "generation_changed",
            "error",
        ],
    ),
    (
        "renew",
        &[
            "renewed",
            "missing",
            "held_by_other",
            "generation_changed",
            "error",
        ],
    ),
    ("release", &["released", "handed_over", "not_held", "error"]),
];

/// The `result` values of `posgate_dials_total` (see `DialError::label`).
pub(super) const DIAL_RESULTS: [&str; 7] = [
    "ok",
    "refused",
    "timeout",
    "tls_error",
    "stale_epoch",
    "rejected",
    "error",
];

/// The `path` values of the push API metrics.
pub(super) const PUSH_PATHS: [&str; 3] = ["local", "forwarded", "none"];

/// The `result` values of `posgate_planned_moves_total` (`MoveCounts`).
pub(super) const MOVE_RESULTS: [&str; 3] = ["elected", "skipped", "failed"];

/// The `delivery` values of `posgate_shards_suspended`: held past the lease deadline and
/// delivering (the cluster-wide verdict stands) or parked (connections kept, nothing
/// delivered).
/// Every `result` of `posgate_queue_enqueued_total`.
pub const QUEUE_ENQUEUE_RESULTS: [&str; 6] = [
    "accepted",
    "existing",
    "conflict",
    "full",
    "unknown_terminal",
    "error",
];
/// Every `result` of `posgate_queue_copies_total` and `posgate_broadcast_copies_total`.
pub const QUEUE_COPY_RESULTS: [&str; 7] = [
    "taken",
    "duplicate",
    "rejected",
    "try_again",
    "not_sent",
    "stale_epoch",
    "unknown",
];

pub const SUSPENDED_DELIVERY: [&str; 2] = ["delivering", "parked"];

/// The `reason` values of `posgate_peer_requests_refused_total` (`AuthError::reason`).
pub const PEER_REFUSAL_REASONS: [&str; 10] = [
    "unsigned",
    "malformed",
    "stale",
    "bad_signature",
    "wrong_recipient",
    "replay",
    "digest_mismatch",
    "unsupported_version",
    "legacy_refused",
    "window_full",
];

/// The series every push API answer updates, looked up once: a `Family` lookup hashes
/// the labels and takes the family's lock, on every push. The handles share their
/// values with the families' series (the ones [`Metrics::zero_known_series`] creates).
#[derive(Debug)]
pub struct PushSeries {
    /// `posgate_push_requests_total{path, result="ok"}`, in [`PUSH_PATHS`] order.
    ok: [Counter; PUSH_PATHS.len()],
    /// `posgate_push_duration_seconds{path}`, in [`PUSH_PATHS`] order.
    duration: [Histogram; PUSH_PATHS.len()],
}

impl PushSeries {
    pub(super) fn of(requests: &Family<Labels2, Counter>, duration: &Hist) -> Self {
        PushSeries {
            ok: PUSH_PATHS.map(|path| {
                requests
                    .get_or_create(&[("path", path), ("result", "ok")])
                    .clone()
            }),
            duration: PUSH_PATHS.map(|path| duration.get_or_create(&[("path", path)]).clone()),
        }
    }

    fn index(path: &str) -> Option<usize> {
        PUSH_PATHS.iter().position(|p| *p == path)
    }

    /// The `result="ok"` counter of `path`, if `path` is one of [`PUSH_PATHS`].
    pub fn ok(&self, path: &str) -> Option<&Counter> {
        Self::index(path).map(|i| &self.ok[i])
    }

    /// The latency histogram of `path`, if `path` is one of [`PUSH_PATHS`].
    pub fn duration(&self, path: &str) -> Option<&Histogram> {
        Self::index(path).map(|i| &self.duration[i])
    }
}

impl Metrics {
    /// Creates every series of the bounded label sets at zero, so dashboards and
    /// `rate()` see them before the first event.
    pub(super) fn zero_known_series(&self) {
        for reason in [
            "rebalance",
            "expired",
            "lost",
            "stolen",
            "stale_epoch",
            "isolated",
            "paused",
            "shutdown",
        ] {
            let _ = self.shard_stops.get_or_create(&[("reason", reason)]);
        }
        for outcome in ["released", "not_draining", "failed"] {
            let _ = self
                .handover_releases
                .get_or_create(&[("outcome", outcome)]);
        }
        for outcome in ["relayed", "not_relayed", "unknown"] {
            let _ = self.handover_relays.get_or_create(&[("outcome", outcome)]);
        }
        for how in ["released", "budget", "resumed", "unannounced"] {
            let _ = self.drains_ended.get_or_create(&[("how", how)]);
        }
        for from in ["sender", "peer"] {
            let _ = self.push_batches.get_or_create(&[("from", from)]);
            let _ = self.push_batch_items.get_or_create(&[("from", from)]);
        }
        for outcome in ["taken", "unsupported", "failed", "refused"] {
            let _ = self
                .kept_answers_handovers
                .get_or_create(&[("outcome", outcome)]);
        }
        for result in QUEUE_ENQUEUE_RESULTS {
            let _ = self.queue_enqueued.get_or_create(&[("result", result)]);
        }
        for state in crate::store::queue::State::FINAL {
            let _ = self.queue_finals.get_or_create(&[("state", state)]);
        }
        for result in QUEUE_COPY_RESULTS {
            let _ = self.queue_copies.get_or_create(&[("result", result)]);
            let _ = self.broadcast_copies.get_or_create(&[("result", result)]);
        }
        for delivery in SUSPENDED_DELIVERY {
            let _ = self
                .shards_suspended
                .get_or_create(&[("delivery", delivery)]);
        }
        for result in MOVE_RESULTS {
            let _ = self.planned_moves.get_or_create(&[("result", result)]);
        }
        for verdict in crate::status::VERDICTS {
            let _ = self.store_verdict.get_or_create(&[("verdict", verdict)]);
        }
        for op in STORE_OPS {
            let _ = self.store_errors.get_or_create(&[("op", op)]);
            let _ = self.store_op_duration.get_or_create(&[("op", op)]);
        }
        for (op, outcomes) in LEASE_OUTCOMES {
            for outcome in outcomes {
                let _ = self
                    .lease_ops
                    .get_or_create(&[("op", op), ("outcome", outcome)]);
            }
        }
        for state in ["disconnected", "dialing", "connected", "backoff"] {
            let _ = self.terminals.get_or_create(&[("state", state)]);
        }
        for result in DIAL_RESULTS {
            let _ = self.dials.get_or_create(&[("result", result)]);
        }
        for result in ["ok", "error"] {
            let _ = self.reloads.get_or_create(&[("result", result)]);
        }
        for reason in PEER_REFUSAL_REASONS {
            let _ = self.peer_refusals.get_or_create(&[("reason", reason)]);
        }
        for reason in ["lost", "stopped", "hello_failed"] {
            let _ = self.connections_closed.get_or_create(&[("reason", reason)]);
        }
        for reason in ["timeout", "evicted", "refused"] {
            let _ = self
                .http_connections_closed
                .get_or_create(&[("reason", reason)]);
        }
        for path in PUSH_PATHS {
            let _ = self.push_duration.get_or_create(&[("path", path)]);
            let _ = self
                .push_requests
                .get_or_create(&[("path", path), ("result", "ok")]);
        }
    }
}
