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

pub use self::stats::{NoSessions, SessionStats, ShardCount, TerminalCounts};

use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::core::membership::Member;
use crate::core::reconciler::Stop;
use crate::core::{Epoch, ShardId};

/// One shard as the table records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    Idle,
    /// Delivered on with `epoch` while `now < deadline` (local monotonic time): the lease
    /// deadline.
    Serving {
        epoch: Epoch,
        deadline: Instant,
    },
    /// Suspended and delivering: held past its lease deadline through a cluster-wide
    /// store outage (nobody can acquire), delivered on with `epoch` while `now < until`,
    /// the lapse of the verdict.
    Held {
        epoch: Epoch,
        until: Instant,
    },
    /// Suspended and parked: held, its connections kept, but not delivering: a store
    /// outage whose verdict is not (or no longer) cluster-wide.
    Parked {
        epoch: Epoch,
    },
}

/// On what footing this pod may deliver on a shard now, with which epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Within the lease's local deadline.
    Leased(Epoch),
    /// Past the lease deadline, held through a cluster-wide store outage (static
    /// stability: the held lease is still the newest, since nobody can acquire).
    Held(Epoch),
}

impl Grant {
    pub fn epoch(self) -> Epoch {
        match self {
            Grant::Leased(epoch) | Grant::Held(epoch) => epoch,
        }
    }
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

    /// How many shards the table has (the cluster's shard count).
    pub fn shards(&self) -> u32 {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        u32::try_from(slots.len()).expect("made from a u32")
    }

    /// The epoch to deliver on `shard` with at `now`, or `None` when this pod must not
    /// deliver on it. `now` is monotonic time as the driver sees it:
    /// `crate::clock::now()`.
    pub fn serving(&self, shard: ShardId, now: Instant) -> Option<Epoch> {
        self.grant(shard, now).map(Grant::epoch)
    }

    /// Like [`ServingTable::serving`], also saying whether the epoch is delivered on
    /// within its lease or held past it.
    pub fn grant(&self, shard: ShardId, now: Instant) -> Option<Grant> {
        match self.read(shard)? {
            Slot::Serving { epoch, deadline } if now < deadline => Some(Grant::Leased(epoch)),
            Slot::Held { epoch, until } if now < until => Some(Grant::Held(epoch)),
            _ => None,
        }
    }

    /// The epoch of a shard held past its lease deadline through a store outage
    /// (suspended: delivering or parked), if it is.
    pub fn suspended(&self, shard: ShardId) -> Option<Epoch> {
        match self.read(shard)? {
            Slot::Held { epoch, .. } | Slot::Parked { epoch } => Some(epoch),
            Slot::Idle | Slot::Serving { .. } => None,
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
    /// `shard` was acquired while another pod, `from`, held it last as far as this pod
    /// saw (a planned move or a takeover); called right before [`ServingHook::start`].
    /// For what moves with a shard besides its connections (the push layer's kept
    /// answers); the connection layer needs nothing more than `start`.
    fn taken_over(&self, _shard: ShardId, _epoch: Epoch, _from: &Member) {}

    /// `shard` is served with `epoch` from now on (new, resumed or re-claimed).
    fn start(&self, _shard: ShardId, _epoch: Epoch) {}

    /// Stop delivering on `shard` but keep its connections (cluster-wide store outage).
    fn suspend(&self, _shard: ShardId, _epoch: Epoch) {}

    /// Close `shard`'s connections, or with [`Close::Drain`](crate::core::reconciler::Close::Drain) keep them open without
    /// delivering until the next owner asks for each terminal. The lease is released (or
    /// forgotten) only once the returned future resolves, so the next owner cannot dial
    /// before they are closed (or drained: nothing is being sent on them any more).
    fn stop(&self, stop: Stop) -> impl Future<Output = ()> + Send + 'static;

    /// The [`Member::handover`] protocol this hook speaks (advertised in the pod's
    /// registration): whether it can drain a stopped shard and ask a predecessor.
    fn handover(&self) -> u32 {
        0
    }

    /// How long a drained shard's sessions stay open at most (zero when this hook does
    /// not drain): how long the note its release leaves for the next holder is kept.
    fn drain_budget(&self) -> Duration {
        Duration::ZERO
    }

    /// The [`Member::queue`] capability this hook gives the pod (advertised in its
    /// registration): whether it keeps pushes for later and drains the ones of the
    /// shards it serves.
    fn queue(&self) -> u32 {
        0
    }
}

/// Two hooks told the same transitions, in order; a stop resolves when both have.
impl<A: ServingHook, B: ServingHook> ServingHook for (A, B) {
    fn taken_over(&self, shard: ShardId, epoch: Epoch, from: &Member) {
        self.0.taken_over(shard, epoch, from);
        self.1.taken_over(shard, epoch, from);
    }

    fn start(&self, shard: ShardId, epoch: Epoch) {
        self.0.start(shard, epoch);
        self.1.start(shard, epoch);
    }

    fn suspend(&self, shard: ShardId, epoch: Epoch) {
        self.0.suspend(shard, epoch);
        self.1.suspend(shard, epoch);
    }

    fn stop(&self, stop: Stop) -> impl Future<Output = ()> + Send + 'static {
        let (a, b) = (self.0.stop(stop), self.1.stop(stop));
        async move {
            tokio::join!(a, b);
        }
    }

    /// The one that keeps sessions decides (the other answers the default 0).
    fn handover(&self) -> u32 {
        self.0.handover().max(self.1.handover())
    }

    fn drain_budget(&self) -> Duration {
        self.0.drain_budget().max(self.1.drain_budget())
    }

    fn queue(&self) -> u32 {
        self.0.queue().max(self.1.queue())
    }
}

/// No connection layer: nothing to dial or close, so a stop is acknowledged at once.
impl ServingHook for () {
    fn stop(&self, _stop: Stop) -> impl Future<Output = ()> + Send + 'static {
        std::future::ready(())
    }
}

#[cfg(test)]
mod tests {
    //! The table's answers for each kind of slot.

    use std::time::Duration;

    use super::*;

    #[test]
    fn a_held_shard_is_delivered_on_until_the_verdict_lapses() {
        let t = Instant::now();
        let table = ServingTable::new(4);
        table.set(&[
            Slot::Idle,
            Slot::Serving {
                epoch: 3,
                deadline: t + Duration::from_secs(1),
            },
            Slot::Held {
                epoch: 5,
                until: t + Duration::from_secs(2),
            },
            Slot::Parked { epoch: 7 },
        ]);
        let grants = |at| (0..4).map(|s| table.grant(s, at)).collect::<Vec<_>>();
        assert_eq!(
            grants(t),
            [None, Some(Grant::Leased(3)), Some(Grant::Held(5)), None]
        );
        let later = t + Duration::from_millis(1500);
        assert_eq!(grants(later), [None, None, Some(Grant::Held(5)), None]);
        assert_eq!(table.serving(2, later), Some(5));
        assert_eq!(grants(t + Duration::from_secs(2)), [None; 4]);
        // Held and parked shards are both suspended, whatever the time.
        let suspended: Vec<_> = (0..4).map(|s| table.suspended(s)).collect();
        assert_eq!(suspended, [None, None, Some(5), Some(7)]);
    }
}
