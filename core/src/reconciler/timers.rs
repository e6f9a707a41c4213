//! Periodic-operation timers and the membership debounce, both on caller-supplied time.

use std::time::{Duration, Instant};

use crate::PodId;

/// A periodic store operation: due at a time, at most one in flight.
#[derive(Clone, Debug)]
pub enum Timer {
    Waiting {
        next: Instant,
    },
    /// An operation is out since `since`. `again` keeps a reschedule that arrived
    /// meanwhile: a change notification during a poll must cause another poll once this
    /// one answers, since the answer may predate the change (it did: a release published
    /// while the new owner's poll was in flight waited a whole poll interval for the next
    /// one).
    InFlight {
        since: Instant,
        again: Option<Instant>,
    },
}

impl Timer {
    pub fn due_at(next: Instant) -> Self {
        Timer::Waiting { next }
    }

    pub fn due(&self, now: Instant) -> bool {
        self.next().is_some_and(|next| now >= next)
    }

    /// When it fires next; `None` while an operation is in flight.
    pub fn next(&self) -> Option<Instant> {
        match self {
            Timer::Waiting { next } => Some(*next),
            Timer::InFlight { .. } => None,
        }
    }

    pub fn in_flight(&self) -> bool {
        matches!(self, Timer::InFlight { .. })
    }

    pub fn start(&mut self, now: Instant) {
        *self = Timer::InFlight {
            since: now,
            again: None,
        };
    }

    /// When the operation in flight was started, if one is.
    pub fn started(&self) -> Option<Instant> {
        match self {
            Timer::InFlight { since, .. } => Some(*since),
            Timer::Waiting { .. } => None,
        }
    }

    /// The operation answered; fire again at `next`, or sooner if rescheduled meanwhile.
    pub fn finish(&mut self, next: Instant) {
        let next = match self {
            Timer::InFlight {
                again: Some(at), ..
            } => next.min(*at),
            _ => next,
        };
        *self = Timer::Waiting { next };
    }

    /// Fire no later than `at` (after the operation in flight, if one is).
    pub fn reschedule(&mut self, at: Instant) {
        match self {
            Timer::Waiting { next } => *next = (*next).min(at),
            Timer::InFlight { again, .. } => *again = Some(again.map_or(at, |t| t.min(at))),
        }
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

    /// Whether a member set different from the applied one is waiting to settle.
    pub fn pending(&self) -> bool {
        self.pending.is_some()
    }

    pub fn take(&mut self) -> Option<Vec<PodId>> {
        self.pending.take().map(|p| p.view)
    }
}
