//! Deterministic simulation of a whole posgate cluster: many reconcilers, one in-memory
//! store, a virtual clock, seeded faults.
//!
//! Every pod runs the real [`crate::core::reconciler::Reconciler`]; the store is the real
//! [`crate::store::memory::MemoryState`]. Only the IO is simulated: message latency,
//! lost replies, crashes, pauses, store outages and restarts that lose all data, pods cut
//! off from the store, and per-pod clock rates (+-2%). The same seed always produces the
//! same run, so a failing seed printed by a test is replayed with
//! `posgate simulate --seed <SEED>`.
//!
//! After every event the invariants in [`checks`] are verified: no two pods serve one
//! shard at the same instant unless the older is fenced by epoch, epochs per shard only
//! grow, and once faults stop and `max(lease TTL, member TTL) + 3 s` pass, every shard is
//! served by its assigned pod. Pushes run through the same cluster (callers retrying
//! keys whose answers were lost, the real routing rule and idempotency cache, a terminal
//! that fences and dedupes), and [`keys`] checks that a key reaches a terminal again
//! only after an answer was lost.
//!
//! What it does not simulate: HTTP, TLS, request bodies, or the terminals' sessions
//! (a terminal of a served shard is taken to be connected to its newest hello).

mod checks;
mod faults;
mod keys;
mod later;
mod world;

use std::time::Duration;

use crate::core::CoreConfig;

pub use checks::Violation;

/// The knobs of one simulated run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub core: CoreConfig,
    /// Pods started at the beginning.
    pub initial_pods: usize,
    /// Upper bound on pods alive at once (joins stop there).
    pub max_pods: usize,
    /// Terminals of each shard, each with the sessions open to it.
    pub terminals_per_shard: usize,
    /// Faults are injected from `fault_start` until `fault_end` (virtual time).
    pub fault_start: Duration,
    pub fault_end: Duration,
    /// Maximum clock-rate deviation per pod (0.02 = +-2%).
    pub clock_skew: f64,
    /// Probability that a store reply is lost after the store applied the call.
    pub reply_loss: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            core: CoreConfig::fast(),
            initial_pods: 4,
            max_pods: 8,
            terminals_per_shard: 3,
            fault_start: Duration::from_secs(8),
            fault_end: Duration::from_secs(50),
            clock_skew: 0.02,
            reply_loss: 0.01,
        }
    }
}

/// What one seed did, for reports and to show a test exercised something.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub events: u64,
    pub faults: u64,
    pub acquisitions: u64,
    pub handovers: u64,
    /// Leases a planned move handed straight to their next owner (`release.lua`).
    pub leases_handed_over: u64,
    pub invariant_checks: u64,
    /// Checks that found two pods holding one shard, the older epoch fenced (a holder
    /// through an outage overtaken by a pod its quorum could not hear).
    pub fenced_overlaps: u64,
    /// Checks that found a pod delivering on a shard past its lease deadline, held under
    /// a cluster-wide verdict: static stability at work (zero would mean an outage longer
    /// than the lease stops the data plane).
    pub served_in_outage: u64,
    /// Hellos the terminals refused as stale: a pod resumed a shard it held through a
    /// verdict while a pod outside its quorum acquired it (the fence at work).
    pub refused_hellos: u64,
    /// Keys the callers sent, attempts (first sends and retries), keys answered `200`.
    pub pushes: u64,
    pub push_attempts: u64,
    pub keys_delivered: u64,
    /// Attempts the entry pod answered "delivery unknown".
    pub push_answers_unknown: u64,
    /// Copies of a key the terminal deduplicated (a retry after a lost answer), and of
    /// those, the ones from another pod than the copy before (across a handover).
    pub deduplicated: u64,
    pub deduplicated_across_pods: u64,
    /// Kept answers a new owner took over from a shard's last holder.
    pub answers_handed_over: u64,
    /// Terminal sessions opened after the previous owner released them, opened without
    /// a release (nobody to ask, asking failed or was refused), and older sessions the
    /// terminals dropped for a newer epoch.
    pub terminals_released: u64,
    pub terminals_unasked: u64,
    pub sessions_fenced: u64,
    /// Of the terminals dialed on a release, those a pod the new owner did not ask
    /// still drained (its view of the shard's last holder was stale): fenced.
    pub unknown_predecessor: u64,
    /// Drains that could not be announced to every member (closed whole instead).
    pub unannounced_drains: u64,
    /// Failovers of the store to a replica that lacked its last writes.
    pub failovers: u64,
    /// Times a pod found the store had gone back in time (lost writes it acknowledged).
    pub rollbacks_seen: u64,
    /// Pushes with a TTL: planned, stored, acknowledged to their caller; of those,
    /// ended delivered, expired, replaced (collapse key), unknown, or lost with the
    /// store's data; copies sent, and copies the terminal answered as repeats.
    pub later_pushes: u64,
    pub later_stored: u64,
    pub later_acked: u64,
    pub later_delivered: u64,
    pub later_expired: u64,
    pub later_replaced: u64,
    pub later_unknown: u64,
    pub later_lost: u64,
    pub later_copies: u64,
    pub later_repeats: u64,
    /// Keys taken again from a new stored push after a wipe lost the first (a retry
    /// the caller made within the window, waiting in the queue past it).
    pub later_retaken: u64,
}

impl SimStats {
    pub fn add(&mut self, other: &SimStats) {
        self.events += other.events;
        self.faults += other.faults;
        self.acquisitions += other.acquisitions;
        self.handovers += other.handovers;
        self.leases_handed_over += other.leases_handed_over;
        self.invariant_checks += other.invariant_checks;
        self.fenced_overlaps += other.fenced_overlaps;
        self.served_in_outage += other.served_in_outage;
        self.refused_hellos += other.refused_hellos;
        self.pushes += other.pushes;
        self.push_attempts += other.push_attempts;
        self.keys_delivered += other.keys_delivered;
        self.push_answers_unknown += other.push_answers_unknown;
        self.deduplicated += other.deduplicated;
        self.deduplicated_across_pods += other.deduplicated_across_pods;
        self.answers_handed_over += other.answers_handed_over;
        self.terminals_released += other.terminals_released;
        self.terminals_unasked += other.terminals_unasked;
        self.sessions_fenced += other.sessions_fenced;
        self.unknown_predecessor += other.unknown_predecessor;
        self.unannounced_drains += other.unannounced_drains;
        self.failovers += other.failovers;
        self.rollbacks_seen += other.rollbacks_seen;
        self.later_pushes += other.later_pushes;
        self.later_stored += other.later_stored;
        self.later_acked += other.later_acked;
        self.later_delivered += other.later_delivered;
        self.later_expired += other.later_expired;
        self.later_replaced += other.later_replaced;
        self.later_unknown += other.later_unknown;
        self.later_lost += other.later_lost;
        self.later_copies += other.later_copies;
        self.later_repeats += other.later_repeats;
        self.later_retaken += other.later_retaken;
    }
}

/// Runs seeds `first..first + count` in order, stopping at the first violation.
pub fn run_seeds(first: u64, count: u64, cfg: &SimConfig) -> Result<SimStats, Violation> {
    let mut total = SimStats::default();
    for seed in first..first + count {
        total.add(&run_seed(seed, cfg)?);
    }
    Ok(total)
}

/// Runs one seed to completion. `Err` carries the first invariant violation, with enough
/// context (virtual time, shard, pods, recent events) to debug it.
pub fn run_seed(seed: u64, cfg: &SimConfig) -> Result<SimStats, Violation> {
    world::World::new(seed, cfg).run()
}
