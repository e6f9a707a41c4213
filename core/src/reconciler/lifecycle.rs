//! The pod's lifecycle: running, then (on a graceful shutdown) placing itself out of the
//! placement while it still serves, draining its shards, deregistering, finished; and beside that stage, its presence in the cluster
//! (registered, ready).
//!
//! Two enums, changed only through the methods here, so a deregistration cannot be in
//! flight while the pod runs, nor shutdown lose the time it began (its budget counts
//! from there), nor a pod be ready before it registered.
//!
//! Not for: what shutting down does to the shards (stop, release: `rules.rs`) or when a
//! shutdown is asked for (the driver calls [`super::Reconciler::begin_shutdown`]).

use std::time::Instant;

#[derive(Clone, Debug)]
pub(super) struct Lifecycle {
    inner: Life,
    presence: Presence,
}

/// The pod in the member list, as its last snapshot showed it, and whether it was ever
/// ready. Readiness is never withdrawn (`/readyz` is sticky: a probe that flipped back
/// on a rebalance or a lost registration would take a pod that still serves out of its
/// Service), hence four states, not two flags that could say "ready, never registered".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Presence {
    /// Not registered yet, or the registration was lost before the pod was ever ready.
    Absent,
    /// Registered; some shard assigned to the pod is not served yet.
    Joining,
    /// Registered, and every assigned shard was served at once: ready.
    Ready,
    /// Ready once; the registration was lost since (a failover, an expiry while the pod
    /// could not write) and is being renewed. Still ready.
    ReadyAbsent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Running,
    /// Shutdown began at `started`: the pod writes the placement without itself and
    /// serves its shards meanwhile, so each can be handed to its next owner
    /// (`rules.rs`, `place_itself_out`).
    PlacingOut {
        started: Instant,
    },
    /// Shutdown began at `started`: shards are stopped and released (handed over).
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
            presence: Presence::Absent,
        }
    }

    /// In the member list, as of the last snapshot.
    pub fn registered(&self) -> bool {
        matches!(self.presence, Presence::Joining | Presence::Ready)
    }

    /// Ready once: registered with every assigned shard served; never reset.
    pub fn ready(&self) -> bool {
        matches!(self.presence, Presence::Ready | Presence::ReadyAbsent)
    }

    /// A snapshot (or the store's loss, or deregistration: `false`) says whether the pod
    /// is in the member list. Returns `true` when that lost a registration.
    pub fn set_registered(&mut self, registered: bool) -> bool {
        let was = self.registered();
        self.presence = match (self.ready(), registered) {
            (false, false) => Presence::Absent,
            (false, true) => Presence::Joining,
            (true, true) => Presence::Ready,
            (true, false) => Presence::ReadyAbsent,
        };
        was && !registered
    }

    /// Every shard assigned to the registered pod is served: it is ready from now on.
    pub fn move_to_ready(&mut self) {
        debug_assert!(self.registered(), "ready while {:?}", self.presence);
        if self.presence == Presence::Joining {
            self.presence = Presence::Ready;
        }
    }

    pub fn running(&self) -> bool {
        self.inner == Life::Running
    }

    /// When the graceful shutdown under way began.
    pub fn shutdown_started(&self) -> Option<Instant> {
        match self.inner {
            Life::PlacingOut { started }
            | Life::Draining { started }
            | Life::Deregistering { started } => Some(started),
            Life::Running | Life::Finished => None,
        }
    }

    /// Shutting down, stopping shards, and `Deregister` not sent yet.
    pub fn draining(&self) -> bool {
        matches!(self.inner, Life::Draining { .. })
    }

    /// Shutting down, still serving while the placement without this pod is written.
    pub fn placing_out(&self) -> bool {
        matches!(self.inner, Life::PlacingOut { .. })
    }

    pub fn finished(&self) -> bool {
        self.inner == Life::Finished
    }

    /// A graceful shutdown is asked for at `now`: it begins by placing the pod out.
    /// Asking again changes nothing: the budget counts from the first request.
    pub fn move_to_placing_out(&mut self, now: Instant) {
        if self.inner == Life::Running {
            self.inner = Life::PlacingOut { started: now };
        }
    }

    /// The placement without the pod is written, or will not be: stop the shards.
    pub fn move_to_draining(&mut self) {
        if let Life::PlacingOut { started } = self.inner {
            self.inner = Life::Draining { started };
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
