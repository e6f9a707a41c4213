//! What a running pod tells the outside world: the data behind `/readyz`, `/v1/cluster`
//! and the peer "do you reach the store?" answer.
//!
//! The driver publishes a fresh [`PodStatus`] on a `tokio::sync::watch` channel after
//! every change; readers (HTTP handlers, the metrics sampler) never lock the reconciler.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::core::membership::Member;
use crate::core::reconciler::Outage;
use crate::core::{Epoch, PodId, ShardId};

/// A pod's view of itself and the cluster at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodStatus {
    pub pod: Option<PodId>,
    /// Registered in the store's membership (heartbeat accepted).
    pub registered: bool,
    /// Registered and, once, every shard assigned to this pod was served. Stays true
    /// through later rebalances (see `/readyz`).
    pub ready: bool,
    /// The coordination store as this pod sees it.
    pub store: StoreStatus,
    /// Until when this pod changes no ownership but re-claims what it holds: the
    /// recovery hold after the store lost its data, went back in time (a failover that
    /// lost writes) or was unreachable past the lease deadlines. `None` when it does not.
    pub recovery_hold: Option<Instant>,
    /// Live members from the last poll, sorted by pod id.
    pub members: Vec<Member>,
    /// The placement this pod follows; `None` before it follows one.
    pub placement: Option<PlacementStatus>,
    /// One entry per shard, index = shard.
    pub shards: Vec<ShardStatus>,
}

/// Whether this pod reaches the coordination store and, when it does not, what it
/// makes of the failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoreStatus {
    /// No store call has finished yet (the pod is starting).
    #[default]
    Untried,
    /// The last store call succeeded.
    Reachable,
    /// Store calls fail since `since` (the first failed call, local monotonic time);
    /// `outage` is this pod's verdict on the failure.
    Unreachable { since: Instant, outage: Outage },
}

/// Every value of [`StoreStatus::verdict`].
pub const VERDICTS: [&str; 4] = ["reachable", "unknown", "isolated", "cluster_wide"];

impl StoreStatus {
    /// Whether the last store call succeeded.
    pub fn reachable(&self) -> bool {
        *self == StoreStatus::Reachable
    }

    /// The verdict as a label, one of [`VERDICTS`]: `reachable`; `unknown` (starting, or
    /// the peers not asked yet); `isolated` (only this pod is cut off: its shards are
    /// given up at their deadlines); `cluster_wide` (a majority cannot reach the store:
    /// shards are held past their deadlines and keep delivering).
    pub fn verdict(&self) -> &'static str {
        match self {
            StoreStatus::Reachable => "reachable",
            StoreStatus::Untried
            | StoreStatus::Unreachable {
                outage: Outage::Unknown,
                ..
            } => "unknown",
            StoreStatus::Unreachable {
                outage: Outage::Isolated { .. },
                ..
            } => "isolated",
            StoreStatus::Unreachable {
                outage: Outage::ClusterWide { .. },
                ..
            } => "cluster_wide",
        }
    }

    /// How long the store has failed at `now`: since the first failed call of the
    /// current failure; zero while it answers (or before the first call).
    pub fn unreachable_for(&self, now: Instant) -> Duration {
        match self {
            StoreStatus::Unreachable { since, .. } => now.saturating_duration_since(*since),
            StoreStatus::Untried | StoreStatus::Reachable => Duration::ZERO,
        }
    }
}

/// The placement a pod follows: its version, and when the pod learned it (the last
/// placement change it saw, local monotonic time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementStatus {
    pub version: u64,
    pub since: Instant,
}

/// One shard as this pod sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShardStatus {
    pub shard: ShardId,
    /// The ring's choice for the current (applied) membership view.
    pub assigned: Option<PodId>,
    /// The lease holder in the last poll.
    pub owner: Option<PodId>,
    /// The lease holder's epoch in the last poll.
    pub epoch: Option<Epoch>,
    /// This pod serves the shard right now (a suspended shard too, while it delivers).
    pub serving: bool,
    /// This pod holds the shard past its lease deadline through a store outage, its
    /// connections kept: delivering while `serving` (the cluster-wide verdict stands),
    /// parked otherwise, until the lease is confirmed again.
    pub suspended: bool,
    /// The pod the shard moves to once a slot of the move budget is free
    /// (`--max-moving-shards`); the placement keeps it with `assigned` until then.
    /// `None` when its move does not wait.
    pub next_owner: Option<PodId>,
}
