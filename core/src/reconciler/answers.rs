//! How one store answer to a claim or a renewal moves a shard (rules 3, 6 and 7): serve on
//! it, re-claim, wait for an older lease to go, or stop. The handlers in `inputs.rs` call
//! these per shard and act on what they return (a store that went back in time).

use std::time::Instant;

use super::shard::ClaimEnd;
use super::{Action, AfterStop, Reconciler, ShardState, StopReason};
use crate::lease::{AcquireOutcome, RenewOutcome};
use crate::membership::Lease;
use crate::ShardId;

impl Reconciler {
    /// Applies one acquire outcome; returns whether it proves the store went back in time
    /// (another pod's lease with an epoch below the one this pod holds).
    pub(super) fn claim_answered(
        &mut self,
        now: Instant,
        s: ShardId,
        outcome: AcquireOutcome,
    ) -> bool {
        let window = self.cfg.serve_window();
        let wanted =
            self.lifecycle.running() && self.placement.assignment.owner(s) == Some(&self.me);
        if let AcquireOutcome::Acquired {
            released_by: Some(from),
            ..
        } = &outcome
        {
            // The lease's last holder, whether or not it is still a member (a pod under
            // SIGTERM deregisters while its sessions drain).
            if from.pod != self.me {
                self.shards[s as usize].last_holder = Some(from.clone());
            }
        }
        self.know_epoch(s, outcome.epoch());
        let sh = &mut self.shards[s as usize];
        let Some(sent) = sh.claim_sent() else {
            return false;
        };
        let late = sent + window <= now;
        match outcome {
            // The answer came too late to serve on (e.g. the pod was paused meanwhile):
            // the lease may be ours until its TTL, so claim it afresh or release it.
            AcquireOutcome::Acquired { .. } | AcquireOutcome::AlreadyMine { .. } if late => {
                sh.end_claim(ClaimEnd::Late);
            }
            AcquireOutcome::Acquired { epoch, .. } | AcquireOutcome::AlreadyMine { epoch } => {
                match sh.view() {
                    ShardState::Idle if !wanted => sh.move_to_releasing(),
                    state @ (ShardState::Idle
                    | ShardState::Serving { .. }
                    | ShardState::Suspended { .. }) => {
                        let resumed =
                            !matches!(state, ShardState::Serving { epoch: e, .. } if e == epoch);
                        sh.move_to_serving(epoch, sent + window);
                        if resumed {
                            self.actions
                                .push_back(Action::StartServing { shard: s, epoch });
                        }
                    }
                    // Stopped meanwhile: a release that follows deletes this lease too; a
                    // forgotten shard leaves it to expire by its TTL.
                    ShardState::Stopping { .. } | ShardState::Releasing { .. } => {
                        sh.end_claim(ClaimEnd::Answered);
                    }
                }
            }
            AcquireOutcome::HeldBy { owner, epoch } => {
                let held = sh.held_epoch();
                let older = held.is_some_and(|held| epoch < held);
                if older {
                    // A lease from before ours, kept by a store that lost our acquisition
                    // (and its release or expiry): nobody newer holds the shard. Keep it
                    // and claim again once that lease is gone.
                    sh.reclaim_blocked();
                } else {
                    sh.end_claim(ClaimEnd::Answered);
                }
                self.note_holder(s, &owner);
                self.shards[s as usize].lease = Some(Lease { owner, epoch });
                if held.is_some_and(|held| epoch >= held) {
                    self.stop(s, StopReason::Stolen, AfterStop::Forget);
                }
                return older;
            }
        }
        false
    }

    /// Applies one renewal outcome; returns whether it proves the store went back in time
    /// (our acquisition gone: an epoch below the one held).
    pub(super) fn renewal_answered(
        &mut self,
        now: Instant,
        sent: Instant,
        s: ShardId,
        outcome: RenewOutcome,
    ) -> bool {
        let window = self.cfg.serve_window();
        if let RenewOutcome::Missing { epoch } | RenewOutcome::HeldBy { epoch, .. } = &outcome {
            self.know_epoch(s, *epoch);
        }
        let sh = &mut self.shards[s as usize];
        let Some(held) = sh.held_epoch() else {
            return false;
        };
        match (outcome, sh.view()) {
            (RenewOutcome::Renewed, ShardState::Serving { .. }) => {
                sh.extend_deadline(sent + window);
            }
            (RenewOutcome::Renewed, ShardState::Suspended { epoch }) if sent + window > now => {
                sh.resume(sent + window);
                self.actions
                    .push_back(Action::StartServing { shard: s, epoch });
            }
            (RenewOutcome::Renewed, _) => {}
            // The key is gone, so whoever held it since we did has stopped serving it
            // (before its release, or by its deadline). A suspended shard's key expired
            // in a long outage; a served one's can only have been lost by the store (a
            // failover that lost writes) when nobody acquired since we did (the store's
            // last epoch is not above ours). Re-claim it rather than give it up. An epoch
            // below ours means our acquisition itself is gone: the store went back.
            (RenewOutcome::Missing { epoch }, state)
                if epoch <= held || matches!(state, ShardState::Suspended { .. }) =>
            {
                sh.reclaim_needed();
                return epoch < held;
            }
            (RenewOutcome::Missing { .. }, _) => self.stop(s, StopReason::Lost, AfterStop::Forget),
            // Another pod's lease from before ours, which the store kept while losing our
            // acquisition: claim again once it is gone (see `Owed::Blocked`).
            (RenewOutcome::HeldBy { epoch, .. }, _) if epoch < held => {
                sh.reclaim_blocked();
                return true;
            }
            (RenewOutcome::HeldBy { .. }, _) => self.stop(s, StopReason::Stolen, AfterStop::Forget),
        }
        false
    }
}
