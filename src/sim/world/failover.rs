//! A failover of the simulated store to a replica: the store is unreachable for a while,
//! then comes back with the data it had a little earlier (the writes of the last moments
//! never reached the replica, as with Redis's asynchronous replication) and, possibly, a
//! clock that runs behind (or slightly ahead of) the old master's.
//!
//! The replica's view is kept as copies of the store state taken every
//! [`REPLICATION_STEP`] of virtual time, for the last [`KEPT`]; a failover restores the
//! newest copy at least `lost` old. Client-side state (the notification counter, the
//! generation RNG) is not part of a Redis and survives.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Ev, World};
use crate::store::memory::MemoryState;

/// How often the simulated replica's copy of the store is taken.
const REPLICATION_STEP: Duration = Duration::from_millis(100);
/// How far back copies are kept (a failover loses at most this much).
const KEPT: Duration = Duration::from_secs(5);

/// What a replica of the simulated store has: recent copies of the master's state.
#[derive(Default)]
pub(super) struct Replica {
    copies: VecDeque<(Duration, MemoryState)>,
}

/// A failover as the fault plan draws it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Failover {
    /// How long the store is unreachable (detection and promotion).
    pub outage: Duration,
    /// How much of the master's most recent history the promoted replica never received.
    pub lost: Duration,
    /// The promoted replica's clock minus the old master's, in milliseconds: negative is
    /// behind (an epoch rule without floors would then hand out lower epochs).
    pub clock_ms: i64,
}

impl Replica {
    /// Called after every store call: copies the state when a step has passed.
    pub fn replicate(&mut self, now: Duration, state: &MemoryState) {
        if self
            .copies
            .back()
            .is_some_and(|(at, _)| now < *at + REPLICATION_STEP)
        {
            return;
        }
        self.copies.push_back((now, state.clone()));
        while self.copies.front().is_some_and(|(at, _)| *at + KEPT < now) {
            self.copies.pop_front();
        }
    }

    /// Copies the state now, whatever the step: a write the replica acknowledged
    /// (`WAIT`) is in it.
    pub fn force(&mut self, now: Duration, state: &MemoryState) {
        if self.copies.back().is_some_and(|(at, _)| *at == now) {
            self.copies.pop_back();
        }
        self.copies.push_back((now, state.clone()));
    }

    /// The newest copy taken no later than `at`, if any is kept.
    fn as_of(&self, at: Duration) -> Option<&MemoryState> {
        self.copies
            .iter()
            .rev()
            .find(|(taken, _)| *taken <= at)
            .map(|(_, state)| state)
    }
}

impl World<'_> {
    /// The store loses all its data (Redis restarted empty). Its clock normally beats
    /// every epoch it handed out before; once a failover set it back, it may not, and
    /// only the claims' floors and the terminals' fence keep epochs from going back.
    pub(super) fn wipe_store(&mut self) {
        self.store.wipe();
        if self.store_clock_ms < self.store_clock_peak_ms {
            self.check.rolled_back(|_| 0);
        }
    }

    /// The store becomes unreachable; after `outage` the replica takes over.
    pub(super) fn begin_failover(&mut self, failover: Failover) {
        self.store_up = false;
        let at = self.now + failover.outage;
        // Writes acknowledged by the replica (the queue's, with `WAIT`) are not lost, nor
        // is anything before them: a replica's data is a prefix of the master's.
        let promoted = self
            .now
            .saturating_sub(failover.lost)
            .max(self.queue_waited);
        self.failing_over = true;
        self.schedule(at, Ev::FailedOver(failover, promoted));
    }

    /// The replica is the store now: the data it had at `promoted`, its own clock.
    pub(super) fn failed_over(&mut self, failover: Failover, promoted: Duration) {
        if let Some(state) = self.replica.as_of(promoted) {
            let state = state.clone();
            self.store.roll_back_to(&state);
            self.later_rolled_back();
        }
        self.store_clock_ms += failover.clock_ms;
        self.store_clock_peak_ms = self.store_clock_ms.max(self.store_clock_peak_ms);
        self.store_up = true;
        self.failing_over = false;
        self.stats.failovers += 1;
        self.check.rolled_back(|shard| self.store.last_epoch(shard));
        self.check.log(
            self.now,
            format_args!(
                "store failed over: data of {:.3}s, clock {:+} ms",
                promoted.as_secs_f64(),
                failover.clock_ms
            ),
        );
        self.replica = Replica::default();
    }
}
