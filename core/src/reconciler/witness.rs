//! What this pod saw the store acknowledge, kept to prove that the store went back in
//! time: a failover to a replica the last writes had not reached. The generation is the
//! same then (this is no wipe), so only values that never go down inside one generation
//! can show it: the placement version and the heartbeat count.
//!
//! Each is remembered with the time the answer that showed it arrived. A snapshot *sent*
//! after that which shows less proves the store lost acknowledged writes
//! ([`Reconciler::store_went_back`](super::Reconciler)); one sent earlier may have been
//! read before the write and proves nothing.
//!
//! Why the heartbeat count: Sentinel promotes a replica and announces it only after
//! reconfiguring the others, and the old master takes writes until then, which are lost
//! on its demotion. If that takes longer than a member TTL less a heartbeat interval,
//! the promoted replica shows live pods' registrations expired; their peers would write
//! a placement without them and move their shards twice. Any pod that saw one of those
//! heartbeats (its own answer, or a snapshot of the old master) sees a count the new
//! master lacks, and holds rebalancing until every pod has registered again.
//!
//! Not for: a lost lease (a renewal answering an epoch below the held one proves that,
//! `inputs.rs`) or a wipe (a new generation, `rules.rs`'s recovery).

use std::time::Instant;

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub(super) struct Witness {
    /// When the answer that made this pod follow its current placement version arrived.
    placement: Option<Instant>,
    /// The highest heartbeat count of this generation seen, and when it arrived.
    heartbeats: Option<(u64, Instant)>,
}

impl Witness {
    /// The pod follows a placement version it learned at `now`.
    pub fn placement_followed(&mut self, now: Instant) {
        self.placement = Some(now);
    }

    /// When the answer that made the pod follow its current placement version arrived.
    pub fn placement_since(&self) -> Option<Instant> {
        self.placement
    }

    /// Whether a snapshot sent at `sent` that shows an older placement version than the
    /// followed one proves the store lost it.
    pub fn proves_placement_lost(&self, sent: Option<Instant>) -> bool {
        sent.zip(self.placement)
            .is_some_and(|(s, known)| s >= known)
    }

    /// A heartbeat answered at `now` with the generation's count `count`.
    pub fn heartbeat_answered(&mut self, count: u64, now: Instant) {
        if self.heartbeats.is_none_or(|(seen, _)| count > seen) {
            self.heartbeats = Some((count, now));
        }
    }

    /// A snapshot of this pod's generation, sent at `sent`, shows the heartbeat count
    /// `count`: true when that proves the store lost heartbeats this pod saw it take.
    /// Either way, what the store shows now is what later snapshots are held to.
    pub fn heartbeats_read(&mut self, sent: Option<Instant>, count: u64, now: Instant) -> bool {
        let lost = self
            .heartbeats
            .zip(sent)
            .is_some_and(|((seen, known), sent)| count < seen && sent >= known);
        if lost {
            self.heartbeats = Some((count, now));
        } else {
            self.heartbeat_answered(count, now);
        }
        lost
    }

    /// A new generation: its count starts again from zero.
    pub fn new_generation(&mut self) {
        self.heartbeats = None;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_a_snapshot_sent_after_a_higher_count_arrived_proves_a_loss() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut w = Witness::default();
        assert!(!w.heartbeats_read(Some(t0), 3, ms(1)), "nothing seen yet");
        w.heartbeat_answered(5, ms(10));
        // Sent before the count 5 arrived: it may have been read before that heartbeat.
        assert!(!w.heartbeats_read(Some(ms(9)), 4, ms(11)));
        assert!(w.heartbeats_read(Some(ms(10)), 4, ms(12)));
        // The store's count is the new reference: the same reading proves nothing twice.
        assert!(!w.heartbeats_read(Some(ms(13)), 4, ms(14)));
        assert!(!w.heartbeats_read(Some(ms(15)), 6, ms(16)));
        assert!(w.heartbeats_read(Some(ms(17)), 5, ms(18)));
        w.new_generation();
        assert!(!w.heartbeats_read(Some(ms(19)), 0, ms(20)));
    }
}
