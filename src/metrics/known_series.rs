//! The bounded label values of the labelled families, and their series created at zero
//! when a pod starts, so dashboards and `rate()` see every series before its first event.
//!
//! Not for: anything that changes a value after the start (`super`, `super::sampler`).

use super::Metrics;

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
    ("release", &["released", "not_held", "error"]),
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

/// The `delivery` values of `posgate_shards_suspended`: held past the lease deadline and
/// delivering (the cluster-wide verdict stands) or parked (connections kept, nothing
/// delivered).
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
        for how in ["released", "budget", "resumed", "unannounced"] {
            let _ = self.drains_ended.get_or_create(&[("how", how)]);
        }
        for outcome in ["taken", "unsupported", "failed", "refused"] {
            let _ = self
                .kept_answers_handoffs
                .get_or_create(&[("outcome", outcome)]);
        }
        for delivery in SUSPENDED_DELIVERY {
            let _ = self
                .shards_suspended
                .get_or_create(&[("delivery", delivery)]);
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
