//! A planned move, per terminal, at the pod that takes a shard over: before it dials a
//! terminal it asks the shard's previous owner (its *predecessor*, still holding the
//! session as draining) to close it, and dials only once that is answered. So a moved
//! terminal is without a connection for about one close and one dial, never for the
//! whole shard's turn in the dial queue, and never has two sessions at once.
//!
//! The [`Walk`] task of a taken-over shard gets each new link's [`Gate`] in directory
//! order (by id) and opens the gates a batch at a time: it takes one slot of the pod-wide walk
//! window per terminal (held until the link's dial is admitted by the pacer, so the
//! terminals closed ahead of their dial stay few, pod-wide), asks the predecessor to
//! release the batch, and opens the gates with the answer. A push waiting for a
//! terminal whose gate is shut makes it urgent: it goes in the next batch, ahead of the
//! rest. Whatever goes wrong (the predecessor is unreachable, slow, of an earlier
//! release, or not draining the shard), the walk falls back to today's path: every
//! remaining gate opens and the terminals are dialed at the pacer's rate; a session the
//! predecessor still has is then fenced by the terminal on our newer hello.
//!
//! Until the walk reached a terminal, its session is still the predecessor's: a push for
//! it may be relayed there (by the push layer, through
//! [`TerminalLink::draining_at`](super::manager::TerminalLink::draining_at)), which the
//! predecessor sends on that session ([`ConnectionManager::draining_session`]).
//!
//! Both ends of the handover belong to this layer: the successor's walk asks through a
//! [`Predecessor`] (the peer client is one: the signed calls of `peer::wire`), and the
//! predecessor answers through [`Handovers`] (the connection manager is one), which the
//! peer endpoints and the shutdown call.
//!
//! Not for: draining the predecessor's sessions (the manager's `drain`), the transport
//! (`crate::peer`), or pacing the dials (`pacer`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use futures::FutureExt;

use super::link::LinkShared;
use super::manager::ConnectionManager;
use crate::core::membership::{Member, HANDOVER_RELAY};
use crate::core::ShardId;
use crate::metrics::Metrics;
use crate::peer::{PeerClient, PeerTarget};
use crate::rate_log::RateLog;
use crate::status::PodStatus;
use crate::store::directory::Directory;

/// `--drain-budget`'s default: how long a shard handed over keeps its sessions for the
/// new owner to ask for. A pod under SIGTERM stays up until its shards' new owners have
/// asked for their terminals, at most this long from the start of its shutdown:
/// `k8s/base/deployment.yaml`'s grace period covers it.
pub const DEFAULT_DRAIN_BUDGET: Duration = Duration::from_secs(15);

/// Bound of one request asking a shard's previous owner to release terminals: it closes
/// a handful of sessions, normally in milliseconds. Past it (a crashed, paused or
/// partitioned predecessor) the rest of the shard is dialed normally, so a takeover
/// after a crash waits at most this long more.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// Most terminals one release request names. Also bounds what a peer may ask a pod to
/// close with one request (`peer::wire`).
pub const MAX_RELEASE_BATCH: usize = 64;

/// What a predecessor answered to a release request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// It drains the shard and has closed the named terminals' sessions (`closed` of
    /// them had one; the others had none to close).
    Closed { closed: usize },
    /// It does not drain the shard (never had it, closed it already, or still serves
    /// it): nothing to wait for.
    NotDraining,
}

/// Why a release request got no usable answer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReleaseFailed(pub String);

/// How the successor talks to its predecessor: the signed peer calls
/// (`POST /internal/v1/release-terminals/{shard}`, `POST /internal/v1/draining/{shard}`)
/// of [`PeerClient`], or a test's stand-in.
pub trait Predecessor: Send + Sync + 'static {
    /// Asks `from` to close `terminals` of `shard`, answering within `timeout`.
    fn release(
        &self,
        from: &Member,
        shard: ShardId,
        terminals: Vec<String>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Released, ReleaseFailed>>;

    /// Tells `to` that this pod drains `shard`, so that whoever acquires it next asks
    /// this pod first; `Ok` once `to` recorded it.
    fn announce(
        &self,
        to: &Member,
        shard: ShardId,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<(), ReleaseFailed>>;
}

/// The predecessor's side: what the peer endpoints and the shutdown need of the
/// connection layer while a pod drains shards it handed over.
pub trait Handovers: Send + Sync + 'static {
    /// The pod that took `shard` over asks for `terminals`.
    fn release_terminals(
        &self,
        shard: ShardId,
        terminals: Vec<String>,
    ) -> BoxFuture<'static, Released>;
    /// Resolves once no shard handed over still drains here.
    fn drained(&self) -> BoxFuture<'static, ()>;
    /// A member announced it drains `shard`; `false` when nothing here walks.
    fn expect_predecessor(&self, shard: ShardId, from: Member) -> bool;
}

impl<D: Directory> Handovers for ConnectionManager<D> {
    fn release_terminals(
        &self,
        shard: ShardId,
        terminals: Vec<String>,
    ) -> BoxFuture<'static, Released> {
        ConnectionManager::release_terminals(self, shard, terminals).boxed()
    }

    fn drained(&self) -> BoxFuture<'static, ()> {
        ConnectionManager::drained(self).boxed()
    }

    fn expect_predecessor(&self, shard: ShardId, from: Member) -> bool {
        ConnectionManager::expect_predecessor(self, shard, from)
    }
}

/// A pod without a connection layer (coordination-only pods and tests): it never drains.
#[derive(Debug, Default)]
pub struct NoHandovers;

impl Handovers for NoHandovers {
    fn release_terminals(
        &self,
        _shard: ShardId,
        _terminals: Vec<String>,
    ) -> BoxFuture<'static, Released> {
        std::future::ready(Released::NotDraining).boxed()
    }

    fn drained(&self) -> BoxFuture<'static, ()> {
        std::future::ready(()).boxed()
    }

    fn expect_predecessor(&self, _shard: ShardId, _from: Member) -> bool {
        false
    }
}

/// The successor asks its predecessor with the signed peer calls
/// (`peer::wire::RELEASE_TERMINALS_ROUTE`, `peer::wire::DRAINING_ROUTE`).
impl Predecessor for PeerClient {
    fn release(
        &self,
        from: &Member,
        shard: ShardId,
        terminals: Vec<String>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Released, ReleaseFailed>> {
        let (peers, target) = (self.clone(), PeerTarget::from(from));
        async move {
            let answer = peers
                .release_terminals(&target, shard, terminals, timeout)
                .await
                .map_err(|e| ReleaseFailed(e.to_string()))?;
            Ok(if answer.draining {
                Released::Closed {
                    closed: answer.closed,
                }
            } else {
                Released::NotDraining
            })
        }
        .boxed()
    }

    fn announce(
        &self,
        to: &Member,
        shard: ShardId,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<(), ReleaseFailed>> {
        let (peers, target) = (self.clone(), PeerTarget::from(to));
        async move {
            peers
                .announce_draining(&target, shard, timeout)
                .await
                .map_err(|e| ReleaseFailed(format!("{}: {e}", target.pod)))
        }
        .boxed()
    }
}

/// Pod-wide settings of the walks.
#[derive(Clone)]
pub struct WalkConfig {
    pub predecessor: Arc<dyn Predecessor>,
    /// This pod and the members of its last poll: whom a drain is announced to.
    pub status: watch::Receiver<PodStatus>,
    /// Terminals asked for but not yet admitted to a dial, pod-wide: about 65 ms of
    /// dials. A release takes about 50 ms (the peer round trip, the close, the 30 ms
    /// settle), so the asks keep just ahead of the pacer: the walk dials at the pod's
    /// dial rate, and a released terminal waits only a little for its turn.
    pub window: Arc<Semaphore>,
    /// Bound of one release request (the predecessor closes within its close budget).
    pub timeout: Duration,
    /// Lines about predecessors that did not answer: after a crash, every shard of the
    /// dead pod's walk finds it gone at once, which is one event, not a warning each.
    pub unanswered: Arc<RateLog>,
}

impl WalkConfig {
    /// Announces that this pod drains `shard` to every other member; `true` when all of
    /// them recorded it (none to tell counts as told).
    pub(super) async fn announce(&self, shard: ShardId) -> bool {
        let (me, others) = {
            let status = self.status.borrow();
            let me = status.pod.clone();
            let others: Vec<Member> = status
                .members
                .iter()
                .filter(|m| Some(&m.pod) != me.as_ref())
                .cloned()
                .collect();
            (me, others)
        };
        if me.is_none() {
            return false;
        }
        let told = others
            .iter()
            .map(|m| self.predecessor.announce(m, shard, self.timeout));
        let answers = futures::future::join_all(told).await;
        match answers.iter().find_map(|a| a.as_ref().err()) {
            None => true,
            Some(e) => {
                warn!(shard, error = %e, "could not announce the drain to every member; closing the shard instead");
                false
            }
        }
    }
}

impl WalkConfig {
    /// A window of `dial_rate / 15` (at least 1, at most a batch). `/ 20` (50 ms)
    /// left the asks, not the pacer, setting the pace: a 50k rolling restart took 4%
    /// longer than closing whole shards; `/ 10` (100 ms) doubled the dark time while
    /// released terminals queued at the pacer (the commit that set `/ 15` has the
    /// runs; today's rolling-restart figures are in `docs/performance.md`).
    pub fn new(
        predecessor: Arc<dyn Predecessor>,
        status: watch::Receiver<PodStatus>,
        dial_rate: u32,
        timeout: Duration,
    ) -> Self {
        let window = (dial_rate as usize / 15).clamp(1, MAX_RELEASE_BATCH);
        WalkConfig {
            predecessor,
            status,
            window: Arc::new(Semaphore::new(window)),
            timeout,
            unanswered: Arc::default(),
        }
    }
}

impl std::fmt::Debug for WalkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalkConfig")
            .field("window", &self.window.available_permits())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A link's leave to dial for the first time, given by the walk.
#[derive(Debug)]
pub(super) struct Gate {
    id: String,
    open: oneshot::Receiver<Opened>,
    walk: mpsc::UnboundedSender<Input>,
}

/// How a gate opened.
#[derive(Debug)]
pub(super) enum Opened {
    /// The predecessor closed the terminal's session (asked at `asked`); the slot of
    /// the walk window is held until the dial is admitted.
    Released {
        asked: Instant,
        _slot: OwnedSemaphorePermit,
    },
    /// The walk fell back: dial as if there were no predecessor.
    Fallback,
}

impl Gate {
    /// Waits until the walk opens the gate; a push starting to wait meanwhile makes the
    /// terminal urgent (once). A walk that is gone (its shard stopped) opens every gate
    /// it held: the link is being removed anyway, or dials normally.
    pub(super) async fn wait(mut self, shared: &LinkShared) -> Opened {
        let mut told = false;
        loop {
            tokio::select! {
                opened = &mut self.open => return opened.unwrap_or(Opened::Fallback),
                () = shared.woken(), if !told => {
                    if shared.urgent() {
                        told = true;
                        let _ = self.walk.send(Input::Urgent(self.id.clone()));
                    }
                }
            }
        }
    }
}

/// What the walk task hears.
#[derive(Debug)]
pub(super) enum Input {
    /// A new link waits at its gate, in directory order.
    Add(String, oneshot::Sender<Opened>),
    /// A push waits for this terminal.
    Urgent(String),
}

/// The manager's handle on a taken-over shard's walk. Dropping it (the shard stopped)
/// ends the walk.
#[derive(Debug)]
pub(super) struct Walk {
    tx: mpsc::UnboundedSender<Input>,
    /// Dropped with the handle: the walk asks for nothing more (gates hold `tx`).
    _stop: oneshot::Sender<()>,
    /// Who is asked, and how: kept for a drain that cuts the walk short, and shared
    /// with every push's lookup while the walk lasts ([`Walk::relay`]).
    cfg: WalkConfig,
    from: Arc<Member>,
}

impl Walk {
    /// Ends the walk, keeping whom it asked: a shard handed on before its walk finished
    /// still owes its predecessor's sessions a release ([`Chain::release`]).
    pub(super) fn stop(self) -> Chain {
        Chain {
            cfg: self.cfg,
            from: self.from,
        }
    }
}

/// The predecessor of a shard handed on before its walk finished. Terminals the walk
/// had not reached have no session here, but may still have one at the predecessor:
/// before saying they are released, the pod asks the predecessor to release them too,
/// so the next owner never dials a terminal whose session is open two handovers back.
#[derive(Clone, Debug)]
pub(super) struct Chain {
    cfg: WalkConfig,
    from: Arc<Member>,
}

impl Chain {
    /// Asks the predecessor to release `terminals` of `shard`; failures only logged
    /// (the next owner's newer epoch then fences whatever session is left).
    pub(super) async fn release(&self, shard: ShardId, terminals: Vec<String>) {
        let asked = self
            .cfg
            .predecessor
            .release(&self.from, shard, terminals, self.cfg.timeout)
            .await;
        if let Err(e) = asked {
            warn!(shard, from = %self.from.pod, error = %e, "could not pass a release on to the shard's previous owner");
        }
    }
}

impl Walk {
    /// Starts the walk of `shard` from `from`.
    pub(super) fn start(
        cfg: WalkConfig,
        shard: ShardId,
        from: Member,
        metrics: Arc<Metrics>,
    ) -> Walk {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop_tx, stop) = oneshot::channel();
        let kept = (cfg.clone(), Arc::new(from.clone()));
        tokio::spawn(
            Walker {
                cfg,
                shard,
                from,
                metrics,
                queue: VecDeque::new(),
                urgent: VecDeque::new(),
                gates: HashMap::new(),
                fallen_back: None,
            }
            .run(rx, stop),
        );
        Walk {
            tx,
            _stop: stop_tx,
            cfg: kept.0,
            from: kept.1,
        }
    }

    /// The predecessor a push may be relayed through while a terminal waits at its gate
    /// (see [`HANDOVER_RELAY`]); `None` if it does not relay.
    pub(super) fn relay(&self) -> Option<Arc<Member>> {
        (self.from.handover >= HANDOVER_RELAY).then(|| self.from.clone())
    }

    /// The gate of a new link for `id`.
    pub(super) fn gate(&self, id: &str) -> Gate {
        let (open_tx, open) = oneshot::channel();
        let _ = self.tx.send(Input::Add(id.to_string(), open_tx));
        Gate {
            id: id.to_string(),
            open,
            walk: self.tx.clone(),
        }
    }
}

struct Walker {
    cfg: WalkConfig,
    shard: ShardId,
    from: Member,
    metrics: Arc<Metrics>,
    /// Terminals not asked for yet, in directory order.
    queue: VecDeque<String>,
    /// Terminals a push waits for, first come first asked.
    urgent: VecDeque<String>,
    gates: HashMap<String, oneshot::Sender<Opened>>,
    /// Why the walk gave up asking, once it did: every gate opens at once from then on.
    fallen_back: Option<&'static str>,
}

impl Walker {
    async fn run(self, rx: mpsc::UnboundedReceiver<Input>, mut stop: oneshot::Receiver<()>) {
        let shard = self.shard;
        tokio::select! {
            () = self.walk(rx) => {}
            _ = &mut stop => debug!(shard, "walk stopped with its shard"),
        }
    }

    async fn walk(mut self, mut rx: mpsc::UnboundedReceiver<Input>) {
        let started = Instant::now();
        let mut released = 0usize;
        loop {
            while let Ok(input) = rx.try_recv() {
                self.take(input);
            }
            if self.fallen_back.is_some() {
                self.open_all();
            }
            if self.gates.is_empty() {
                match rx.recv().await {
                    Some(input) => {
                        self.take(input);
                        continue;
                    }
                    // The shard stopped (its walk handle and every gate are gone).
                    None => break,
                }
            }
            // One slot per terminal: the first is waited for, the rest taken if free.
            let first = tokio::select! {
                slot = self.cfg.window.clone().acquire_owned() => slot.expect("never closed"),
                input = rx.recv() => match input {
                    Some(input) => { self.take(input); continue; }
                    None => break,
                },
            };
            let mut slots = vec![first];
            let batch = self.next_batch(&mut slots);
            if batch.is_empty() {
                continue;
            }
            let asked = Instant::now();
            let answer = self
                .cfg
                .predecessor
                .release(&self.from, self.shard, batch.clone(), self.cfg.timeout)
                .await;
            let outcome = match &answer {
                Ok(Released::Closed { .. }) => "released",
                Ok(Released::NotDraining) => "not_draining",
                Err(_) => "failed",
            };
            self.metrics
                .handover_releases
                .get_or_create(&[("outcome", outcome)])
                .inc();
            match answer {
                Ok(Released::Closed { closed }) => {
                    released += closed;
                    for (id, slot) in batch.into_iter().zip(slots) {
                        self.open(&id, Opened::Released { asked, _slot: slot });
                    }
                }
                Ok(Released::NotDraining) => {
                    debug!(shard = self.shard, from = %self.from.pod, "predecessor does not drain the shard; dialing normally");
                    self.fall_back("not_draining", batch);
                }
                Err(e) => {
                    // A crashed predecessor (the usual reason) is expected: one line a
                    // second for all shards, the count in
                    // posgate_handover_releases_total{outcome="failed"}.
                    let now = Instant::now();
                    if let Some(suppressed) = self.cfg.unanswered.admit("predecessor", now) {
                        info!(
                            shard = self.shard, from = %self.from.pod, error = %e, suppressed,
                            "predecessor did not release terminals (gone, or not answering); \
                             dialing them normally"
                        );
                    }
                    self.fall_back("failed", batch);
                }
            }
        }
        info!(
            shard = self.shard, from = %self.from.pod, released,
            fallback = self.fallen_back.unwrap_or("none"),
            secs = started.elapsed().as_secs_f64(), "handover walk ended"
        );
    }

    fn take(&mut self, input: Input) {
        match input {
            Input::Add(id, gate) => {
                // A replaced link (its address changed) has a new gate; its place in
                // the queue stands for the new one (the old link is being removed).
                if self.gates.insert(id.clone(), gate).is_none() {
                    self.queue.push_back(id);
                    self.metrics.handover_waiting.inc();
                }
            }
            Input::Urgent(id) => {
                if self.gates.contains_key(&id) {
                    self.urgent.push_back(id);
                }
            }
        }
    }

    /// Up to one terminal per slot in `slots` (taking more while the window has them),
    /// urgent ones first; gates whose link is gone are dropped on the way.
    fn next_batch(&mut self, slots: &mut Vec<OwnedSemaphorePermit>) -> Vec<String> {
        let mut batch = Vec::new();
        while batch.len() < MAX_RELEASE_BATCH {
            let Some(id) = self.urgent.pop_front().or_else(|| self.queue.pop_front()) else {
                break;
            };
            match self.gates.get(&id) {
                // Asked for already (urgent, and still queued), or its link is gone.
                None => continue,
                _ if batch.contains(&id) => continue,
                Some(gate) if gate.is_closed() => {
                    self.gates.remove(&id);
                    self.metrics.handover_waiting.dec();
                    continue;
                }
                Some(_) => {}
            }
            if batch.len() == slots.len() {
                match self.cfg.window.clone().try_acquire_owned() {
                    Ok(slot) => slots.push(slot),
                    Err(_) => {
                        self.queue.push_front(id);
                        break;
                    }
                }
            }
            batch.push(id);
        }
        slots.truncate(batch.len());
        batch
    }

    fn open(&mut self, id: &str, opened: Opened) {
        if let Some(gate) = self.gates.remove(id) {
            self.metrics.handover_waiting.dec();
            let _ = gate.send(opened);
        }
    }

    fn fall_back(&mut self, why: &'static str, batch: Vec<String>) {
        self.fallen_back.get_or_insert(why);
        for id in batch {
            self.open(&id, Opened::Fallback);
        }
        self.open_all();
    }

    fn open_all(&mut self) {
        let ids: Vec<String> = self.gates.keys().cloned().collect();
        for id in ids {
            self.open(&id, Opened::Fallback);
        }
        self.queue.clear();
        self.urgent.clear();
    }
}

impl Drop for Walker {
    fn drop(&mut self) {
        // Gates still shut when the shard stopped: no longer waiting.
        for _ in self.gates.drain() {
            self.metrics.handover_waiting.dec();
        }
    }
}
