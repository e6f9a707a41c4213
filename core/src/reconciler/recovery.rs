//! Recovery after the store lost everything or could not be reached for longer than the
//! lease deadlines (rule 5 of the reconciler).
//!
//! The danger in both cases is the same: the store no longer proves who holds what, while
//! pods may still be serving. So every pod that notices re-claims (`SET NX`) exactly the
//! shards it still holds, re-registers, and claims or releases nothing else until the
//! store generation is one member TTL old (or, after an outage, for one member TTL).
//! After a generation change a suspended shard (deadline passed in a cluster-wide outage)
//! is re-claimed like a served one, so an outage followed by an empty Redis disconnects
//! nobody. The simulation once showed why that needs care (seed 4453): its lease may have
//! expired and been taken before the wipe by a pod that reached the store — possible only
//! for a minority the quorum verdict could not hear — and that pod may be serving it now.
//! Both then re-claim with `SET NX` in the new generation: exactly one wins, the other's
//! answer is `HeldBy` and it stops; and the winner's new epoch (Redis time) is higher than
//! any of the old generation, so its hello fences the loser at every terminal the moment
//! it arrives. Until then the terminal takes pushes from whichever session is current,
//! one at a time, and dedupes keys across them (`docs/pos-protocol.md`). What is kept
//! from before: a shard is re-claimed, never served on a new lease it did not win.
//! By the end of the hold every live pod has re-registered and re-claimed its own shards,
//! and the placement the pods put back (see `placing`) still stands, so no shard changes
//! owner unless the store shows another pod acquired it.
//!
//! Why a pod that has never seen the old generation must hold too: it cannot tell a fresh
//! cluster from a restarted one, and a pod still serving from before the restart may not
//! have re-claimed yet. `CoreConfig::validate` requires the member TTL to outlast every
//! pre-restart lease deadline, so when the hold ends those deadlines have passed.

use std::time::Instant;

use super::store_view::History;
use super::{Reconciler, ShardState};
use crate::membership::GenerationInfo;

impl Reconciler {
    /// Adopts the store generation reported by any answer.
    pub(super) fn observe_generation(&mut self, now: Instant, info: &GenerationInfo) {
        if self.generation.as_deref() == Some(info.id.as_str()) {
            return;
        }
        let first = self.generation.is_none();
        self.generation = Some(info.id.clone());
        let hold = now + self.cfg.member_ttl.saturating_sub(info.age);
        self.hold(hold);
        if first {
            return;
        }
        // Everything the store knew is gone: leases, registrations, our view of holders.
        self.lifecycle.set_registered(false);
        self.witness.new_generation();
        self.heartbeat.reschedule(now);
        for s in 0..self.cfg.shards {
            let sh = &mut self.shards[s as usize];
            sh.lease = None;
            // A lease we may have taken in the old generation no longer exists.
            sh.forget_stray();
            // Served: our deadline proves we were the only holder; nobody could have
            // taken it in the old generation since, and nobody can claim in the new one
            // before the hold ends. Suspended: see the module docs. Re-claim either.
            if matches!(
                sh.view(),
                ShardState::Serving { .. } | ShardState::Suspended { .. }
            ) {
                sh.reclaim_needed();
            }
        }
    }

    /// The store answers again after failing since `since`. If the outage outlasted the
    /// lease deadlines, leases expired in the store while their holders kept (suspended)
    /// connections; those holders re-claim them now. Every pod that saw the outage holds
    /// its own new claims for one member TTL so the holders win that race — including a
    /// pod that never reached the store before, which cannot know what it missed.
    pub(super) fn store_returned(&mut self, now: Instant, since: Instant, history: History) {
        let suspended = self
            .shards
            .iter()
            .any(|s| matches!(s.view(), ShardState::Suspended { .. }));
        let long = now.saturating_duration_since(since) >= self.cfg.serve_window();
        if suspended || long || history == History::NeverReached {
            self.hold(now + self.cfg.member_ttl);
            self.heartbeat.reschedule(now);
        }
    }

    /// The store went back in time: it lost writes it had acknowledged (a failover to a
    /// replica they had not reached; the generation is the same, so this is not a wipe;
    /// `witness.rs` says how that is proven).
    /// What it forgot is recovered like a data loss, for the part that was lost: the
    /// pods whose leases it forgot re-claim them (their renewals tell them), the
    /// placement is put back by the pods that followed it (`placing`), this pod
    /// re-registers at once, and nothing else is claimed or released for one member TTL
    /// while the others re-register too, so no shard changes owner on a member list or
    /// placement the store lost part of. Counted once per answer that proved it.
    pub(super) fn store_went_back(&mut self, now: Instant) {
        self.rollbacks += 1;
        self.hold(now + self.cfg.member_ttl);
        self.heartbeat.reschedule(now);
    }

    fn hold(&mut self, until: Instant) {
        self.hold_until = Some(self.hold_until.map_or(until, |t| t.max(until)));
    }
}
