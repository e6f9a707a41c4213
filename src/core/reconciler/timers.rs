//! Periodic-operation timers and the membership debounce, both on caller-supplied time.

use std::time::{Duration, Instant};

use crate::core::PodId;

/// A periodic store operation: due at `next`, at most one in flight.
#[derive(Clone, Debug)]
pub struct Timer {
    next: Instant,
    in_flight: bool,
}

impl Timer {
    pub fn due_at(next: Instant) -> Self {
        Timer {
            next,
            in_flight: false,
        }
    }

    pub fn due(&self, now: Instant) -> bool {
        !self.in_flight && now >= self.next
    }

    /// When it fires next; `None` while an operation is in flight.
    pub fn next(&self) -> Option<Instant> {
        (!self.in_flight).then_some(self.next)
    }

    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    pub fn start(&mut self) {
        self.in_flight = true;
    }

    /// The operation answered; fire again at `next`.
    pub fn finish(&mut self, next: Instant) {
        self.in_flight = false;
        self.next = next;
    }

    /// Fire no later than `at`.
    pub fn reschedule(&mut self, at: Instant) {
        self.next = self.next.min(at);
    }
}

/// Waits for the member set to be stable before it is applied, so a burst of joins
/// (a rollout, a scale-out by several pods) causes one rebalance, not one per pod.
/// A view that keeps changing is applied anyway after five debounce periods.
#[derive(Clone, Debug, Default)]
pub struct Debounce {
    pending: Option<Pending>,
}

#[derive(Clone, Debug)]
struct Pending {
    view: Vec<PodId>,
    changed: Instant,
    first: Instant,
}

const MAX_DEFERRALS: u32 = 5;

impl Debounce {
    /// Records the member set seen at `now` (`view` sorted) against the applied one.
    pub fn observe(&mut self, now: Instant, view: Vec<PodId>, applied: &[PodId]) {
        if view == applied {
            self.pending = None;
            return;
        }
        match &mut self.pending {
            Some(p) if p.view == view => {}
            Some(p) => {
                p.view = view;
                p.changed = now;
            }
            None => {
                self.pending = Some(Pending {
                    view,
                    changed: now,
                    first: now,
                })
            }
        }
    }

    /// When the pending view becomes applicable.
    pub fn due(&self, debounce: Duration) -> Option<Instant> {
        self.pending
            .as_ref()
            .map(|p| (p.changed + debounce).min(p.first + debounce * MAX_DEFERRALS))
    }

    pub fn ready(&self, now: Instant, debounce: Duration) -> bool {
        self.due(debounce).is_some_and(|t| now >= t)
    }

    pub fn take(&mut self) -> Option<Vec<PodId>> {
        self.pending.take().map(|p| p.view)
    }
}
