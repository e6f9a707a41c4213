//! What a running pod tells the outside world: the data behind `/readyz`, `/v1/cluster`
//! and the peer "do you reach the store?" answer.
//!
//! The driver publishes a fresh [`PodStatus`] on a `tokio::sync::watch` channel after
//! every change; readers (HTTP handlers) never lock the reconciler.

use serde::Serialize;

use crate::core::membership::Member;
use crate::core::{Epoch, PodId, ShardId};

/// A pod's view of itself and the cluster at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodStatus {
    pub pod: Option<PodId>,
    /// Registered in the store's membership (heartbeat accepted).
    pub registered: bool,
    /// Registered and, once, every shard assigned to this pod was served. Stays true
    /// through later rebalances (see `/readyz`).
    pub ready: bool,
    /// The last store call succeeded (within one renew interval).
    pub store_reachable: bool,
    /// Live members from the last poll, sorted by pod id.
    pub members: Vec<Member>,
    /// One entry per shard, index = shard.
    pub shards: Vec<ShardStatus>,
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
    /// This pod serves the shard right now.
    pub serving: bool,
    /// This pod holds the shard through a cluster-wide store outage: connections kept,
    /// nothing delivered until the lease is confirmed again.
    pub suspended: bool,
}
