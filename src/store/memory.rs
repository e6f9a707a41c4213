//! The in-memory coordination store: the same contract as the Redis scripts, in one
//! process.
//!
//! Two layers:
//! - [`MemoryState`] is a synchronous, deterministic model of the keys in
//!   `store::keys` and of every script in `store/lua/`. The caller passes the store
//!   clock (`now_ms`) and the generation ids come from a seeded RNG, so the
//!   deterministic simulation drives it directly with virtual time and replays runs from
//!   a seed. Keys expire lazily, judged by the `now_ms` of each call, exactly where Redis
//!   would judge them: a lease is live while `now_ms <= expiry` (Redis deletes a key
//!   once `now > expiry`), a member while its expiry `>= now_ms`, and expired members
//!   are pruned only by [`MemoryState::snapshot`], like the snapshot script does.
//! - [`MemoryStore`] wraps it for real use (single-process embedded mode, tests): a
//!   shared lock, the wall clock in milliseconds since the Unix epoch (so epochs look
//!   like Redis ones) and a `watch` channel bumped on notifications.
//!
//! What it does not do: persist anything, or simulate partial failures (a call here
//! never fails with `Unavailable`/`Timeout`; tests that need those use the Redis store
//! behind a TCP proxy).

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{broadcast, watch};

use futures::future::BoxFuture;
use futures::FutureExt;

use super::broadcast::{
    BroadcastState, BroadcastStore, Create, Created, Found as BroadcastFound, Mark, MarkWrite,
    MarksWritten,
};
use super::queue::{
    push_id, Cancelled, Enqueue, Enqueued, Feed, Found, QueueState, QueueStore, Record, Waiting,
    Wakeup, Write, Written,
};
use super::{ClusterMeta, CoordStore, StoreError};
use crate::core::lease::{
    next_epoch, AcquireOutcome, Checked, Claim, LeaseCall, Release, ReleaseNote, Released,
    RenewOutcome,
};
use crate::core::membership::{GenerationInfo, Lease, Member, Snapshot};
use crate::core::placement::Placement;
use crate::core::{Epoch, PodId, ShardId};

/// A TTL in whole milliseconds, at least 1: Redis refuses `PX 0`, and both stores must
/// treat the same inputs the same way.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Everything the store holds, as plain data. See the module docs for the expiry rules.
#[derive(Clone, Debug)]
pub struct MemoryState {
    rng: StdRng,
    /// Generation id and creation time (store ms).
    generation: Option<(String, u64)>,
    /// Heartbeats taken in this generation (the `heartbeats` field of Redis's `gen`).
    heartbeats: u64,
    meta: Option<ClusterMeta>,
    /// Pod -> (registration expiry ms, details).
    members: BTreeMap<PodId, (u64, Member)>,
    /// Last epoch handed out per shard.
    epochs: BTreeMap<ShardId, Epoch>,
    /// Shard -> (owner, expiry ms).
    leases: BTreeMap<ShardId, (PodId, u64)>,
    /// Shard -> (the release note of its last drained release, expiry ms).
    notes: BTreeMap<ShardId, (Member, u64)>,
    placement: Option<Placement>,
    notifications: u64,
    /// The queue's keys (`store::queue`): lost and rolled back with the rest.
    queue: QueueState,
    /// The broadcasts' keys (`store::broadcast`): lost and rolled back with the rest.
    broadcasts: BroadcastState,
}

impl MemoryState {
    /// An empty store whose generation ids derive from `seed`.
    pub fn new(seed: u64) -> Self {
        MemoryState {
            rng: StdRng::seed_from_u64(seed),
            generation: None,
            heartbeats: 0,
            meta: None,
            members: BTreeMap::new(),
            epochs: BTreeMap::new(),
            leases: BTreeMap::new(),
            notes: BTreeMap::new(),
            placement: None,
            notifications: 0,
            queue: QueueState::default(),
            broadcasts: BroadcastState::default(),
        }
    }

    /// Simulates Redis restarting empty: every key is gone, epochs and generation too.
    /// The notification counter and the RNG are client-side state and survive.
    pub fn wipe(&mut self) {
        self.generation = None;
        self.meta = None;
        self.members.clear();
        self.epochs.clear();
        self.leases.clear();
        self.notes.clear();
        self.placement = None;
        self.queue = QueueState::default();
        self.broadcasts = BroadcastState::default();
    }

    /// Simulates a failover to a replica that has the data of `earlier` (a copy of this
    /// state taken before): every write since is lost. The notification counter and the
    /// RNG are client-side state and survive.
    pub fn roll_back_to(&mut self, earlier: &MemoryState) {
        let (rng, notifications) = (self.rng.clone(), self.notifications);
        *self = earlier.clone();
        (self.rng, self.notifications) = (rng, notifications);
    }

    /// How many join, leave and release notifications were published so far.
    pub fn notifications(&self) -> u64 {
        self.notifications
    }

    /// The generation check every writing script starts with (`check_gen` in
    /// `lua/lib.lua`): `None` when `caller` is current; otherwise the current generation,
    /// created first when missing.
    fn check_generation(&mut self, now_ms: u64, caller: &str) -> Option<GenerationInfo> {
        match &self.generation {
            Some((id, _)) if id == caller => None,
            Some((id, created)) => Some(GenerationInfo {
                id: id.clone(),
                age: Duration::from_millis(now_ms.saturating_sub(*created)),
            }),
            None => {
                // Same shape as the Lua id: `<seconds>.<micros>-<random>`.
                let nonce: u64 = self.rng.random();
                let id = format!(
                    "{}.{:06}-{nonce:016x}",
                    now_ms / 1000,
                    (now_ms % 1000) * 1000
                );
                self.generation = Some((id.clone(), now_ms));
                self.heartbeats = 0;
                Some(GenerationInfo {
                    id,
                    age: Duration::ZERO,
                })
            }
        }
    }

    /// `SET meta NX`, then compare (`check_meta` in `lua/lib.lua`).
    pub fn pin_meta(&mut self, meta: &ClusterMeta) -> Result<(), StoreError> {
        match &self.meta {
            None => {
                self.meta = Some(meta.clone());
                Ok(())
            }
            Some(stored) if stored == meta => Ok(()),
            Some(stored) => Err(StoreError::MetaMismatch {
                stored: stored.clone(),
                ours: meta.clone(),
            }),
        }
    }

    /// The live owner of `shard`, deleting an expired lease like Redis would on access.
    fn lease_owner(&mut self, now_ms: u64, shard: ShardId) -> Option<&PodId> {
        if matches!(self.leases.get(&shard), Some((_, expiry)) if now_ms > *expiry) {
            self.leases.remove(&shard);
        }
        self.leases.get(&shard).map(|(owner, _)| owner)
    }

    /// See `lua/heartbeat.lua`.
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        generation: &str,
        member: &Member,
        meta: &ClusterMeta,
        ttl: Duration,
    ) -> Result<Checked<u64>, StoreError> {
        if let Some(info) = self.check_generation(now_ms, generation) {
            return Ok(Checked::GenerationChanged(info));
        }
        self.pin_meta(meta)?;
        let expiry = now_ms.saturating_add(ttl_ms(ttl));
        let old = self
            .members
            .insert(member.pod.clone(), (expiry, member.clone()));
        // A registration that expired but was not pruned yet counts as a new join.
        if !matches!(old, Some((old_expiry, _)) if old_expiry >= now_ms) {
            self.notifications += 1;
        }
        self.heartbeats += 1;
        Ok(Checked::Ok(self.heartbeats))
    }

    /// See `lua/deregister.lua`: removes the registration (expired or not) and notifies
    /// only if there was one.
    pub fn deregister(&mut self, _now_ms: u64, pod: &PodId) {
        if self.members.remove(pod).is_some() {
            self.notifications += 1;
        }
    }

    /// See `lua/acquire.lua`.
    pub fn acquire(
        &mut self,
        now_ms: u64,
        call: &LeaseCall<'_>,
        claims: &[Claim],
    ) -> Result<Checked<Vec<AcquireOutcome>>, StoreError> {
        let shards: Vec<ShardId> = claims.iter().map(|c| c.shard).collect();
        let mut floors = claims.iter().map(|c| c.floor);
        Ok(
            self.per_lease(now_ms, call, &shards, |s, shard, owner, expiry| {
                let last = s.last_epoch(shard);
                let floor = floors.next().unwrap_or(0);
                match owner {
                    None => {
                        let epoch = next_epoch(last, now_ms, floor);
                        s.leases.insert(shard, (call.pod.clone(), expiry));
                        s.epochs.insert(shard, epoch);
                        let released_by = match s.notes.get(&shard) {
                            Some((member, expiry)) if now_ms <= *expiry => Some(member.clone()),
                            _ => None,
                        };
                        AcquireOutcome::Acquired { epoch, released_by }
                    }
                    Some(owner) if &owner == call.pod => {
                        s.leases.insert(shard, (owner, expiry));
                        // A terminal has seen a newer epoch than the store remembers: bump.
                        let epoch = if floor > last {
                            let bumped = next_epoch(last, now_ms, floor);
                            s.epochs.insert(shard, bumped);
                            bumped
                        } else {
                            last
                        };
                        AcquireOutcome::AlreadyMine { epoch }
                    }
                    Some(owner) => AcquireOutcome::HeldBy { owner, epoch: last },
                }
            }),
        )
    }

    /// See `lua/renew.lua`.
    pub fn renew(
        &mut self,
        now_ms: u64,
        call: &LeaseCall<'_>,
        shards: &[ShardId],
    ) -> Result<Checked<Vec<RenewOutcome>>, StoreError> {
        Ok(
            self.per_lease(now_ms, call, shards, |s, shard, owner, expiry| {
                let epoch = s.last_epoch(shard);
                match owner {
                    None => RenewOutcome::Missing { epoch },
                    Some(owner) if &owner == call.pod => {
                        s.leases.insert(shard, (owner, expiry));
                        RenewOutcome::Renewed
                    }
                    Some(owner) => RenewOutcome::HeldBy { owner, epoch },
                }
            }),
        )
    }

    /// The generation's id, created when missing (`current_gen` in `lua/queue_lib.lua`).
    fn generation_id(&mut self, now_ms: u64) -> String {
        match self.check_generation(now_ms, "") {
            Some(info) => info.id,
            None => unreachable!("no generation id is empty"),
        }
    }

    /// See `lua/queue_enqueue.lua`; `known`: whether the terminal is in the shard's
    /// directory, which this store does not hold. Also says whether the shard's owner
    /// is to be woken (the enqueuing pod does not hold the shard).
    pub fn queue_enqueue(&mut self, now_ms: u64, e: &Enqueue, known: bool) -> (Enqueued, bool) {
        let generation = self.generation_id(now_ms);
        let holder = self.lease_owner(now_ms, e.shard).cloned();
        self.queue.enqueue(e, &generation, holder.as_ref(), known)
    }

    /// See `lua/queue_write.lua`.
    pub fn queue_write(&mut self, now_ms: u64, w: &Write) -> Written {
        let holder = self.lease_owner(now_ms, w.shard).cloned();
        let epoch = self.last_epoch(w.shard);
        self.queue.write(w, holder.as_ref().map(|h| (h, epoch)))
    }

    /// See `lua/queue_read.lua` `find`.
    pub fn queue_find(&self, tenant: &str, terminal: &str, key: &str, now_ms: u64) -> Found {
        Found {
            record: self
                .queue
                .find(tenant, terminal, &push_id(tenant, terminal, key), now_ms),
            generation: self.generation.as_ref().map(|(id, _)| id.clone()),
        }
    }

    /// See `lua/broadcast_marks.lua`: the lease check, then the marks.
    pub fn broadcast_marks(&mut self, now_ms: u64, w: &MarkWrite) -> MarksWritten {
        let holder = self.lease_owner(now_ms, w.shard).cloned();
        let epoch = self.last_epoch(w.shard);
        self.broadcasts
            .write_marks(w, holder.as_ref().map(|h| (h, epoch)))
    }

    /// The broadcasts' state, for the rest of their calls.
    pub fn broadcasts(&mut self) -> &mut BroadcastState {
        &mut self.broadcasts
    }

    /// The queue's state, for the rest of its reads and calls.
    pub fn queue(&mut self) -> &mut QueueState {
        &mut self.queue
    }

    /// The last epoch handed out for `shard` (0: none).
    pub fn last_epoch(&self, shard: ShardId) -> Epoch {
        self.epochs.get(&shard).copied().unwrap_or(0)
    }

    /// The frame the two lease scripts share: the generation check, then `decide` for
    /// each shard in call order, given its live owner and the expiry a lease written now
    /// gets.
    fn per_lease<O>(
        &mut self,
        now_ms: u64,
        call: &LeaseCall<'_>,
        shards: &[ShardId],
        mut decide: impl FnMut(&mut Self, ShardId, Option<PodId>, u64) -> O,
    ) -> Checked<Vec<O>> {
        if let Some(info) = self.check_generation(now_ms, call.generation) {
            return Checked::GenerationChanged(info);
        }
        let expiry = now_ms.saturating_add(ttl_ms(call.ttl));
        let out = shards
            .iter()
            .map(|&shard| {
                let owner = self.lease_owner(now_ms, shard).cloned();
                decide(self, shard, owner, expiry)
            })
            .collect();
        Checked::Ok(out)
    }

    /// See `lua/release.lua`: no generation check; each lease of `pod` is handed to its
    /// target when that is a live member (a new epoch above the floor, expiring `ttl`
    /// from now but not after the target's registration) or deleted; one notification
    /// per lease given up; with `note`, each leaves it for the next acquire.
    pub fn release(
        &mut self,
        now_ms: u64,
        pod: &PodId,
        releases: &[Release],
        note: Option<&ReleaseNote>,
        ttl: Duration,
    ) -> Vec<Released> {
        releases
            .iter()
            .map(|r| {
                if self.lease_owner(now_ms, r.shard) != Some(pod) {
                    return Released::NotHeld;
                }
                // The target, with its registration's expiry, while it is live.
                let target = r.to.as_ref().and_then(|to| match self.members.get(to) {
                    Some((until, _)) if *until >= now_ms => Some((to, *until)),
                    _ => None,
                });
                let outcome = match target {
                    Some((to, until)) => {
                        let epoch = next_epoch(self.last_epoch(r.shard), now_ms, r.floor);
                        let expiry = now_ms
                            .saturating_add(ttl_ms(ttl))
                            .min(until.max(now_ms + 1));
                        self.leases.insert(r.shard, (to.clone(), expiry));
                        self.epochs.insert(r.shard, epoch);
                        Released::HandedOver { epoch }
                    }
                    None => {
                        self.leases.remove(&r.shard);
                        Released::Deleted
                    }
                };
                if let Some(note) = note {
                    let expiry = now_ms.saturating_add(ttl_ms(note.ttl));
                    self.notes.insert(r.shard, (note.member.clone(), expiry));
                }
                self.notifications += 1;
                outcome
            })
            .collect()
    }

    /// See `lua/snapshot.lua`: creates the generation if missing, prunes expired
    /// members, and lists live members (sorted by pod id) and the holders of shards
    /// `0..shards`.
    pub fn snapshot(&mut self, now_ms: u64, shards: u32) -> Snapshot {
        // "" never matches, so this always answers the current (or a new) generation.
        let generation = self
            .check_generation(now_ms, "")
            .expect("the empty generation id never matches");
        self.members.retain(|_, (expiry, _)| *expiry >= now_ms);
        let members = self.members.values().map(|(_, m)| m.clone()).collect();
        let leases = (0..shards)
            .map(|shard| {
                let owner = self.lease_owner(now_ms, shard)?.clone();
                let epoch = self.epochs.get(&shard).copied().unwrap_or(0);
                Some(Lease { owner, epoch })
            })
            .collect();
        Snapshot {
            generation,
            members,
            leases,
            placement: self.placement.clone(),
            heartbeats: self.heartbeats,
        }
    }

    /// The stored placement, if any.
    pub fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    /// See `lua/place.lua`: compare-and-set on the version, no generation check, one
    /// notification when stored.
    pub fn place(&mut self, expected: Option<u64>, placement: &Placement) -> bool {
        if self.placement.as_ref().map(|p| p.version) != expected {
            return false;
        }
        self.placement = Some(placement.clone());
        self.notifications += 1;
        true
    }
}

/// Milliseconds since the Unix epoch: the memory store's clock, so its epochs are
/// comparable with the ones Redis hands out from `TIME`.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// [`MemoryState`] behind a lock, with the wall clock, implementing [`CoordStore`].
/// Clones share the same state.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    state: Arc<Mutex<MemoryState>>,
    changes: Arc<watch::Sender<u64>>,
    wakeups: broadcast::Sender<Wakeup>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store with a randomly seeded generation RNG.
    pub fn new() -> Self {
        Self::from_state(MemoryState::new(rand::random()))
    }

    /// A store over an existing state (e.g. seeded for a reproducible test).
    pub fn from_state(state: MemoryState) -> Self {
        let (tx, _) = watch::channel(state.notifications());
        MemoryStore {
            state: Arc::new(Mutex::new(state)),
            changes: Arc::new(tx),
            wakeups: broadcast::channel(1024).0,
        }
    }

    /// The queue's charge now: (cluster bytes, `tenant`'s bytes, pushes not final).
    pub fn queue_usage(&self, tenant: &str) -> (u64, u64, u64) {
        let mut state = self.lock();
        let (cluster, of_tenant) = state.queue().usage(tenant);
        (cluster, of_tenant, state.queue().count())
    }

    /// Test hook: forget everything, like a Redis that restarted empty.
    pub fn wipe(&self) {
        self.lock().wipe();
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        // A panic while holding the lock cannot leave the plain-data state half-written
        // in a way that matters more than the panic itself; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the state at the current wall time and bumps the change counter if
    /// `f` published notifications.
    fn with_state<T>(&self, f: impl FnOnce(&mut MemoryState, u64) -> T) -> T {
        let mut state = self.lock();
        let before = state.notifications();
        let out = f(&mut state, wall_ms());
        let after = state.notifications();
        drop(state);
        if after != before {
            self.changes.send_replace(after);
        }
        out
    }
}

impl CoordStore for MemoryStore {
    async fn pin_meta(&self, meta: &ClusterMeta) -> Result<(), StoreError> {
        self.with_state(|s, _| s.pin_meta(meta))
    }

    async fn heartbeat(
        &self,
        generation: &str,
        member: &Member,
        meta: &ClusterMeta,
        ttl: Duration,
    ) -> Result<Checked<u64>, StoreError> {
        self.with_state(|s, now| s.heartbeat(now, generation, member, meta, ttl))
    }

    async fn deregister(&self, pod: &PodId) -> Result<(), StoreError> {
        self.with_state(|s, now| s.deregister(now, pod));
        Ok(())
    }

    async fn acquire(
        &self,
        call: &LeaseCall<'_>,
        claims: &[Claim],
    ) -> Result<Checked<Vec<AcquireOutcome>>, StoreError> {
        self.with_state(|s, now| s.acquire(now, call, claims))
    }

    async fn renew(
        &self,
        call: &LeaseCall<'_>,
        shards: &[ShardId],
    ) -> Result<Checked<Vec<RenewOutcome>>, StoreError> {
        self.with_state(|s, now| s.renew(now, call, shards))
    }

    async fn release(
        &self,
        pod: &PodId,
        releases: &[Release],
        note: Option<&ReleaseNote>,
        ttl: Duration,
    ) -> Result<Vec<Released>, StoreError> {
        Ok(self.with_state(|s, now| s.release(now, pod, releases, note, ttl)))
    }

    async fn snapshot(&self, shards: u32) -> Result<Snapshot, StoreError> {
        Ok(self.with_state(|s, now| s.snapshot(now, shards)))
    }

    async fn place(
        &self,
        expected: Option<u64>,
        placement: &Placement,
    ) -> Result<bool, StoreError> {
        Ok(self.with_state(|s, _| s.place(expected, placement)))
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// The queue in this store's state; the terminal directory is not in it, so an enqueue
/// that asks for the directory check takes every terminal as listed.
impl QueueStore for MemoryStore {
    fn enqueue<'a>(&'a self, e: &'a Enqueue) -> BoxFuture<'a, Result<Enqueued, StoreError>> {
        let (answer, wake) = self.with_state(|s, now| s.queue_enqueue(now, e, true));
        if wake {
            let _ = self
                .wakeups
                .send(Wakeup::Terminal(e.shard, e.record.terminal.clone()));
        }
        std::future::ready(Ok(answer)).boxed()
    }

    fn write<'a>(&'a self, w: &'a Write) -> BoxFuture<'a, Result<Written, StoreError>> {
        let answer = self.with_state(|s, now| s.queue_write(now, w));
        std::future::ready(Ok(answer)).boxed()
    }

    fn find<'a>(
        &'a self,
        tenant: &'a str,
        terminal: &'a str,
        key: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<Found, StoreError>> {
        let found = self.with_state(|s, _| s.queue_find(tenant, terminal, key, now));
        std::future::ready(Ok(found)).boxed()
    }

    fn pending<'a>(&'a self, terminal: &'a str) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        let records = self.with_state(|s, _| s.queue().pending(terminal));
        std::future::ready(Ok(records)).boxed()
    }

    fn waiting<'a>(
        &'a self,
        shards: &'a [ShardId],
    ) -> BoxFuture<'a, Result<Vec<Waiting>, StoreError>> {
        let waiting = self.with_state(|s, _| s.queue().waiting(shards));
        std::future::ready(Ok(waiting)).boxed()
    }

    fn cancel<'a>(
        &'a self,
        shard: ShardId,
        tenant: &'a str,
        terminal: &'a str,
        key: &'a str,
        now: u64,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<Cancelled, StoreError>> {
        let out = self.with_state(|s, _| {
            s.queue()
                .cancel(shard, tenant, terminal, Some(key), now, retention_ms)
        });
        std::future::ready(Ok(out)).boxed()
    }

    fn purge<'a>(
        &'a self,
        shard: ShardId,
        tenant: &'a str,
        terminal: &'a str,
        now: u64,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<Cancelled, StoreError>> {
        let out = self.with_state(|s, _| {
            s.queue()
                .cancel(shard, tenant, terminal, None, now, retention_ms)
        });
        std::future::ready(Ok(out)).boxed()
    }

    fn wakeups(&self) -> broadcast::Receiver<Wakeup> {
        self.wakeups.subscribe()
    }

    fn feed<'a>(
        &'a self,
        tenant: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Feed, StoreError>> {
        let after = match after.map(str::parse::<u64>).transpose() {
            Ok(after) => after,
            Err(_) => {
                let refused = StoreError::Config(format!("not a feed cursor: {after:?}"));
                return std::future::ready(Err(refused)).boxed();
            }
        };
        let feed = self.with_state(|s, _| {
            let generation = s.generation.as_ref().map(|(id, _)| id.clone());
            let (events, gap) = s.queue().feed(tenant, after, limit.max(1));
            Feed {
                events: events
                    .into_iter()
                    .map(|(c, r)| (c.to_string(), r))
                    .collect(),
                generation,
                gap,
            }
        });
        std::future::ready(Ok(feed)).boxed()
    }
}

/// Broadcasts in this store's state.
impl BroadcastStore for MemoryStore {
    fn create<'a>(&'a self, c: &'a Create) -> BoxFuture<'a, Result<Created, StoreError>> {
        let created = self.with_state(|s, now| s.broadcasts().create(c, now));
        if created == Created::New {
            let _ = self.wakeups.send(Wakeup::Broadcast);
        }
        std::future::ready(Ok(created)).boxed()
    }

    fn find<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<BroadcastFound>, StoreError>> {
        let found = self.with_state(|s, _| s.broadcasts().find(id));
        std::future::ready(Ok(found)).boxed()
    }

    fn active(&self, now: u64) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        let active = self.with_state(|s, _| s.broadcasts().active(now));
        std::future::ready(Ok(active)).boxed()
    }

    fn body<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, StoreError>> {
        let body = self.with_state(|s, _| s.broadcasts().body(id));
        std::future::ready(Ok(body)).boxed()
    }

    fn marks<'a>(
        &'a self,
        id: &'a str,
        shard: ShardId,
    ) -> BoxFuture<'a, Result<HashMap<String, Mark>, StoreError>> {
        let marks = self.with_state(|s, _| s.broadcasts().marks(id, shard));
        std::future::ready(Ok(marks)).boxed()
    }

    fn write_marks<'a>(
        &'a self,
        w: &'a MarkWrite,
    ) -> BoxFuture<'a, Result<MarksWritten, StoreError>> {
        let written = self.with_state(|s, now| s.broadcast_marks(now, w));
        std::future::ready(Ok(written)).boxed()
    }

    fn news(&self) -> broadcast::Receiver<Wakeup> {
        self.wakeups.subscribe()
    }
}

#[cfg(test)]
mod tests;
