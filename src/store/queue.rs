//! Pushes that wait for their terminal: what the store keeps of each one, the calls
//! that change it ([`QueueStore`]), and [`QueueState`], the model of those calls that
//! the in-memory store and the simulation run and the Redis scripts
//! (`store/lua/queue_*.lua`) must match (`tests/queue_store.rs` runs both).
//!
//! A push with a TTL is a [`Record`], written by the pod that accepted it and changed
//! only by compare-and-set on its revision, so two pods that disagree about it cannot
//! both change it. Who may make which change:
//! - **enqueue**: any pod (the owner, or any entry pod while no owner answers); the
//!   record starts `queued`, at the tail of its terminal's queue (acceptance order).
//! - **mark** (`queued` or `sending` -> `sending`): only the shard's lease holder with
//!   its current epoch, checked in the same atomic step. A mark is written before the
//!   copy leaves and keeps the time of the first copy whose answer is missing, so a new
//!   owner knows that a copy may have been taken and since when.
//! - **unsent** (`sending` -> the state before the mark): the marking pod, when the
//!   copy provably was not taken (never left, or the terminal refused it as
//!   `409`/`421`/`428`/`5xx`).
//! - **final** (`delivered`, `rejected`, `expired`, `unknown`): the owner that decided
//!   it; `cancelled` by the tenant through any pod, `replaced` by a newer push with the
//!   same collapse key, both only from `queued` (never a push that may be on its way).
//!
//! Bounds, enforced inside the enqueue call, so no interleaving of pods can pass them:
//! pushes not yet final per terminal, bytes per tenant and bytes in the cluster (a
//! queued push is charged [`charge_of`] its body, a final one kept for its retention
//! [`RECORD_CHARGE`]: what Redis spends on them, measured); every call touches at most one body, except a purge
//! (at most one terminal's queue). Final records are kept for the retention window and
//! dropped by the next calls of their tenant ([`GC_PER_CALL`] at a time), and each
//! tenant's outcome feed holds at most [`FEED_MAX`] entries.
//!
//! Redis losing its data loses every record (the generation changes, which answers
//! tell); a failover keeps what its replica had, which with `--redis-wait-replicas`
//! includes every acknowledged call.
//!
//! Not for: when to send or give up (`crate::core::delivery`), or driving a drain
//! (`crate::push::queue`).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::StoreError;
use crate::core::delivery::{Pending, WallMs};
use crate::core::{Epoch, PodId, ShardId};

/// Bytes a record is charged besides its body: its metadata, its entries in the
/// terminal's keys, and once final, its record kept for the retention and its feed entry.
/// Redis spent 520-950 bytes per queued push beyond the body (10 or 1 per terminal), and
/// 990-1,290 per final one (`tests/queue_store.rs` measures it).
///
/// Changing it is a stored-data change: a final record is charged the finishing pod's
/// value and uncharged the collecting pod's, so pods of both versions would drift the
/// usage counters by the difference per final record; store the charge in the final
/// record first.
pub const RECORD_CHARGE: u64 = 1_536;

/// What a queued push with a body of `body` bytes is charged: the body as Redis's
/// allocator stores it (size classes a quarter apart: up to 25% more) plus
/// [`RECORD_CHARGE`].
pub fn charge_of(body: u64) -> u64 {
    body.saturating_add(body / 4).saturating_add(RECORD_CHARGE)
}
/// Due final records of a tenant dropped per call of that tenant.
pub const GC_PER_CALL: usize = 16;
/// Most outcome events a tenant's feed keeps (oldest trimmed first).
pub const FEED_MAX: usize = 10_000;

/// The id of a push within the store: the first 16 bytes of SHA-256 over tenant,
/// terminal and key, hex. Fixed length and free of separators, whatever the key holds.
pub fn push_id(tenant: &str, terminal: &str, key: &str) -> String {
    let mut hash = Sha256::new();
    for part in [tenant, terminal, key] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hex::encode(&hash.finalize()[..16])
}

/// One push with a TTL, as the store keeps it (JSON; the body apart).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub tenant: String,
    pub terminal: String,
    pub key: String,
    /// Grows by one with every change: the compare-and-set handle.
    pub rev: u64,
    /// When it was accepted and when it expires, on the accepting pod's wall clock.
    pub accepted_ms: WallMs,
    pub expires_ms: WallMs,
    /// The pod that accepted it.
    pub accepted_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collapse_key: Option<String>,
    /// SHA-256 of the body, hex: a retry with the same key must carry the same body.
    pub digest: String,
    /// What the queue is charged for it while it is not final.
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Copies sent so far (marks).
    pub copies: u32,
    #[serde(flatten)]
    pub state: State,
}

/// Where a push stands. Every variant but `Queued` and `Sending` is final.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum State {
    /// Waiting for its turn and a session; no copy can have been taken.
    Queued,
    /// A copy was marked to leave by `pod` on `epoch` and no answer has been recorded
    /// since `since_ms`, when the first copy without an answer left (its sender's
    /// clock): it is on its way, or its answer was lost.
    Sending {
        since_ms: WallMs,
        epoch: Epoch,
        pod: String,
    },
    Delivered {
        at_ms: WallMs,
        pod: String,
        epoch: Epoch,
        pos_status: u16,
        /// The terminal had the key already (an earlier copy) and did not act again.
        duplicate: bool,
    },
    /// The terminal's final non-2xx answer.
    Rejected {
        at_ms: WallMs,
        pod: String,
        epoch: Epoch,
        pos_status: u16,
    },
    /// Its TTL passed and no copy can have been taken.
    Expired { at_ms: WallMs },
    /// A newer push with the same collapse key took its place while it was queued.
    Replaced { at_ms: WallMs, replaced_by: String },
    /// The tenant cancelled it while it was queued.
    Cancelled { at_ms: WallMs },
    /// A copy may have been taken, and no copy may be sent any more: its answer was
    /// lost and the terminal's dedup window (or the TTL) has passed since.
    Unknown { at_ms: WallMs, since_ms: WallMs },
}

impl State {
    /// The state's name, as the API and the metrics say it.
    pub fn name(&self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Sending { .. } => "sending",
            State::Delivered { .. } => "delivered",
            State::Rejected { .. } => "rejected",
            State::Expired { .. } => "expired",
            State::Replaced { .. } => "replaced",
            State::Cancelled { .. } => "cancelled",
            State::Unknown { .. } => "unknown",
        }
    }

    pub fn is_final(&self) -> bool {
        !matches!(self, State::Queued | State::Sending { .. })
    }

    /// Every final state's name.
    pub const FINAL: [&'static str; 6] = [
        "delivered",
        "rejected",
        "expired",
        "replaced",
        "cancelled",
        "unknown",
    ];
}

impl Record {
    /// What the delivery rule needs of it.
    pub fn pending(&self) -> Pending {
        Pending {
            expires_ms: self.expires_ms,
            unanswered_since_ms: match &self.state {
                State::Sending { since_ms, .. } => Some(*since_ms),
                _ => None,
            },
        }
    }

    /// The record with `state`, one revision on.
    pub fn moved_to(&self, state: State) -> Record {
        Record {
            rev: self.rev.saturating_add(1),
            state,
            ..self.clone()
        }
    }

    /// Marked to leave now from `pod` on `epoch`: `since` stays that of an earlier copy
    /// whose answer is still missing.
    pub fn marked(&self, pod: &PodId, epoch: Epoch, now: WallMs) -> Record {
        let since_ms = match &self.state {
            State::Sending { since_ms, .. } => *since_ms,
            _ => now,
        };
        Record {
            copies: self.copies.saturating_add(1),
            ..self.moved_to(State::Sending {
                since_ms,
                epoch,
                pod: pod.to_string(),
            })
        }
    }

    /// A copy marked from `before` (the record as it was before that mark) provably was
    /// not taken: back to `before`'s state, keeping the copy count.
    pub fn unsent(&self, before: &Record) -> Record {
        self.moved_to(before.state.clone())
    }
}

/// Limits the enqueue call enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Pushes not yet final per terminal.
    pub per_terminal: u32,
    /// Bytes charged to one tenant (queued pushes and kept final records).
    pub tenant_bytes: u64,
    /// Bytes charged to the whole cluster.
    pub cluster_bytes: u64,
    /// How long a final record is kept for status lookups.
    pub retention_ms: u64,
}

/// Which bound an enqueue was over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    TerminalPushes,
    TenantBytes,
    ClusterBytes,
}

impl Bound {
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::TerminalPushes => "terminal_pushes",
            Bound::TenantBytes => "tenant_bytes",
            Bound::ClusterBytes => "cluster_bytes",
        }
    }

    fn named(name: &str) -> Option<Bound> {
        [
            Bound::TerminalPushes,
            Bound::TenantBytes,
            Bound::ClusterBytes,
        ]
        .into_iter()
        .find(|b| b.as_str() == name)
    }
}

/// A new push for the queue.
#[derive(Clone, Debug)]
pub struct Enqueue {
    pub shard: ShardId,
    pub id: String,
    /// The record, `Queued` at revision 1.
    pub record: Record,
    pub body: Bytes,
    pub limits: Limits,
    /// The terminal must be in the shard's directory (an entry pod's enqueue; the owner
    /// already found its link).
    pub check_directory: bool,
    /// Publish a wake-up for the shard's owner unless this pod holds the shard's lease
    /// (an owner enqueuing wakes its own drain).
    pub pod: PodId,
}

/// The answer of [`QueueStore::enqueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// Stored at `position` (1 = next) of its terminal's queue; it `replaced` the push
    /// with this key (same tenant, terminal and collapse key) that was queued.
    Accepted {
        position: u32,
        replaced: Option<String>,
        generation: String,
    },
    /// The key was accepted before with the same body: its record (queued, sending or
    /// final).
    Existing {
        record: Box<Record>,
        generation: String,
    },
    /// The key was accepted before with another body.
    Conflict,
    Full(Bound),
    /// Not in the shard's directory.
    UnknownTerminal,
}

/// What a [`QueueStore::write`] changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// To `Sending`, by the lease holder of `shard` with `epoch` (checked).
    Mark { pod: PodId, epoch: Epoch },
    /// From `Sending` back to the state before the mark.
    Unsent,
    /// To a final state, kept `retention_ms` after `now`.
    Final { retention_ms: u64 },
}

/// A compare-and-set of one record.
#[derive(Clone, Debug)]
pub struct Write {
    pub shard: ShardId,
    pub id: String,
    /// The revision the writer read; the write happens only if it is still current.
    pub expect: u64,
    /// The new record (revision `expect + 1`).
    pub record: Record,
    pub change: Change,
    pub now: WallMs,
}

/// The answer of [`QueueStore::write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// Written; for a mark, the body to send.
    Done { body: Option<Bytes> },
    /// Someone changed it since (or it is final now): the record as it is.
    Changed(Box<Record>),
    /// No record (final and past its retention, or never written: a lost store).
    Gone,
    /// A mark by a pod that does not hold the shard's lease with that epoch.
    NotHolder,
}

/// A push looked up by key, with the store generation it was looked up in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub record: Option<Record>,
    /// `None` while the store has none (it lost its data and nobody wrote since).
    pub generation: Option<String>,
}

/// The answer of [`QueueStore::cancel`] and [`QueueStore::purge`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cancelled {
    /// Keys cancelled.
    pub cancelled: Vec<String>,
    /// Pushes of the tenant left because a copy may be on its way (`sending`), as
    /// records.
    pub in_flight: Vec<Record>,
}

/// A page of a tenant's outcome feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Feed {
    /// Final records in the order they became final, each with its cursor.
    pub events: Vec<(String, Record)>,
    pub generation: Option<String>,
    /// Events after the cursor asked for were trimmed before they were read.
    pub gap: bool,
}

/// A terminal with pushes not final: its shard, its id, how many.
pub type Waiting = (ShardId, String, u32);

/// News from the store for the push layer: a push queued by a pod that does not hold
/// its shard (the owner's drain looks), or a broadcast created (every pod looks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wakeup {
    Terminal(ShardId, String),
    /// A broadcast was created (`crate::store::broadcast`).
    Broadcast,
    /// Notifications may have been missed (a new subscription): every drain looks.
    All,
}

/// The queue's store calls. Each is one atomic step; like every store call, a failed one
/// may or may not have been applied.
pub trait QueueStore: Send + Sync + 'static {
    fn enqueue<'a>(&'a self, e: &'a Enqueue) -> BoxFuture<'a, Result<Enqueued, StoreError>>;

    fn write<'a>(&'a self, w: &'a Write) -> BoxFuture<'a, Result<Written, StoreError>>;

    /// The push of `tenant` with `key` to `terminal`, final ones during their retention
    /// (judged at `now`).
    fn find<'a>(
        &'a self,
        tenant: &'a str,
        terminal: &'a str,
        key: &'a str,
        now: WallMs,
    ) -> BoxFuture<'a, Result<Found, StoreError>>;

    /// Every push of `terminal` not yet final, in acceptance order.
    fn pending<'a>(&'a self, terminal: &'a str) -> BoxFuture<'a, Result<Vec<Record>, StoreError>>;

    /// The terminals of each of `shards` with pushes not yet final, and how many each,
    /// in one call.
    fn waiting<'a>(
        &'a self,
        shards: &'a [ShardId],
    ) -> BoxFuture<'a, Result<Vec<Waiting>, StoreError>>;

    /// Cancels the `queued` push of `tenant` with `key` to `terminal`.
    fn cancel<'a>(
        &'a self,
        shard: ShardId,
        tenant: &'a str,
        terminal: &'a str,
        key: &'a str,
        now: WallMs,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<Cancelled, StoreError>>;

    /// Cancels every `queued` push of `tenant` to `terminal`.
    fn purge<'a>(
        &'a self,
        shard: ShardId,
        tenant: &'a str,
        terminal: &'a str,
        now: WallMs,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<Cancelled, StoreError>>;

    /// Wake-ups for owners: a push queued by a pod that does not hold its shard.
    fn wakeups(&self) -> tokio::sync::broadcast::Receiver<Wakeup>;

    /// Up to `limit` outcome events of `tenant` after `after` (from the oldest kept
    /// without one).
    fn feed<'a>(
        &'a self,
        tenant: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Feed, StoreError>>;
}

/// One terminal's pushes that are not final.
#[derive(Clone, Debug, Default)]
struct TerminalQueue {
    /// id -> (seq, record, body).
    pushes: BTreeMap<String, (u64, Record, Bytes)>,
    /// `tenant \n collapse key` -> id of the queued push with it.
    collapse: BTreeMap<String, String>,
}

/// One tenant's final records and outcome feed.
#[derive(Clone, Debug, Default)]
struct TenantLog {
    /// id -> (record, drop at).
    finals: BTreeMap<String, (Record, WallMs)>,
    /// (drop at, id) of every final record: the order they are dropped in.
    drops: BTreeSet<(WallMs, String)>,
    /// (cursor sequence, record); cursors grow.
    feed: VecDeque<(u64, Record)>,
    /// The newest cursor trimmed from the feed.
    trimmed: Option<u64>,
}

/// The in-memory model of the queue's keys and scripts (see the module docs): plain
/// data, driven with the caller's clock. Lives inside the in-memory store's state, so a
/// wipe or a failover's rollback applies to it with the rest.
#[derive(Clone, Debug, Default)]
pub struct QueueState {
    seq: u64,
    terminals: HashMap<String, TerminalQueue>,
    /// shard -> terminal -> pushes not final.
    waiting: BTreeMap<ShardId, BTreeMap<String, u32>>,
    tenants: HashMap<String, TenantLog>,
    tenant_bytes: HashMap<String, u64>,
    bytes: u64,
    count: u64,
    feed_seq: u64,
}

fn collapse_field(tenant: &str, key: &str) -> String {
    format!("{tenant}\n{key}")
}

impl QueueState {
    /// Bytes charged now: the whole cluster's, and `tenant`'s.
    pub fn usage(&self, tenant: &str) -> (u64, u64) {
        (
            self.bytes,
            self.tenant_bytes.get(tenant).copied().unwrap_or(0),
        )
    }

    /// Pushes not yet final in the whole store.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// `enqueue`: `lease_holder` is the shard's lease holder now, `known` whether the
    /// terminal is in the shard's directory. Returns the answer and whether a wake-up is
    /// published.
    pub fn enqueue(
        &mut self,
        e: &Enqueue,
        generation: &str,
        lease_holder: Option<&PodId>,
        known: bool,
    ) -> (Enqueued, bool) {
        let r = &e.record;
        self.gc(&r.tenant, r.accepted_ms);
        if let Some(existing) = self.lookup(&r.tenant, &r.terminal, &e.id) {
            // (The script bumps the sequence here so its `WAIT` covers the record;
            // nothing the model shows.)
            let answer = if existing.digest == r.digest {
                Enqueued::Existing {
                    record: Box::new(existing),
                    generation: generation.to_string(),
                }
            } else {
                Enqueued::Conflict
            };
            return (answer, false);
        }
        if e.check_directory && !known {
            return (Enqueued::UnknownTerminal, false);
        }
        let queue = self.terminals.get(&r.terminal);
        let candidate = r.collapse_key.as_ref().and_then(|c| {
            let id = queue?.collapse.get(&collapse_field(&r.tenant, c))?;
            let (_, old, _) = queue?.pushes.get(id)?;
            (old.state == State::Queued).then(|| (id.clone(), old.clone()))
        });
        let freed = candidate.as_ref().map_or(0, |(_, old)| old.bytes);
        let kept = u64::from(candidate.is_some()) * RECORD_CHARGE;
        let count = queue.map_or(0, |q| q.pushes.len()) - usize::from(candidate.is_some());
        let tenant = self.tenant_bytes.get(&r.tenant).copied().unwrap_or(0);
        let after = |used: u64| (used + r.bytes + kept).saturating_sub(freed);
        let over = if count + 1 > e.limits.per_terminal as usize {
            Some(Bound::TerminalPushes)
        } else if after(tenant) > e.limits.tenant_bytes {
            Some(Bound::TenantBytes)
        } else if after(self.bytes) > e.limits.cluster_bytes {
            Some(Bound::ClusterBytes)
        } else {
            None
        };
        if let Some(bound) = over {
            return (Enqueued::Full(bound), false);
        }
        let replaced = candidate.map(|(id, old)| {
            let state = State::Replaced {
                at_ms: r.accepted_ms,
                replaced_by: r.key.clone(),
            };
            let done = old.moved_to(state);
            self.finish(e.shard, &id, done, r.accepted_ms + e.limits.retention_ms);
            old.key
        });
        self.seq += 1;
        let queue = self.terminals.entry(r.terminal.clone()).or_default();
        queue
            .pushes
            .insert(e.id.clone(), (self.seq, r.clone(), e.body.clone()));
        if let Some(c) = &r.collapse_key {
            queue
                .collapse
                .insert(collapse_field(&r.tenant, c), e.id.clone());
        }
        let position = queue.pushes.len() as u32;
        *self
            .waiting
            .entry(e.shard)
            .or_default()
            .entry(r.terminal.clone())
            .or_default() += 1;
        self.charge(&r.tenant, r.bytes as i64);
        self.count += 1;
        let answer = Enqueued::Accepted {
            position,
            replaced,
            generation: generation.to_string(),
        };
        (answer, lease_holder != Some(&e.pod))
    }

    /// `write`: `lease` is the shard's lease holder and last epoch now.
    pub fn write(&mut self, w: &Write, lease: Option<(&PodId, Epoch)>) -> Written {
        let terminal = &w.record.terminal;
        let Some((_, old, body)) = self
            .terminals
            .get(terminal)
            .and_then(|q| q.pushes.get(&w.id))
            .cloned()
        else {
            return match self.lookup(&w.record.tenant, terminal, &w.id) {
                Some(done) => Written::Changed(Box::new(done)),
                None => Written::Gone,
            };
        };
        if old.rev != w.expect {
            return Written::Changed(Box::new(old));
        }
        match &w.change {
            Change::Mark { pod, epoch } => {
                if lease != Some((pod, *epoch)) {
                    return Written::NotHolder;
                }
                let queue = self.terminals.get_mut(terminal).expect("read above");
                if let Some(c) = &old.collapse_key {
                    let field = collapse_field(&old.tenant, c);
                    if queue.collapse.get(&field) == Some(&w.id) {
                        queue.collapse.remove(&field);
                    }
                }
                let entry = queue.pushes.get_mut(&w.id).expect("read above");
                entry.1 = w.record.clone();
                Written::Done { body: Some(body) }
            }
            Change::Unsent => {
                let queue = self.terminals.get_mut(terminal).expect("read above");
                if w.record.state == State::Queued {
                    if let Some(c) = &old.collapse_key {
                        let field = collapse_field(&old.tenant, c);
                        queue.collapse.entry(field).or_insert_with(|| w.id.clone());
                    }
                }
                let entry = queue.pushes.get_mut(&w.id).expect("read above");
                entry.1 = w.record.clone();
                Written::Done { body: None }
            }
            Change::Final { retention_ms } => {
                self.gc(&old.tenant, w.now);
                self.finish(w.shard, &w.id, w.record.clone(), w.now + retention_ms);
                Written::Done { body: None }
            }
        }
    }

    /// The record of `id` (of `tenant`'s push to `terminal`), final ones included while
    /// kept.
    fn lookup(&self, tenant: &str, terminal: &str, id: &str) -> Option<Record> {
        if let Some((_, record, _)) = self.terminals.get(terminal).and_then(|q| q.pushes.get(id)) {
            return Some(record.clone());
        }
        let (record, _) = self.tenants.get(tenant)?.finals.get(id)?;
        Some(record.clone())
    }

    /// `find`: a final record past its drop time counts as gone.
    pub fn find(&self, tenant: &str, terminal: &str, id: &str, now: WallMs) -> Option<Record> {
        if let Some((_, record, _)) = self.terminals.get(terminal).and_then(|q| q.pushes.get(id)) {
            return Some(record.clone());
        }
        let (record, drop_at) = self.tenants.get(tenant)?.finals.get(id)?;
        (*drop_at > now).then(|| record.clone())
    }

    /// `pending`.
    pub fn pending(&self, terminal: &str) -> Vec<Record> {
        let Some(queue) = self.terminals.get(terminal) else {
            return Vec::new();
        };
        let mut all: Vec<(u64, Record)> = queue
            .pushes
            .values()
            .map(|(seq, r, _)| (*seq, r.clone()))
            .collect();
        all.sort_by_key(|(seq, _)| *seq);
        all.into_iter().map(|(_, r)| r).collect()
    }

    /// `waiting`.
    pub fn waiting(&self, shards: &[ShardId]) -> Vec<Waiting> {
        let mut out = Vec::new();
        for &s in shards {
            for (t, n) in self.waiting.get(&s).into_iter().flatten() {
                out.push((s, t.clone(), *n));
            }
        }
        out
    }

    /// `cancel` (`key`: one push) and `purge` (`None`: all of the tenant's).
    pub fn cancel(
        &mut self,
        shard: ShardId,
        tenant: &str,
        terminal: &str,
        key: Option<&str>,
        now: WallMs,
        retention_ms: u64,
    ) -> Cancelled {
        self.gc(tenant, now);
        let mut out = Cancelled::default();
        let wanted = key.map(|k| push_id(tenant, terminal, k));
        for record in self.pending(terminal) {
            let id = push_id(&record.tenant, terminal, &record.key);
            if record.tenant != tenant || wanted.as_ref().is_some_and(|w| *w != id) {
                continue;
            }
            if record.state == State::Queued {
                out.cancelled.push(record.key.clone());
                let done = record.moved_to(State::Cancelled { at_ms: now });
                self.finish(shard, &id, done, now + retention_ms);
            } else {
                out.in_flight.push(record);
            }
        }
        out
    }

    /// `feed`.
    pub fn feed(
        &self,
        tenant: &str,
        after: Option<u64>,
        limit: usize,
    ) -> (Vec<(u64, Record)>, bool) {
        let Some(log) = self.tenants.get(tenant) else {
            return (Vec::new(), false);
        };
        let from = after.unwrap_or(0);
        let events = log
            .feed
            .iter()
            .filter(|(c, _)| *c > from)
            .take(limit)
            .cloned()
            .collect();
        let gap = after.is_some_and(|a| log.trimmed.is_some_and(|t| a < t));
        (events, gap)
    }

    /// Moves the not-final push `id` to its final record `done`, kept until `drop_at`.
    fn finish(&mut self, shard: ShardId, id: &str, done: Record, drop_at: WallMs) {
        let Some(queue) = self.terminals.get_mut(&done.terminal) else {
            return;
        };
        let Some((_, old, _)) = queue.pushes.remove(id) else {
            return;
        };
        if let Some(c) = &old.collapse_key {
            let field = collapse_field(&old.tenant, c);
            if queue.collapse.get(&field).map(String::as_str) == Some(id) {
                queue.collapse.remove(&field);
            }
        }
        if queue.pushes.is_empty() {
            self.terminals.remove(&done.terminal);
        }
        if let Some(terminals) = self.waiting.get_mut(&shard) {
            if let Some(n) = terminals.get_mut(&done.terminal) {
                *n -= 1;
                if *n == 0 {
                    terminals.remove(&done.terminal);
                }
            }
            if terminals.is_empty() {
                self.waiting.remove(&shard);
            }
        }
        self.charge(&old.tenant, RECORD_CHARGE as i64 - old.bytes as i64);
        self.count -= 1;
        self.feed_seq += 1;
        let log = self.tenants.entry(old.tenant.clone()).or_default();
        log.feed.push_back((self.feed_seq, done.clone()));
        if log.feed.len() > FEED_MAX {
            log.trimmed = log.feed.pop_front().map(|(cut, _)| cut);
        }
        log.drops.insert((drop_at, id.to_string()));
        log.finals.insert(id.to_string(), (done, drop_at));
    }

    /// Drops up to [`GC_PER_CALL`] of `tenant`'s final records whose drop time passed.
    fn gc(&mut self, tenant: &str, now: WallMs) {
        let Some(log) = self.tenants.get_mut(tenant) else {
            return;
        };
        let due: Vec<(WallMs, String)> = log
            .drops
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(GC_PER_CALL)
            .cloned()
            .collect();
        for entry in &due {
            log.drops.remove(entry);
            log.finals.remove(&entry.1);
        }
        self.charge(tenant, -((due.len() as u64 * RECORD_CHARGE) as i64));
    }

    fn charge(&mut self, tenant: &str, delta: i64) {
        let t = self.tenant_bytes.entry(tenant.to_string()).or_default();
        *t = t.saturating_add_signed(delta);
        self.bytes = self.bytes.saturating_add_signed(delta);
    }
}

/// The JSON a store answer carries for a record, parsed.
pub(crate) fn parse_record(json: &[u8]) -> Result<Record, StoreError> {
    serde_json::from_slice(json)
        .map_err(|e| StoreError::Protocol(format!("bad queued push record: {e}")))
}

/// A bound's name from a store answer.
pub(crate) fn parse_bound(name: &str) -> Result<Bound, StoreError> {
    Bound::named(name).ok_or_else(|| StoreError::Protocol(format!("unknown queue bound {name:?}")))
}

#[cfg(test)]
mod tests;
