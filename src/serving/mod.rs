//! The one seam between ownership and delivery: how the rest of the pod learns which
//! shards it may deliver on — the [`ServingTable`] (state, read at any time) and the
//! [`ServingHook`] (transitions, told as they happen) — and what the connection layer
//! reports back for metrics and pages ([`SessionStats`]).
//!
//! The driver is the only writer of both. The table is the authority for "may I deliver
//! on this shard now?": readers pass their own `now` and the lease's local deadline is
//! checked on every read, so nothing is delivered past a deadline even when the driver
//! is late to notice it. The hook is the seam for the connection layer (dial terminals
//! on start, close them on stop): `posgate serve` runs with the POS connection manager;
//! tests may use `()`, which acknowledges every stop at once.
//!
//! Not for: deciding anything. The table and hook mirror the reconciler's shard states;
//! the stats are counts, never read for a decision.

mod stats;

pub use self::stats::{NoSessions, SessionStats, TerminalCounts};

use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use crate::core::reconciler::StopReason;
use crate::core::{Epoch, ShardId};

/// One shard as the table records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    Idle,
    /// Delivered on with `epoch` while `now < deadline` (local monotonic time): the lease
    /// deadline, or for a shard held through a cluster-wide outage the lapse of the
    /// verdict.
    Serving {
        epoch: Epoch,
        deadline: Instant,
    },
    /// Held, its connections kept, but not delivering: a store outage whose verdict is
    /// not (or no longer) cluster-wide.
    Suspended {
        epoch: Epoch,
    },
}

/// Which shards this pod serves, with which epoch, until when. Cheap to clone and to
/// read; shared by every clone.
#[derive(Clone, Debug)]
pub struct ServingTable {
    slots: Arc<RwLock<Vec<Slot>>>,
}

impl ServingTable {
    /// A table of `shards` shards, none served. Only the driver ever marks one served.
    pub fn new(shards: u32) -> Self {
        ServingTable {
            slots: Arc::new(RwLock::new(vec![Slot::Idle; shards as usize])),
        }
    }

    /// The epoch to deliver on `shard` with at `now`, or `None` when this pod must not
    /// deliver on it. `now` is monotonic time as the driver sees it:
    /// `crate::clock::now()`.
    pub fn serving(&self, shard: ShardId, now: Instant) -> Option<Epoch> {
        match self.read(shard)? {
            Slot::Serving { epoch, deadline } if now < deadline => Some(epoch),
            _ => None,
        }
    }

    fn read(&self, shard: ShardId) -> Option<Slot> {
        // A writer cannot panic half-way through a slice copy, so a poisoned lock still
        // holds a consistent table.
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots.get(shard as usize).copied()
    }

    pub(crate) fn set(&self, slots: &[Slot]) {
        let mut table = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        table.copy_from_slice(slots);
    }
}

/// What the driver tells the connection layer about serving transitions. The table is
/// already updated when a method is called.
pub trait ServingHook: Send + Sync + 'static {
    /// `shard` is served with `epoch` from now on (new, resumed or re-claimed).
    fn start(&self, shard: ShardId, epoch: Epoch);

    /// Stop delivering on `shard` but keep its connections (cluster-wide store outage).
    fn suspend(&self, shard: ShardId, epoch: Epoch);

    /// Close `shard`'s connections. The lease is released (or forgotten) only once the
    /// returned future resolves, so the next owner cannot dial before they are closed.
    fn stop(
        &self,
        shard: ShardId,
        epoch: Epoch,
        reason: StopReason,
    ) -> impl Future<Output = ()> + Send + 'static;
}

/// No connection layer: nothing to dial or close, so a stop is acknowledged at once.
impl ServingHook for () {
    fn start(&self, _shard: ShardId, _epoch: Epoch) {}

    fn suspend(&self, _shard: ShardId, _epoch: Epoch) {}

    fn stop(
        &self,
        _shard: ShardId,
        _epoch: Epoch,
        _reason: StopReason,
    ) -> impl Future<Output = ()> + Send + 'static {
        std::future::ready(())
    }
}
