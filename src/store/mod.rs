//! The `CoordStore` seam: everything posgate needs from its coordination store.
//!
//! Two implementations share one contract: [`redis::RedisStore`] (production; every
//! multi-key step is one Lua script, so it is atomic) and [`memory::MemoryStore`]
//! (single-process embedded mode and the deterministic simulation). A differential test
//! runs one operation script against both and compares the answers.
//!
//! Semantics every implementation must keep (see `docs/design.md`, "Keys and scripts"):
//! - **Generation.** Every call that writes takes the caller's generation id and writes
//!   nothing when it differs, answering [`Checked::GenerationChanged`]. When the store
//!   has no generation (first use, or Redis restarted empty) the call creates one with a
//!   fresh random id. `""` never matches, so a pod's first call learns the generation.
//! - **Liveness by the store's clock.** Member and lease expiry use the store's clock
//!   (`TIME` in Redis), never the caller's.
//! - **Epochs never decrease**, even across a restart that lost everything:
//!   `epoch = max(last_epoch(shard) + 1, store_time_ms)`.
//! - **Owner checks.** Renew and release act only on keys whose value is the caller.
//! - **Lease lifetime.** A lease lives at least `ttl` after the last acquire or renew
//!   that named it (by the store clock), until released. It may live longer, never
//!   shorter: Redis keeps a pod's leases by one pod lease while every member reads them
//!   (`docs/design.md`, "Pod leases"), so a lease the pod stopped renewing lasts while
//!   the pod renews others or stays a member; the memory store expires each on its own.
//! - **Placement compare-and-set.** [`CoordStore::place`] replaces the stored placement
//!   only when the caller names the version the store holds (or `None` when it holds
//!   none); it never checks the generation, so a placement can be put back after a wipe.
//! - **Notifications.** Joins, graceful leaves, releases and placement changes bump
//!   [`CoordStore::changes`] so peers poll at once instead of waiting for the poll
//!   interval.
//!
//! What it does not do: decide anything. Policy (who should own what, when to give up)
//! lives in `crate::core`.

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::core::lease::{
    AcquireOutcome, Checked, Claim, LeaseCall, Release, ReleaseNote, Released, RenewOutcome,
};
use crate::core::membership::{Member, Snapshot};
use crate::core::placement::Placement;
use crate::core::ring::Assignment;
use crate::core::{PodId, ShardId};

pub mod broadcast;
pub mod directory;
pub mod keys;
pub mod memory;
pub mod queue;
pub mod redis;

/// Settings every pod of a cluster must share, pinned in the store by the first pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMeta {
    pub shards: u32,
    pub shard_hash: String,
    pub ring: String,
}

impl ClusterMeta {
    /// The metadata this binary runs with for `shards` shards.
    pub fn current(shards: u32) -> Self {
        ClusterMeta {
            shards,
            shard_hash: crate::core::shard::SHARD_HASH.to_string(),
            ring: crate::core::ring::RING_VERSION.to_string(),
        }
    }
}

/// Why a store call failed. A failed call may or may not have taken effect.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The settings themselves are wrong (URL, cluster name, TLS set-up): retrying cannot
    /// help, unlike every other variant.
    #[error("invalid store configuration: {0}")]
    Config(String),
    #[error("store unreachable: {0}")]
    Unavailable(String),
    /// The store answered, but refuses to serve now: Redis gave one of the error codes of
    /// a passing condition (a read-only replica, out of memory, loading its data set, a
    /// replica cut from its master; `store/redis/client.rs` lists them). Treated like an
    /// unreachable store: retrying later may succeed.
    #[error("store refuses to serve ({code}): {detail}")]
    Refused { code: String, detail: String },
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// A write the store applied but fewer replicas acknowledged than required
    /// (`--redis-wait-replicas`): a failover could lose it, so it does not count. Treated
    /// like a call that was not answered.
    #[error("store write acknowledged by {acked} of {wanted} replicas required: not counted")]
    NotReplicated { acked: u64, wanted: u32 },
    #[error(
        "cluster metadata mismatch: the store has {stored:?} but this pod runs {ours:?}; \
         every pod of a cluster must use the same --shards, shard hash and ring version"
    )]
    MetaMismatch {
        stored: ClusterMeta,
        ours: ClusterMeta,
    },
    #[error("unexpected store reply: {0}")]
    Protocol(String),
}

/// The coordination store. All methods are cancel-safe to drop; a dropped or failed call
/// may still have been applied.
pub trait CoordStore: Send + Sync + 'static {
    /// Writes `meta` if the store has none; fails with [`StoreError::MetaMismatch`] if it
    /// holds a different one.
    fn pin_meta(&self, meta: &ClusterMeta) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Registers or refreshes `member` for `ttl` (by the store clock) and re-pins `meta`
    /// if the store lost it. Publishes a join notification when the member was not
    /// registered before. Answers the generation's heartbeat count including this one
    /// ([`crate::core::membership::Snapshot::heartbeats`]).
    fn heartbeat(
        &self,
        generation: &str,
        member: &Member,
        meta: &ClusterMeta,
        ttl: Duration,
    ) -> impl Future<Output = Result<Checked<u64>, StoreError>> + Send;

    /// Removes `pod`'s registration at once and publishes a leave notification.
    fn deregister(&self, pod: &PodId) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Tries to take each claimed shard's lease for `call.ttl` (`SET NX PX` + an epoch
    /// above the claim's floor), in one call; a lease `call.pod` already holds is
    /// extended, and its epoch bumped above the floor when the floor is higher.
    /// Outcomes are in the order of `claims`.
    fn acquire(
        &self,
        call: &LeaseCall<'_>,
        claims: &[Claim],
    ) -> impl Future<Output = Result<Checked<Vec<AcquireOutcome>>, StoreError>> + Send;

    /// Extends each of `call.pod`'s leases to `call.ttl` if it still holds it, in one
    /// call.
    fn renew(
        &self,
        call: &LeaseCall<'_>,
        shards: &[ShardId],
    ) -> impl Future<Output = Result<Checked<Vec<RenewOutcome>>, StoreError>> + Send;

    /// Gives up each lease that `pod` holds (owner-checked), in one call: deleted, or,
    /// with [`Release::to`] a live member, handed to it with a new epoch above the
    /// release's floor (the key keeps an expiry of `ttl` unless the target keeps a pod
    /// lease). Publishes a release notification for each; with `note`, each leaves it
    /// (for `note.ttl`) to the next [`CoordStore::acquire`] of the shard. Answers per
    /// release, in order.
    fn release(
        &self,
        pod: &PodId,
        releases: &[Release],
        note: Option<&ReleaseNote>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<Released>, StoreError>> + Send;

    /// Live members, all lease holders and the placement in one atomic read; creates the
    /// generation if the store has none.
    fn snapshot(&self, shards: u32) -> impl Future<Output = Result<Snapshot, StoreError>> + Send;

    /// Stores `placement` if the stored placement has version `expected` (`None`: there is
    /// none) and publishes a placement notification. Returns whether it was stored.
    fn place(
        &self,
        expected: Option<u64>,
        placement: &Placement,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// A counter bumped on every join, leave or release notification. Implementations
    /// keep the subscription alive (reconnecting as needed) for the store's lifetime.
    fn changes(&self) -> watch::Receiver<u64>;
}

/// The stored form of a placement's table (the `table` field of the placement key).
#[derive(Serialize, Deserialize)]
struct PlacementTable {
    pods: Vec<PodId>,
    owner: Vec<u32>,
}

/// The JSON `table` of `placement`.
pub(crate) fn placement_table(placement: &Placement) -> Result<String, StoreError> {
    let table = PlacementTable {
        pods: placement.assignment.pods().to_vec(),
        owner: placement.assignment.owner_indices().to_vec(),
    };
    serde_json::to_string(&table).map_err(|e| StoreError::Protocol(e.to_string()))
}

/// The placement of `version` with JSON `table`, checked against `shards`.
pub(crate) fn parse_placement(
    version: u64,
    table: &str,
    shards: u32,
) -> Result<Placement, StoreError> {
    let bad = |e: String| StoreError::Protocol(format!("bad stored placement: {e}"));
    let table: PlacementTable = serde_json::from_str(table).map_err(|e| bad(e.to_string()))?;
    let assignment =
        Assignment::from_parts(table.pods, table.owner, shards).map_err(|e| bad(e.to_string()))?;
    Ok(Placement {
        version,
        assignment,
    })
}
