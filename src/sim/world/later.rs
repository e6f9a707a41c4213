//! Pushes with a TTL through the simulated cluster: callers store them through any pod
//! (retrying the same key until a pod acknowledges it), and each pod's drain of a shard
//! it serves reads its terminal's queue from the store, asks the real delivery rule
//! ([`crate::core::delivery`]), marks a copy in the store (the real
//! [`crate::store::queue::QueueState`], lease- and epoch-checked), sends it, and records
//! the terminal's answer, as `crate::push::queue` does. The terminal is offline at
//! times, fences by its newest hello and deduplicates for its window; answers are lost
//! on the way back; every queue write waits for the store's replica (`WAIT`), so a
//! failover keeps every acknowledged write and a wipe is the one loss
//! ([`crate::sim::later`] holds the invariants).
//!
//! Each pod's wall clock is true time plus an offset within half the skew allowance, so
//! two pods disagree by at most the allowance, as NTP keeps real pods.
//!
//! Not modelled: the pod-wide drain pace, cancels, the owner's wait for the outcome.

use std::time::Duration;

use bytes::Bytes;
use rand::Rng;

use super::{Ev, World};
use crate::core::delivery::{self, Moment, QueueRules, Step, Verdict};
use crate::core::{Epoch, ShardId};
use crate::sim::checks::Violation;
use crate::sim::later::{End, LaterKey, Taken};
use crate::store::queue::{
    push_id, Change, Enqueue, Enqueued, Limits, Record, State, Write, Written, RECORD_CHARGE,
};

/// The terminals' dedup window (`--idempotency-ttl`) in the simulation: shorter than
/// many TTLs, so the window rule binds.
pub(super) const WINDOW: Duration = Duration::from_secs(4);
/// How far the pods' wall clocks may disagree.
const SKEW: Duration = Duration::from_millis(500);
/// How long a copy waits for its answer.
const COPY_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a pod looks at every shard it drains, in case a wake-up was lost (30 s in
/// a pod, whose lease is 5 times the simulation's).
const SCAN: Duration = Duration::from_secs(3);
/// A caller's deadline for one request (`timeout_ms`).
const REQUEST_DEADLINE: Duration = Duration::from_millis(1_500);
/// How likely a terminal's answer to a copy is lost on its way back.
const ANSWER_LOSS: f64 = 0.05;
/// A drain's pause after a copy without an answer, a failed store call, or while its
/// terminal has no session.
const PAUSE: Duration = Duration::from_millis(300);
const RETENTION_MS: u64 = 600_000;
const LIMITS: Limits = Limits {
    per_terminal: 1_000,
    tenant_bytes: u64::MAX / 4,
    cluster_bytes: u64::MAX / 4,
    retention_ms: RETENTION_MS,
};
const TENANT: &str = "sim";

fn rules() -> QueueRules {
    QueueRules {
        window: WINDOW,
        skew: SKEW,
        copy_timeout: COPY_TIMEOUT,
    }
}

/// One pod's drain of one served shard.
#[derive(Debug, Default)]
pub(super) struct Drain {
    /// Bumped by every look: answers to an older look are ignored.
    gen: u64,
    /// A step (a read, a mark, a copy, a write) is in flight.
    busy: bool,
    /// Woken while busy: look again once done.
    again: bool,
}

/// A copy on its way, at its pod: what to record when its answer comes.
#[derive(Clone, Debug)]
pub(super) struct Copy {
    shard: ShardId,
    key: usize,
    before: Record,
    marked: Record,
    epoch: Epoch,
}

/// The terminal's answer to a copy.
#[derive(Clone, Copy, Debug)]
pub(super) enum Answer {
    Taken(Taken),
    /// Refused as stale: a newer owner said hello.
    Stale,
    /// The terminal is offline: the copy never got there.
    Offline,
}

/// A store call of a pod's queue, on its way to the store.
#[derive(Clone, Debug)]
pub(super) enum StoreOp {
    Enqueue(usize, Box<Enqueue>),
    Pending(ShardId, u64),
    Mark(ShardId, u64, Box<(Record, Write)>),
    Write(ShardId, u64, Box<Write>),
}

/// A queue event at a pod (not while it is paused).
#[derive(Clone, Debug)]
pub(super) enum LaterEv {
    /// The caller's request for `key`, with its deadline, reaches this (entry) pod.
    Enqueue(usize, Duration),
    Enqueued(usize, Option<Enqueued>),
    Look(ShardId),
    Read(ShardId, u64, Option<Vec<Record>>),
    Marked(ShardId, u64, Box<(Record, Record, Epoch)>, Option<Written>),
    Written(ShardId, u64),
    Answer(u64, Answer),
    CopyTimeout(u64),
    /// The pod's periodic look at every shard it drains (`push::queue`'s scan).
    Scan,
}

impl World<'_> {
    /// Pushes with a TTL from `from` until `until`, one every 100-400 ms, to random
    /// shards; a fifth share a collapse key per terminal. TTLs 1-10 s.
    pub(super) fn plan_later(&mut self, from: Duration, until: Duration) {
        let mut at = from;
        while at < until {
            let key = self.later.keys.len();
            let shard = self.rng.random_range(0..self.cfg.core.shards);
            let collapse = self.rng.random_bool(0.2).then(|| "menu".to_string());
            let ttl = Duration::from_millis(self.rng.random_range(1_000..10_000));
            self.later.keys.push(LaterKey {
                shard,
                key: format!("q{key}"),
                collapse,
                ttl,
                first_sent: None,
                stored: Vec::new(),
                acked_in: None,
                taken: None,
            });
            self.schedule(at, Ev::LaterSend(key));
            at += Duration::from_millis(self.rng.random_range(100..400));
        }
        // Each terminal is offline for a while, once or twice, during the faults.
        for _ in 0..self.cfg.core.shards {
            let mut spans = Vec::new();
            for _ in 0..self.rng.random_range(0..3) {
                let start =
                    Duration::from_millis(self.rng.random_range(2_000..until.as_millis() as u64));
                let span = Duration::from_millis(self.rng.random_range(500..8_000));
                spans.push((start, start + span));
            }
            self.terminal_offline.push(spans);
        }
    }

    fn terminal_online(&self, shard: ShardId) -> bool {
        let spans = &self.terminal_offline[shard as usize];
        !spans.iter().any(|(a, b)| (*a..*b).contains(&self.now))
    }

    /// A pod's wall clock now, ms since the Unix epoch.
    fn wall_ms(&self, pod: usize) -> u64 {
        (super::STORE_EPOCH_MS + self.now.as_millis() as u64)
            .saturating_add_signed(self.pods[pod].wall_offset_ms)
    }

    /// The true time `pod`'s wall clock shows `wall`.
    fn true_at(&self, pod: usize, wall: u64) -> Duration {
        let ms = wall
            .saturating_add_signed(-self.pods[pod].wall_offset_ms)
            .saturating_sub(super::STORE_EPOCH_MS);
        Duration::from_millis(ms)
    }

    /// The caller sends `key`'s push through a random live pod, and again until a pod
    /// acknowledges it, within the terminal's window of its first send (as senders are
    /// told: a later retry of a push the store lost would be delivered again).
    pub(super) fn later_send(&mut self, key: usize) {
        let now = self.now;
        let k = &mut self.later.keys[key];
        let first = *k.first_sent.get_or_insert(now);
        if k.acked_in.is_some() || now + Duration::from_secs(1) >= first + WINDOW {
            return;
        }
        let entries: Vec<usize> = self
            .alive()
            .into_iter()
            .filter(|&p| !self.pods[p].leaving)
            .collect();
        let at = self.now + self.latency();
        if let Some(&entry) = entries.get(self.rng.random_range(0..entries.len().max(1))) {
            let deadline = now + REQUEST_DEADLINE;
            self.schedule(at, Ev::Later(entry, LaterEv::Enqueue(key, deadline)));
        }
        // Unless a pod acknowledges it by then, the caller tries again.
        let retry = self.now + Duration::from_millis(self.rng.random_range(800..1_500));
        if retry < self.retry_until {
            self.schedule(retry, Ev::LaterSend(key));
        }
    }

    /// The answer of `key`'s request reaches its caller: acknowledged in `generation`.
    pub(super) fn later_heard(&mut self, key: usize, generation: String) {
        let k = &mut self.later.keys[key];
        if k.acked_in.is_none() {
            k.acked_in = Some(generation);
            self.stats.later_acked += 1;
        }
    }

    /// `pod` started: its periodic scan begins.
    pub(super) fn later_pod_started(&mut self, pod: usize) {
        self.schedule(self.now + SCAN, Ev::Later(pod, LaterEv::Scan));
    }

    /// `pod` starts serving `shard`: its drain looks at the shard's terminal's queue.
    pub(super) fn later_start(&mut self, pod: usize, shard: ShardId) {
        self.pods[pod].drains.entry(shard).or_default();
        self.schedule(self.now, Ev::Later(pod, LaterEv::Look(shard)));
    }

    /// `pod` stops serving `shard`: its drain ends (a copy on its way is still recorded
    /// when its answer comes, as the real drain finishes its step).
    pub(super) fn later_stop(&mut self, pod: usize, shard: ShardId) {
        self.pods[pod].drains.remove(&shard);
    }

    /// A queue call reaches the store: applied, and a write answered only once the
    /// replica has it (`WAIT`). While a failover is under way the replica cannot
    /// acknowledge anything: a write is applied to the old master (and lost with it)
    /// and its pod hears a failure, as `StoreError::NotReplicated`.
    pub(super) fn later_store(&mut self, pod: usize, op: StoreOp) -> Result<(), Violation> {
        let reachable = !self.pods[pod].partitioned && self.store_up;
        let unacked = self.failing_over && !matches!(op, StoreOp::Pending(..));
        let lost = !reachable || unacked || self.rng.random_bool(self.cfg.reply_loss);
        let ms = (super::STORE_EPOCH_MS + self.now.as_millis() as u64)
            .saturating_add_signed(self.store_clock_ms);
        let reply = |w: &mut Self, ev: LaterEv| {
            let at = if lost {
                w.now + super::STORE_TIMEOUT
            } else {
                w.now + w.latency()
            };
            w.schedule(at, Ev::Later(pod, ev));
        };
        let ev = match op {
            StoreOp::Enqueue(key, e) => {
                let answer = if reachable {
                    let (answer, wake) = self.store.queue_enqueue(ms, &e, true);
                    self.check.log(
                        self.now,
                        format_args!("store: {} enqueued via pod-{pod}: {answer:?}", e.record.key),
                    );
                    self.replica_waited();
                    if let Enqueued::Accepted {
                        generation,
                        replaced,
                        ..
                    } = &answer
                    {
                        let expires = self.true_at(pod, e.record.expires_ms);
                        let accepted = e.record.accepted_ms;
                        self.later.stored(key, accepted, expires, generation);
                        self.stats.later_stored += 1;
                        if let Some(old) = replaced.as_deref().and_then(key_index) {
                            // The replaced push is the old key's one of this generation.
                            let of = self.later.keys[old]
                                .stored
                                .iter()
                                .rev()
                                .find(|s| s.generation == *generation)
                                .map(|s| s.accepted_ms);
                            if let Some(of) = of {
                                let state = State::Replaced {
                                    at_ms: accepted,
                                    replaced_by: e.record.key.clone(),
                                };
                                self.later
                                    .ended(&mut self.check, self.now, (old, of), &state)?;
                                self.stats.later_replaced += 1;
                            }
                        }
                    }
                    if wake {
                        self.wake_drains(e.shard);
                    }
                    Some(answer)
                } else {
                    None
                };
                LaterEv::Enqueued(key, answer.filter(|_| !lost))
            }
            StoreOp::Pending(shard, gen) => {
                let terminal = terminal_of(shard);
                let read = reachable.then(|| self.store.queue().pending(&terminal));
                LaterEv::Read(shard, gen, read.filter(|_| !lost))
            }
            StoreOp::Mark(shard, gen, boxed) => {
                let (before, w) = *boxed;
                let Change::Mark { epoch, .. } = w.change else {
                    unreachable!("a mark")
                };
                let written = reachable.then(|| {
                    let written = self.store.queue_write(ms, &w);
                    self.check.log(
                        self.now,
                        format_args!(
                            "store: {} {} marked by pod-{pod} on {epoch}: {written:?}",
                            w.record.key, w.expect
                        ),
                    );
                    self.replica_waited();
                    written
                });
                let marked = (before, w.record, epoch);
                LaterEv::Marked(shard, gen, Box::new(marked), written.filter(|_| !lost))
            }
            StoreOp::Write(shard, gen, w) => {
                if reachable {
                    let written = self.store.queue_write(ms, &w);
                    self.check.log(
                        self.now,
                        format_args!(
                            "store: {} {} -> {:?}: {written:?}",
                            w.record.key, w.expect, w.record.state
                        ),
                    );
                    if let (Written::Done { .. }, true) = (written, w.record.state.is_final()) {
                        self.count_final(&w.record.state);
                        if let Some(key) = key_index(&w.record.key) {
                            let of = (key, w.record.accepted_ms);
                            self.later
                                .ended(&mut self.check, self.now, of, &w.record.state)?;
                        }
                    }
                    self.replica_waited();
                }
                LaterEv::Written(shard, gen)
            }
        };
        reply(self, ev);
        Ok(())
    }

    /// The store failed over: what the ledger recorded of writes the promoted replica
    /// lacks (writes its pods heard fail, during the failover) is taken back.
    pub(super) fn later_rolled_back(&mut self) {
        let ms = (super::STORE_EPOCH_MS + self.now.as_millis() as u64)
            .saturating_add_signed(self.store_clock_ms);
        for key in 0..self.later.keys.len() {
            let k = &self.later.keys[key];
            let found = self
                .store
                .queue_find(TENANT, &terminal_of(k.shard), &k.key, ms);
            let Some(generation) = found.generation else {
                continue;
            };
            self.later.keep(key, &generation, found.record.as_ref());
        }
    }

    /// A queue write was acknowledged by the replica (`WAIT`): a failover keeps it.
    fn replica_waited(&mut self) {
        if self.failing_over {
            return;
        }
        self.replica.force(self.now, &self.store);
        self.queue_waited = self.now;
    }

    fn count_final(&mut self, state: &State) {
        let s = &mut self.stats;
        match state {
            State::Delivered { .. } => s.later_delivered += 1,
            State::Expired { .. } => s.later_expired += 1,
            State::Unknown { .. } => s.later_unknown += 1,
            _ => {}
        }
    }

    /// A push was stored by a pod that does not hold `shard`: the store's notification
    /// wakes the drains of every pod serving it.
    fn wake_drains(&mut self, shard: ShardId) {
        for pod in 0..self.pods.len() {
            if self.pods[pod].drains.contains_key(&shard) {
                let at = self.now + self.latency();
                self.schedule(at, Ev::Later(pod, LaterEv::Look(shard)));
            }
        }
    }

    fn queue_call(&mut self, pod: usize, op: StoreOp) {
        let at = self.now + self.latency();
        self.schedule(at, Ev::LaterStore(pod, op));
    }

    fn drain_look_after(&mut self, pod: usize, shard: ShardId, after: Duration) {
        self.schedule(self.now + after, Ev::Later(pod, LaterEv::Look(shard)));
    }

    /// A queue event at a live, running pod.
    pub(super) fn later_event(&mut self, pod: usize, ev: LaterEv) -> Result<(), Violation> {
        match ev {
            // Never stored past the request's deadline (`push::later`): a pod frozen
            // with the request in hand would store it when its caller gave up.
            LaterEv::Enqueue(key, deadline) if self.now < deadline => self.enqueue_at(pod, key),
            LaterEv::Enqueue(..) => {}
            LaterEv::Enqueued(key, answer) => {
                let generation = match answer {
                    Some(Enqueued::Accepted { generation, .. })
                    | Some(Enqueued::Existing { generation, .. }) => Some(generation),
                    _ => None,
                };
                if let Some(generation) = generation {
                    if !self.rng.random_bool(ANSWER_LOSS) {
                        let at = self.now + self.latency();
                        self.schedule(at, Ev::LaterHeard(key, generation));
                    }
                }
                // The entry pod wakes its own drain, if it serves the shard, whatever
                // the answer: a failed call may have stored it.
                let shard = self.later.keys[key].shard;
                if self.pods[pod].drains.contains_key(&shard) {
                    self.drain_look_after(pod, shard, Duration::ZERO);
                }
            }
            LaterEv::Look(shard) => self.drain_look(pod, shard),
            LaterEv::Read(shard, gen, read) => return self.drain_read(pod, shard, gen, read),
            LaterEv::Marked(shard, gen, boxed, written) => {
                let (before, marked, epoch) = *boxed;
                self.drain_marked(pod, shard, gen, before, marked, epoch, written);
            }
            LaterEv::Written(shard, gen) => self.drain_done(pod, shard, gen, Duration::ZERO),
            LaterEv::Answer(copy, answer) => self.drain_answered(pod, copy, answer),
            LaterEv::Scan => {
                let shards: Vec<ShardId> = self.pods[pod].drains.keys().copied().collect();
                for shard in shards {
                    self.drain_look(pod, shard);
                }
                if self.now < self.end() {
                    self.schedule(self.now + SCAN, Ev::Later(pod, LaterEv::Scan));
                }
            }
            LaterEv::CopyTimeout(copy) => {
                if let Some(c) = self.pods[pod].copies.remove(&copy) {
                    // No answer: it stays `sending`; the rule decides on the next look.
                    self.drain_idle(pod, c.shard, PAUSE);
                }
            }
        }
        Ok(())
    }

    fn enqueue_at(&mut self, pod: usize, key: usize) {
        let k = &self.later.keys[key];
        let accepted_ms = self.wall_ms(pod);
        let record = Record {
            tenant: TENANT.into(),
            terminal: terminal_of(k.shard),
            key: k.key.clone(),
            rev: 1,
            accepted_ms,
            expires_ms: accepted_ms + k.ttl.as_millis() as u64,
            accepted_by: self.pods[pod].id.to_string(),
            collapse_key: k.collapse.clone(),
            digest: String::new(),
            bytes: RECORD_CHARGE,
            content_type: None,
            copies: 0,
            state: State::Queued,
        };
        let e = Enqueue {
            shard: k.shard,
            id: push_id(TENANT, &record.terminal, &record.key),
            record,
            body: Bytes::new(),
            limits: LIMITS,
            check_directory: false,
            pod: self.pods[pod].id.clone(),
        };
        self.queue_call(pod, StoreOp::Enqueue(key, Box::new(e)));
    }

    /// The drain of `shard` at `pod` reads its terminal's queue, unless a step is in
    /// flight (then it looks again after it).
    fn drain_look(&mut self, pod: usize, shard: ShardId) {
        if self.serving_epoch_at(pod, shard).is_none() {
            self.pods[pod].drains.remove(&shard);
            return;
        }
        let Some(drain) = self.pods[pod].drains.get_mut(&shard) else {
            return;
        };
        if drain.busy {
            drain.again = true;
            return;
        }
        drain.busy = true;
        drain.gen += 1;
        let gen = drain.gen;
        self.queue_call(pod, StoreOp::Pending(shard, gen));
    }

    /// A step of the drain ended: look again after `pause` (at once if woken meanwhile).
    fn drain_done(&mut self, pod: usize, shard: ShardId, gen: u64, pause: Duration) {
        let Some(drain) = self.pods[pod].drains.get_mut(&shard) else {
            return;
        };
        if drain.gen != gen {
            return;
        }
        self.drain_idle(pod, shard, pause);
    }

    fn drain_idle(&mut self, pod: usize, shard: ShardId, pause: Duration) {
        let Some(drain) = self.pods[pod].drains.get_mut(&shard) else {
            return;
        };
        drain.busy = false;
        let pause = if std::mem::take(&mut drain.again) {
            Duration::ZERO
        } else {
            pause
        };
        self.drain_look_after(pod, shard, pause);
    }

    /// The queue as read: the rule for its head.
    fn drain_read(
        &mut self,
        pod: usize,
        shard: ShardId,
        gen: u64,
        read: Option<Vec<Record>>,
    ) -> Result<(), Violation> {
        if self.pods[pod]
            .drains
            .get(&shard)
            .is_none_or(|d| d.gen != gen)
        {
            return Ok(());
        }
        let Some(pending) = read else {
            self.drain_done(pod, shard, gen, PAUSE);
            return Ok(());
        };
        let Some(head) = pending.into_iter().next() else {
            // Empty: wait for a wake-up.
            if let Some(d) = self.pods[pod].drains.get_mut(&shard) {
                d.busy = false;
                if std::mem::take(&mut d.again) {
                    self.drain_look_after(pod, shard, Duration::ZERO);
                }
            }
            return Ok(());
        };
        let rules = rules();
        let wall = self.wall_ms(pod);
        match delivery::step(&head.pending(), wall, &rules) {
            Step::Expire => {
                self.drain_settle(pod, shard, gen, &head, State::Expired { at_ms: wall })
            }
            Step::GiveUp => {
                let since_ms = head.pending().unanswered_since_ms.unwrap_or(wall);
                let state = State::Unknown {
                    at_ms: wall,
                    since_ms,
                };
                self.drain_settle(pod, shard, gen, &head, state);
            }
            Step::WaitUntil(at) => {
                let wait = self.true_at(pod, at).saturating_sub(self.now);
                self.drain_done(pod, shard, gen, wait.max(Duration::from_millis(1)));
            }
            Step::Send => self.drain_mark(pod, shard, gen, head),
        }
        Ok(())
    }

    /// The terminal's session this pod would send on, if any: the terminal is online and
    /// its newest hello is this pod's on the epoch it serves the shard with.
    fn drain_session(&self, pod: usize, shard: ShardId) -> Option<Epoch> {
        let epoch = self.serving_epoch_at(pod, shard)?;
        let current = self.check.newest_hello(shard) == Some((&self.pods[pod].id, epoch));
        (current && self.terminal_online(shard)).then_some(epoch)
    }

    fn drain_check(&self, pod: usize, shard: ShardId, epoch: Epoch, record: &Record) -> Verdict {
        delivery::check(&Moment {
            serving: self.serving_epoch_at(pod, shard),
            session: epoch,
            left: COPY_TIMEOUT,
            queued: Some((&record.pending(), self.wall_ms(pod), &rules())),
        })
    }

    fn drain_mark(&mut self, pod: usize, shard: ShardId, gen: u64, head: Record) {
        let Some(epoch) = self.drain_session(pod, shard) else {
            // No session now (offline, or not said hello with this epoch): look again.
            self.drain_done(pod, shard, gen, PAUSE);
            return;
        };
        if self.drain_check(pod, shard, epoch, &head) != Verdict::Send {
            self.drain_done(pod, shard, gen, PAUSE);
            return;
        }
        let id = self.pods[pod].id.clone();
        let marked = head.marked(&id, epoch, self.wall_ms(pod));
        let w = Write {
            shard,
            id: push_id(TENANT, &head.terminal, &head.key),
            expect: head.rev,
            record: marked,
            change: Change::Mark { pod: id, epoch },
            now: self.wall_ms(pod),
        };
        self.queue_call(pod, StoreOp::Mark(shard, gen, Box::new((head, w))));
    }

    #[allow(clippy::too_many_arguments)]
    fn drain_marked(
        &mut self,
        pod: usize,
        shard: ShardId,
        gen: u64,
        before: Record,
        marked: Record,
        epoch: Epoch,
        written: Option<Written>,
    ) {
        match written {
            Some(Written::Done { .. }) => {}
            // Changed, gone or not the holder: look again (a failed call may have
            // marked it; the rule copes).
            Some(_) => return self.drain_done(pod, shard, gen, Duration::ZERO),
            None => return self.drain_done(pod, shard, gen, PAUSE),
        }
        // The rule once more, as the copy leaves.
        if self.drain_check(pod, shard, epoch, &marked) != Verdict::Send
            || self.drain_session(pod, shard) != Some(epoch)
        {
            let back = marked.unsent(&before);
            return self.drain_write(pod, shard, gen, &marked, back, Change::Unsent);
        }
        let Some(key) = key_index(&marked.key) else {
            return;
        };
        self.stats.later_copies += 1;
        self.next_copy += 1;
        let copy = self.next_copy;
        self.pods[pod].copies.insert(
            copy,
            Copy {
                shard,
                key,
                before,
                marked,
                epoch,
            },
        );
        let at = self.now + self.latency();
        let left = self.now;
        let accepted = self.pods[pod].copies[&copy].marked.accepted_ms;
        self.schedule(
            at,
            Ev::LaterAtTerminal(pod, copy, shard, (key, accepted), epoch, left),
        );
        self.schedule(
            self.now + COPY_TIMEOUT,
            Ev::Later(pod, LaterEv::CopyTimeout(copy)),
        );
    }

    /// A copy reaches the terminal.
    pub(super) fn later_at_terminal(
        &mut self,
        pod: usize,
        copy: u64,
        shard: ShardId,
        (key, accepted): (usize, u64),
        epoch: Epoch,
        left: Duration,
    ) -> Result<(), Violation> {
        let answer = if !self.terminal_online(shard) {
            Answer::Offline
        } else if self.check.newest_hello(shard) != Some((&self.pods[pod].id, epoch)) {
            Answer::Stale
        } else {
            let taken =
                self.later
                    .arrived(&mut self.check, self.now, left, (key, accepted), WINDOW)?;
            Answer::Taken(taken)
        };
        self.check.log(
            self.now,
            format_args!("terminal {shard}: copy of q{key} from pod-{pod} on {epoch}: {answer:?}"),
        );
        if matches!(answer, Answer::Taken(_)) && self.rng.random_bool(ANSWER_LOSS) {
            return Ok(());
        }
        let at = self.now + self.latency();
        self.schedule(at, Ev::Later(pod, LaterEv::Answer(copy, answer)));
        Ok(())
    }

    fn drain_answered(&mut self, pod: usize, copy: u64, answer: Answer) {
        let Some(c) = self.pods[pod].copies.remove(&copy) else {
            return; // timed out already: the pod stopped waiting
        };
        let gen = self.pods[pod].drains.get(&c.shard).map_or(0, |d| d.gen);
        match answer {
            Answer::Taken(taken) => {
                let state = State::Delivered {
                    at_ms: self.wall_ms(pod),
                    pod: self.pods[pod].id.to_string(),
                    epoch: c.epoch,
                    pos_status: 200,
                    duplicate: taken == Taken::Repeat,
                };
                self.drain_settle(pod, c.shard, gen, &c.marked, state);
            }
            Answer::Stale | Answer::Offline => {
                if let Answer::Stale = answer {
                    let refused = self.stale_epoch(c.shard, c.epoch);
                    self.schedule(self.now, Ev::Stale(pod, refused));
                }
                let back = c.marked.unsent(&c.before);
                self.drain_write(pod, c.shard, gen, &c.marked, back, Change::Unsent);
            }
        }
        let _ = c.key;
    }

    fn drain_settle(
        &mut self,
        pod: usize,
        shard: ShardId,
        gen: u64,
        record: &Record,
        state: State,
    ) {
        let done = record.moved_to(state);
        let change = Change::Final {
            retention_ms: RETENTION_MS,
        };
        self.drain_write(pod, shard, gen, record, done, change);
    }

    fn drain_write(
        &mut self,
        pod: usize,
        shard: ShardId,
        gen: u64,
        record: &Record,
        next: Record,
        change: Change,
    ) {
        let w = Write {
            shard,
            id: push_id(TENANT, &record.terminal, &record.key),
            expect: record.rev,
            record: next,
            change,
            now: self.wall_ms(pod),
        };
        self.queue_call(pod, StoreOp::Write(shard, gen, Box::new(w)));
    }

    fn serving_epoch_at(&self, pod: usize, shard: ShardId) -> Option<Epoch> {
        let now = self.local(pod);
        self.pods[pod].rec.as_ref()?.serving(shard, now)
    }

    /// The end check: every acknowledged push ended (once, as the terminal saw it),
    /// or a wipe lost it before it did; one that expired a second before the faults
    /// ended must have.
    pub(super) fn later_converged(&mut self) -> Result<(), Violation> {
        let ms = (super::STORE_EPOCH_MS + self.now.as_millis() as u64)
            .saturating_add_signed(self.store_clock_ms);
        let due_by = self.cfg.fault_end.saturating_sub(Duration::from_secs(1));
        for key in 0..self.later.keys.len() {
            let k = &self.later.keys[key];
            let terminal = terminal_of(k.shard);
            let found = self.store.queue_find(TENANT, &terminal, &k.key, ms);
            let end = self.later.at_end(
                &mut self.check,
                self.now,
                key,
                found.generation.as_deref(),
                found.record.as_ref(),
                due_by,
            )?;
            if end == End::Lost {
                self.stats.later_lost += 1;
            }
        }
        self.stats.later_repeats = self.later.repeats;
        self.stats.later_retaken = self.later.retaken;
        Ok(())
    }
}

/// The caller's index of a key named `q<n>`.
fn key_index(key: &str) -> Option<usize> {
    key.strip_prefix('q')?.parse().ok()
}

/// The one terminal of a shard that pushes with a TTL go to (as `pushes` names it).
fn terminal_of(shard: ShardId) -> String {
    format!("term-{shard}")
}
