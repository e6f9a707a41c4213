//! What a shard's claims leave behind, as [`super::Shard`]'s phases carry it: whether a
//! lease of this pod may be stray in the store, how a claim ended, and where a held
//! shard's re-claim stands. Plain values; every transition that changes them is in
//! `super`.

use std::time::Instant;

/// Whether the store may hold a lease naming this pod that the shard's phase does not
/// account for ("maybe ours", rule 6): an acquire landed too late to serve on, or its call
/// failed while the shard was not held. Such a shard is claimed afresh or released rather
/// than forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stray {
    None,
    MaybeOurs,
}

/// How an acquire ended without this pod serving on its answer, as far as a lease it may
/// have left in the store is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimEnd {
    /// Answered in time (held by another pod, or the shard stopped meanwhile): nothing of
    /// ours is stray.
    Answered,
    /// Answered with the lease, but too late to serve on (the pod was paused): the lease
    /// may be ours, with a fresh TTL, beyond any deadline this pod keeps.
    Late,
    /// The call failed: it may or may not have taken effect. A shard that is not held may
    /// then have a lease of ours; a held one's key names us anyway, so it records nothing.
    Failed,
    /// The store's generation had changed, so the call wrote nothing.
    Void,
}

/// A re-claim (`SET NX`, or the owner-checked bump of `acquire.lua`) a held shard owes:
/// after a new store generation, a store that came back after the deadline passed, a
/// renewal that found the lease lost by the store, or a terminal that has seen a higher
/// epoch than the one held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owed {
    /// To be sent once the store answers.
    Due,
    /// In flight since the instant.
    Sent(Instant),
    /// The store shows another pod's lease with a lower epoch than the one held: a lease
    /// from before this pod's acquisition, which the store lost (a failover that lost
    /// writes) while it still keeps the older lease, until its pod releases it (it finds
    /// it stray) or it expires. Due again after the next snapshot.
    Blocked,
}

/// Where the re-claim of a served shard stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reclaim {
    /// None is needed: renewals keep the lease.
    NotNeeded,
    Owed(Owed),
    /// In flight since the instant, but no longer needed: a renewal resumed the shard
    /// meanwhile. Its answer still counts (it may carry a new epoch); its failure leaves
    /// the lease to the renewals.
    Overtaken(Instant),
}

impl Owed {
    pub(super) fn in_flight(self) -> Option<Instant> {
        match self {
            Owed::Sent(sent) => Some(sent),
            Owed::Due | Owed::Blocked => None,
        }
    }
}

impl Reclaim {
    pub(super) fn in_flight(self) -> Option<Instant> {
        match self {
            Reclaim::Owed(owed) => owed.in_flight(),
            Reclaim::Overtaken(sent) => Some(sent),
            Reclaim::NotNeeded => None,
        }
    }
}

impl Stray {
    /// What is stray after an acquire of a held or stopping shard ended (see [`ClaimEnd`]).
    pub(super) fn after(self, end: ClaimEnd) -> Stray {
        match end {
            ClaimEnd::Answered => Stray::None,
            ClaimEnd::Late => Stray::MaybeOurs,
            ClaimEnd::Failed | ClaimEnd::Void => self,
        }
    }
}
