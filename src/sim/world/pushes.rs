//! Pushes through the simulated cluster: callers send keys and retry those whose answer
//! they did not get; entry pods route each attempt by the real rule
//! ([`crate::core::route`]) from their reconciler's view; owners deliver only while
//! their reconciler serves the shard, through the real idempotency cache
//! ([`crate::push::idempotency::IdempotencyCache`]), whose kept answers move with a
//! shard to its next owner (as `push::handover` does); the terminal fences by epoch and
//! deduplicates by key ([`crate::sim::keys`], which also holds the invariant).
//!
//! Timings follow the real pod at the simulation's faster lease: a deadline per
//! attempt, a re-look pause after each miss; the owner's last check is the pod's own
//! ([`crate::core::delivery::check`]). Answers are
//! lost on each hop with a small probability (the owner's from the terminal, the
//! entry's from the owner, the caller's from the entry), which is what makes a caller
//! retry a key the terminal already has.
//!
//! Not modelled: request bodies, the owner's wait for a session (a served shard's
//! terminal is taken to be connected), per-terminal limits.

use std::time::Duration;

use rand::Rng;

use super::{Ev, World};
use crate::core::delivery::{self, Moment, Verdict};
use crate::core::route::{self, Miss, Target};
use crate::core::{Epoch, ShardId};
use crate::credentials::Tenant;
use crate::push::answer::{Answer, Delivered};
use crate::push::idempotency::Reserve;
use crate::sim::checks::Violation;
use crate::sim::keys::{Heard, Receipt};

/// The caller's deadline for one attempt (the real default is 10 s at a 15 s lease).
const DEADLINE: Duration = Duration::from_millis(1_500);
/// The caller gives up waiting this long after the deadline.
const CALLER_GRACE: Duration = Duration::from_millis(300);
/// The entry pod's pause before it looks for the owner again.
const RELOOK: Duration = Duration::from_millis(50);
/// How likely an answer is lost on one hop.
const ANSWER_LOSS: f64 = 0.02;
/// The idempotency cache's key digest: the simulation sends one body per key.
const DIGEST: [u8; 32] = [0; 32];

/// One caller's key.
pub(super) struct Caller {
    shard: ShardId,
    attempt: u32,
    delivered: bool,
}

/// One attempt on its way through the cluster.
pub(super) struct Flight {
    key: usize,
    attempt: u32,
    entry: usize,
    deadline: Duration,
    /// Looks so far; answers to an older look are ignored.
    looks: u32,
    answered: bool,
}

/// What one look at a target came back with, at the entry pod.
#[derive(Clone, Copy, Debug)]
pub(super) enum Tried {
    Answer(Heard),
    Miss(Miss),
}

/// A push event at a pod (delivered like every pod event: not while it is paused).
#[derive(Clone, Copy, Debug)]
pub(super) enum PushEv {
    /// The entry pod looks for the owner of the flight's shard.
    Look(usize),
    /// A forwarded look reaches the owner.
    AtOwner(usize, u32),
    /// The terminal's answer to the copy sent on this epoch reaches the owner (`None`:
    /// refused as stale).
    FromTerminal(usize, u32, Epoch, Option<Receipt>),
    /// The owner's send had no answer by the deadline.
    OwnerTimeout(usize, u32),
    /// A look's outcome reaches the entry pod.
    Tried(usize, u32, Tried),
    /// The entry pod's forward had no answer by the deadline.
    ForwardTimeout(usize, u32),
}

impl World<'_> {
    /// Keys from `from` until `until`, one every 50-150 ms, to random shards.
    pub(super) fn plan_pushes(&mut self, from: Duration, until: Duration) {
        let mut at = from;
        while at < until {
            let key = self.callers.len();
            let shard = self.rng.random_range(0..self.cfg.core.shards);
            self.callers.push(Caller {
                shard,
                attempt: 0,
                delivered: false,
            });
            self.schedule(at, Ev::CallerSend(key));
            at += Duration::from_millis(self.rng.random_range(50..150));
        }
    }

    /// The caller sends the next attempt of `key` through a random pod it can reach.
    pub(super) fn caller_send(&mut self, key: usize) {
        let entries: Vec<usize> = self
            .alive()
            .into_iter()
            .filter(|&p| !self.pods[p].leaving)
            .collect();
        if entries.is_empty() {
            let at = self.now + DEADLINE;
            if at + DEADLINE < self.retry_until {
                self.schedule(at, Ev::CallerSend(key));
            }
            return;
        }
        let entry = entries[self.rng.random_range(0..entries.len())];
        let caller = &mut self.callers[key];
        caller.attempt += 1;
        let attempt = caller.attempt;
        self.keys.sent(key as u64, attempt);
        self.stats.push_attempts += 1;
        self.flights.push(Flight {
            key,
            attempt,
            entry,
            deadline: self.now + DEADLINE,
            looks: 0,
            answered: false,
        });
        let flight = self.flights.len() - 1;
        let at = self.now + self.latency();
        self.schedule(at, Ev::Push(entry, PushEv::Look(flight)));
        let timeout = self.now + DEADLINE + CALLER_GRACE;
        self.schedule(timeout, Ev::CallerTimeout(key, attempt));
    }

    /// The caller hears `heard` for `attempt` (or times out: `Unknown`) and retries a
    /// key it does not know delivered, while the run has time for it.
    pub(super) fn caller_hears(
        &mut self,
        key: usize,
        attempt: u32,
        heard: Heard,
    ) -> Result<(), Violation> {
        let caller = &self.callers[key];
        if caller.attempt != attempt || caller.delivered || self.keys.was_heard(key as u64, attempt)
        {
            return Ok(());
        }
        self.keys
            .heard(&mut self.check, self.now, key as u64, attempt, heard)?;
        if heard == Heard::Delivered {
            self.callers[key].delivered = true;
            self.stats.keys_delivered += 1;
            return Ok(());
        }
        let at = self.now + Duration::from_millis(self.rng.random_range(100..400));
        if at + DEADLINE < self.retry_until {
            self.schedule(at, Ev::CallerSend(key));
        }
        Ok(())
    }

    /// A copy reaches the terminal of `flight`'s shard from `pod` on `epoch`.
    pub(super) fn at_terminal(
        &mut self,
        flight: usize,
        look: u32,
        pod: usize,
        epoch: Epoch,
    ) -> Result<(), Violation> {
        let f = &self.flights[flight];
        let (key, attempt) = (f.key, f.attempt);
        let shard = self.callers[key].shard;
        let id = self.pods[pod].id.clone();
        let receipt = if self.check.newest_hello(shard) == Some((&id, epoch)) {
            let ids = (shard, key as u64, attempt);
            Some(
                self.keys
                    .arrived(&mut self.check, self.now, ids, &id, epoch)?,
            )
        } else {
            None
        };
        if self.rng.random_bool(ANSWER_LOSS) {
            let deadline = self.flights[flight].deadline;
            self.schedule(deadline, Ev::Push(pod, PushEv::OwnerTimeout(flight, look)));
        } else {
            let at = self.now + self.latency();
            let ev = PushEv::FromTerminal(flight, look, epoch, receipt);
            self.schedule(at, Ev::Push(pod, ev));
        }
        Ok(())
    }

    /// A push event at a live, running pod.
    pub(super) fn push_event(&mut self, pod: usize, ev: PushEv) -> Result<(), Violation> {
        match ev {
            PushEv::Look(flight) => return self.look(pod, flight),
            PushEv::AtOwner(flight, look) => return self.at_owner(pod, flight, look),
            PushEv::FromTerminal(flight, look, epoch, receipt) => {
                let reservation = self.reservations.remove(&(flight, look));
                let tried = match receipt {
                    Some(_) => {
                        if let Some(r) = reservation {
                            r.complete(&self.delivered_answer(flight, pod, epoch));
                        }
                        Tried::Answer(Heard::Delivered)
                    }
                    None => {
                        // The terminal refused the epoch: nothing was taken.
                        let shard = self.callers[self.flights[flight].key].shard;
                        let refused = self.stale_epoch(shard, epoch);
                        self.schedule(self.now, Ev::Stale(pod, refused));
                        Tried::Miss(Miss::NotHere)
                    }
                };
                self.reply(pod, flight, look, tried);
            }
            PushEv::OwnerTimeout(flight, look) => {
                self.reservations.remove(&(flight, look));
                self.reply(pod, flight, look, Tried::Answer(Heard::Unknown));
            }
            PushEv::Tried(flight, look, tried) => {
                let f = &self.flights[flight];
                if f.answered || f.looks != look {
                    return Ok(());
                }
                match tried {
                    Tried::Answer(heard) => self.answer_caller(flight, heard),
                    Tried::Miss(miss) if miss.may_look_again() => {
                        let at = (self.now + RELOOK).min(f.deadline);
                        self.schedule(at, Ev::Push(pod, PushEv::Look(flight)));
                    }
                    Tried::Miss(_) => self.answer_caller(flight, Heard::Unknown),
                }
            }
            // Whatever the peer did is unknown: the same as a broken connection.
            PushEv::ForwardTimeout(flight, look) => {
                let ev = PushEv::Tried(flight, look, Tried::Miss(Miss::Unknown));
                return self.push_event(pod, ev);
            }
        }
        Ok(())
    }

    /// The entry pod looks for the owner by [`route::target`] and tries it.
    fn look(&mut self, pod: usize, flight: usize) -> Result<(), Violation> {
        let f = &mut self.flights[flight];
        if f.answered {
            return Ok(());
        }
        if self.now >= f.deadline {
            // No pod served the shard by the deadline: 503, nothing sent.
            self.answer_caller(flight, Heard::NotDelivered);
            return Ok(());
        }
        f.looks += 1;
        let (look, deadline) = (f.looks, f.deadline);
        let shard = self.callers[f.key].shard;
        let serving_here = self.serving_epoch(pod, shard).is_some();
        let Some(rec) = self.pods[pod].rec.as_ref() else {
            return Ok(());
        };
        let owner = rec.lease(shard).map(|l| &l.owner);
        let peer = match route::target(rec.pod(), serving_here, owner, rec.members()) {
            Target::Here => return self.at_owner(pod, flight, look),
            Target::Peer(member) => self.pods.iter().position(|p| p.id == member.pod),
            Target::Nobody => None,
        };
        match peer {
            Some(peer) if self.pods[peer].alive => {
                let at = self.now + self.latency();
                self.schedule(at, Ev::Push(peer, PushEv::AtOwner(flight, look)));
                self.schedule(
                    deadline,
                    Ev::Push(pod, PushEv::ForwardTimeout(flight, look)),
                );
            }
            // A dead pod refuses the connection: nothing left this pod.
            Some(_) => self.reply(pod, flight, look, Tried::Miss(Miss::NotSent)),
            None => {
                let at = (self.now + RELOOK).min(deadline);
                self.schedule(at, Ev::Push(pod, PushEv::Look(flight)));
            }
        }
        Ok(())
    }

    /// The owner's checks, in the order of `push::owner`: serving here, the key
    /// reserved, then the delivery rule ([`delivery::check`]: still served, the
    /// session's epoch, enough deadline left); then the copy goes to the terminal.
    fn at_owner(&mut self, pod: usize, flight: usize, look: u32) -> Result<(), Violation> {
        let f = &self.flights[flight];
        let (key, deadline, local) = (f.key, f.deadline, f.entry == pod);
        let shard = self.callers[key].shard;
        let Some(epoch) = self.serving_epoch(pod, shard) else {
            let miss = if local { Miss::NotHere } else { Miss::Moved };
            self.reply(pod, flight, look, Tried::Miss(miss));
            return Ok(());
        };
        let now = self.local(pod);
        let (terminal, key_name) = (terminal_of(shard), key_name(key));
        let tenant = Tenant("sim".into());
        let reserved = self.pods[pod]
            .cache
            .reserve(&tenant, &terminal, &key_name, DIGEST, now);
        let tried = match reserved {
            Reserve::Replay(_) => Tried::Answer(Heard::Delivered),
            Reserve::Conflict(_) => Tried::Answer(Heard::NotDelivered),
            // A served shard's terminal is taken to be connected with its epoch.
            Reserve::Reserved(_)
                if self.last_check(pod, shard, epoch, deadline) != Verdict::Send =>
            {
                Tried::Answer(Heard::NotDelivered)
            }
            Reserve::Reserved(r) => {
                self.reservations.insert((flight, look), r);
                let at = self.now + self.latency();
                self.schedule(at, Ev::AtTerminal(flight, look, pod, epoch));
                return Ok(());
            }
        };
        self.reply(pod, flight, look, tried);
        Ok(())
    }

    /// `pod` starts serving `shard`: it takes the kept answers of the shard's last other
    /// holder over, as `push::handover` does (at once here; a holder that is dead or
    /// frozen answers nothing).
    pub(super) fn take_over_answers(&mut self, pod: usize, shard: ShardId) {
        let Some(last) = self.pods[pod]
            .rec
            .as_ref()
            .and_then(|r| r.last_holder(shard))
        else {
            return;
        };
        let Some(from) = self.pods.iter().position(|p| p.id == last.pod) else {
            return;
        };
        if !self.pods[from].alive || self.pods[from].paused_until.is_some() {
            return;
        }
        let terminal = terminal_of(shard);
        let kept = self.pods[from]
            .cache
            .export(|t| t == terminal, usize::MAX, self.local(from));
        self.stats.answers_handed_over += kept.len() as u64;
        let now = self.local(pod);
        self.pods[pod].cache.import(kept, now);
    }

    /// The delivery rule for a copy on `epoch`'s session with `deadline`, at `pod` now.
    fn last_check(&self, pod: usize, shard: ShardId, epoch: Epoch, deadline: Duration) -> Verdict {
        delivery::check(&Moment {
            serving: self.serving_epoch(pod, shard),
            session: epoch,
            left: deadline.saturating_sub(self.now),
            queued: None,
        })
    }

    fn serving_epoch(&self, pod: usize, shard: ShardId) -> Option<Epoch> {
        let now = self.local(pod);
        self.pods[pod].rec.as_ref()?.serving(shard, now)
    }

    /// The owner's outcome of a look goes back to the entry pod. A forwarded answer may
    /// be lost on the way: silently (the entry's forward timeout covers it) or with the
    /// connection breaking, which the entry sees at once as an unknown outcome.
    fn reply(&mut self, owner: usize, flight: usize, look: u32, tried: Tried) {
        let entry = self.flights[flight].entry;
        let at = self.now + self.latency();
        let tried = if entry == owner || !self.rng.random_bool(ANSWER_LOSS) {
            tried
        } else if self.rng.random_bool(0.5) {
            Tried::Miss(Miss::Unknown)
        } else {
            return;
        };
        self.schedule(at, Ev::Push(entry, PushEv::Tried(flight, look, tried)));
    }

    /// The entry pod answers the caller (the answer may be lost on the way).
    fn answer_caller(&mut self, flight: usize, heard: Heard) {
        let f = &mut self.flights[flight];
        f.answered = true;
        let (key, attempt) = (f.key, f.attempt);
        if heard == Heard::Unknown {
            self.stats.push_answers_unknown += 1;
        }
        if !self.rng.random_bool(ANSWER_LOSS) {
            let at = self.now + self.latency();
            self.schedule(at, Ev::CallerHears(key, attempt, heard));
        }
    }

    fn delivered_answer(&self, flight: usize, pod: usize, epoch: Epoch) -> Answer {
        let f = &self.flights[flight];
        let shard = self.callers[f.key].shard;
        Answer::delivered(&Delivered {
            terminal: terminal_of(shard),
            idempotency_key: key_name(f.key),
            pod: self.pods[pod].id.clone(),
            shard,
            epoch,
            pos_status: 200,
            latency_ms: 0,
            duplicate: false,
        })
    }
}

/// The one terminal the simulation gives a shard, as the idempotency cache names it.
fn terminal_of(shard: ShardId) -> String {
    format!("term-{shard}")
}

/// A caller's key as the idempotency cache names it.
fn key_name(key: usize) -> String {
    format!("k{key}")
}
