//! The reconciler's inputs: `handle_*(now, ..)` for every store answer, peer report,
//! connection-layer acknowledgement and the passage of time. Each records what it
//! learned and then runs the rules (`rules.rs`) once. How one store answer to a claim
//! or a renewal moves a shard is the second half, which the handlers call per shard.

use std::time::Instant;

use super::shard::{ClaimEnd, Shard};
use super::{
    Action, AfterStop, OpFailed, OpResult, PeerReport, Reconciler, ShardState, StopReason, Stored,
};
use crate::lease::{AcquireOutcome, Checked, Released, RenewOutcome, StaleEpoch, MAX_EPOCH};
use crate::membership::{Lease, Snapshot};
use crate::placement::Placement;
use crate::types::{PodId, ShardId};

impl Reconciler {
    /// Time passed: expire deadlines, fire timers, reconcile.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.reconcile(now);
    }

    /// A change notification from the store (join, leave, release): poll now.
    pub fn handle_change_notification(&mut self, now: Instant) {
        self.poll.reschedule(now);
        self.reconcile(now);
    }

    pub fn handle_snapshot(&mut self, now: Instant, result: OpResult<Snapshot>) {
        let sent = self.poll.started();
        self.poll.finish(now + self.cfg.poll_interval);
        match result {
            Err(OpFailed) => self.store_failed(now),
            Ok(snap) => {
                self.store_ok(now);
                let same_generation = self.generation.as_deref() == Some(&snap.generation.id);
                self.observe_generation(now, &snap.generation);
                let registered = snap.members.iter().any(|m| m.pod == self.me);
                if self.lifecycle.set_registered(registered) {
                    // Our registration is gone while we run (lost by a failover, or it
                    // expired while we could not write): peers drop us after one
                    // debounce, so register again now rather than at the next interval.
                    self.heartbeat.reschedule(now);
                }
                let sent_here = sent.filter(|_| same_generation);
                let mut went_back = self
                    .witness
                    .heartbeats_read(sent_here, snap.heartbeats, now);
                match snap.placement {
                    // Read after this pod learned a newer version, in the same
                    // generation: the store lost it. Keep following ours and put it
                    // back (`rules.rs`, placing).
                    Some(p)
                        if p.version < self.placement.version
                            && self.witness.proves_placement_lost(sent_here) =>
                    {
                        self.stored = Stored::Version(p.version);
                        went_back = true;
                    }
                    Some(p) => {
                        self.stored = Stored::Version(p.version);
                        if p.version != self.placement.version {
                            self.witness.placement_followed(now);
                        }
                        self.placement = p;
                    }
                    None => self.stored = Stored::Absent,
                }
                if went_back {
                    self.store_went_back(now);
                }
                let ids: Vec<PodId> = snap.members.iter().map(|m| m.pod.clone()).collect();
                self.debounce
                    .observe(now, ids, self.placement.assignment.pods());
                self.members = snap.members;
                let mut leases = snap.leases.into_iter();
                for s in 0..self.cfg.shards {
                    let lease = leases.next().flatten();
                    self.shards[s as usize].lease = lease.clone();
                    if let Some(lease) = lease {
                        self.note_holder(s, &lease.owner);
                        self.know_epoch(s, lease.epoch);
                        if lease.owner == self.me {
                            self.shards[s as usize].lease_found();
                        }
                    }
                    self.shards[s as usize].unblock();
                }
                self.stop_superseded();
            }
        }
        self.reconcile(now);
    }

    /// The answer to [`Action::Place`] for `placement`: `Ok(true)` stored, `Ok(false)` the
    /// store's version was not the expected one (someone else changed it first).
    pub fn handle_place(&mut self, now: Instant, placement: Placement, result: OpResult<bool>) {
        let admitted = u64::from(self.placing.take().unwrap_or(0));
        match result {
            Ok(true) => {
                self.moves.elected += admitted;
                self.store_ok(now);
                self.stored = Stored::Version(placement.version);
                self.placement = placement;
                self.witness.placement_followed(now);
            }
            Ok(false) => {
                self.moves.failed += admitted;
                self.store_ok(now);
                self.poll.reschedule(now);
            }
            Err(OpFailed) => {
                self.moves.failed += admitted;
                self.store_failed(now);
            }
        }
        self.reconcile(now);
    }

    /// The answer to [`Action::Heartbeat`]: with the generation's heartbeat count.
    pub fn handle_heartbeat(&mut self, now: Instant, result: OpResult<Checked<u64>>) {
        match result {
            Err(OpFailed) => {
                self.heartbeat.finish(now + self.cfg.heartbeat_interval / 4);
                self.store_failed(now);
            }
            Ok(Checked::GenerationChanged(info)) => {
                self.heartbeat.finish(now);
                self.store_ok(now);
                self.observe_generation(now, &info);
            }
            Ok(Checked::Ok(count)) => {
                self.heartbeat.finish(now + self.cfg.heartbeat_interval);
                self.store_ok(now);
                self.witness.heartbeat_answered(count, now);
            }
        }
        self.reconcile(now);
    }

    pub fn handle_acquire(
        &mut self,
        now: Instant,
        shards: &[ShardId],
        result: OpResult<Checked<Vec<AcquireOutcome>>>,
    ) {
        match result {
            Err(OpFailed) => {
                self.store_failed(now);
                for &s in shards {
                    let sh = &mut self.shards[s as usize];
                    if sh.claim_sent().is_some() {
                        sh.end_claim(ClaimEnd::Failed);
                    }
                }
            }
            Ok(Checked::GenerationChanged(info)) => {
                self.store_ok(now);
                for &s in shards {
                    let sh = &mut self.shards[s as usize];
                    if sh.claim_sent().is_some() {
                        sh.end_claim(ClaimEnd::Void);
                    }
                }
                self.observe_generation(now, &info);
            }
            Ok(Checked::Ok(outcomes)) => {
                self.store_ok(now);
                let mut went_back = false;
                for (&s, outcome) in shards.iter().zip(outcomes) {
                    went_back |= self.claim_answered(now, s, outcome);
                }
                if went_back {
                    self.store_went_back(now);
                }
            }
        }
        self.reconcile(now);
    }

    pub fn handle_renew(
        &mut self,
        now: Instant,
        shards: &[ShardId],
        result: OpResult<Checked<Vec<RenewOutcome>>>,
    ) {
        let sent = match self.renew_sent.take() {
            Some((sent, ref sent_shards)) if sent_shards == shards => sent,
            other => {
                // Not the renewal we are waiting for (cannot happen with one driver);
                // keep waiting for ours.
                self.renew_sent = other;
                return;
            }
        };
        match result {
            Err(OpFailed) => {
                self.renew.finish(now + self.cfg.renew_interval / 4);
                self.store_failed(now);
            }
            Ok(Checked::GenerationChanged(info)) => {
                self.renew.finish(now + self.cfg.renew_interval);
                self.store_ok(now);
                self.observe_generation(now, &info);
            }
            Ok(Checked::Ok(outcomes)) => {
                self.renew.finish(now + self.cfg.renew_interval);
                self.store_ok(now);
                let mut went_back = false;
                for (&s, outcome) in shards.iter().zip(outcomes) {
                    went_back |= self.renewal_answered(now, sent, s, outcome);
                }
                if went_back {
                    self.store_went_back(now);
                }
            }
        }
        self.reconcile(now);
    }

    pub fn handle_release(
        &mut self,
        now: Instant,
        shards: &[ShardId],
        result: OpResult<Vec<Released>>,
    ) {
        match result {
            // The lease expires by itself; we stopped serving before sending the release.
            Err(OpFailed) => self.store_failed(now),
            Ok(_) => self.store_ok(now),
        }
        for &s in shards {
            self.shards[s as usize].release_answered();
        }
        self.reconcile(now);
    }

    pub fn handle_deregister(&mut self, now: Instant, result: OpResult<()>) {
        // Even a failed deregistration ends shutdown: the registration expires by TTL.
        let _ = result;
        self.lifecycle.move_to_finished();
        self.lifecycle.set_registered(false);
        self.reconcile(now);
    }

    /// The connections of a shard that was told to stop are closed.
    pub fn handle_serving_stopped(&mut self, now: Instant, shard: ShardId) {
        if let Some(sh) = self.shards.get_mut(shard as usize) {
            sh.serving_stopped();
        }
        self.reconcile(now);
    }

    /// A terminal refused the epoch this pod holds a shard with as stale: it accepted a
    /// hello with a higher one. Either a newer owner exists, or the store handed that
    /// epoch out and then lost it (a failover that lost writes) or now hands out lower
    /// ones (a promoted replica whose clock is behind). The store tells which: the held
    /// lease is re-claimed with the terminal's epoch as its floor, which bumps it above
    /// that epoch if the store still names this pod (rule 7), and stops it if another
    /// pod holds the lease. Without the terminal's epoch, or while the store cannot be
    /// asked, the shard is stopped: the terminal fences this pod anyway.
    pub fn handle_stale_epoch(&mut self, now: Instant, stale: StaleEpoch) {
        let StaleEpoch {
            shard,
            epoch,
            highest,
        } = stale;
        if self.shards.get(shard as usize).and_then(Shard::held_epoch) == Some(epoch) {
            match highest.filter(|&h| h > epoch && h <= MAX_EPOCH) {
                Some(h) if !self.store.failing() => {
                    self.know_epoch(shard, h);
                    self.shards[shard as usize].reclaim_needed();
                }
                _ => self.stop(shard, StopReason::StaleEpoch, AfterStop::Forget),
            }
        }
        self.reconcile(now);
    }

    pub fn handle_peer_report(&mut self, now: Instant, report: PeerReport) {
        let failing = self.store.failing();
        let members =
            self.members.len() + usize::from(!self.members.iter().any(|m| m.pod == self.me));
        self.change_verdict(|store| store.judge(now, report, members));
        // A peer whose last store call predates the outage still says it reaches the
        // store. While we serve, ask again well before our deadlines rather than one
        // renew interval later, or a cluster-wide outage is mistaken for isolation.
        let serving = self
            .shards
            .iter()
            .any(|s| matches!(s.view(), ShardState::Serving { .. }));
        let again = if failing && report.reaching > 0 && serving {
            self.cfg.renew_interval / 4
        } else {
            self.cfg.renew_interval
        };
        self.probe.finish(now + again);
        self.reconcile(now);
    }

    /// Start a graceful shutdown: place this pod out of the placement (serving
    /// meanwhile), stop serving everything, hand over or release, deregister.
    pub fn begin_shutdown(&mut self, now: Instant) {
        self.lifecycle.move_to_placing_out(now);
        self.reconcile(now);
    }

    // ----- answers ---------------------------------------------------------
    //
    // How one store answer to a claim or a renewal moves a shard (rules 3, 6 and 7): serve on
    // it, re-claim, wait for an older lease to go, or stop. The handlers above call
    // these per shard and act on what they return (a store that went back in time).

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
