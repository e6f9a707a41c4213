//! Terminal sessions one by one, and the per-terminal handover of a planned move
//! (`pos::handover`, the manager's `drain`), as a model: each shard has
//! [`TERMINALS_PER_SHARD`] terminals, each with the sessions open to it. A pod that stops
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
use std::time::Duration;

use rand::Rng;

mod walks;

use super::{Ev, World};
use crate::core::{Epoch, ShardId};
use crate::sim::checks::Violation;

/// Terminals of each simulated shard.
pub(super) const TERMINALS_PER_SHARD: usize = 3;
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
        for k in 0..TERMINALS_PER_SHARD {
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
        for k in 0..TERMINALS_PER_SHARD {
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
                for k in 0..TERMINALS_PER_SHARD {
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
