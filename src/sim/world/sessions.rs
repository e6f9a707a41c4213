//! Terminal sessions one by one, and the per-terminal handover of a planned move
//! (`pos::handover`, the manager's `drain`), as a model: each shard has
//! `SimConfig::terminals_per_shard` terminals, each with the sessions open to it. A pod that stops
//! a shard with `Close::Drain` keeps its sessions open as draining; the pod that starts
//! it asks the shard's last holder, in batches, to release terminals, and opens a
//! session to each only on the answer; a lost or late answer (1 s) falls back to
//! opening the rest at once, and the terminal then fences the older session by epoch.
//! A shard handed on before its walk finished passes the releases of terminals it never
//! reached back to its own predecessor; a shard taken back while it drains walks the
//! terminals it had released. A drain is announced to every member of the pod's view
//! first (lost like any message; one not told closes the shard whole), and the next
//! owner asks the pod that announced, else the last holder it saw (the core's, which
//! the release note the store returns with the lease names when there is one). Asks and
//! answers are lost with p = 0.02 and delayed like every message; a crashed pod's
//! sessions close; a paused pod answers late.
//!
//! The invariant, checked at every session that opens: **a terminal released by its
//! previous owner has no draining session open anywhere** (nobody dials a terminal
//! whose session a handover left open, unless asking failed); a session opened without
//! a release, or meeting a pod that still believes it serves the shard, may meet an
//! older session, which the terminal drops (the fence), never a newer one. At the end: every
//! terminal has exactly one session, with its shard's serving owner and epoch.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use rand::Rng;

mod walks;

use super::{Ev, World};
use crate::core::lease::StaleEpoch;
use crate::core::reconciler::ShardState;
use crate::core::{Epoch, PodId, ShardId};
use crate::sim::checks::Violation;

pub(super) use crate::pos::handover::RELEASE_TIMEOUT;
/// Peer messages lost on the way.
const LOSS: f64 = 0.02;

/// One terminal: `(shard, index)`.
pub(super) type Term = (ShardId, usize);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Session {
    pub pod: usize,
    pub epoch: Epoch,
    pub draining: bool,
}

/// How a session came to be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Opened {
    /// Released by the previous owner and the pods it passed the release on to (`by`);
    /// `sure` unless a release passed on went unanswered.
    Released { by: Vec<usize>, sure: bool },
    /// Asking failed, was refused, or there was nobody to ask.
    Unasked,
}

/// What a previous owner answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// Closed by these pods (the one asked, and those it passed the release on to);
    /// not `sure` when a release passed on went unanswered.
    Released {
        by: Vec<usize>,
        sure: bool,
    },
    NotDraining,
}

/// A pod's walk of a shard it started: whom it asks, what is left, what is out.
#[derive(Debug)]
struct Walk {
    epoch: Epoch,
    from: usize,
    queue: VecDeque<usize>,
    asked: Option<(u64, Vec<usize>)>,
}

/// What is left of a walk cut short by a drain: terminals its predecessor may still have.
#[derive(Debug)]
struct Owed {
    from: usize,
    terms: Vec<usize>,
}

/// A release passed on to a predecessor: whom to answer once it answers.
#[derive(Debug)]
struct Forward {
    asker: usize,
    id: u64,
    shard: ShardId,
}

/// Messages and timers of the handover.
#[derive(Clone, Debug)]
pub(super) enum SessionEv {
    Ask {
        to: usize,
        asker: usize,
        shard: ShardId,
        terms: Vec<usize>,
        id: u64,
    },
    Answer {
        to: usize,
        id: u64,
        answer: Answer,
    },
    Timeout {
        pod: usize,
        id: u64,
    },
    DrainBudget {
        pod: usize,
        shard: ShardId,
        epoch: Epoch,
    },
}

/// Every terminal's sessions and every walk in progress.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    pub(super) open: HashMap<Term, Vec<Session>>,
    walks: HashMap<(usize, ShardId), Walk>,
    owed: HashMap<(usize, ShardId), Owed>,
    forwards: HashMap<(usize, u64), Forward>,
    next_id: u64,
    /// Sessions opened on a release, without one, and older sessions fenced.
    pub released: u64,
    pub unasked: u64,
    pub fenced: u64,
    /// Released terminals that still had a draining session at a pod the new owner did
    /// not ask (see `open_session`).
    pub unknown_predecessor: u64,
    /// The truth the invariant checks against: the pod each drain cut short owed its
    /// walk's terminals to (kept after the owed releases were passed on).
    pub(super) owed_to: HashMap<(usize, ShardId), usize>,
    /// Drains announced to a pod, per shard: by whom, and when.
    announced: HashMap<(usize, ShardId), (usize, Duration)>,
    /// Drains that could not be announced to every member, so closed whole.
    pub unannounced: u64,
}

impl World<'_> {
    /// `StartServing`: the pod's own sessions say hello with `epoch` (re-claimed,
    /// resumed, bumped, or taken back while draining); the terminals it has none to are
    /// walked from the shard's last holder, or opened at once when there is none. A walk
    /// already under way goes on with the new epoch (as the manager's links dial with
    /// the shard's current one).
    pub(super) fn sessions_start(
        &mut self,
        pod: usize,
        shard: ShardId,
        epoch: Epoch,
    ) -> Result<(), Violation> {
        let mut missing = VecDeque::new();
        for k in 0..self.cfg.terminals_per_shard {
            let open = self.sessions.open.entry((shard, k)).or_default();
            match open.iter_mut().find(|s| s.pod == pod) {
                Some(s) => {
                    s.epoch = epoch;
                    s.draining = false;
                }
                None => missing.push_back(k),
            }
        }
        if let Some(walk) = self.sessions.walks.get_mut(&(pod, shard)) {
            walk.epoch = epoch;
            return Ok(());
        }
        self.sessions.owed.remove(&(pod, shard));
        self.sessions.owed_to.remove(&(pod, shard));
        // The pod that announced it drains the shard, if fresh; else the last holder
        // this pod saw.
        let budget = self.cfg.core.lease_ttl;
        let announced = self
            .sessions
            .announced
            .remove(&(pod, shard))
            .filter(|&(_, at)| self.now.saturating_sub(at) < budget)
            .map(|(from, _)| from);
        let last = self.pods[pod]
            .rec
            .as_ref()
            .and_then(|r| r.last_holder(shard));
        let from =
            announced.or_else(|| last.and_then(|m| self.pods.iter().position(|p| p.id == m.pod)));
        match from.filter(|&f| f != pod) {
            Some(from) if !missing.is_empty() => {
                let walk = Walk {
                    epoch,
                    from,
                    queue: missing,
                    asked: None,
                };
                self.sessions.walks.insert((pod, shard), walk);
                self.walk_next(pod, shard)
            }
            _ => {
                for k in missing {
                    self.open_session(pod, (shard, k), epoch, Opened::Unasked)?;
                }
                Ok(())
            }
        }
    }

    /// `StopServing`: closed now, or kept open as draining until asked or the budget.
    pub(super) fn sessions_stop(&mut self, pod: usize, shard: ShardId, epoch: Epoch, drain: bool) {
        let walk = self.sessions.walks.remove(&(pod, shard));
        // Before the release, every member of the pod's view is told; one that cannot
        // be (paused, crashed, the message lost) makes the shard close whole.
        let drain = drain && self.announce_drain(pod, shard);
        for k in 0..self.cfg.terminals_per_shard {
            let open = self.sessions.open.entry((shard, k)).or_default();
            if drain {
                open.iter_mut()
                    .filter(|s| s.pod == pod)
                    .for_each(|s| s.draining = true);
            } else {
                open.retain(|s| s.pod != pod);
            }
        }
        if !drain {
            return;
        }
        self.sessions.owed_to.remove(&(pod, shard));
        if let Some(walk) = walk {
            let mut terms: Vec<usize> = walk.queue.into();
            terms.extend(walk.asked.map(|(_, t)| t).unwrap_or_default());
            self.sessions.owed_to.insert((pod, shard), walk.from);
            let owed = Owed {
                from: walk.from,
                terms,
            };
            self.sessions.owed.insert((pod, shard), owed);
        }
        let at = self.now + self.cfg.core.lease_ttl;
        self.schedule(
            at,
            Ev::Session(SessionEv::DrainBudget { pod, shard, epoch }),
        );
    }

    /// Tells every other member in `pod`'s view that it drains `shard`; `false` if one
    /// could not be told.
    fn announce_drain(&mut self, pod: usize, shard: ShardId) -> bool {
        let members: Vec<usize> = match self.pods[pod].rec.as_ref() {
            Some(rec) => rec
                .members()
                .iter()
                .filter_map(|m| self.pods.iter().position(|p| p.id == m.pod))
                .filter(|&p| p != pod)
                .collect(),
            None => Vec::new(),
        };
        let mut told = Vec::new();
        for p in members {
            let reachable = self.pods[p].alive && self.pods[p].paused_until.is_none();
            if !reachable || self.rng.random_bool(LOSS) {
                self.sessions.unannounced += 1;
                return false;
            }
            told.push(p);
        }
        for p in told {
            self.sessions.announced.insert((p, shard), (pod, self.now));
        }
        true
    }

    /// A pod crashed: its sessions close with it, its walks and drains end.
    pub(super) fn sessions_crash(&mut self, pod: usize) {
        for open in self.sessions.open.values_mut() {
            open.retain(|s| s.pod != pod);
        }
        self.sessions.walks.retain(|&(p, _), _| p != pod);
        self.sessions.owed.retain(|&(p, _), _| p != pod);
        self.sessions.forwards.retain(|&(p, _), _| p != pod);
    }

    /// A pod finished its shutdown: it walks nothing more (it lingers for its drains).
    pub(super) fn sessions_finished(&mut self, pod: usize) {
        self.sessions.walks.retain(|&(p, _), _| p != pod);
    }

    /// Whether `pod` still drains something (a pod that shut down lingers for it).
    fn drains(&self, pod: usize) -> bool {
        self.sessions
            .open
            .values()
            .flatten()
            .any(|s| s.pod == pod && s.draining)
            || self.sessions.owed.keys().any(|&(p, _)| p == pod)
    }

    pub(super) fn session_event(&mut self, ev: SessionEv) -> Result<(), Violation> {
        let pod = match &ev {
            SessionEv::Ask { to, .. } | SessionEv::Answer { to, .. } => *to,
            SessionEv::Timeout { pod, .. } | SessionEv::DrainBudget { pod, .. } => *pod,
        };
        let p = &self.pods[pod];
        if !p.alive && !self.drains(pod) {
            return Ok(()); // crashed, or shut down with nothing left to drain
        }
        if let Some(until) = p.paused_until {
            // Frozen: handled when it runs again.
            self.schedule(until + Duration::from_micros(1), Ev::Session(ev));
            return Ok(());
        }
        match ev {
            SessionEv::Ask {
                to,
                asker,
                shard,
                terms,
                id,
            } => self.ask_arrives(to, asker, shard, terms, id),
            SessionEv::Answer { to, id, answer } => self.answer_arrives(to, id, answer),
            SessionEv::Timeout { pod, id } => self.ask_timed_out(pod, id),
            SessionEv::DrainBudget { pod, shard, epoch } => {
                for k in 0..self.cfg.terminals_per_shard {
                    let open = self.sessions.open.entry((shard, k)).or_default();
                    open.retain(|s| !(s.pod == pod && s.draining && s.epoch == epoch));
                }
                self.sessions.owed.remove(&(pod, shard));
                Ok(())
            }
        }
    }

    fn send_session(&mut self, ev: SessionEv) {
        if self.rng.random_bool(LOSS) {
            return;
        }
        let at = self.now + self.latency();
        self.schedule(at, Ev::Session(ev));
    }
}

// The invariant of the per-terminal handover model above, checked at every
// session that opens, and its end-of-run check.

impl World<'_> {
    /// `pod` dials `term` with `epoch`: the invariant.
    pub(super) fn open_session(
        &mut self,
        pod: usize,
        term: Term,
        epoch: Epoch,
        how: Opened,
    ) -> Result<(), Violation> {
        let open = self.sessions.open.entry(term).or_default();
        let others: Vec<Session> = open.iter().copied().filter(|s| s.pod != pod).collect();
        // Draining sessions are the planned path's: whoever released the terminal has
        // none left. One of a pod the new owner did not know of (its view of the last
        // holder was stale) or that did not answer a release passed on is fenced by
        // the terminal, counted apart. A session another pod still serves on (a stale
        // belief, a hold through an outage) is not ours to release: fenced too.
        if let Opened::Released { by, sure } = &how {
            // The releasing pods, and (when every release passed on was answered) the
            // predecessors they owed terminals to: none of them may drain it still.
            let mut by = by.clone();
            if *sure {
                let owed_to = &self.sessions.owed_to;
                let more: Vec<usize> = by
                    .iter()
                    .filter_map(|&p| owed_to.get(&(p, term.0)).copied())
                    .collect();
                by.extend(more);
            }
            let by = &by;
            if let Some(s) = others.iter().find(|s| s.draining && by.contains(&s.pod)) {
                let what = format!(
                    "pod-{pod} dialed terminal {term:?} (epoch {epoch}) released by {by:?} \
                     while {s:?} was open"
                );
                return Err(self.check.violation(self.now, what));
            }
            if others.iter().any(|s| s.draining) {
                self.sessions.unknown_predecessor += 1;
            }
        }
        if others.iter().any(|s| s.epoch >= epoch) {
            // The terminal refuses the older epoch: our hello is the stale one (the
            // shard-level model already tells the pod).
            return Ok(());
        }
        self.sessions.fenced += others.len() as u64;
        open.retain(|s| s.pod == pod);
        match open.first_mut() {
            Some(s) => {
                s.epoch = epoch;
                s.draining = false;
            }
            None => open.push(Session {
                pod,
                epoch,
                draining: false,
            }),
        }
        match how {
            Opened::Released { .. } => self.sessions.released += 1,
            Opened::Unasked => self.sessions.unasked += 1,
        }
        self.check.log(
            self.now,
            format_args!("pod-{pod} session to {term:?} epoch {epoch} ({how:?})"),
        );
        Ok(())
    }

    /// At the end: every terminal has one session, with its shard's serving owner and
    /// that owner's epoch.
    pub(super) fn sessions_converged(
        &mut self,
        shard: ShardId,
        owner: usize,
        epoch: Epoch,
    ) -> Result<(), Violation> {
        for k in 0..self.cfg.terminals_per_shard {
            let open = self
                .sessions
                .open
                .get(&(shard, k))
                .cloned()
                .unwrap_or_default();
            let want = [Session {
                pod: owner,
                epoch,
                draining: false,
            }];
            if open != want {
                let what = format!(
                    "not converged: terminal {:?} has sessions {open:?}, not pod-{owner}'s with epoch {epoch}",
                    (shard, k)
                );
                return Err(self.check.violation(self.now, what));
            }
        }
        Ok(())
    }
}

// What the simulated terminals make of the pods: after every event of a pod, at most
// one of the pods that may deliver on a shard holds its terminals' current session (the
// rest fenced by epoch), and what a terminal answers a refused epoch with.

impl World<'_> {
    /// A terminal's stale-epoch answer to `epoch` on `shard`: it names the newest epoch
    /// the shard's terminals said hello with, as a real `409` does.
    pub(super) fn stale_epoch(&self, shard: ShardId, epoch: Epoch) -> StaleEpoch {
        StaleEpoch {
            shard,
            epoch,
            highest: self.check.newest_hello(shard).map(|(_, e)| e),
        }
    }

    pub(super) fn check_exclusive(&mut self, pod: usize) -> Result<(), Violation> {
        let now_of: Vec<Instant> = (0..self.pods.len()).map(|i| self.local(i)).collect();
        let Some(rec) = self.pods[pod].rec.as_ref() else {
            return Ok(());
        };
        for shard in 0..self.cfg.core.shards {
            if rec.serving(shard, now_of[pod]).is_none() {
                continue;
            }
            if matches!(rec.shard_state(shard), Some(ShardState::Suspended { .. })) {
                self.stats.served_in_outage += 1;
            }
            // A frozen pod delivers nothing; on waking its first input runs first.
            let servers: Vec<(PodId, Epoch)> = self
                .pods
                .iter()
                .enumerate()
                .filter(|(_, p)| p.alive && p.paused_until.is_none())
                .filter_map(|(i, p)| {
                    let epoch = p.rec.as_ref()?.serving(shard, now_of[i])?;
                    Some((p.id.clone(), epoch))
                })
                .collect();
            self.check.exclusive(self.now, shard, &servers)?;
        }
        Ok(())
    }
}
