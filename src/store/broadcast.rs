//! Broadcasts as the store keeps them: one record with the body per broadcast, and per
//! shard what its owners recorded (a mark per terminal, a progress summary), the calls
//! that change them ([`BroadcastStore`]) and [`BroadcastState`], the model the in-memory
//! store runs and the Redis scripts (`store/lua/broadcast_*.lua`) must match
//! (`tests/broadcast_store.rs` runs both).
//!
//! Who may change what:
//! - **create**: any pod, for the tenant whose token it checked. Idempotent by (tenant,
//!   idempotency key): the id is derived from them ([`broadcast_id`]), so a retry through
//!   any pod finds the same record. At most `max_active` broadcasts are unexpired at
//!   once, checked inside the create call.
//! - **marks and progress of a shard**: only the shard's lease holder with its current
//!   epoch, checked in the same atomic step as the write. A `sending` mark is written
//!   before a copy leaves and never replaces another mark (a new owner keeps the first
//!   copy's time, which bounds when it may send again); a final mark replaces `sending`.
//!
//! Bounds: a record is at most the push body limit plus its metadata; marks are one
//! field per matching terminal of the shard (~10 bytes plus the id); every key of a
//! broadcast expires by itself at its expiry plus the retention (`PEXPIREAT`), so a
//! stopped cluster leaves nothing behind for longer.
//!
//! Redis losing its data loses the broadcasts: owners stop walking what they cannot
//! read, and a retried create makes a new one, sent again to every terminal; terminals
//! that took the first within their window answer it as a duplicate (same key). A
//! failover keeps what its replica had; with `--redis-wait-replicas` that includes every
//! acknowledged create and every mark before its copy left.
//!
//! Not for: deciding when to send (`crate::core::delivery`), or walking a shard
//! (`crate::push::broadcast`).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::queue::Wakeup;
use super::StoreError;
use crate::core::delivery::WallMs;
use crate::core::{Epoch, PodId, ShardId};

/// Unexpired broadcasts a cluster keeps at most, unless `--broadcast-max-active` says
/// otherwise: each costs every owner a walk of its shards per second.
pub const MAX_ACTIVE: usize = 16;

/// The id of the broadcast of `tenant` with idempotency key `key`: the first 16 bytes
/// of SHA-256 over both, hex (the same key of two tenants is two broadcasts).
pub fn broadcast_id(tenant: &str, key: &str) -> String {
    let mut hash = Sha256::new();
    for part in ["broadcast", tenant, key] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hex::encode(&hash.finalize()[..16])
}

/// The key every terminal gets a broadcast's push under: one per broadcast, so a copy
/// sent again (a new owner, an answer lost) is a duplicate at the terminal.
pub fn terminal_key(id: &str) -> String {
    format!("broadcast-{id}")
}

/// One broadcast as the store keeps it (JSON; the body apart).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Broadcast {
    pub id: String,
    pub tenant: String,
    /// The sender's idempotency key.
    pub key: String,
    /// SHA-256 of the body, selector and patterns, hex: a retry must ask the same.
    pub digest: String,
    /// The label selector, text form (`store=17;region=eu`); never empty.
    pub selector: String,
    /// The sending token's terminal patterns; empty when it reaches every terminal.
    /// Owners re-apply them to every terminal they select.
    #[serde(default)]
    pub patterns: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// When it was created and until when copies leave, on the creating pod's clock.
    pub created_ms: WallMs,
    pub expires_ms: WallMs,
    pub created_by: String,
    /// Body bytes.
    pub bytes: u64,
}

/// What an owner recorded for one terminal of a broadcast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A copy was about to leave at `since_ms` (its sender's clock) and no answer is
    /// recorded: it may have been taken.
    Sending { since_ms: WallMs },
    /// The terminal took it (`duplicate`: it had the key already).
    Delivered { duplicate: bool },
    /// The terminal refused it for good (its status).
    Rejected { status: u16 },
    /// A copy may have been taken, and another can no longer be sent safely (the
    /// terminal's dedup window passed) or in time (the broadcast expired).
    Unknown,
}

impl Mark {
    /// The stored text: `s<ms>`, `d`, `dup`, `r<status>`, `u`.
    pub fn text(&self) -> String {
        match self {
            Mark::Sending { since_ms } => format!("s{since_ms}"),
            Mark::Delivered { duplicate: false } => "d".into(),
            Mark::Delivered { duplicate: true } => "dup".into(),
            Mark::Rejected { status } => format!("r{status}"),
            Mark::Unknown => "u".into(),
        }
    }

    pub fn parse(text: &str) -> Option<Mark> {
        match text {
            "d" => Some(Mark::Delivered { duplicate: false }),
            "dup" => Some(Mark::Delivered { duplicate: true }),
            "u" => Some(Mark::Unknown),
            _ => match text.split_at_checked(1)? {
                ("s", ms) => ms.parse().ok().map(|since_ms| Mark::Sending { since_ms }),
                ("r", status) => status.parse().ok().map(|status| Mark::Rejected { status }),
                _ => None,
            },
        }
    }

    pub fn is_final(&self) -> bool {
        !matches!(self, Mark::Sending { .. })
    }
}

/// What the owner of one shard last recorded of its walk (JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardProgress {
    pub pod: String,
    pub epoch: Epoch,
    /// When it was recorded, on the owner's clock.
    pub at_ms: WallMs,
    /// Terminals of the shard the selector and the patterns select now.
    pub matched: u64,
    /// Of those: taken (duplicates included), of which answered as duplicates.
    pub delivered: u64,
    pub duplicates: u64,
    /// Refused for good by the terminal.
    pub failed: u64,
    /// Copies whose outcome is unknown for good ([`Mark::Unknown`]).
    pub unknown: u64,
    /// Without an outcome and without a session now: waiting for their terminal.
    pub offline: u64,
}

impl ShardProgress {
    /// Selected terminals without a final outcome.
    pub fn remaining(&self) -> u64 {
        self.matched
            .saturating_sub(self.delivered + self.failed + self.unknown)
    }
}

/// A broadcast to create, with its body and how long its keys are kept.
#[derive(Clone, Debug)]
pub struct Create {
    pub broadcast: Broadcast,
    pub body: Bytes,
    /// When every key of the broadcast goes (its expiry plus the retention).
    pub keep_until_ms: WallMs,
    /// The creating pod's clock: broadcasts that expired before it no longer count.
    pub now_ms: WallMs,
    pub max_active: usize,
}

/// What a create did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    New,
    /// One with this id exists: the same request again, or (digest differs) another
    /// request under a key already used.
    Existing(Box<Broadcast>),
    /// `active` unexpired broadcasts already: nothing written.
    Full {
        active: usize,
    },
}

/// Marks of one shard's terminals and its progress, written by the shard's holder.
#[derive(Clone, Debug)]
pub struct MarkWrite {
    pub id: String,
    pub shard: ShardId,
    pub pod: PodId,
    pub epoch: Epoch,
    pub keep_until_ms: WallMs,
    /// `Sending` marks are written only where the terminal has none; final ones always.
    pub marks: Vec<(String, Mark)>,
    /// Copies that provably were not taken: the terminal's `Sending` mark with this
    /// time is removed (one another copy wrote since stays).
    pub unsent: Vec<(String, WallMs)>,
    pub progress: Option<ShardProgress>,
}

/// What a mark write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MarksWritten {
    /// The writer does not hold the shard with that epoch: nothing written.
    NotHolder,
    /// Written; per mark asked for, the mark that was kept instead (a `Sending` mark
    /// where the terminal had one).
    Done { kept: Vec<Option<Mark>> },
}

/// One broadcast, and what each shard's owners recorded of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub broadcast: Broadcast,
    pub shards: BTreeMap<ShardId, ShardProgress>,
}

/// The broadcast calls of a store.
pub trait BroadcastStore: Send + Sync + 'static {
    fn create<'a>(&'a self, c: &'a Create) -> BoxFuture<'a, Result<Created, StoreError>>;

    /// The broadcast `id` and its progress, while its keys are kept.
    fn find<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Found>, StoreError>>;

    /// The ids of the broadcasts not expired at `now`, soonest expiry first: one cheap
    /// call that every pod makes each second (records are read once, with `find`).
    fn active(&self, now: WallMs) -> BoxFuture<'_, Result<Vec<String>, StoreError>>;

    fn body<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, StoreError>>;

    /// Every mark of `shard`'s terminals for broadcast `id`.
    fn marks<'a>(
        &'a self,
        id: &'a str,
        shard: ShardId,
    ) -> BoxFuture<'a, Result<HashMap<String, Mark>, StoreError>>;

    fn write_marks<'a>(
        &'a self,
        w: &'a MarkWrite,
    ) -> BoxFuture<'a, Result<MarksWritten, StoreError>>;

    /// The store's news for the push layer: [`Wakeup::Broadcast`] when a broadcast was
    /// created (by any pod), [`Wakeup::All`] when news may have been missed.
    fn news(&self) -> tokio::sync::broadcast::Receiver<Wakeup>;
}

/// Reads a stored record; what another writer left is an error, not a panic.
pub fn parse_broadcast(json: &[u8]) -> Result<Broadcast, StoreError> {
    serde_json::from_slice(json)
        .map_err(|e| StoreError::Protocol(format!("unreadable broadcast record: {e}")))
}

/// Reads a stored shard progress.
pub fn parse_progress(json: &[u8]) -> Result<ShardProgress, StoreError> {
    serde_json::from_slice(json)
        .map_err(|e| StoreError::Protocol(format!("unreadable broadcast progress: {e}")))
}

/// The broadcasts of a store as plain data: what the in-memory store keeps and the
/// Redis scripts must match. Lease checks are the caller's (it knows the leases).
#[derive(Clone, Debug, Default)]
pub struct BroadcastState {
    records: BTreeMap<String, Stored>,
}

#[derive(Clone, Debug)]
struct Stored {
    broadcast: Broadcast,
    body: Bytes,
    keep_until_ms: WallMs,
    shards: BTreeMap<ShardId, ShardProgress>,
    marks: HashMap<ShardId, HashMap<String, Mark>>,
}

impl BroadcastState {
    /// Drops what is kept no longer (Redis does it by `PEXPIREAT`).
    fn expire(&mut self, now: WallMs) {
        self.records.retain(|_, s| s.keep_until_ms > now);
    }

    /// See `lua/broadcast_create.lua`.
    pub fn create(&mut self, c: &Create, now: WallMs) -> Created {
        self.expire(now);
        if let Some(s) = self.records.get(&c.broadcast.id) {
            return Created::Existing(Box::new(s.broadcast.clone()));
        }
        let active = self.active(c.now_ms).len();
        if active >= c.max_active {
            return Created::Full { active };
        }
        self.records.insert(
            c.broadcast.id.clone(),
            Stored {
                broadcast: c.broadcast.clone(),
                body: c.body.clone(),
                keep_until_ms: c.keep_until_ms,
                shards: BTreeMap::new(),
                marks: HashMap::new(),
            },
        );
        Created::New
    }

    pub fn find(&self, id: &str) -> Option<Found> {
        self.records.get(id).map(|s| Found {
            broadcast: s.broadcast.clone(),
            shards: s.shards.clone(),
        })
    }

    pub fn active(&self, now: WallMs) -> Vec<String> {
        let mut active: Vec<&Broadcast> = self
            .records
            .values()
            .map(|s| &s.broadcast)
            .filter(|b| b.expires_ms > now)
            .collect();
        active.sort_by(|a, b| (a.expires_ms, &a.id).cmp(&(b.expires_ms, &b.id)));
        active.into_iter().map(|b| b.id.clone()).collect()
    }

    pub fn body(&self, id: &str) -> Option<Bytes> {
        self.records.get(id).map(|s| s.body.clone())
    }

    pub fn marks(&self, id: &str, shard: ShardId) -> HashMap<String, Mark> {
        self.records
            .get(id)
            .and_then(|s| s.marks.get(&shard).cloned())
            .unwrap_or_default()
    }

    /// See `lua/broadcast_marks.lua`; `holder`: the shard's lease owner and last epoch.
    pub fn write_marks(&mut self, w: &MarkWrite, holder: Option<(&PodId, Epoch)>) -> MarksWritten {
        if holder != Some((&w.pod, w.epoch)) {
            return MarksWritten::NotHolder;
        }
        let Some(stored) = self.records.get_mut(&w.id) else {
            // Gone (expired and dropped): nothing to record, nothing kept.
            return MarksWritten::Done {
                kept: vec![None; w.marks.len()],
            };
        };
        let marks = stored.marks.entry(w.shard).or_default();
        let kept = w
            .marks
            .iter()
            .map(|(terminal, mark)| match (mark, marks.get(terminal)) {
                (Mark::Sending { .. }, Some(old)) => Some(*old),
                _ => {
                    marks.insert(terminal.clone(), *mark);
                    None
                }
            })
            .collect();
        for (terminal, since_ms) in &w.unsent {
            if marks.get(terminal)
                == Some(&Mark::Sending {
                    since_ms: *since_ms,
                })
            {
                marks.remove(terminal);
            }
        }
        if let Some(progress) = &w.progress {
            stored.shards.insert(w.shard, progress.clone());
        }
        MarksWritten::Done { kept }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_read_back_from_their_text() {
        for mark in [
            Mark::Sending { since_ms: 17 },
            Mark::Delivered { duplicate: false },
            Mark::Delivered { duplicate: true },
            Mark::Rejected { status: 400 },
            Mark::Unknown,
        ] {
            assert_eq!(Mark::parse(&mark.text()), Some(mark));
        }
        for bad in ["", "s", "sx", "r", "x", "dd"] {
            assert_eq!(Mark::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn ids_differ_by_tenant_and_key() {
        let id = broadcast_id("acme", "k");
        assert_eq!(id.len(), 32);
        assert_ne!(id, broadcast_id("bank", "k"));
        assert_ne!(id, broadcast_id("acme", "k2"));
        assert_eq!(id, broadcast_id("acme", "k"));
    }
}
