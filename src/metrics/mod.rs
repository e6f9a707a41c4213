//! The pod's Prometheus metrics: one [`Metrics`] value per pod (no process-global
//! registry, so one process can run many pods), shared by `Arc`, served on
//! `GET /metrics` as OpenMetrics or classic Prometheus text, whichever the scraper asks
//! for ([`Exposition`]). Every name, type and label is listed in `docs/metrics.md`.
//!
//! Counters and histograms are bumped where things happen (driver store calls, dials,
//! pushes); gauges that describe state (shards, terminals by state, queue depth) are
//! set by the [`sampler`] from the pod's status and the connection manager, so no hot
//! path pays for them. Labels are bounded sets only: never a terminal id, a token or an
//! idempotency key; `shard` has at most `--shards` values.
//!
//! Not for: deciding anything. Nothing reads these values back except `/metrics` and
//! the status page's [`timeline`], a few of them sampled every few seconds.

mod exposition;
mod known_series;
pub mod sampler;
pub mod timeline;

pub use self::exposition::Exposition;
pub use self::known_series::{PushSeries, PEER_REFUSAL_REASONS, SUSPENDED_DELIVERY};

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A label set of one label with a fixed value.
pub type Label = [(&'static str, &'static str); 1];
/// Two fixed labels.
pub type Labels2 = [(&'static str, &'static str); 2];
/// The `shard` label.
pub type ShardLabel = [(&'static str, u32); 1];

pub(crate) type Hist = Family<Label, Histogram, fn() -> Histogram>;

fn latency_buckets() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn rebalance_buckets() -> Histogram {
    // 50 ms .. ~27 min.
    Histogram::new(exponential_buckets(0.05, 2.0, 16))
}

/// One unit of a gauge that counts things in progress: incremented when made,
/// decremented when dropped. A request future dropped half-way (its caller went away)
/// still counts down, so such gauges cannot drift; never pair `inc` and `dec` by hand
/// around an `.await`.
#[derive(Debug)]
pub struct GaugeUnit(Gauge);

impl GaugeUnit {
    pub fn hold(gauge: &Gauge) -> Self {
        gauge.inc();
        GaugeUnit(gauge.clone())
    }
}

impl Drop for GaugeUnit {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Every metric of one pod. See `docs/metrics.md`.
pub struct Metrics {
    registry: Registry,
    // Membership and ring.
    pub members: Gauge,
    pub membership_changes: Counter,
    pub rebalances: Counter,
    pub rebalance_duration: Histogram,
    pub shards_assigned: Gauge,
    pub shards_served: Gauge,
    pub shards_suspended: Family<Label, Gauge>,
    pub shards_without_owner: Gauge,
    pub shard_served: Family<ShardLabel, Gauge>,
    pub shard_epoch: Family<ShardLabel, Gauge>,
    // Leases and the store.
    pub lease_ops: Family<Labels2, Counter>,
    pub shard_stops: Family<Label, Counter>,
    pub store_op_duration: Hist,
    pub store_errors: Family<Label, Counter>,
    pub store_reachable: Gauge,
    pub store_rollbacks: Counter,
    pub planned_moves: Family<Label, Counter>,
    pub shards_waiting_for_slot: Gauge,
    pub store_unreachable_seconds: Gauge<f64, AtomicU64>,
    pub store_verdict: Family<Label, Gauge>,
    pub peers_reaching_store: Gauge,
    // Connections.
    pub terminals: Family<Label, Gauge>,
    pub dials: Family<Label, Counter>,
    pub dial_duration: Histogram,
    pub dial_wait: Histogram,
    pub dial_queue_depth: Gauge,
    pub connections_closed: Family<Label, Counter>,
    // Planned moves, per terminal (`pos::handover`, the manager's drain).
    pub handover_releases: Family<Label, Counter>,
    pub handover_relays: Family<Label, Counter>,
    pub handover_waiting: Gauge,
    pub handover_dark: Histogram,
    pub draining_sessions: Gauge,
    pub drains_ended: Family<Label, Counter>,
    // Pushes.
    pub push_requests: Family<Labels2, Counter>,
    pub push_duration: Hist,
    /// The series of the two above that every push updates.
    pub push_series: PushSeries,
    pub pushes_in_flight: Gauge,
    pub pushes_waiting_for_owner: Gauge,
    pub push_owner_wait: Histogram,
    pub push_replays: Counter,
    pub pushes_on_suspended: Counter,
    pub push_duplicates: Counter,
    pub kept_answers_handovers: Family<Label, Counter>,
    pub kept_answers_taken: Counter,
    pub push_batches: Family<Label, Counter>,
    pub push_batch_items: Family<Label, Counter>,
    // Pushes kept for later (`push::queue`, `push::later`).
    pub queue_enqueued: Family<Label, Counter>,
    pub queue_finals: Family<Label, Counter>,
    pub queue_copies: Family<Label, Counter>,
    pub queue_pushes: Gauge,
    pub queue_bytes: Gauge,
    pub queue_oldest_seconds: Gauge<f64, AtomicU64>,
    pub queue_oldest_connected_seconds: Gauge<f64, AtomicU64>,
    pub queue_max_bytes: Gauge,
    // Broadcasts (`push::broadcast`).
    pub broadcasts_active: Gauge,
    pub broadcast_copies: Family<Label, Counter>,
    // Operations.
    pub reloads: Family<Label, Counter>,
    pub peer_refusals: Family<Label, Counter>,
    pub peer_legacy_accepted: Counter,
    pub http_connections: Gauge,
    pub http_connections_closed: Family<Label, Counter>,
    /// Samples of a few of the above for the status page (not exported).
    timeline: Mutex<timeline::Timeline>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let push_requests = Family::default();
        let push_duration = Family::new_with_constructor(latency_buckets as fn() -> Histogram);
        let push_series = PushSeries::of(&push_requests, &push_duration);
        let mut m = Metrics {
            registry: Registry::default(),
            members: Gauge::default(),
            membership_changes: Counter::default(),
            rebalances: Counter::default(),
            rebalance_duration: rebalance_buckets(),
            shards_assigned: Gauge::default(),
            shards_served: Gauge::default(),
            shards_suspended: Family::default(),
            shards_without_owner: Gauge::default(),
            shard_served: Family::default(),
            shard_epoch: Family::default(),
            lease_ops: Family::default(),
            shard_stops: Family::default(),
            store_op_duration: Family::new_with_constructor(latency_buckets),
            store_errors: Family::default(),
            store_reachable: Gauge::default(),
            store_rollbacks: Counter::default(),
            planned_moves: Family::default(),
            shards_waiting_for_slot: Gauge::default(),
            store_unreachable_seconds: Gauge::default(),
            store_verdict: Family::default(),
            peers_reaching_store: Gauge::default(),
            terminals: Family::default(),
            dials: Family::default(),
            dial_duration: latency_buckets(),
            dial_wait: latency_buckets(),
            dial_queue_depth: Gauge::default(),
            connections_closed: Family::default(),
            handover_releases: Family::default(),
            handover_relays: Family::default(),
            push_batches: Family::default(),
            push_batch_items: Family::default(),
            handover_waiting: Gauge::default(),
            handover_dark: latency_buckets(),
            draining_sessions: Gauge::default(),
            drains_ended: Family::default(),
            push_requests,
            push_duration,
            push_series,
            pushes_in_flight: Gauge::default(),
            pushes_waiting_for_owner: Gauge::default(),
            push_owner_wait: latency_buckets(),
            push_replays: Counter::default(),
            pushes_on_suspended: Counter::default(),
            push_duplicates: Counter::default(),
            kept_answers_handovers: Family::default(),
            kept_answers_taken: Counter::default(),
            queue_enqueued: Family::default(),
            queue_finals: Family::default(),
            queue_copies: Family::default(),
            queue_pushes: Gauge::default(),
            queue_bytes: Gauge::default(),
            queue_oldest_seconds: Gauge::default(),
            queue_oldest_connected_seconds: Gauge::default(),
            queue_max_bytes: Gauge::default(),
            broadcasts_active: Gauge::default(),
            broadcast_copies: Family::default(),
            reloads: Family::default(),
            peer_refusals: Family::default(),
            peer_legacy_accepted: Counter::default(),
            http_connections: Gauge::default(),
            http_connections_closed: Family::default(),
            timeline: Mutex::default(),
        };
        m.register();
        m.zero_known_series();
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        // prometheus-client appends `_total` to counter names.
        r.register(
            "posgate_members",
            "Live members in this pod's view",
            self.members.clone(),
        );
        r.register(
            "posgate_membership_changes",
            "Membership views that differed from the previous one",
            self.membership_changes.clone(),
        );
        r.register(
            "posgate_rebalances",
            "Changes of the set of shards assigned to this pod",
            self.rebalances.clone(),
        );
        r.register("posgate_rebalance_duration_seconds", "From a change of this pod's assignment until every assigned shard is served and each of its terminals was dialed once", self.rebalance_duration.clone());
        r.register(
            "posgate_shards_assigned",
            "Shards the ring assigns to this pod",
            self.shards_assigned.clone(),
        );
        r.register(
            "posgate_shards_served",
            "Shards this pod serves now",
            self.shards_served.clone(),
        );
        r.register(
            "posgate_shards_suspended",
            "Shards held past their lease deadline through a store outage, by delivery (delivering: the cluster-wide verdict stands; parked: connections kept, nothing delivered)",
            self.shards_suspended.clone(),
        );
        r.register(
            "posgate_shards_without_owner",
            "Shards with no lease holder in this pod's last view of the store",
            self.shards_without_owner.clone(),
        );
        r.register(
            "posgate_shard_served",
            "1 while this pod serves the shard",
            self.shard_served.clone(),
        );
        r.register(
            "posgate_shard_epoch",
            "Fencing epoch of the shard's lease holder in this pod's last view",
            self.shard_epoch.clone(),
        );
        r.register(
            "posgate_lease_ops",
            "Lease calls by op (acquire, renew, release) and outcome, per shard",
            self.lease_ops.clone(),
        );
        r.register("posgate_shard_stops", "Shards this pod stopped serving, by reason (rebalance, expired, lost, stolen, stale_epoch, isolated, shutdown)", self.shard_stops.clone());
        r.register("posgate_store_op_duration_seconds", "Duration of coordination store calls by op (snapshot, heartbeat, acquire, renew, release, deregister); op=renew is the lease renew latency", self.store_op_duration.clone());
        r.register(
            "posgate_store_errors",
            "Failed coordination store calls by op",
            self.store_errors.clone(),
        );
        r.register(
            "posgate_store_reachable",
            "1 when the last store call succeeded",
            self.store_reachable.clone(),
        );
        r.register(
            "posgate_planned_moves",
            "Planned shard moves this pod put in placement steps, by result (elected: took a slot of the move budget; skipped: left waiting for one; failed: the step's write lost)",
            self.planned_moves.clone(),
        );
        r.register(
            "posgate_shards_waiting_for_slot",
            "Shards whose planned move waits for a slot of the move budget (--max-moving-shards), in this pod's view",
            self.shards_waiting_for_slot.clone(),
        );
        r.register(
            "posgate_store_rollbacks",
            "Times this pod found the store had lost writes it acknowledged (a failover to a replica that lacked them)",
            self.store_rollbacks.clone(),
        );
        r.register(
            "posgate_store_unreachable_seconds",
            "Seconds since the store last answered this pod (since the first failed call of the current failure); 0 while it answers",
            self.store_unreachable_seconds.clone(),
        );
        r.register(
            "posgate_store_verdict",
            "1 for this pod's verdict on the store (reachable, unknown, isolated, cluster_wide), 0 for the others",
            self.store_verdict.clone(),
        );
        r.register(
            "posgate_peers_reaching_store",
            "Peers that said they reach the store in the last probe",
            self.peers_reaching_store.clone(),
        );
        r.register("posgate_terminals", "Terminals of served shards by connection state (disconnected, dialing, connected, backoff)", self.terminals.clone());
        r.register("posgate_dials", "Finished terminal dials by result (ok, refused, timeout, tls_error, stale_epoch, rejected, error)", self.dials.clone());
        r.register(
            "posgate_dial_duration_seconds",
            "Duration of a dial: TCP, TLS, HTTP/2 and hello",
            self.dial_duration.clone(),
        );
        r.register(
            "posgate_dial_wait_seconds",
            "Time a dial waited for the rate limiter and a handshake slot",
            self.dial_wait.clone(),
        );
        r.register(
            "posgate_dial_queue_depth",
            "Dials waiting for the pacer now",
            self.dial_queue_depth.clone(),
        );
        r.register("posgate_connections_closed", "Terminal connections that ended, by reason (lost: died under us; stopped: shard stopped or terminal removed; hello_failed)", self.connections_closed.clone());
        r.register("posgate_handover_releases", "Requests to a shard's previous owner to close terminals before this pod dials them, by outcome (released; not_draining: it does not drain the shard; failed: unreachable, slow or refused; the last two make the rest of the shard dial normally)", self.handover_releases.clone());
        r.register("posgate_handover_relays", "Pushes for a terminal not yet released by a shard's previous owner, sent through that owner's draining session, by outcome (relayed: the terminal answered there, or it may have; not_relayed: nothing was sent there, and the push waited for this pod's own session; unknown: the previous owner did not answer)", self.handover_relays.clone());
        r.register(
            "posgate_handover_terminals_waiting",
            "Terminals of shards taken over that wait for their previous owner to close them before their first dial",
            self.handover_waiting.clone(),
        );
        r.register("posgate_handover_dark_seconds", "Per terminal moved by a planned handover: from asking the previous owner to close it until this pod's session to it is up (an upper bound of the time the terminal had no connection)", self.handover_dark.clone());
        r.register(
            "posgate_draining_sessions",
            "Terminal sessions kept open without delivering, for shards handed over, until the new owner asks to close them",
            self.draining_sessions.clone(),
        );
        r.register("posgate_drains_ended", "Shards handed over whose draining ended, by how (released: the new owner asked for every terminal; budget: the drain budget closed the rest; resumed: this pod serves the shard again; unannounced: a member could not be told, so the shard was closed whole before release)", self.drains_ended.clone());
        r.register(
            "posgate_push_requests",
            "Push API requests by path (local, forwarded, none) and result (ok or the error code)",
            self.push_requests.clone(),
        );
        r.register(
            "posgate_push_duration_seconds",
            "Push API latency by path",
            self.push_duration.clone(),
        );
        r.register(
            "posgate_pushes_in_flight",
            "Push API requests being handled now",
            self.pushes_in_flight.clone(),
        );
        r.register(
            "posgate_pushes_waiting_for_owner",
            "Pushes waiting for a serving owner now",
            self.pushes_waiting_for_owner.clone(),
        );
        r.register(
            "posgate_push_owner_wait_seconds",
            "Time pushes waited for a serving owner",
            self.push_owner_wait.clone(),
        );
        r.register(
            "posgate_push_replays",
            "Pushes answered from the idempotency cache",
            self.push_replays.clone(),
        );
        r.register(
            "posgate_pushes_on_suspended_shards",
            "Pushes delivered (the terminal answered 2xx) on shards held past their lease deadline through a cluster-wide store outage",
            self.pushes_on_suspended.clone(),
        );
        r.register(
            "posgate_push_duplicates",
            "Pushes a terminal answered with the duplicate marker: it had the idempotency key already and did not take the push again",
            self.push_duplicates.clone(),
        );
        // "handoff": the name predates "handover" as the one word for a shard's move,
        // and a metric's name is its dashboards' contract.
        r.register(
            "posgate_kept_answers_handoffs",
            "Shards taken over whose previous owner was asked for its kept push answers, by outcome (taken, unsupported: an older release, failed: unreachable or too slow, refused: a malformed answer)",
            self.kept_answers_handovers.clone(),
        );
        r.register(
            "posgate_kept_answers_taken",
            "Kept push answers taken into this pod's idempotency cache from a shard's previous owner",
            self.kept_answers_taken.clone(),
        );
        r.register("posgate_queue_enqueued", "Pushes with a TTL this pod tried to store, by result (accepted, existing: the key was stored before, conflict, full, unknown_terminal, error: the store did not answer)", self.queue_enqueued.clone());
        r.register("posgate_queue_finals", "Pushes with a TTL this pod moved to a final state, by state (delivered, rejected, expired, replaced, cancelled, unknown)", self.queue_finals.clone());
        r.register("posgate_broadcasts_active", "Unexpired broadcasts of the cluster, as this pod last read them (each walked by every pod on its shards)", self.broadcasts_active.clone());
        r.register(
            "posgate_broadcast_copies",
            "Broadcast copies this pod sent, by result (as posgate_queue_copies_total)",
            self.broadcast_copies.clone(),
        );
        r.register("posgate_queue_copies", "Copies of queued pushes this pod sent, by result (taken, duplicate: the terminal had the key, rejected, try_again: 409/421/428/5xx, not_sent, stale_epoch, unknown: no answer)", self.queue_copies.clone());
        r.register(
            "posgate_queue_pushes",
            "Pushes with a TTL not final yet for the terminals of the shards this pod serves (what its drains last read)",
            self.queue_pushes.clone(),
        );
        r.register(
            "posgate_queue_bytes",
            "Bytes the store charges for those pushes (bodies and records)",
            self.queue_bytes.clone(),
        );
        r.register(
            "posgate_queue_oldest_seconds",
            "Age of the oldest of those pushes; 0 when there is none",
            self.queue_oldest_seconds.clone(),
        );
        r.register("posgate_queue_oldest_connected_seconds", "Age of the oldest of those pushes whose terminal has a session: a queue that does not drain although its terminal is connected; 0 when there is none", self.queue_oldest_connected_seconds.clone());
        r.register(
            "posgate_queue_max_bytes",
            "The cluster's bound on the queue's bytes (--queue-max-bytes)",
            self.queue_max_bytes.clone(),
        );
        r.register(
            "posgate_reloads",
            "Reloads of secrets and certificates (SIGHUP or changed files) by result (ok, error)",
            self.reloads.clone(),
        );
        r.register(
            "posgate_peer_requests_refused",
            "Requests to the peer endpoints refused before they were acted on, by reason",
            self.peer_refusals.clone(),
        );
        r.register(
            "posgate_push_batches",
            "Batches of pushes received, by whom from (sender: POST /v1/pushes; peer: one owner's share of a batch, forwarded in one request)",
            self.push_batches.clone(),
        );
        r.register(
            "posgate_push_batch_items",
            "Pushes received in batches, by whom from (sender, peer)",
            self.push_batch_items.clone(),
        );
        r.register(
            "posgate_peer_legacy_requests",
            "Peer requests accepted in protocol 1 (from pods of the previous release during a rolling upgrade)",
            self.peer_legacy_accepted.clone(),
        );
        r.register(
            "posgate_http_connections",
            "Client connections the HTTP listener holds now (pushes, peers, probes; not terminal sessions)",
            self.http_connections.clone(),
        );
        r.register("posgate_http_connections_closed", "Client connections the listener closed itself, by reason (timeout: no first request head within --header-read-timeout, or no request for --idle-timeout; evicted: the oldest waiting without a request, to make room at --max-connections; refused: at --max-connections with every connection in a request)", self.http_connections_closed.clone());
    }

    /// Every metric, as text in `format`.
    pub fn encode(&self, format: Exposition) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        encode(&mut out, &self.registry).expect("encoding into a String");
        match format {
            Exposition::OpenMetrics => out,
            Exposition::Classic => exposition::classic(&out),
        }
    }

    /// Records one store call.
    pub fn store_call(&self, op: &'static str, took: Duration, ok: bool) {
        self.store_op_duration
            .get_or_create(&[("op", op)])
            .observe(took.as_secs_f64());
        if !ok {
            self.store_errors.get_or_create(&[("op", op)]).inc();
        }
    }

    /// Counts `n` lease outcomes.
    pub fn lease_outcome(&self, op: &'static str, outcome: &'static str, n: u64) {
        self.lease_ops
            .get_or_create(&[("op", op), ("outcome", outcome)])
            .inc_by(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_family_with_posgate_names() {
        let m = Metrics::new();
        m.store_call("renew", Duration::from_millis(3), false);
        m.lease_outcome("renew", "renewed", 4);
        m.dials.get_or_create(&[("result", "ok")]).inc();
        m.shard_served.get_or_create(&[("shard", 7)]).set(1);
        let text = m.encode(Exposition::OpenMetrics);
        assert!(
            text.contains("posgate_store_errors_total{op=\"renew\"} 1"),
            "{text}"
        );
        assert!(text.contains("posgate_lease_ops_total{op=\"renew\",outcome=\"renewed\"} 4"));
        assert!(text.contains("posgate_shard_served{shard=\"7\"} 1"));
        assert!(text.contains("posgate_store_op_duration_seconds_bucket{"));
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            assert!(line.starts_with("# TYPE posgate_"), "{line}");
        }
        assert!(text.trim_end().ends_with("# EOF"));
    }
}
