//! What a pod knows about the cluster: the members registered in the store, the holders
//! of every shard lease and the stored placement, as returned by one poll of the store.
//!
//! These are plain records; liveness was already judged by the store (by its own clock),
//! so a [`Snapshot`] only ever lists members whose registration had not expired.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::placement::Placement;
use super::types::{Epoch, PodId};

/// One registered pod, as written by its heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub pod: PodId,
    /// How peers reach this pod's HTTP listener (e.g. `http://10.1.2.3:8080`).
    pub url: String,
    /// The posgate binary version.
    pub version: String,
    /// The ring algorithm this pod computes assignments with (`ring::RING_VERSION`).
    pub ring_version: String,
    /// Wall-clock start time of the pod, milliseconds since the Unix epoch (informational).
    pub started_ms: u64,
    /// The newest peer protocol the pod speaks (`posgate::peer::PEER_PROTOCOL`). Records
    /// of the release before it have none, which means protocol 1.
    #[serde(default = "protocol_1")]
    pub peer_protocol: u32,
    /// The planned-move protocol the pod speaks: 0 (records of releases before it)
    /// closes a whole shard before releasing it; [`HANDOVER_DRAIN`] keeps the sessions
    /// open as draining and closes each terminal when the new owner asks, right before
    /// it dials (`docs/design.md` "Planned moves, per terminal").
    #[serde(default)]
    pub handover: u32,
    /// Whether the pod keeps pushes for later (`QUEUE_CAPABILITY` of `posgate::push::queue`):
    /// 0 in records of releases before it. Pods accept pushes with a TTL only while every
    /// member has it, so a push is never queued where a pod serving its shard would not
    /// drain it.
    #[serde(default)]
    pub queue: u32,
    /// Whether the pod takes a batch's pushes in one peer request ([`BATCH_PEER_ROUTE`]):
    /// 0 in records of releases before it, which are sent the pushes one by one.
    #[serde(default)]
    pub batch: u32,
    /// Whether the pod walks broadcasts on the shards it serves ([`BROADCAST_WALK`]): 0
    /// in records of releases before it. Broadcasts are created only while every member
    /// does, so none stalls on a shard whose owner would not send it.
    #[serde(default)]
    pub broadcast: u32,
    /// Whether the pod counts planned moves against the move budget ([`MOVE_BUDGET`]): 0
    /// in records of releases before it, which write whole placements and no steps.
    /// Only a pod that has it writes the steps toward a placement's target.
    #[serde(default)]
    pub moves: u32,
    /// Whether the pod reads and keeps leases by pod lease ([`POD_LEASE`]; the Redis
    /// store's `pod-lease:<pod>` key): 0 in records of releases before it, which only
    /// understand leases with an expiry of their own. Pods keep their leases by one pod
    /// lease only while every member has it.
    #[serde(default)]
    pub pod_lease: u32,
}

/// [`Member::handover`] of a pod that drains: it closes a moved shard's terminals one
/// batch at a time, when the new owner asks, and asks its predecessor the same way.
pub const HANDOVER_DRAIN: u32 = 1;

/// [`Member::handover`] of a pod that also gives and takes a lease in one script
/// ([`crate::lease::Release::to`]): on a planned move the leaving owner hands the lease
/// to the assigned pod with a new epoch, and a pod under SIGTERM first writes the
/// placement without itself, so its shards go straight to their next owners.
pub const HANDOVER_LEASE: u32 = 2;

/// [`Member::handover`] of a pod that also relays pushes while it drains: until the new
/// owner has asked for a terminal, a push for it that reached the new owner goes out on
/// this pod's draining session (`POST /internal/v1/relay/{terminal}`), so a push never
/// waits for the terminal's close and redial.
pub const HANDOVER_RELAY: u32 = 3;

/// [`Member::batch`] of a pod that serves the peer batch route (`posgate::push::batch`).
pub const BATCH_PEER_ROUTE: u32 = 1;

/// [`Member::moves`] of a pod that writes placement steps under the move budget
/// (`crate::placement::step`).
pub const MOVE_BUDGET: u32 = 1;

/// [`Member::pod_lease`] of a pod whose store keeps its leases by one pod lease when
/// every member can read that (`docs/design.md` "Pod leases").
pub const POD_LEASE: u32 = 1;

/// [`Member::broadcast`] of a pod that walks broadcasts (`posgate::push::broadcast`).
pub const BROADCAST_WALK: u32 = 1;

fn protocol_1() -> u32 {
    1
}

/// The store's generation: a random id created whenever the store finds it missing, i.e.
/// on first use and after Redis restarted empty. A change of generation is how pods learn
/// that every lease and registration they had was lost at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerationInfo {
    pub id: String,
    /// How long ago the generation was created, by the store's clock.
    pub age: Duration,
}

/// A shard lease as seen in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub owner: PodId,
    pub epoch: Epoch,
}

/// One poll of the store: members and all lease holders, read atomically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub generation: GenerationInfo,
    /// Live members, sorted by pod id.
    pub members: Vec<Member>,
    /// Index = shard; `None` when nobody holds the lease.
    pub leases: Vec<Option<Lease>>,
    /// The stored placement; `None` before the first one is written and after the store
    /// lost its data.
    pub placement: Option<Placement>,
    /// How many heartbeats the store has taken in this generation (pods of releases
    /// before this count was kept add none). It only grows, so a pod that saw a higher
    /// count learns that the store lost acknowledged writes: registrations among them.
    pub heartbeats: u64,
}
