//! The simulation engine: a virtual clock, an event queue, simulated pods around real
//! reconcilers, and the in-memory store.
//!
//! Time: `Duration` since the start is "true" time (the store's clock). Each pod sees its
//! own monotonic clock running at `rate` (1 +- skew) from a shared origin, converted to
//! `Instant`s for its reconciler. Messages take 1-10 ms each way; a call to an unreachable
//! store fails after the store timeout, and a reply may be lost after the store applied
//! the call.

mod failover;
mod inject;
mod later;
mod pushes;
mod sessions;
mod store_calls;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use self::failover::Failover;
use self::failover::Replica;
use self::later::{LaterEv, StoreOp};
use self::pushes::{Caller, Flight, PushEv};
use self::sessions::{SessionEv, Sessions};
use self::store_calls::failed;
use super::checks::{Checker, Hello, Violation};
use super::faults::{self, Fault};
use super::keys::{Heard, Keys};
use super::later::Ledger;
use super::{SimConfig, SimStats};
use crate::core::lease::{
    AcquireOutcome, Checked, Claim, Release, Released, RenewOutcome, StaleEpoch,
};
use crate::core::membership::{Member, Snapshot, HANDOVER_LEASE};
use crate::core::placement::Placement;
use crate::core::reconciler::{Action, Close, OpFailed, OpResult, PeerReport, Reconciler, Stop};
use crate::core::{Epoch, PodId, ShardId};
use crate::push::idempotency::{IdempotencyCache, Reservation};
use crate::store::memory::MemoryState;
use crate::store::ClusterMeta;

/// Store calls fail after this long when the store cannot be reached.
const STORE_TIMEOUT: Duration = Duration::from_millis(800);
/// Store time at virtual time zero (milliseconds since the Unix epoch), so epochs look real.
const STORE_EPOCH_MS: u64 = 1_800_000_000_000;
/// Hard cap on events per seed: a run beyond it is reported as a livelock.
const MAX_EVENTS: u64 = 3_000_000;

#[derive(Clone, Debug)]
enum Call {
    Heartbeat(String),
    Poll,
    Acquire(String, Vec<Claim>),
    Renew(String, Vec<ShardId>),
    Release(Vec<Release>),
    Deregister,
    Place(Option<u64>, Placement),
}

#[derive(Clone, Debug)]
enum Reply {
    Heartbeat(OpResult<Checked<u64>>),
    Snapshot(OpResult<Snapshot>),
    Acquire(Vec<ShardId>, OpResult<Checked<Vec<AcquireOutcome>>>),
    Renew(Vec<ShardId>, OpResult<Checked<Vec<RenewOutcome>>>),
    Release(Vec<ShardId>, OpResult<Vec<Released>>),
    Deregister(OpResult<()>),
    Place(Placement, OpResult<bool>),
}

#[derive(Clone, Debug)]
enum Ev {
    Start(usize),
    Wake(usize),
    Arrive(usize, Call),
    Reply(usize, Reply),
    Notify(usize),
    Peers(usize, PeerReport),
    StopAck(usize, ShardId),
    /// The terminals refused the pod's hello or push on an epoch as stale.
    Stale(usize, StaleEpoch),
    Fault(Fault),
    Resume(usize),
    Heal(usize),
    StoreUp,
    /// The store comes back, empty.
    StoreUpWiped,
    /// The store comes back as its replica, with the data it had at the instant.
    FailedOver(Failover, Duration),
    /// A caller sends the next attempt of a key; its timeout for an attempt; an answer
    /// reaching it.
    CallerSend(usize),
    CallerTimeout(usize, u32),
    CallerHears(usize, u32, Heard),
    /// A push event at a pod.
    Push(usize, PushEv),
    /// A copy of a flight's look reaches the terminal, from a pod on an epoch.
    AtTerminal(usize, u32, usize, Epoch),
    /// The per-terminal handover (`sessions`).
    Session(SessionEv),
    /// A caller sends (again) a push with a TTL; a pod's acknowledgement reaches it.
    LaterSend(usize),
    LaterHeard(usize, String),
    /// A queue event at a pod (`later`), a queue call reaching the store, a queued copy
    /// reaching the terminal (pod, copy, shard, key, epoch, when it left).
    Later(usize, LaterEv),
    LaterStore(usize, StoreOp),
    LaterAtTerminal(usize, u64, ShardId, (usize, u64), Epoch, Duration),
}

struct SimPod {
    id: PodId,
    rec: Option<Reconciler>,
    rate: f64,
    alive: bool,
    /// Graceful shutdown begun.
    leaving: bool,
    paused_until: Option<Duration>,
    partitioned: bool,
    deferred: Vec<Ev>,
    wake_at: Option<Duration>,
    /// The pod's idempotency cache (the real one); lost when the pod dies.
    cache: IdempotencyCache,
    /// Its wall clock minus true time, ms (within half the queue's skew allowance).
    wall_offset_ms: i64,
    /// Its drains of pushes with a TTL, one per served shard, and their copies on the
    /// way (`later`).
    drains: BTreeMap<ShardId, later::Drain>,
    copies: BTreeMap<u64, later::Copy>,
}

pub struct World<'a> {
    cfg: &'a SimConfig,
    rng: StdRng,
    origin: Instant,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<(Duration, u64, usize)>>,
    events: Vec<Option<Ev>>,
    store: MemoryState,
    store_up: bool,
    /// What the store's replica has (for failovers).
    replica: Replica,
    /// The store's clock minus true time, ms (moved by failovers), and the most it ever
    /// was.
    store_clock_ms: i64,
    store_clock_peak_ms: i64,
    notifications: u64,
    pods: Vec<SimPod>,
    check: Checker,
    stats: SimStats,
    callers: Vec<Caller>,
    flights: Vec<Flight>,
    /// Keys reserved in an owner's cache while its copy is out, per (flight, look).
    reservations: HashMap<(usize, u32), Reservation>,
    keys: Keys,
    sessions: Sessions,
    /// Callers stop retrying here, so every attempt ends before the run does.
    retry_until: Duration,
    /// Pushes with a TTL (`later`): their ledger, when each shard's terminal is
    /// offline, when a queue write last waited for the replica, the last copy's number.
    later: Ledger,
    terminal_offline: Vec<Vec<(Duration, Duration)>>,
    queue_waited: Duration,
    /// A failover is under way: the replica to be promoted is cut off from the master,
    /// so no write can be acknowledged by it (`WAIT` fails) until it is the store.
    failing_over: bool,
    next_copy: u64,
}

impl<'a> World<'a> {
    pub fn new(seed: u64, cfg: &'a SimConfig) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let store = MemoryState::new(rng.random());
        let mut w = World {
            cfg,
            origin: Instant::now(),
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            store,
            store_up: true,
            replica: Replica::default(),
            store_clock_ms: 0,
            store_clock_peak_ms: 0,
            notifications: 0,
            pods: Vec::new(),
            check: Checker::new(seed, cfg.core.shards),
            stats: SimStats::default(),
            callers: Vec::new(),
            flights: Vec::new(),
            reservations: HashMap::new(),
            keys: Keys::default(),
            sessions: Sessions::default(),
            retry_until: cfg.fault_end + settle(cfg),
            later: Ledger::default(),
            terminal_offline: Vec::new(),
            queue_waited: Duration::ZERO,
            failing_over: false,
            next_copy: 0,
            rng,
        };
        for _ in 0..cfg.initial_pods {
            let at = Duration::from_millis(w.rng.random_range(0..2_000));
            w.add_pod(at);
        }
        for (at, fault) in faults::plan(&mut w.rng, cfg) {
            w.schedule(at, Ev::Fault(fault));
        }
        w.plan_pushes(Duration::from_secs(2), cfg.fault_end);
        // Pushes with a TTL end (at most 10 s) a few seconds before the faults do.
        let later_until = cfg.fault_end.saturating_sub(Duration::from_secs(14));
        w.plan_later(Duration::from_secs(2), later_until);
        w
    }

    pub fn run(mut self) -> Result<SimStats, Violation> {
        while let Some(Reverse((at, _, idx))) = self.queue.pop() {
            if at > self.end() {
                break;
            }
            self.now = at;
            let ev = self.events[idx].take().expect("event taken once");
            self.stats.events += 1;
            if self.stats.events + 40 > MAX_EVENTS {
                self.check.log(at, format_args!("event {ev:?}"));
            }
            if self.stats.events > MAX_EVENTS {
                return Err(self
                    .check
                    .violation(at, "event limit reached (livelock?)".into()));
            }
            self.step(ev)?;
        }
        self.now = self.end();
        self.converged()?;
        self.later_converged()?;
        self.stats.later_pushes = self.later.keys.len() as u64;
        self.stats.invariant_checks = self.check.checks;
        self.stats.fenced_overlaps = self.check.fenced_overlaps;
        self.stats.refused_hellos = self.check.refused_hellos;
        self.stats.pushes = self.callers.len() as u64;
        self.stats.deduplicated = self.keys.deduplicated;
        self.stats.deduplicated_across_pods = self.keys.from_another_pod;
        self.stats.terminals_released = self.sessions.released;
        self.stats.terminals_unasked = self.sessions.unasked;
        self.stats.sessions_fenced = self.sessions.fenced;
        self.stats.unknown_predecessor = self.sessions.unknown_predecessor;
        self.stats.unannounced_drains = self.sessions.unannounced;
        self.stats.rollbacks_seen = self
            .pods
            .iter()
            .filter_map(|p| p.rec.as_ref())
            .map(Reconciler::rollbacks)
            .sum();
        Ok(self.stats)
    }

    fn schedule(&mut self, at: Duration, ev: Ev) {
        self.events.push(Some(ev));
        self.seq += 1;
        self.queue
            .push(Reverse((at, self.seq, self.events.len() - 1)));
    }

    fn latency(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(1_000..10_000))
    }

    fn local(&self, pod: usize) -> Instant {
        self.origin + self.now.mul_f64(self.pods[pod].rate)
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.pods.len())
            .filter(|&i| self.pods[i].alive && self.pods[i].rec.is_some())
            .collect()
    }

    fn step(&mut self, ev: Ev) -> Result<(), Violation> {
        match ev {
            Ev::Fault(f) => self.fault(f),
            Ev::StoreUp => {
                self.check.log(self.now, "store up");
                self.store_up = true;
                Ok(())
            }
            Ev::StoreUpWiped => {
                self.check.log(self.now, "store up, empty");
                self.wipe_store();
                self.store_up = true;
                Ok(())
            }
            Ev::FailedOver(failover, promoted) => {
                self.failed_over(failover, promoted);
                Ok(())
            }
            Ev::Arrive(pod, call) => self.arrive(pod, call),
            Ev::Resume(pod) => {
                self.check.log(self.now, format_args!("pod-{pod} resumed"));
                self.pods[pod].paused_until = None;
                for ev in std::mem::take(&mut self.pods[pod].deferred) {
                    self.deliver(pod, ev)?;
                }
                // Timers that fired during the pause fire now.
                self.pods[pod].wake_at = Some(self.now);
                self.deliver(pod, Ev::Wake(pod))
            }
            Ev::Heal(pod) => {
                self.pods[pod].partitioned = false;
                Ok(())
            }
            Ev::Start(pod) | Ev::Wake(pod) | Ev::Notify(pod) => self.deliver(pod, ev),
            Ev::Reply(pod, _) | Ev::Peers(pod, _) | Ev::StopAck(pod, _) | Ev::Stale(pod, ..) => {
                self.deliver(pod, ev)
            }
            Ev::Push(pod, _) => self.deliver(pod, ev),
            Ev::CallerSend(key) => {
                self.caller_send(key);
                Ok(())
            }
            Ev::CallerTimeout(key, attempt) => self.caller_hears(key, attempt, Heard::Unknown),
            Ev::CallerHears(key, attempt, heard) => self.caller_hears(key, attempt, heard),
            Ev::AtTerminal(flight, look, pod, epoch) => self.at_terminal(flight, look, pod, epoch),
            Ev::Session(ev) => self.session_event(ev),
            Ev::LaterSend(key) => {
                self.later_send(key);
                Ok(())
            }
            Ev::LaterHeard(key, generation) => {
                self.later_heard(key, generation);
                Ok(())
            }
            Ev::Later(pod, _) => self.deliver(pod, ev),
            Ev::LaterStore(pod, op) => self.later_store(pod, op),
            Ev::LaterAtTerminal(pod, copy, shard, key, epoch, left) => {
                self.later_at_terminal(pod, copy, shard, key, epoch, left)
            }
        }
    }

    /// Hands an event to a pod's reconciler, honouring crashes and pauses.
    fn deliver(&mut self, pod: usize, ev: Ev) -> Result<(), Violation> {
        let p = &mut self.pods[pod];
        if !p.alive {
            return Ok(());
        }
        if p.paused_until.is_some() {
            if !matches!(ev, Ev::Wake(_)) {
                p.deferred.push(ev);
            }
            return Ok(());
        }
        if let Ev::Wake(_) = ev {
            if p.wake_at != Some(self.now) {
                return Ok(()); // superseded
            }
            p.wake_at = None;
        }
        if self.check.tracing() && !matches!(ev, Ev::Wake(_)) {
            self.check
                .log(self.now, format_args!("pod-{pod} <- {ev:?}"));
        }
        if let Ev::Push(_, push) = ev {
            return self.push_event(pod, push);
        }
        if let Ev::Later(_, later) = ev {
            return self.later_event(pod, later);
        }
        let now = self.local(pod);
        let p = &mut self.pods[pod];
        if let Ev::Start(_) = ev {
            p.rec = Some(Reconciler::new(self.cfg.core.clone(), p.id.clone(), now));
            self.later_pod_started(pod);
        }
        let p = &mut self.pods[pod];
        let Some(rec) = p.rec.as_mut() else {
            return Ok(());
        };
        match ev {
            Ev::Start(_) | Ev::Wake(_) => rec.handle_timeout(now),
            Ev::Notify(_) => rec.handle_change_notification(now),
            Ev::Peers(_, report) => rec.handle_peer_report(now, report),
            Ev::StopAck(_, shard) => rec.handle_serving_stopped(now, shard),
            Ev::Stale(_, refused) => rec.handle_stale_epoch(now, refused),
            Ev::Reply(_, reply) => match reply {
                Reply::Heartbeat(r) => rec.handle_heartbeat(now, r),
                Reply::Snapshot(r) => rec.handle_snapshot(now, r),
                Reply::Acquire(s, r) => rec.handle_acquire(now, &s, r),
                Reply::Renew(s, r) => rec.handle_renew(now, &s, r),
                Reply::Release(s, r) => rec.handle_release(now, &s, r),
                Reply::Deregister(r) => rec.handle_deregister(now, r),
                Reply::Place(p, r) => rec.handle_place(now, p, r),
            },
            _ => unreachable!("not a pod event"),
        }
        self.perform(pod)?;
        self.check_exclusive(pod)?;
        self.schedule_wake(pod);
        Ok(())
    }

    fn perform(&mut self, pod: usize) -> Result<(), Violation> {
        while let Some(action) = self.pods[pod]
            .rec
            .as_mut()
            .and_then(Reconciler::poll_action)
        {
            if self.check.tracing() {
                self.check
                    .log(self.now, format_args!("pod-{pod} {action:?}"));
            }
            match action {
                Action::Heartbeat { generation } => self.send(pod, Call::Heartbeat(generation)),
                Action::Poll => self.send(pod, Call::Poll),
                Action::Acquire { generation, claims } => {
                    self.send(pod, Call::Acquire(generation, claims))
                }
                Action::Renew { generation, shards } => {
                    self.send(pod, Call::Renew(generation, shards))
                }
                Action::Release { releases } => self.send(pod, Call::Release(releases)),
                Action::Deregister => self.send(pod, Call::Deregister),
                Action::Place {
                    expected,
                    placement,
                } => self.send(pod, Call::Place(expected, placement)),
                Action::StartServing { shard, epoch } => {
                    let id = self.pods[pod].id.clone();
                    self.check
                        .log(self.now, format_args!("{id} serves {shard} epoch {epoch}"));
                    let known = self.pods[pod]
                        .rec
                        .as_ref()
                        .and_then(|r| r.lease(shard).cloned());
                    let hello = self
                        .check
                        .started(self.now, &id, shard, epoch, known.as_ref())?;
                    if hello == Hello::Refused {
                        let at = self.now + self.latency();
                        let refused = self.stale_epoch(shard, epoch);
                        self.schedule(at, Ev::Stale(pod, refused));
                    }
                    self.take_over_answers(pod, shard);
                    self.sessions_start(pod, shard, epoch)?;
                    self.later_start(pod, shard);
                    self.stats.handovers += 1;
                }
                Action::SuspendServing { shard, epoch } => {
                    self.check.log(
                        self.now,
                        format_args!("pod-{pod} suspends {shard} epoch {epoch}"),
                    );
                }
                Action::StopServing(Stop {
                    shard,
                    epoch,
                    reason,
                    close,
                }) => {
                    self.check.log(
                        self.now,
                        format_args!(
                            "pod-{pod} stops {shard} epoch {epoch} ({}, {close:?})",
                            reason.as_str()
                        ),
                    );
                    // Closing takes part of the close budget; draining only waits for
                    // the sends in flight, bounded by the least send budget's order.
                    let share = match close {
                        Close::Now => self.rng.random_range(0.0..0.5),
                        Close::Drain => self.rng.random_range(0.0..0.05),
                    };
                    self.sessions_stop(pod, shard, epoch, close == Close::Drain);
                    self.later_stop(pod, shard);
                    let close = self.cfg.core.close_budget.mul_f64(share);
                    self.schedule(self.now + close, Ev::StopAck(pod, shard));
                }
                Action::ProbePeers { peers } => {
                    let mut report = PeerReport::default();
                    for m in &peers {
                        let peer = self.pods.iter().find(|p| p.id == m.pod);
                        if let Some(peer) = peer.filter(|p| p.alive && p.paused_until.is_none()) {
                            report.answered += 1;
                            let reaches =
                                peer.rec.as_ref().is_some_and(Reconciler::store_reachable);
                            report.reaching += usize::from(reaches);
                        }
                    }
                    let at = self.now + self.latency();
                    self.schedule(at, Ev::Peers(pod, report));
                }
            }
        }
        let rec = self.pods[pod].rec.as_ref();
        if rec.is_some_and(Reconciler::is_finished) {
            self.check
                .log(self.now, format_args!("pod-{pod} finished shutdown"));
            self.pods[pod].alive = false;
            // It lingers for its drains, but walks nothing any more.
            self.sessions_finished(pod);
        }
        Ok(())
    }

    fn send(&mut self, pod: usize, call: Call) {
        if self.pods[pod].partitioned || !self.store_up {
            let at = self.now + STORE_TIMEOUT;
            self.schedule(at, Ev::Reply(pod, failed(call)));
        } else {
            let at = self.now + self.latency();
            self.schedule(at, Ev::Arrive(pod, call));
        }
    }

    fn schedule_wake(&mut self, pod: usize) {
        let Some(next) = self.pods[pod]
            .rec
            .as_ref()
            .and_then(Reconciler::poll_timeout)
        else {
            return;
        };
        let local = next.saturating_duration_since(self.origin);
        // Round up so the pod's clock has reached `next` when it wakes.
        let at = Duration::from_secs_f64(local.as_secs_f64() / self.pods[pod].rate)
            + Duration::from_micros(1);
        let at = at.max(self.now);
        if self.pods[pod]
            .wake_at
            .is_none_or(|w| at < w || w < self.now)
        {
            self.pods[pod].wake_at = Some(at);
            self.schedule(at, Ev::Wake(pod));
        }
    }
}

// The end-of-run check: once faults stop and the settle time passes, the stored
// placement is a balanced table over exactly the live pods, every shard is served
// by exactly its pod, and each of its terminals has exactly one session, with that pod.

/// How long a run goes on after the faults end: long enough for every shard to settle
/// on its assigned pod.
fn settle(cfg: &SimConfig) -> Duration {
    cfg.core.lease_ttl.max(cfg.core.member_ttl) + Duration::from_secs(3)
}

impl World<'_> {
    /// When the run ends and convergence is judged: [`settle`] after the faults, plus
    /// how far the store's clock is behind true time (a failover to a replica whose
    /// clock lags keeps every TTL alive that much longer: liveness is the store's).
    pub(super) fn end(&self) -> Duration {
        let lag = Duration::from_millis(self.store_clock_ms.min(0).unsigned_abs());
        self.cfg.fault_end + settle(self.cfg) + lag
    }

    /// After faults stop and the settle time passes: the stored placement is a balanced
    /// table over exactly the live pods, and each shard is served by exactly its pod.
    pub(super) fn converged(&mut self) -> Result<(), Violation> {
        let alive = self.alive();
        let mut ids: Vec<PodId> = alive.iter().map(|&p| self.pods[p].id.clone()).collect();
        ids.sort();
        let shards = self.cfg.core.shards;
        let assignment = match self.store.placement() {
            Some(p) if p.assignment.pods() == ids.as_slice() => p.assignment.clone(),
            other => {
                let pods = other.map(|p| p.assignment.pods().to_vec());
                return Err(self.check.violation(
                    self.now,
                    format!("not converged: placement for {pods:?}, live pods {ids:?}"),
                ));
            }
        };
        let n = ids.len().max(1);
        let (lo, hi) = (shards as usize / n, (shards as usize).div_ceil(n));
        if let Some(p) = ids
            .iter()
            .find(|p| !(lo..=hi).contains(&assignment.load_of(p)))
        {
            let load = assignment.load_of(p);
            return Err(self.check.violation(
                self.now,
                format!("unbalanced placement: {p} holds {load}, not {lo}..={hi}"),
            ));
        }
        for shard in 0..self.cfg.core.shards {
            let servers: Vec<PodId> = alive
                .iter()
                .filter(|&&p| {
                    let now = self.local(p);
                    self.pods[p]
                        .rec
                        .as_ref()
                        .is_some_and(|r| r.serving(shard, now).is_some())
                })
                .map(|&p| self.pods[p].id.clone())
                .collect();
            let want = assignment.owner(shard).cloned();
            if servers.len() != 1 || Some(&servers[0]) != want.as_ref() {
                return Err(self.check.violation(
                    self.now,
                    format!(
                        "not converged: shard {shard} assigned to {want:?}, served by {servers:?}"
                    ),
                ));
            }
            let owner = self.pods.iter().position(|p| p.id == servers[0]);
            let owner = owner.expect("a live pod");
            let now = self.local(owner);
            let rec = self.pods[owner].rec.as_ref();
            let epoch = rec.and_then(|r| r.serving(shard, now)).expect("served");
            self.sessions_converged(shard, owner, epoch)?;
        }
        Ok(())
    }
}
