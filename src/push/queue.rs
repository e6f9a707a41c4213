//! Pushes that wait for their terminal, on the owner: the drain. For every terminal of a
//! shard this pod serves that has pushes not yet final in the store
//! (`crate::store::queue`), one task sends them one at a time, in acceptance order,
//! right after the terminal's hello, and records each outcome.
//!
//! A copy leaves only after three things: the delivery rule says it is due
//! ([`crate::core::delivery`]: served here, the session's epoch, not expired, a lost
//! answer still within the terminal's dedup window), the pod-wide drain pace
//! (`--queue-drain-rate`) lets it, and the store accepted its **mark** (the record moves
//! to `sending`, checked against the shard's lease and epoch, with the time of the
//! first copy whose answer is missing). Then the terminal's answer decides: 2xx
//! `delivered`; `409`, `421`, `428` or `5xx` "not taken, try again" (the record goes
//! back to what it was before the mark); another status `rejected`; no answer leaves it
//! `sending`, and the next copy goes only while the rule allows, else `unknown`.
//!
//! What the terminal sees when two pods disagree: only a lease holder with its current
//! epoch can mark, so a pod that lost the shard sends nothing new; a copy it marked
//! before and that arrives after the new owner's hello is refused by epoch; one that
//! arrived first and was taken is a key the new owner's copy repeats within the
//! terminal's window, answered as a duplicate (`delivered` with `duplicate`), never
//! acted on twice.
//!
//! Wake-ups: the shard starting here (its terminals with waiting pushes are read), a
//! push queued by this pod (whatever its store call answered: a lost answer may hide a
//! write that happened), a store notification of one queued by a pod that does not hold
//! the shard, each terminal's own timers (expiry, the window), and every 30 s a read of
//! the waiting terminals of the next 64 served shards, so a lost wake-up delays a push by
//! 30 s per 64 shards served at most.
//!
//! Not for: accepting a push (`route`, `owner`), or the store's rules (`store::queue`).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{HeaderValue, StatusCode};
use tokio::sync::{broadcast, mpsc, watch, Notify};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::Sessions;
use crate::clock::now;
use crate::core::delivery::{self, Moment, QueueRules, Step, Verdict, WallMs};
use crate::core::lease::StaleEpoch;
use crate::core::{Epoch, PodId, ShardId};
use crate::metrics::Metrics;
use crate::pos::manager::{Lookup, TerminalLink};
use crate::pos::push::{self as pos_push, Answered, PushFailure};
use crate::pos::wire::{PosPush, Queued, Receipt};
use crate::serving::{ServingHook, ServingTable};
use crate::store::queue::{
    push_id, Change, Limits, QueueStore, Record, State, Wakeup, Write, Written,
};
use crate::store::StoreError;

/// [`crate::core::membership::Member::queue`] of a pod that keeps pushes for later.
pub const QUEUE_CAPABILITY: u32 = 1;

/// How far two pods' wall clocks may disagree (NTP keeps them within milliseconds): a
/// queued push leaves only while `now + CLOCK_SKEW` is before its expiry, which another
/// pod fixed. See `docs/operations.md` for what a wider skew does.
pub const CLOCK_SKEW: Duration = Duration::from_millis(500);
/// How long one queued copy waits for the terminal's answer: the same as a push's
/// default deadline would give a live one, twice over.
pub const COPY_TIMEOUT: Duration = Duration::from_secs(10);
/// First pause after a copy the terminal did not take or answer, doubled each time up
/// to [`MAX_RETRY_PAUSE`].
const RETRY_PAUSE: Duration = Duration::from_millis(500);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(30);
/// How often a pod reads the waiting terminals of the shards it serves (one store call,
/// at most [`WAITING_SCAN_SHARDS`] of them, the next ones at the next scan), in case a
/// wake-up was lost.
const WAITING_SCAN: Duration = Duration::from_secs(30);
/// How many shards one scan reads: each costs Redis a command, so a pod serving more
/// (hundreds, with 1,024 shards and few pods) takes several scans to cover them all
/// rather than making Redis's load grow with the shard count.
const WAITING_SCAN_SHARDS: usize = 64;
/// How often the queue's gauges are set from what the drains read.
const GAUGE_EVERY: Duration = Duration::from_secs(1);
/// Pause while the shard is not served for a moment (a lease renewed late): only the
/// shard's stop ends a drain.
const LAPSE_PAUSE: Duration = Duration::from_millis(200);
/// Pause after a failed store call, doubled up to [`MAX_RETRY_PAUSE`].
const STORE_PAUSE: Duration = Duration::from_millis(100);
/// Longest a shard's stop waits for its drains to record what they sent: a drain in
/// the middle of a copy holds the shard's sending guard, which the connection layer
/// waits for anyway.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The queue's flags (`posgate serve --queue-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// `--queue-max-ttl`: the longest TTL a push may ask for.
    pub max_ttl: Duration,
    /// The store's bounds: `--queue-max-per-terminal`, `--queue-max-tenant-bytes`,
    /// `--queue-max-bytes`, `--queue-retention`.
    pub limits: Limits,
    /// `--queue-drain-rate`: queued copies this pod sends per second, at most.
    pub drain_rate: NonZeroU32,
    /// How long one queued copy waits for its answer ([`COPY_TIMEOUT`]; not a flag).
    pub copy_timeout: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_ttl: Duration::from_secs(7 * 24 * 3600),
            limits: Limits {
                per_terminal: 100,
                tenant_bytes: 64 << 20,
                cluster_bytes: 256 << 20,
                retention_ms: 3_600_000,
            },
            drain_rate: NonZeroU32::new(500).expect("non-zero"),
            copy_timeout: COPY_TIMEOUT,
        }
    }
}

/// This pod's wall clock, ms since the Unix epoch: expiries and first-copy times are
/// wall-clock values other pods judge.
pub fn wall_ms() -> WallMs {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the drain told the pod's serving hook about.
enum Served {
    Start(ShardId),
    Stop(ShardId, tokio::sync::oneshot::Sender<()>),
}

/// The serving hook of the drain: starts and stops each shard's drains with the shard.
pub struct QueueHook {
    tx: mpsc::UnboundedSender<Served>,
    /// Whether the pod has a queue store ([`QUEUE_CAPABILITY`] in its registration).
    capable: bool,
}

/// The other end of a [`QueueHook`], for [`Drains::run`].
pub struct QueueEvents(mpsc::UnboundedReceiver<Served>);

/// A hook and its other end; `capable` when the pod has a queue store.
pub fn hook(capable: bool) -> (QueueHook, QueueEvents) {
    let (tx, rx) = mpsc::unbounded_channel();
    (QueueHook { tx, capable }, QueueEvents(rx))
}

impl ServingHook for QueueHook {
    fn start(&self, shard: ShardId, _epoch: Epoch) {
        let _ = self.tx.send(Served::Start(shard));
    }

    fn stop(
        &self,
        stop: crate::core::reconciler::Stop,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (done, stopped) = tokio::sync::oneshot::channel();
        let sent = self.tx.send(Served::Stop(stop.shard, done)).is_ok();
        async move {
            if sent {
                let _ = tokio::time::timeout(STOP_WAIT * 2, stopped).await;
            }
        }
    }

    fn queue(&self) -> u32 {
        if self.capable {
            QUEUE_CAPABILITY
        } else {
            0
        }
    }
}

/// One running terminal drain, as its shard keeps it.
struct Running {
    wake: Arc<Notify>,
    /// Bumped by every wake-up, so a drain that found its queue empty knows whether
    /// something came in since it looked.
    wakes: Arc<AtomicU64>,
    /// What it last read: pushes not final, their bytes, the oldest's acceptance time,
    /// whether its terminal had a session then.
    seen: Arc<Mutex<Seen>>,
}

/// What a terminal drain last read of its queue (for the metrics).
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    pub pushes: u64,
    pub bytes: u64,
    pub oldest_ms: Option<WallMs>,
    pub connected: bool,
}

/// The drains of one served shard.
struct ShardDrains {
    terminals: HashMap<String, Running>,
    tasks: JoinSet<()>,
    stop: watch::Sender<bool>,
}

/// The pod's drains. Cheap to share behind an `Arc`.
pub struct Drains {
    pod: PodId,
    store: Arc<dyn QueueStore>,
    serving: ServingTable,
    sessions: Arc<dyn Sessions>,
    settings: QueueConfig,
    rules: QueueRules,
    push_path: String,
    pace: DefaultDirectRateLimiter,
    shards: Mutex<HashMap<ShardId, ShardDrains>>,
    /// Pushes a request waits for (by push id): the drain publishes each change.
    waiters: Mutex<HashMap<String, watch::Sender<Record>>>,
    /// Bumped when this pod records a final state: feed readers look again.
    finals: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Drains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drains")
            .field("pod", &self.pod)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the drain does after one step.
enum Next {
    Again,
    Stop,
}

/// Whether a terminal's non-2xx answer says the copy was not taken because of its
/// session (`421` superseded, `428` no hello with this epoch): the protocol's checks
/// before it looks at the push. Sent again as if never sent.
pub(super) fn not_taken(status: StatusCode) -> bool {
    matches!(status.as_u16(), 421 | 428)
}

/// Whether a terminal's non-2xx answer is an error of a moment (`5xx`, a `409` without
/// `posgate-stale-epoch`): sent again later, but only within the terminal's window, as
/// after a lost answer, because nothing says the terminal did not act on it. Any other
/// status is its final refusal (`rejected`).
pub(super) fn try_later(status: StatusCode) -> bool {
    status.as_u16() == 409 || status.is_server_error()
}

impl Drains {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pod: PodId,
        store: Arc<dyn QueueStore>,
        serving: ServingTable,
        sessions: Arc<dyn Sessions>,
        settings: QueueConfig,
        window: Duration,
        push_path: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        let quota = Quota::per_second(settings.drain_rate).allow_burst(settings.drain_rate);
        Drains {
            pod,
            store,
            serving,
            sessions,
            rules: QueueRules {
                window,
                skew: CLOCK_SKEW,
                copy_timeout: settings.copy_timeout,
            },
            settings,
            push_path,
            pace: RateLimiter::direct(quota),
            shards: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
            finals: watch::channel(0).0,
            metrics,
        }
    }

    pub fn store(&self) -> &Arc<dyn QueueStore> {
        &self.store
    }

    pub fn settings(&self) -> &QueueConfig {
        &self.settings
    }

    pub fn rules(&self) -> &QueueRules {
        &self.rules
    }

    /// Follows the serving hook's starts and stops and the store's wake-ups until the
    /// hook is dropped.
    pub async fn run(self: Arc<Self>, mut events: QueueEvents) {
        let mut wakeups = self.store.wakeups();
        let mut gauges = tokio::time::interval(GAUGE_EVERY);
        let mut scan = tokio::time::interval(WAITING_SCAN);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut scan_from: ShardId = 0;
        loop {
            tokio::select! {
                _ = gauges.tick() => self.set_gauges(),
                _ = scan.tick() => scan_from = self.clone().scan(scan_from),
                event = events.0.recv() => match event {
                    Some(Served::Start(shard)) => self.start(shard),
                    Some(Served::Stop(shard, done)) => {
                        let drains = self.clone();
                        tokio::spawn(async move {
                            drains.stop(shard).await;
                            let _ = done.send(());
                        });
                    }
                    None => return,
                },
                woken = wakeups.recv() => match woken {
                    Ok(Wakeup::Terminal(shard, terminal)) => self.wake(shard, &terminal),
                    // News for the broadcasts, not for a drain.
                    Ok(Wakeup::Broadcast) => {}
                    // Missed or resubscribed: every shard looks again.
                    Ok(Wakeup::All) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        let shards: Vec<ShardId> = lock(&self.shards).keys().copied().collect();
                        for shard in shards {
                            self.start(shard);
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        wakeups = self.store.wakeups();
                        tokio::time::sleep(STORE_PAUSE).await;
                    }
                },
            }
        }
    }

    /// `shard` is served here: read its terminals with waiting pushes and drain each.
    fn start(self: &Arc<Self>, shard: ShardId) {
        let mut stop = {
            let mut shards = lock(&self.shards);
            let entry = shards.entry(shard).or_insert_with(|| ShardDrains {
                terminals: HashMap::new(),
                tasks: JoinSet::new(),
                stop: watch::channel(false).0,
            });
            entry.stop.subscribe()
        };
        let drains = self.clone();
        tokio::spawn(async move {
            let mut pause = STORE_PAUSE;
            let shards = [shard];
            loop {
                let read = tokio::select! {
                    read = drains.store.waiting(&shards) => read,
                    _ = stop.wait_for(|s| *s) => return,
                };
                match read {
                    Ok(terminals) => {
                        for (shard, terminal, _) in terminals {
                            drains.wake(shard, &terminal);
                        }
                        return;
                    }
                    Err(e) => {
                        debug!(shard, error = %e, "queue: reading the shard's waiting terminals failed; retrying");
                        if sleep_or_stop(pause, &mut stop).await {
                            return;
                        }
                        pause = (pause * 2).min(MAX_RETRY_PAUSE);
                    }
                }
            }
        });
    }

    /// Reads the waiting terminals of the next [`WAITING_SCAN_SHARDS`] shards served here
    /// from shard `from` on (wrapping around), in one call, and wakes their drains: a
    /// wake-up that was lost (the reply of a pod's own store call, a notification missed
    /// without a resubscription) delays a push by [`WAITING_SCAN`] per
    /// [`WAITING_SCAN_SHARDS`] shards served here at most. Returns where the next scan
    /// starts.
    fn scan(self: Arc<Self>, from: ShardId) -> ShardId {
        let served: Vec<ShardId> = lock(&self.shards).keys().copied().collect();
        let shards = scan_slice(served, from);
        let Some(&last) = shards.last() else {
            return 0;
        };
        tokio::spawn(async move {
            match self.store.waiting(&shards).await {
                Ok(terminals) => {
                    for (shard, terminal, _) in terminals {
                        self.wake(shard, &terminal);
                    }
                }
                Err(e) => debug!(error = %e, "queue: the periodic scan failed"),
            }
        });
        last + 1
    }

    /// Ends `shard`'s drains, once each has recorded what it sent.
    async fn stop(&self, shard: ShardId) {
        let Some(mut drains) = lock(&self.shards).remove(&shard) else {
            return;
        };
        drains.stop.send_replace(true);
        let ended = async { while drains.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(STOP_WAIT, ended).await.is_err() {
            warn!(shard, "queue drains did not end in time; cancelled (their pushes stay sending and are re-sent within the terminal's window)");
        }
    }

    /// Something was queued for `terminal` of `shard`: its drain looks (started if
    /// none runs). Nothing happens for a shard not served here.
    pub fn wake(self: &Arc<Self>, shard: ShardId, terminal: &str) {
        let mut shards = lock(&self.shards);
        let Some(entry) = shards.get_mut(&shard) else {
            return;
        };
        if let Some(running) = entry.terminals.get(terminal) {
            running.wakes.fetch_add(1, Ordering::AcqRel);
            running.wake.notify_one();
            return;
        }
        let running = Running {
            wake: Arc::new(Notify::new()),
            wakes: Arc::new(AtomicU64::new(0)),
            seen: Arc::default(),
        };
        let drain = TerminalDrain {
            drains: self.clone(),
            shard,
            terminal: terminal.to_string(),
            wake: running.wake.clone(),
            wakes: running.wakes.clone(),
            seen: running.seen.clone(),
            stop: entry.stop.subscribe(),
            link: None,
            pause: RETRY_PAUSE,
            unsettled: None,
        };
        entry.terminals.insert(terminal.to_string(), running);
        // Drains that ended are joined here, so the set holds only running ones.
        while entry.tasks.try_join_next().is_some() {}
        entry.tasks.spawn(drain.run());
    }

    /// Called by a drain that found its queue empty: it ends unless woken since it
    /// looked (`seen` wake-ups).
    fn retire(&self, shard: ShardId, terminal: &str, seen: u64) -> bool {
        let mut shards = lock(&self.shards);
        let Some(entry) = shards.get_mut(&shard) else {
            return true;
        };
        match entry.terminals.get(terminal) {
            Some(r) if r.wakes.load(Ordering::Acquire) == seen => {
                entry.terminals.remove(terminal);
                true
            }
            Some(_) => false,
            None => true,
        }
    }

    /// Sets the queue's gauges from what the drains last read.
    fn set_gauges(&self) {
        let (all, connected) = self.seen();
        let m = &self.metrics;
        let age =
            |at: Option<WallMs>| at.map_or(0.0, |at| wall_ms().saturating_sub(at) as f64 / 1e3);
        m.queue_pushes.set(all.pushes as i64);
        m.queue_bytes.set(all.bytes as i64);
        m.queue_oldest_seconds.set(age(all.oldest_ms));
        m.queue_oldest_connected_seconds.set(age(connected));
    }

    /// What every running drain last read, summed: pushes, bytes, the oldest's
    /// acceptance time, and the oldest of those whose terminal has a session.
    pub fn seen(&self) -> (Seen, Option<WallMs>) {
        let shards = lock(&self.shards);
        let mut all = Seen::default();
        let mut connected_oldest: Option<WallMs> = None;
        for running in shards.values().flat_map(|s| s.terminals.values()) {
            let seen = *lock(&running.seen);
            all.pushes += seen.pushes;
            all.bytes += seen.bytes;
            all.oldest_ms = min_some(all.oldest_ms, seen.oldest_ms);
            if seen.connected {
                connected_oldest = min_some(connected_oldest, seen.oldest_ms);
            }
        }
        (all, connected_oldest)
    }

    /// A receiver of every change the drain makes to push `id`, starting at `record`.
    pub fn watch(&self, id: &str, record: Record) -> watch::Receiver<Record> {
        let mut waiters = lock(&self.waiters);
        waiters.retain(|_, tx| tx.receiver_count() > 0);
        match waiters.get(id) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(record);
                waiters.insert(id.to_string(), tx);
                rx
            }
        }
    }

    fn publish(&self, record: &Record) {
        let id = push_id(&record.tenant, &record.terminal, &record.key);
        let waiters = lock(&self.waiters);
        if let Some(tx) = waiters.get(&id) {
            tx.send_replace(record.clone());
        }
    }

    /// Resolves when this pod records a final state after `since` (a value of
    /// [`Drains::finals`]).
    pub fn finals(&self) -> watch::Receiver<u64> {
        self.finals.subscribe()
    }

    /// Counts a final state this pod recorded (a drain's, or a cancel or collapse made
    /// here).
    pub fn counted_final(&self, state: &State) {
        self.metrics
            .queue_finals
            .get_or_create(&[("state", state.name())])
            .inc();
        self.finals.send_modify(|n| *n = n.wrapping_add(1));
    }
}

fn min_some(a: Option<WallMs>, b: Option<WallMs>) -> Option<WallMs> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Sleeps `pause`; `true` if the shard stopped meanwhile.
async fn sleep_or_stop(pause: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(pause) => false,
        _ = stop.wait_for(|s| *s) => true,
    }
}

/// One terminal's drain (see the module docs).
struct TerminalDrain {
    drains: Arc<Drains>,
    shard: ShardId,
    terminal: String,
    wake: Arc<Notify>,
    wakes: Arc<AtomicU64>,
    seen: Arc<Mutex<Seen>>,
    stop: watch::Receiver<bool>,
    /// The terminal's link, once found.
    link: Option<TerminalLink>,
    /// The next pause after a copy that was not taken or not answered.
    pause: Duration,
    /// A terminal's answer whose final write failed: written before the next step.
    unsettled: Option<(Record, State)>,
}

impl TerminalDrain {
    async fn run(mut self) {
        let mut store_pause = STORE_PAUSE;
        loop {
            if *self.stop.borrow() {
                return;
            }
            // A terminal's answer whose write failed is written before anything else.
            if let Some((record, state)) = self.unsettled.take() {
                if let Next::Stop = self.settle(&record, state).await {
                    return;
                }
                if self.unsettled.is_some() && self.idle(store_pause).await {
                    return;
                }
                continue;
            }
            let seen = self.wakes.load(Ordering::Acquire);
            let pending = tokio::select! {
                read = self.drains.store.pending(&self.terminal) => read,
                _ = self.stop.wait_for(|s| *s) => return,
            };
            let pending = match pending {
                Ok(pending) => pending,
                Err(e) => {
                    debug!(shard = self.shard, terminal = %self.terminal, error = %e, "queue: reading the terminal's queue failed; retrying");
                    if self.idle(store_pause).await {
                        return;
                    }
                    store_pause = (store_pause * 2).min(MAX_RETRY_PAUSE);
                    continue;
                }
            };
            store_pause = STORE_PAUSE;
            self.note(&pending);
            let Some(head) = pending.into_iter().next() else {
                if self.drains.retire(self.shard, &self.terminal, seen) {
                    return;
                }
                continue;
            };
            // Only the shard's stop ends a drain: a lapse of the lease (renewed late),
            // a refused mark or a stale epoch pause it, and the shard's stop follows
            // if the shard is lost.
            if let Next::Stop = self.turn(head).await {
                return;
            }
        }
    }

    fn note(&self, pending: &[Record]) {
        let connected = self.link.as_ref().is_some_and(TerminalLink::connected);
        *lock(&self.seen) = Seen {
            pushes: pending.len() as u64,
            bytes: pending.iter().fold(0, |n, r| n.saturating_add(r.bytes)),
            oldest_ms: pending.iter().map(|r| r.accepted_ms).min(),
            connected,
        };
    }

    /// Waits `pause`, a wake-up or the stop; `true` on the stop.
    async fn idle(&mut self, pause: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(pause) => false,
            () = self.wake.notified() => false,
            _ = self.stop.wait_for(|s| *s) => true,
        }
    }

    /// Waits until wall-clock time `at` (or a wake-up or the stop); `true` on the stop.
    async fn until(&mut self, at: WallMs) -> bool {
        let pause = Duration::from_millis(at.saturating_sub(wall_ms()).max(1));
        self.idle(pause).await
    }

    /// One step for the queue's `head`.
    async fn turn(&mut self, head: Record) -> Next {
        let rules = self.drains.rules;
        match delivery::step(&head.pending(), wall_ms(), &rules) {
            Step::Expire => {
                let at_ms = wall_ms();
                self.settle(&head, State::Expired { at_ms }).await
            }
            Step::GiveUp => {
                let since_ms = head
                    .pending()
                    .unanswered_since_ms
                    .unwrap_or(head.accepted_ms);
                let at_ms = wall_ms();
                self.settle(&head, State::Unknown { at_ms, since_ms }).await
            }
            Step::WaitUntil(at) => {
                if self.until(at).await {
                    return Next::Stop;
                }
                Next::Again
            }
            Step::Send => self.send(head).await,
        }
    }

    /// When `head` stops being sendable (its expiry, or the end of a lost answer's
    /// window), on the wall clock.
    fn due(&self, head: &Record) -> WallMs {
        let r = &self.drains.rules;
        let ms = |d: Duration| d.as_millis() as u64;
        let expiry = head.expires_ms.saturating_sub(ms(r.skew));
        match head.pending().unanswered_since_ms {
            Some(since) => {
                let last = since.saturating_add(ms(r.window));
                expiry.min(last.saturating_sub(ms(r.skew) + ms(r.copy_timeout)))
            }
            None => expiry,
        }
    }

    /// The terminal's link, waiting while the shard's list loads; `Err(None)` when the
    /// terminal is not in the shard's directory, `Err(Some(next))` when the shard is not
    /// served now (after a pause) or stopped.
    async fn link(&mut self) -> Result<TerminalLink, Option<Next>> {
        loop {
            if let Some(link) = &self.link {
                return Ok(link.clone());
            }
            match self.drains.sessions.lookup(self.shard, &self.terminal) {
                Lookup::Found(link) => self.link = Some(link),
                Lookup::NotServed => return Err(Some(self.paused(LAPSE_PAUSE).await)),
                Lookup::Unknown => return Err(None),
                Lookup::Loading => {
                    if sleep_or_stop(Duration::from_millis(10), &mut self.stop).await {
                        return Err(Some(Next::Stop));
                    }
                }
            }
        }
    }

    /// Sends `head` once its terminal has a session, or comes back when it is due no
    /// more, something was woken, or the shard stopped.
    async fn send(&mut self, head: Record) -> Next {
        let due = self.due(&head);
        let Some(epoch) = self.drains.serving.serving(self.shard, now()) else {
            return self.paused(LAPSE_PAUSE).await;
        };
        let mut link = match self.link().await {
            Ok(link) => link,
            // Not in the directory: nothing can be sent; wait for its due time (it then
            // expires or ends unknown) or for the directory to list it.
            Err(None) => {
                let at = due.min(wall_ms() + 5_000);
                return if self.until(at).await {
                    Next::Stop
                } else {
                    Next::Again
                };
            }
            Err(Some(next)) => return next,
        };
        let wait = Duration::from_millis(due.saturating_sub(wall_ms()).max(1));
        let sender = tokio::select! {
            sender = link.session(epoch) => sender,
            () = tokio::time::sleep(wait) => return Next::Again,
            () = self.wake.notified() => return Next::Again,
            _ = self.stop.wait_for(|s| *s) => return Next::Stop,
        };
        let Some(mut sender) = sender else {
            // The link went away: the terminal was removed or the shard stopped.
            self.link = None;
            return Next::Again;
        };
        tokio::select! {
            () = self.drains.pace.until_ready() => {}
            _ = self.stop.wait_for(|s| *s) => return Next::Stop,
        }
        // From here to the recorded outcome this copy counts as being sent: a shard
        // handed over releases its lease only after (`pos::manager` drain).
        let _sending = link.sending();
        let rules = self.drains.rules;
        let check = |record: &Record| {
            let wall = wall_ms();
            delivery::check(&Moment {
                serving: self.drains.serving.serving(self.shard, now()),
                session: epoch,
                left: delivery::send_bound(&record.pending(), wall, &rules),
                queued: Some((&record.pending(), wall, &rules)),
            })
        };
        match check(&head) {
            Verdict::Send => {}
            Verdict::NotServed => return self.paused(LAPSE_PAUSE).await,
            Verdict::StaleSession | Verdict::TooLate | Verdict::Queued(_) => return Next::Again,
        }
        let marked = head.marked(&self.drains.pod, epoch, wall_ms());
        let mark = Change::Mark {
            pod: self.drains.pod.clone(),
            epoch,
        };
        let body = match self.write(&head, &marked, mark).await {
            Ok(Written::Done { body: Some(body) }) => body,
            Ok(Written::NotHolder) => {
                debug!(shard = self.shard, epoch, "queue: the store says this pod does not hold the shard with this epoch; pausing");
                return self.paused(Duration::from_secs(1)).await;
            }
            Ok(_) => return Next::Again,
            // The mark may or may not be in: nothing was sent; look again.
            Err(_) => return self.paused(STORE_PAUSE).await,
        };
        self.drains.publish(&marked);
        // The rule once more, as the copy leaves: time passed during the mark.
        if check(&marked) != Verdict::Send {
            return self.unsent(&head, &marked).await;
        }
        let content_type = marked
            .content_type
            .as_deref()
            .and_then(|c| HeaderValue::from_str(c).ok());
        let wire = PosPush {
            terminal: &self.terminal,
            server_name: &link.terminal.server_name,
            path: &self.drains.push_path,
            tenant: &marked.tenant,
            key: &marked.key,
            epoch,
            pod: &self.drains.pod,
            content_type: content_type.as_ref(),
            body,
            queued: Some(Queued {
                accepted_ms: marked.accepted_ms,
                expires_ms: marked.expires_ms,
            }),
            trace: None,
        };
        let copies = &self.drains.metrics.queue_copies;
        let count = |result: &'static str| copies.get_or_create(&[("result", result)]).inc();
        // Bounded by its expiry: it leaves in time (an HTTP/2 request may wait for a
        // stream before it leaves), or not at all.
        let bound = delivery::send_bound(&marked.pending(), wall_ms(), &rules);
        match pos_push::send(&mut sender, wire, bound).await {
            Ok(Answered::Accepted { status, receipt }) => {
                let duplicate = receipt == Receipt::Duplicate;
                count(if duplicate { "duplicate" } else { "taken" });
                self.pause = RETRY_PAUSE;
                let state = State::Delivered {
                    at_ms: wall_ms(),
                    pod: self.drains.pod.to_string(),
                    epoch,
                    pos_status: status.as_u16(),
                    duplicate,
                };
                self.settle(&marked, state).await
            }
            Ok(Answered::Refused { status }) if not_taken(status) => {
                count("try_again");
                debug!(shard = self.shard, terminal = %self.terminal, status = status.as_u16(), "queue: the terminal did not take a copy (its session); trying again later");
                self.unsent(&head, &marked).await;
                self.backed_off().await
            }
            Ok(Answered::Refused { status }) if try_later(status) => {
                // The terminal's error of a moment: it may have acted, so the record
                // stays `sending` and the next copy goes only within the window.
                count("try_again");
                debug!(shard = self.shard, terminal = %self.terminal, status = status.as_u16(), "queue: the terminal answered an error of a moment; trying again within its window");
                self.backed_off().await
            }
            Ok(Answered::Refused { status }) => {
                count("rejected");
                let state = State::Rejected {
                    at_ms: wall_ms(),
                    pod: self.drains.pod.to_string(),
                    epoch,
                    pos_status: status.as_u16(),
                };
                self.settle(&marked, state).await
            }
            Err(PushFailure::NotSent(why)) => {
                count("not_sent");
                debug!(shard = self.shard, terminal = %self.terminal, %why, "queue: copy not sent; waiting for a new session");
                self.unsent(&head, &marked).await;
                self.backed_off().await
            }
            Err(PushFailure::StaleEpoch { highest }) => {
                count("stale_epoch");
                self.unsent(&head, &marked).await;
                self.drains.sessions.report_stale(StaleEpoch {
                    shard: self.shard,
                    epoch,
                    highest,
                });
                self.paused(Duration::from_secs(1)).await
            }
            Err(PushFailure::Unknown(why)) => {
                count("unknown");
                debug!(shard = self.shard, terminal = %self.terminal, %why, "queue: no answer to a copy; it may have been taken");
                self.backed_off().await
            }
        }
    }

    /// Waits the retry pause, doubling it for next time: `Again`, or `Stop` on the stop.
    async fn backed_off(&mut self) -> Next {
        if self.pause().await {
            Next::Stop
        } else {
            Next::Again
        }
    }

    /// Waits `pause` (or the stop): `Again`, or `Stop` on the stop.
    async fn paused(&mut self, pause: Duration) -> Next {
        if sleep_or_stop(pause, &mut self.stop).await {
            Next::Stop
        } else {
            Next::Again
        }
    }

    /// Waits the retry pause (doubling it for next time); `true` on the stop.
    async fn pause(&mut self) -> bool {
        let pause = self.pause;
        self.pause = (self.pause * 2).min(MAX_RETRY_PAUSE);
        sleep_or_stop(pause, &mut self.stop).await
    }

    /// Writes `next` over `record` (its revision) with `change`.
    async fn write(
        &self,
        record: &Record,
        next: &Record,
        change: Change,
    ) -> Result<Written, StoreError> {
        let w = Write {
            shard: self.shard,
            id: push_id(&record.tenant, &record.terminal, &record.key),
            expect: record.rev,
            record: next.clone(),
            change,
            now: wall_ms(),
        };
        let written = self.drains.store.write(&w).await;
        if let Err(e) = &written {
            debug!(shard = self.shard, terminal = %self.terminal, error = %e, "queue: a store write failed");
        }
        written
    }

    /// The copy marked as `marked` (from `before`) provably was not taken.
    async fn unsent(&self, before: &Record, marked: &Record) -> Next {
        let back = marked.unsent(before);
        if let Ok(Written::Done { .. }) = self.write(marked, &back, Change::Unsent).await {
            self.drains.publish(&back);
        }
        Next::Again
    }

    /// Records `record`'s final `state`. A terminal's answer is the truth whatever
    /// changed meanwhile: if another pod re-marked it, it is written over that revision;
    /// if the store does not answer, it is kept and written before the next step.
    async fn settle(&mut self, record: &Record, state: State) -> Next {
        let retention_ms = self.drains.settings.limits.retention_ms;
        let mut current = record.clone();
        for _ in 0..3 {
            let done = current.moved_to(state.clone());
            match self
                .write(&current, &done, Change::Final { retention_ms })
                .await
            {
                Ok(Written::Done { .. }) => {
                    self.drains.publish(&done);
                    self.drains.counted_final(&done.state);
                    return Next::Again;
                }
                Ok(Written::Changed(now)) if !now.state.is_final() && answered(&state) => {
                    current = *now;
                }
                Ok(_) => return Next::Again,
                // Kept, and written first on the next step: not now, while the copy
                // still counts as being sent (a store that does not answer must not
                // hold up the shard's handover).
                Err(_) if answered(&state) => {
                    self.unsettled = Some((current, state));
                    return Next::Again;
                }
                Err(_) => return Next::Again,
            }
        }
        Next::Again
    }
}

/// Whether `state` is the terminal's own answer (which no later change can make
/// untrue), not a decision of this pod's.
fn answered(state: &State) -> bool {
    matches!(state, State::Delivered { .. } | State::Rejected { .. })
}

/// The shards a scan from shard `from` reads: the first [`WAITING_SCAN_SHARDS`] of those
/// `served`, in shard order from `from` on, wrapping around.
fn scan_slice(mut served: Vec<ShardId>, from: ShardId) -> Vec<ShardId> {
    served.sort_unstable();
    let split = served.partition_point(|&s| s < from);
    served.rotate_left(split);
    served.truncate(WAITING_SCAN_SHARDS);
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Successive scans cover every served shard, each at most `WAITING_SCAN_SHARDS` at
    /// a time, so a pod serving 205 of 1,024 shards reads them in four scans.
    #[test]
    fn scans_read_a_bounded_slice_and_cover_every_served_shard_in_turn() {
        let served: Vec<ShardId> = (0..1024).filter(|s| s % 5 == 1).rev().collect();
        let (mut from, mut seen) = (0, std::collections::BTreeSet::new());
        for _ in 0..4 {
            let slice = scan_slice(served.clone(), from);
            assert!(slice.len() <= WAITING_SCAN_SHARDS, "{}", slice.len());
            from = slice.last().unwrap() + 1;
            seen.extend(slice);
        }
        assert_eq!(seen.len(), served.len());
        // The next scan goes on after the last one read; a few served shards are one
        // read.
        let next = served.iter().copied().filter(|&s| s >= from).min();
        assert_eq!(scan_slice(served, from).first().copied(), next);
        assert_eq!(scan_slice(vec![9, 3], 4), vec![9, 3]);
    }

    #[test]
    fn only_a_moments_refusals_are_tried_again() {
        let status = |code| StatusCode::from_u16(code).unwrap();
        for code in [421, 428] {
            assert!(
                not_taken(status(code)) && !try_later(status(code)),
                "{code}"
            );
        }
        for code in [409, 500, 502, 503, 504] {
            assert!(
                try_later(status(code)) && !not_taken(status(code)),
                "{code}"
            );
        }
        for code in [400, 404, 410, 413, 415, 422] {
            assert!(
                !try_later(status(code)) && !not_taken(status(code)),
                "{code}"
            );
        }
    }
}
