//! The rules themselves: what [`Reconciler::reconcile`] does after every input. See the
//! numbered rules in the parent module. Which transition one store answer makes a shard
//! take is `answers.rs`'s; the transitions themselves (and what each phase may hold) are
//! `shard.rs`'s.

use std::time::Instant;

use super::shard::{Shard, Stray};
use super::store_view::StoreView;
use super::{Action, AfterStop, Close, Outage, Reconciler, ShardState, Stop, StopReason};
use crate::lease::Claim;
use crate::membership::HANDOVER_DRAIN;
use crate::ShardId;

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
        self.send_releases();
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
        let mut others = self.members.iter().filter(|m| m.pod != self.me).peekable();
        let someone = others.peek().is_some();
        if planned && someone && others.all(|m| m.handover >= HANDOVER_DRAIN) {
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

    pub(super) fn send_releases(&mut self) {
        let mut shards = Vec::new();
        for (s, sh) in self.shards.iter_mut().enumerate() {
            if sh.release_due() {
                sh.release_sent();
                shards.push(s as ShardId);
            }
        }
        if !shards.is_empty() {
            self.actions.push_back(Action::Release { shards });
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
        for s in 0..self.cfg.shards {
            let sh = &mut self.shards[s as usize];
            if sh.held_epoch().is_some() {
                self.stop(s, StopReason::Shutdown, AfterStop::Release);
            } else if sh.unheld() == Some(Stray::MaybeOurs) {
                sh.move_to_releasing();
            }
        }
        self.send_releases();
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
}
