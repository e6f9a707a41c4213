//! The pod's lifecycle: running, then (on a graceful shutdown) draining its shards,
//! deregistering, finished.
//!
//! One enum, changed only through the `move_to_*` methods here, so a deregistration
//! cannot be in flight while the pod runs, nor shutdown lose the time it began (its
//! budget counts from there).
//!
//! Not for: what shutting down does to the shards (stop, release: `rules.rs`) or when a
//! shutdown is asked for (the driver calls [`super::Reconciler::begin_shutdown`]).

use std::time::Instant;

#[derive(Clone, Debug)]
pub(super) struct Lifecycle {
    inner: Life,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Running,
    /// Shutdown began at `started`: shards are stopped and released.
    Draining {
        started: Instant,
    },
    /// Every release is answered and `Deregister` was sent; waiting for its answer.
    Deregistering {
        started: Instant,
    },
    /// Deregistered, or out of shutdown budget: nothing is done any more.
    Finished,
}

impl Lifecycle {
    pub fn new() -> Self {
        Lifecycle {
            inner: Life::Running,
        }
    }

    pub fn running(&self) -> bool {
        self.inner == Life::Running
    }

    /// When the graceful shutdown under way began.
    pub fn shutdown_started(&self) -> Option<Instant> {
        match self.inner {
            Life::Draining { started } | Life::Deregistering { started } => Some(started),
            Life::Running | Life::Finished => None,
        }
    }

    /// Shutting down and `Deregister` not sent yet.
    pub fn draining(&self) -> bool {
        matches!(self.inner, Life::Draining { .. })
    }

    pub fn finished(&self) -> bool {
        self.inner == Life::Finished
    }

    /// A graceful shutdown is asked for at `now`. Asking again changes nothing: the budget
    /// counts from the first request.
    pub fn move_to_draining(&mut self, now: Instant) {
        if self.inner == Life::Running {
            self.inner = Life::Draining { started: now };
        }
    }

    /// `Deregister` is being sent.
    pub fn move_to_deregistering(&mut self) {
        let Life::Draining { started } = self.inner else {
            debug_assert!(false, "deregistering while {:?}", self.inner);
            return;
        };
        self.inner = Life::Deregistering { started };
    }

    /// Deregistration answered (even a failure ends shutdown: the registration expires by
    /// its TTL), or the shutdown budget ran out.
    pub fn move_to_finished(&mut self) {
        self.inner = Life::Finished;
    }
}
