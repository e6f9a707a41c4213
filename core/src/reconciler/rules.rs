//! The rules themselves: what [`Reconciler::reconcile`] does after every input. See the
//! numbered rules in the parent module; following and changing the stored placement
//! (rule 4) and recovering from a store that lost its data (rule 5) have their own
//! sections below. Which transition one store answer makes a shard take is
//! `inputs.rs`'s; the transitions themselves (and what each phase may hold) are
//! `shard.rs`'s.

use std::time::Instant;

use super::shard::{Shard, Stray};
use super::store_view::{History, StoreView};
use super::{Action, AfterStop, Close, Outage, Reconciler, ShardState, Stop, StopReason, Stored};
use crate::lease::{Claim, Release};
use crate::membership::{GenerationInfo, HANDOVER_DRAIN, HANDOVER_LEASE, MOVE_BUDGET};
use crate::placement::{rebalance, step, Placement};
use crate::{PodId, ShardId};

impl Reconciler {
    pub(super) fn reconcile(&mut self, now: Instant) {
        if self.lifecycle.finished() {
            return;
        }
        self.notice_pause(now);
        self.lapse_verdict(now);
        self.expire_deadlines(now);
        if let Some(started) = self.lifecycle.shutdown_started() {
            self.drive_shutdown(now, started);
            return;
        }
        self.update_placement(now);
        let holding = self.holding(now);
        if !holding {
            self.hold_until = None;
        }
        self.stop_unassigned(holding);
        self.send_releases(now);
        // While the store fails, polls (not claims) find out when it is back.
        let mut claims = if !self.store.failing() {
            self.reclaims()
        } else {
            Vec::new()
        };
        if self.claims_allowed() {
            claims.extend(self.fresh_claims(now));
        }
        self.send_claims(now, claims);
        self.fire_timers(now);
        self.update_ready();
    }

    /// A gap in this pod's clock longer than a renew interval: it was paused (or starved)
    /// and cannot know what happened meanwhile — its lease may have expired and been
    /// taken, and a new outage begun. Shards past their deadline are given up rather than
    /// held, and the outage verdict must be earned again by asking the peers.
    fn notice_pause(&mut self, now: Instant) {
        let gap = self.last_seen.map(|t| now.saturating_duration_since(t));
        self.last_seen = Some(self.last_seen.map_or(now, |t| t.max(now)));
        if gap.is_none_or(|g| g <= self.cfg.renew_interval) {
            return;
        }
        self.change_verdict(|store| store.forget_verdict());
        for s in 0..self.cfg.shards {
            match self.shards[s as usize].view() {
                ShardState::Serving { deadline, .. } if now >= deadline => {
                    self.stop(s, StopReason::Paused, AfterStop::Forget);
                }
                ShardState::Suspended { .. } => self.stop(s, StopReason::Paused, AfterStop::Forget),
                _ => {}
            }
        }
        if self.store.failing() {
            self.probe.reschedule(now);
        }
    }

    /// A cluster-wide verdict no probe confirmed for its life lapses.
    fn lapse_verdict(&mut self, now: Instant) {
        let life = self.verdict_life();
        if self.store.verdict_lapses_at(life).is_some_and(|t| now >= t) {
            self.change_verdict(|store| store.forget_verdict());
        }
    }

    /// Changes the store view by `change`, telling the connection layer when suspended
    /// shards start or stop delivering with it: they deliver exactly while a cluster-wide
    /// verdict stands.
    pub(super) fn change_verdict(&mut self, change: impl FnOnce(&mut StoreView)) {
        let was = self.store.judged_cluster_wide();
        change(&mut self.store);
        let is = self.store.judged_cluster_wide();
        if was == is {
            return;
        }
        for (s, sh) in self.shards.iter().enumerate() {
            if let ShardState::Suspended { epoch } = sh.view() {
                let shard = s as ShardId;
                self.actions.push_back(if is {
                    Action::StartServing { shard, epoch }
                } else {
                    Action::SuspendServing { shard, epoch }
                });
            }
        }
    }

    pub(super) fn expire_deadlines(&mut self, now: Instant) {
        let give_up = self.give_up_suspended_at().is_some_and(|t| now >= t);
        let cluster_wide = self.store.cluster_wide(now, self.verdict_life());
        for s in 0..self.cfg.shards {
            let sh = &mut self.shards[s as usize];
            match sh.view() {
                ShardState::Serving { deadline, .. } if now >= deadline => {
                    if cluster_wide {
                        // Nobody can acquire: the held lease is still the newest, so the
                        // shard keeps its sessions and keeps delivering (static stability).
                        sh.move_to_suspended();
                    } else {
                        self.stop(s, StopReason::Expired, AfterStop::Forget);
                    }
                }
                ShardState::Suspended { .. } if give_up => {
                    self.stop(s, StopReason::Isolated, AfterStop::Forget);
                }
                _ => {}
            }
        }
    }

    pub(super) fn stop(&mut self, shard: ShardId, reason: StopReason, then: AfterStop) {
        let close = self.close_for(reason);
        if let Some(epoch) = self.shards[shard as usize].move_to_stopping(then) {
            self.actions.push_back(Action::StopServing(Stop {
                shard,
                epoch,
                reason,
                close,
            }));
        }
    }

    /// How a shard stopped for `reason` leaves its sessions. Drained only on a move we
    /// chose (rebalance, shutdown) and only when every other member drains too, so
    /// whoever takes the shard asks before it dials: a pod of an earlier release would
    /// dial at once, and the terminal would see two sessions (its epoch fence would
    /// still drop ours). A lone pod has nobody to hand over to. Any other reason means
    /// the lease is or may be another pod's already: close now, as before.
    fn close_for(&self, reason: StopReason) -> Close {
        let planned = matches!(reason, StopReason::Rebalance | StopReason::Shutdown);
        if planned && self.others_speak(HANDOVER_DRAIN) {
            Close::Drain
        } else {
            Close::Now
        }
    }

    /// Rule 3, from a snapshot: a held shard (served or suspended) that the store shows
    /// leased to another pod with a higher epoch has a newer owner, whose hello fences
    /// ours at the terminals. Stop now rather than at the next renewal or re-claim: a
    /// suspended shard would otherwise stay held, and if the store failed again before
    /// its re-claim was answered, a new cluster-wide verdict would resume it on the
    /// superseded epoch (simulation seed 2295: a pod that believed itself alone while
    /// the pod it had outlived came back and took its shards). A lower epoch is a
    /// snapshot read before our own acquisition, not a newer owner.
    pub(super) fn stop_superseded(&mut self) {
        for s in 0..self.cfg.shards {
            let Some(held) = self.shards[s as usize].held_epoch() else {
                continue;
            };
            let newer = self.shards[s as usize]
                .lease
                .as_ref()
                .is_some_and(|l| l.owner != self.me && l.epoch > held);
            if newer {
                self.stop(s, StopReason::Stolen, AfterStop::Forget);
            }
        }
    }

    /// Rule 2, first half: stop serving what the ring gave to someone else (not while
    /// `holding`: the placement may be one the store is still recovering), and release
    /// leases of ours that may be stray there (even while holding: nothing is served on
    /// them, and a pod holding the shard may be waiting for one to go, `Owed::Blocked`).
    pub(super) fn stop_unassigned(&mut self, holding: bool) {
        for s in 0..self.cfg.shards {
            let mine = self.placement.assignment.owner(s) == Some(&self.me);
            let sh = &mut self.shards[s as usize];
            if mine {
                continue;
            }
            if holding {
                if sh.unheld() == Some(Stray::MaybeOurs) {
                    sh.move_to_releasing();
                }
            } else if sh.held_epoch().is_some() && sh.claim_sent().is_none() {
                self.stop(s, StopReason::Rebalance, AfterStop::Release);
            } else if sh.unheld() == Some(Stray::MaybeOurs) {
                sh.move_to_releasing();
            }
        }
    }

    /// Sends the releases due, each handed to the shard's next owner when it takes
    /// handovers ([`Self::handover_to`]), else deleted.
    pub(super) fn send_releases(&mut self, now: Instant) {
        let mut releases = Vec::new();
        for s in 0..self.cfg.shards {
            if self.shards[s as usize].release_due() {
                self.shards[s as usize].release_sent();
                releases.push(Release {
                    shard: s,
                    to: self.handover_to(s, now),
                    floor: self.floor(s),
                });
            }
        }
        if !releases.is_empty() {
            self.actions.push_back(Action::Release { releases });
        }
    }

    /// Rule 2, second half: claim what the ring gives us, pacing retries against a holder.
    pub(super) fn fresh_claims(&self, now: Instant) -> Vec<ShardId> {
        (0..self.cfg.shards)
            .filter(|&s| {
                let sh = &self.shards[s as usize];
                let Some(stray) = sh.unheld() else {
                    return false;
                };
                if self.placement.assignment.owner(s) != Some(&self.me) {
                    return false;
                }
                let free = match &sh.lease {
                    None => true,
                    Some(lease) => lease.owner == self.me,
                };
                let retry_due = sh
                    .last_claim()
                    .is_none_or(|t| now >= t + self.cfg.renew_interval);
                free || stray == Stray::MaybeOurs || retry_due
            })
            .collect()
    }

    pub(super) fn send_claims(&mut self, now: Instant, shards: Vec<ShardId>) {
        let Some(generation) = self.generation.clone() else {
            return;
        };
        if shards.is_empty() {
            return;
        }
        let claims = shards
            .iter()
            .map(|&shard| {
                self.shards[shard as usize].send_claim(now);
                Claim {
                    shard,
                    floor: self.floor(shard),
                }
            })
            .collect();
        self.actions
            .push_back(Action::Acquire { generation, claims });
    }

    pub(super) fn fire_timers(&mut self, now: Instant) {
        if self.poll.due(now) {
            self.poll.start(now);
            self.actions.push_back(Action::Poll);
        }
        if self.store.failing() && self.probe.due(now) {
            self.probe.start(now);
            let peers = self
                .members
                .iter()
                .filter(|m| m.pod != self.me)
                .cloned()
                .collect();
            self.actions.push_back(Action::ProbePeers { peers });
        }
        let Some(generation) = self.generation.clone() else {
            return;
        };
        if self.heartbeat.due(now) {
            self.heartbeat.start(now);
            self.actions.push_back(Action::Heartbeat {
                generation: generation.clone(),
            });
        }
        let renewable = self.renewable();
        if renewable.is_empty() && !self.renew.in_flight() {
            // Nothing held: the first renewal comes one interval after the first claim.
            self.renew.finish(now + self.cfg.renew_interval);
        }
        if !renewable.is_empty() && self.renew.due(now) && self.renew_sent.is_none() {
            self.renew.start(now);
            self.renew_sent = Some((now, renewable.clone()));
            self.actions.push_back(Action::Renew {
                generation,
                shards: renewable,
            });
        }
    }

    pub(super) fn update_ready(&mut self) {
        let lifecycle = &self.lifecycle;
        if lifecycle.ready()
            || !lifecycle.registered()
            || !self.placement.assignment.pods().contains(&self.me)
        {
            return;
        }
        let all_served = (0..self.cfg.shards).all(|s| {
            self.placement.assignment.owner(s) != Some(&self.me)
                || matches!(self.shards[s as usize].view(), ShardState::Serving { .. })
        });
        if all_served {
            self.lifecycle.move_to_ready();
        }
    }

    pub(super) fn drive_shutdown(&mut self, now: Instant, started: Instant) {
        if self.lifecycle.placing_out() {
            if self.place_itself_out(now, started) {
                // Still serving everything: keep renewing, and poll after a lost
                // compare-and-set.
                self.fire_timers(now);
                return;
            }
            self.lifecycle.move_to_draining();
        }
        for s in 0..self.cfg.shards {
            let sh = &mut self.shards[s as usize];
            if sh.held_epoch().is_some() {
                self.stop(s, StopReason::Shutdown, AfterStop::Release);
            } else if sh.unheld() == Some(Stray::MaybeOurs) {
                sh.move_to_releasing();
            }
        }
        self.send_releases(now);
        let busy = self
            .shards
            .iter()
            .any(|s| s.releasing() || s.claim_sent().is_some());
        let out_of_time = now >= started + self.cfg.shutdown_budget;
        if out_of_time {
            self.lifecycle.move_to_finished();
        } else if !busy && self.lifecycle.draining() {
            self.lifecycle.move_to_deregistering();
            self.actions.push_back(Action::Deregister);
        }
    }

    /// A pod under SIGTERM whose every other member takes lease handovers
    /// ([`HANDOVER_LEASE`]) writes the placement without itself (it knows it is leaving:
    /// no membership debounce), serving its shards meanwhile; then each is stopped and
    /// its lease handed to the pod that placement names (`send_releases`). Returns
    /// whether that write is still to be made or answered.
    ///
    /// It writes as soon as a member the placement does not name yet has registered, and
    /// otherwise after one debounce period: in a rollout the replacement pod starts as
    /// this one gets SIGTERM, and placing the shards on it directly moves each terminal
    /// once, where spreading them over the others first would move many twice. Waiting
    /// costs no push anything, because the shards are served until their handover.
    /// Given up (the pod stops and releases as before, and the others move the shards
    /// after their debounce) when the pod is alone, a member of an earlier release is
    /// live, the store fails, or the write has not landed within two debounce periods (a
    /// compare-and-set that keeps losing). Its own shards move at once (a drain is never
    /// held back by the move budget); other planned moves only as the budget leaves
    /// room, as in any step.
    fn place_itself_out(&mut self, now: Instant, started: Instant) -> bool {
        if !self.may_place_itself_out()
            || now >= started + self.cfg.debounce * 2
            || self.store.failing()
            || self.holding(now)
        {
            return false;
        }
        if self.placing.is_some() {
            return true;
        }
        let Stored::Version(expected) = self.stored else {
            return false;
        };
        let placed = self.placement.assignment.pods();
        let joined = self.members.iter().any(|m| !placed.contains(&m.pod));
        if !joined && now < started + self.cfg.debounce {
            return true;
        }
        let others: Vec<PodId> = self
            .members
            .iter()
            .filter(|m| m.pod != self.me)
            .map(|m| m.pod.clone())
            .collect();
        let target = rebalance(&self.placement.assignment, &others, self.cfg.shards);
        let step = step(
            &self.placement.assignment,
            &target,
            |s| self.shards[s as usize].lease.as_ref().map(|l| &l.owner),
            self.cfg.max_moving_shards,
        );
        self.moves.skipped += u64::from(step.waiting);
        let next = Placement {
            version: self.placement.version + 1,
            assignment: step.assignment,
        };
        self.send_place(Some(expected), next, step.admitted);
        true
    }

    /// Whether a shutdown may place this pod out ([`Self::place_itself_out`], its
    /// conditions that do not depend on time): the placement still gives it shards, and
    /// there are other members, all taking lease handovers.
    fn may_place_itself_out(&self) -> bool {
        (0..self.cfg.shards).any(|s| self.assigned(s)) && self.others_speak(HANDOVER_LEASE)
    }

    /// Whether there are other members and every one speaks handover protocol
    /// `handover` or later ([`crate::membership::Member::handover`]; our own record may be
    /// stale and does not count).
    fn others_speak(&self, handover: u32) -> bool {
        let mut others = self.members.iter().filter(|m| m.pod != self.me).peekable();
        others.peek().is_some() && others.all(|m| m.handover >= handover)
    }

    /// Whether the followed placement gives `s` to this pod.
    fn assigned(&self, s: ShardId) -> bool {
        self.placement.assignment.owner(s) == Some(&self.me)
    }

    /// The pod a release of `s` hands the lease to: the pod the placement names, when it
    /// is another live member that takes handovers ([`HANDOVER_LEASE`]). Not during a
    /// recovery hold (the placement may be one the store is still recovering).
    fn handover_to(&self, s: ShardId, now: Instant) -> Option<PodId> {
        let to = self.placement.assignment.owner(s)?;
        let takes = self
            .members
            .iter()
            .any(|m| m.pod == *to && m.handover >= HANDOVER_LEASE);
        (*to != self.me && takes && !self.holding(now)).then(|| to.clone())
    }

    pub(super) fn store_ok(&mut self, now: Instant) {
        let mut ended = None;
        // Back to the store's word: suspended shards wait for their re-claim.
        self.change_verdict(|store| ended = store.move_to_reachable());
        if let Some((since, history)) = ended {
            self.store_returned(now, since, history);
        }
    }

    pub(super) fn store_failed(&mut self, now: Instant) {
        if self.store.move_to_failing(now) {
            self.probe.reschedule(now);
        }
    }

    /// New shards may be claimed: no recovery hold, the store answers, and every release
    /// this pod owes has been sent and answered (rule 2).
    pub(super) fn claims_allowed(&self) -> bool {
        self.hold_until.is_none()
            && self.lifecycle.running()
            && !self.store.failing()
            && !self.shards.iter().any(Shard::releasing)
    }

    /// When suspended shards are given up: once the verdict has been `Isolated` for a
    /// renew interval. Not at once, because at the end of a cluster-wide outage pods
    /// regain the store at slightly different moments, and a pod whose first call back
    /// is still failing sees peers that already reach it. Giving up then would
    /// disconnect its terminals for nothing; the shards are not served meanwhile, and
    /// peers that failed as long hold their own claims for a member TTL.
    pub(super) fn give_up_suspended_at(&self) -> Option<Instant> {
        match self.store.outage() {
            Some(Outage::Isolated { since }) => Some(since + self.cfg.renew_interval),
            _ => None,
        }
    }

    /// Held shards to include in the next renewal (not those being re-claimed).
    pub(super) fn renewable(&self) -> Vec<ShardId> {
        (0..self.cfg.shards)
            .filter(|&s| self.shards[s as usize].renewable())
            .collect()
    }

    pub(super) fn reclaims(&self) -> Vec<ShardId> {
        (0..self.cfg.shards)
            .filter(|&s| self.shards[s as usize].reclaim_due())
            .collect()
    }

    // ----- placing (rule 4) ------------------------------------------------
    //
    // Following and changing the stored placement (rule 4 of the reconciler).
    //
    // Every pod follows the placement in the store. When the live member set differs from
    // the placement's for one debounce period, a pod writes the next placement
    // ([`Placement::next`]) with a version compare-and-set; all pods compute the same table
    // from the same inputs, so whichever write lands first is the one everybody adopts, and
    // the others' writes fail harmlessly and trigger a poll.
    //
    // That write is a step ([`step`]): it moves what must move at once (the shards of
    // departed pods) and as many planned moves as the move budget (`--max-moving-shards`)
    // leaves room for, counted from the leases of the snapshot that showed the version it
    // replaces. The stepper, one pod, writes the further steps from its later polls until
    // the placement reaches its target; the compare-and-set makes every step count
    // against leases read with the version it replaces, so no interleaving of writers
    // exceeds the budget. Pods of earlier releases write the whole `Placement::next` on a
    // membership change and no steps: in a mixed cluster a change is budgeted when a pod
    // of this release writes it first.
    //
    // After the store lost its data, pods that remember the last placement put it back
    // unchanged (even during the recovery hold): shards stay where they were while members
    // re-register. The same after a store that went back in time (a failover that lost the
    // last placement writes): a pod that followed a newer version than the store shows
    // keeps following it and writes it back over the older one. Only once the hold ends
    // may the membership change the placement again, because until then the member list
    // in the store is incomplete.

    /// Writes a placement when one is due: the remembered one after a data loss; the
    /// next one once a membership change has been stable for the debounce period; or the
    /// next step toward it while shards wait for a move slot (see [`step`]).
    pub(super) fn update_placement(&mut self, now: Instant) {
        if self.placing.is_some() || self.store.failing() {
            return;
        }
        let expected = match self.stored {
            Stored::Unknown => return,
            Stored::Absent => None,
            Stored::Version(v) => Some(v),
        };
        if expected.is_none() {
            if let Some(remembered) = self.placement() {
                let restored = Placement {
                    version: remembered.version + 1,
                    assignment: remembered.assignment.clone(),
                };
                self.send_place(None, restored, 0);
                return;
            }
        }
        // The store went back to an older version (it lost ours): put ours back as it
        // was, version included, so pods that followed it see no change.
        if expected.is_some_and(|stored| stored < self.placement.version) {
            self.send_place(expected, self.placement.clone(), 0);
            return;
        }
        if self.holding(now) {
            return;
        }
        // A settled membership change is written by every pod (pods of earlier releases
        // too: whichever write lands first is followed). The steps after it only by the
        // stepper, so 200 pods do not race for each one.
        let view = if self.debounce.ready(now, self.cfg.debounce) {
            let Some(view) = self.debounce.take() else {
                return;
            };
            Some(view)
        } else if self.debounce.pending() || !self.stepper() {
            self.aim(false);
            return;
        } else {
            None
        };
        let settled_change;
        let target = match view {
            Some(pods) => {
                settled_change = rebalance(&self.placement.assignment, &pods, self.cfg.shards);
                &settled_change
            }
            None => {
                self.aim(true);
                match &self.target {
                    Some((_, target)) => target,
                    None => return,
                }
            }
        };
        if target.pods().is_empty() {
            return;
        }
        let step = step(
            &self.placement.assignment,
            target,
            |s| self.shards[s as usize].lease.as_ref().map(|l| &l.owner),
            self.cfg.max_moving_shards,
        );
        if step.assignment == self.placement.assignment {
            return;
        }
        self.moves.skipped += u64::from(step.waiting);
        let next = Placement {
            version: self.placement.version + 1,
            assignment: step.assignment,
        };
        self.send_place(expected, next, step.admitted);
    }

    /// Whether this pod writes the placement's steps toward its target: the first member
    /// (by pod id) that counts moves against the budget ([`MOVE_BUDGET`]).
    fn stepper(&self) -> bool {
        self.members
            .iter()
            .find(|m| m.moves >= MOVE_BUDGET)
            .is_some_and(|m| m.pod == self.me)
    }

    /// Keeps `target` the balanced table for the followed placement's members, reached
    /// from it in the fewest moves (read by [`Reconciler::waiting_for`]): computed once
    /// per placement version. `exact` also compares the members, which a version alone
    /// names except after a failover that lost writes; the stepper, which writes steps
    /// from it, asks for that (for everyone else it only marks shards as waiting).
    /// Comparing every pod's member list on each of its inputs made the 200-pod
    /// simulation 1.5x slower (133 s for 2 seeds against 88 s).
    fn aim(&mut self, exact: bool) {
        let version = self.placement.version;
        let pods = self.placement.assignment.pods();
        let fresh = self
            .target
            .as_ref()
            .is_some_and(|(v, t)| *v == version && (!exact || t.pods() == pods));
        if !fresh {
            let target = rebalance(&self.placement.assignment, pods, self.cfg.shards);
            self.target = Some((version, target));
        }
    }

    fn send_place(&mut self, expected: Option<u64>, placement: Placement, admitted: u32) {
        self.placing = Some(admitted);
        self.actions.push_back(Action::Place {
            expected,
            placement,
        });
    }

    // ----- recovery (rule 5) -----------------------------------------------
    //
    // Recovery after the store lost everything or could not be reached for longer than the
    // lease deadlines (rule 5 of the reconciler).
    //
    // The danger in both cases is the same: the store no longer proves who holds what, while
    // pods may still be serving. So every pod that notices re-claims (`SET NX`) exactly the
    // shards it still holds, re-registers, and claims or releases nothing else until the
    // store generation is one member TTL old (or, after an outage, for one member TTL).
    // After a generation change a suspended shard (deadline passed in a cluster-wide outage)
    // is re-claimed like a served one, so an outage followed by an empty Redis disconnects
    // nobody. The simulation once showed why that needs care (seed 4453): its lease may have
    // expired and been taken before the wipe by a pod that reached the store — possible only
    // for a minority the quorum verdict could not hear — and that pod may be serving it now.
    // Both then re-claim with `SET NX` in the new generation: exactly one wins, the other's
    // answer is `HeldBy` and it stops; and the winner's new epoch (Redis time) is higher than
    // any of the old generation, so its hello fences the loser at every terminal the moment
    // it arrives. Until then the terminal takes pushes from whichever session is current,
    // one at a time, and dedupes keys across them (`docs/pos-protocol.md`). What is kept
    // from before: a shard is re-claimed, never served on a new lease it did not win.
    // By the end of the hold every live pod has re-registered and re-claimed its own shards,
    // and the placement the pods put back (see placing, above) still stands, so no shard changes
    // owner unless the store shows another pod acquired it.
    //
    // Why a pod that has never seen the old generation must hold too: it cannot tell a fresh
    // cluster from a restarted one, and a pod still serving from before the restart may not
    // have re-claimed yet. `CoreConfig::validate` requires the member TTL to outlast every
    // pre-restart lease deadline, so when the hold ends those deadlines have passed.

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
    /// placement is put back by the pods that followed it (placing, above), this pod
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
