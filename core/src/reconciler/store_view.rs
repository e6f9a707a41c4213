//! This pod's view of the store: does it answer, since when does it fail, and what do the
//! peers say about the failure (rule 6 of the reconciler).
//!
//! The view is one enum, changed only through the `move_to_*` methods here, so a verdict
//! without a failure, or an isolation without the time it began, cannot be written. It
//! is meant to grow: a new way of judging an outage is a new [`Outage`] variant, a new
//! condition of the store a new variant of the private `Reach`.
//!
//! Not for: what an outage means for the shards (suspend or give up, `rules.rs`), when
//! the peers are asked (the probe timer), or the hold after the store returns
//! (recovery in `rules.rs`, which gets what it needs from [`StoreView::move_to_reachable`]).

use std::time::Instant;

use super::PeerReport;

/// This pod's judgement of a store failure it is experiencing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// Peers not asked yet (treated as `Isolated`, but suspended shards are not given up).
    Unknown,
    /// Some peer reaches the store, or no peer answered: only we are cut off, since `since`
    /// (when this verdict was first reached, which is when suspended shards start to be
    /// given up).
    Isolated { since: Instant },
    /// A majority of the last known membership, this pod included, reports the store
    /// unreachable and no peer reaches it: nobody can acquire, so holding on is safe.
    /// `confirmed` is when a probe last said so; the verdict lapses [`VERDICT_LIFE`]
    /// renew intervals later unless a probe says so again.
    ClusterWide { confirmed: Instant },
}

/// How many renew intervals a cluster-wide verdict stands without a new probe saying so
/// (probes run every renew interval while the store fails: one may be lost).
pub const VERDICT_LIFE: u32 = 2;

/// Whether the store had ever answered this pod when the current failure began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum History {
    Reached,
    /// A pod that never reached the store cannot know what it missed before.
    NeverReached,
}

/// The store answers or it does not. See the module docs.
#[derive(Clone, Debug)]
pub(super) struct StoreView {
    inner: Reach,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// No store call has answered or failed yet.
    Untried,
    /// The last store call succeeded.
    Reachable,
    /// Store calls fail since `since`.
    Failing {
        since: Instant,
        outage: Outage,
        history: History,
    },
}

impl StoreView {
    pub fn new() -> Self {
        StoreView {
            inner: Reach::Untried,
        }
    }

    /// Whether the last store call succeeded.
    pub fn reachable(&self) -> bool {
        self.inner == Reach::Reachable
    }

    /// Whether the last store call failed.
    pub fn failing(&self) -> bool {
        matches!(self.inner, Reach::Failing { .. })
    }

    /// When the current failure began (the first failed call), if the store fails.
    pub fn failing_since(&self) -> Option<Instant> {
        match self.inner {
            Reach::Failing { since, .. } => Some(since),
            Reach::Untried | Reach::Reachable => None,
        }
    }

    /// The judgement of the current failure, if the store fails.
    pub fn outage(&self) -> Option<Outage> {
        match self.inner {
            Reach::Failing { outage, .. } => Some(outage),
            Reach::Untried | Reach::Reachable => None,
        }
    }

    /// A store call succeeded. Returns when the failure it ends began and whether the
    /// store had answered before it, if it ends one.
    pub fn move_to_reachable(&mut self) -> Option<(Instant, History)> {
        let ended = match self.inner {
            Reach::Failing { since, history, .. } => Some((since, history)),
            Reach::Untried | Reach::Reachable => None,
        };
        self.inner = Reach::Reachable;
        ended
    }

    /// A store call failed at `now`. Returns whether this begins a failure (the peers are
    /// then to be asked at once).
    pub fn move_to_failing(&mut self, now: Instant) -> bool {
        let history = match self.inner {
            Reach::Failing { .. } => return false,
            Reach::Untried => History::NeverReached,
            Reach::Reachable => History::Reached,
        };
        self.inner = Reach::Failing {
            since: now,
            outage: Outage::Unknown,
            history,
        };
        true
    }

    /// The peers answered a probe at `now`; `members` is the size of the last known
    /// membership, this pod included. Judged only while the store fails: a report that
    /// arrives after it answered again says nothing about us.
    ///
    /// Cluster-wide only by a majority: this pod and the peers that answered "unreachable"
    /// must be more than half of `members`, and no peer may reach the store. A pod alone
    /// is its own majority; a pod that hears from nobody in a larger cluster is not, and
    /// must assume the others reach the store and take its shards.
    pub fn judge(&mut self, now: Instant, report: PeerReport, members: usize) {
        let Reach::Failing { outage, .. } = &mut self.inner else {
            return;
        };
        let unreachable = 1 + report.answered.saturating_sub(report.reaching);
        *outage = if report.reaching == 0 && unreachable * 2 > members.max(1) {
            Outage::ClusterWide { confirmed: now }
        } else if let Outage::Isolated { since } = *outage {
            // Still isolated: the verdict keeps the time it was first reached.
            Outage::Isolated { since }
        } else {
            Outage::Isolated { since: now }
        };
    }

    /// Whether the last verdict taken is cluster-wide (standing or lapsed: time is not
    /// asked; see [`StoreView::cluster_wide`] for whether it stands at a given moment).
    pub fn judged_cluster_wide(&self) -> bool {
        matches!(self.outage(), Some(Outage::ClusterWide { .. }))
    }

    /// Whether the store fails under a cluster-wide verdict that still stands at `now`.
    pub fn cluster_wide(&self, now: Instant, life: std::time::Duration) -> bool {
        self.verdict_lapses_at(life).is_some_and(|t| now < t)
    }

    /// When the standing cluster-wide verdict lapses without a new probe, if one stands.
    pub fn verdict_lapses_at(&self, life: std::time::Duration) -> Option<Instant> {
        match self.outage() {
            Some(Outage::ClusterWide { confirmed }) => Some(confirmed + life),
            _ => None,
        }
    }

    /// Forgets the verdict (back to asking the peers): it lapsed, or this pod was paused
    /// and cannot know what happened meanwhile.
    pub fn forget_verdict(&mut self) {
        if let Reach::Failing { outage, .. } = &mut self.inner {
            *outage = Outage::Unknown;
        }
    }
}
