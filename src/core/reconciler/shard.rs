//! The per-shard state a pod keeps, and the names of its transitions.
//!
//! This is bookkeeping only; the decisions that move a shard between states live in
//! `super` (the reconciler), which sees all shards and the cluster at once.

use std::time::Instant;

use crate::core::Epoch;

/// Where one shard stands for this pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardState {
    /// Not held by this pod (as far as it knows).
    Idle,
    /// Held and served until `deadline` (local monotonic time).
    Serving { epoch: Epoch, deadline: Instant },
    /// Held, but the local deadline passed during a cluster-wide store outage: the
    /// connections stay open, nothing is delivered, and the lease is reclaimed when the
    /// store returns.
    Suspended { epoch: Epoch },
    /// `StopServing` was emitted; waiting for the connections to close.
    Stopping { epoch: Epoch, then: AfterStop },
    /// Stopped; an owner-checked release is to be sent (`sent == false`) or in flight.
    Releasing { sent: bool },
}

/// What follows once a shard's connections are closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterStop {
    /// Delete the lease so the next owner can take it at once (rebalance, shutdown).
    Release,
    /// The lease is already lost or unreachable: just forget it.
    Forget,
}

/// Why a shard stops being served. Carried in `Action::StopServing` for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The ring assigns the shard to another pod.
    Rebalance,
    /// The local lease deadline passed without a successful renewal.
    Expired,
    /// A renewal found the lease missing in the store.
    Lost,
    /// Another pod holds the lease (found by a renewal or a reclaim).
    Stolen,
    /// A terminal answered a hello or push with a stale-epoch refusal.
    StaleEpoch,
    /// The store is unreachable from this pod only: it gives the shard up.
    Isolated,
    /// Graceful shutdown.
    Shutdown,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Rebalance => "rebalance",
            StopReason::Expired => "expired",
            StopReason::Lost => "lost",
            StopReason::Stolen => "stolen",
            StopReason::StaleEpoch => "stale_epoch",
            StopReason::Isolated => "isolated",
            StopReason::Shutdown => "shutdown",
        }
    }
}

/// One shard's local record.
#[derive(Clone, Debug)]
pub struct Shard {
    pub state: ShardState,
    /// When an acquire for this shard was sent, while it is in flight (a fresh claim when
    /// `Idle`, a reclaim when held).
    pub claim_sent: Option<Instant>,
    /// A held shard must be re-claimed with `SET NX` (new store generation, or the store
    /// came back after the local deadline passed).
    pub needs_reclaim: bool,
    /// An acquire's answer was lost, so the store may hold a lease naming us.
    pub maybe_ours: bool,
    /// The last time a fresh claim was sent, to pace retries against a current holder.
    pub last_claim: Option<Instant>,
}

impl Shard {
    pub fn new() -> Self {
        Shard {
            state: ShardState::Idle,
            claim_sent: None,
            needs_reclaim: false,
            maybe_ours: false,
            last_claim: None,
        }
    }

    /// The epoch of a lease this pod still holds (serving or suspended).
    pub fn held_epoch(&self) -> Option<Epoch> {
        match self.state {
            ShardState::Serving { epoch, .. } | ShardState::Suspended { epoch } => Some(epoch),
            _ => None,
        }
    }

    /// A release is pending or in flight, or connections are closing before one.
    pub fn releasing(&self) -> bool {
        matches!(
            self.state,
            ShardState::Stopping {
                then: AfterStop::Release,
                ..
            } | ShardState::Releasing { .. }
        )
    }
}
