//! The per-shard state a pod keeps, and every transition of it.
//!
//! A [`Shard`]'s phase is a private enum whose variants carry exactly the data that means
//! something in them: a re-claim can be due only on a held shard, a claim in flight on an
//! unheld shard is its own phase (so it cannot also be paced or released), and a suspended
//! shard always owes a re-claim. The phase changes only through the transition methods
//! here, each of which asserts (in debug builds) the phases it may be called in; inputs
//! from outside that may be stale (a stop acknowledgement, a release answer) are ignored
//! in any other phase. [`ShardState`] is the coarse public view.
//!
//! This module decides nothing: which transition to make, and when, is for the rules in
//! `super` (the reconciler), which see all shards and the cluster at once.

mod claims;

use std::time::Instant;

pub use self::claims::{ClaimEnd, Stray};
use self::claims::{Owed, Reclaim};
use crate::membership::{Lease, Member};
use crate::Epoch;

/// Where one shard stands for this pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardState {
    /// Not held by this pod (as far as it knows); a claim may be in flight.
    Idle,
    /// Held and served until `deadline` (local monotonic time).
    Serving { epoch: Epoch, deadline: Instant },
    /// Held past the local deadline while the store fails: the connections stay open
    /// and the lease is reclaimed when the store returns. Pushes are delivered while a
    /// cluster-wide verdict stands (nobody can acquire) and parked otherwise.
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

/// One shard's local record: its phase, and when the last fresh claim was sent.
#[derive(Clone, Debug)]
pub struct Shard {
    phase: Phase,
    /// When this pod last sent a fresh claim for the shard; fresh claims against another
    /// holder are paced from it. History rather than phase, so it outlives the claim: a
    /// shard lost soon after it was won is not claimed again before the pace allows.
    last_claim: Option<Instant>,
    /// The shard's lease as the last snapshot showed it (or a claim's answer since).
    pub(super) lease: Option<Lease>,
    /// The last pod other than this one seen holding the lease while a member, as the
    /// member it was then: where the shard comes from when this pod acquires it (kept
    /// when the lease disappears on release and the pod leaves the members).
    pub(super) last_holder: Option<Member>,
    /// The highest epoch this pod knows the shard was handed out with: its own grants,
    /// other pods' leases seen in snapshots and answers, the epochs terminals reported.
    /// The floor of every claim (rule 7). Kept across store generations: terminals keep
    /// theirs.
    pub(super) floor: Epoch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not held, no acquire in flight.
    Idle { stray: Stray },
    /// Not held; an acquire sent at `sent` is unanswered: a fresh claim, or a re-claim
    /// sent while the shard was still held. Nothing is kept as stray meanwhile: the
    /// answer settles it (a late or failed one leaves the shard maybe ours; a generation
    /// change, which is learned before or with it, leaves nothing of ours).
    Claiming { sent: Instant },
    /// Held and served until `deadline` (local monotonic time).
    Serving {
        epoch: Epoch,
        deadline: Instant,
        reclaim: Reclaim,
        stray: Stray,
    },
    /// Held past the deadline in a cluster-wide store outage: connections stay open,
    /// nothing is delivered, and the lease is re-claimed when the store returns.
    Suspended {
        epoch: Epoch,
        owed: Owed,
        stray: Stray,
    },
    /// `StopServing` was emitted; waiting for the connections to close. `unanswered`: a
    /// re-claim sent while the shard was held, still in flight. `stray` matters only if
    /// `then` is `Forget` (a release settles it).
    Stopping {
        epoch: Epoch,
        then: AfterStop,
        unanswered: Option<Instant>,
        stray: Stray,
    },
    /// Stopped; an owner-checked release is to be sent (`sent == false`) or in flight.
    /// `unanswered` as in `Stopping`.
    Releasing {
        sent: bool,
        unanswered: Option<Instant>,
    },
}

impl Shard {
    pub fn new() -> Self {
        Shard {
            phase: Phase::Idle { stray: Stray::None },
            last_claim: None,
            lease: None,
            last_holder: None,
            floor: 0,
        }
    }

    // ----- queries -------------------------------------------------------------------

    /// The coarse public view.
    pub fn view(&self) -> ShardState {
        match self.phase {
            Phase::Idle { .. } | Phase::Claiming { .. } => ShardState::Idle,
            Phase::Serving {
                epoch, deadline, ..
            } => ShardState::Serving { epoch, deadline },
            Phase::Suspended { epoch, .. } => ShardState::Suspended { epoch },
            Phase::Stopping { epoch, then, .. } => ShardState::Stopping { epoch, then },
            Phase::Releasing { sent, .. } => ShardState::Releasing { sent },
        }
    }

    /// The epoch of a lease this pod still holds (serving or suspended).
    pub fn held_epoch(&self) -> Option<Epoch> {
        match self.phase {
            Phase::Serving { epoch, .. } | Phase::Suspended { epoch, .. } => Some(epoch),
            _ => None,
        }
    }

    /// A release is pending or in flight, or connections are closing before one.
    pub fn releasing(&self) -> bool {
        matches!(
            self.phase,
            Phase::Stopping {
                then: AfterStop::Release,
                ..
            } | Phase::Releasing { .. }
        )
    }

    /// When the acquire in flight for this shard was sent, if one is.
    pub fn claim_sent(&self) -> Option<Instant> {
        match self.phase {
            Phase::Idle { .. } => None,
            Phase::Claiming { sent } => Some(sent),
            Phase::Serving { reclaim, .. } => reclaim.in_flight(),
            Phase::Suspended { owed, .. } => owed.in_flight(),
            Phase::Stopping { unanswered, .. } | Phase::Releasing { unanswered, .. } => unanswered,
        }
    }

    /// Served, and kept by renewals (no re-claim due or in flight).
    pub fn renewable(&self) -> bool {
        matches!(
            self.phase,
            Phase::Serving {
                reclaim: Reclaim::NotNeeded,
                ..
            }
        )
    }

    /// Held, and to be re-claimed now (none in flight, none blocked).
    pub fn reclaim_due(&self) -> bool {
        matches!(
            self.phase,
            Phase::Serving {
                reclaim: Reclaim::Owed(Owed::Due),
                ..
            } | Phase::Suspended {
                owed: Owed::Due,
                ..
            }
        )
    }

    /// Not held and no acquire in flight: whether a lease of ours may be stray.
    pub fn unheld(&self) -> Option<Stray> {
        match self.phase {
            Phase::Idle { stray } => Some(stray),
            _ => None,
        }
    }

    /// Stopped, and the release not sent yet.
    pub fn release_due(&self) -> bool {
        matches!(self.phase, Phase::Releasing { sent: false, .. })
    }

    /// When the last fresh claim was sent.
    pub fn last_claim(&self) -> Option<Instant> {
        self.last_claim
    }

    // ----- transitions ---------------------------------------------------------------

    /// An acquire is sent at `now`: a fresh claim of an unheld shard, or a due re-claim.
    pub fn send_claim(&mut self, now: Instant) {
        match &mut self.phase {
            Phase::Idle { .. } => {
                self.phase = Phase::Claiming { sent: now };
                self.last_claim = Some(now);
            }
            Phase::Serving { reclaim, .. } if *reclaim == Reclaim::Owed(Owed::Due) => {
                *reclaim = Reclaim::Owed(Owed::Sent(now));
            }
            Phase::Suspended { owed, .. } if *owed == Owed::Due => {
                *owed = Owed::Sent(now);
            }
            _ => debug_assert!(false, "claim sent for {self:?}"),
        }
    }

    /// The acquire in flight ended without this pod serving on its answer.
    pub fn end_claim(&mut self, end: ClaimEnd) {
        debug_assert!(self.claim_sent().is_some(), "no claim to end: {self:?}");
        match &mut self.phase {
            Phase::Idle { .. } => {}
            Phase::Claiming { .. } => {
                let stray = match end {
                    ClaimEnd::Answered | ClaimEnd::Void => Stray::None,
                    ClaimEnd::Late | ClaimEnd::Failed => Stray::MaybeOurs,
                };
                self.phase = Phase::Idle { stray };
            }
            Phase::Serving { reclaim, stray, .. } => {
                *reclaim = match *reclaim {
                    Reclaim::Owed(Owed::Sent(_)) => Reclaim::Owed(Owed::Due),
                    Reclaim::Overtaken(_) => Reclaim::NotNeeded,
                    other => other,
                };
                *stray = stray.after(end);
            }
            Phase::Suspended { owed, stray, .. } => {
                *owed = Owed::Due;
                *stray = stray.after(end);
            }
            Phase::Stopping {
                unanswered, stray, ..
            } => {
                *unanswered = None;
                *stray = stray.after(end);
            }
            Phase::Releasing { unanswered, .. } => *unanswered = None,
        }
    }

    /// The acquire in flight was answered in time with the lease: serve `epoch` until
    /// `deadline`.
    pub fn move_to_serving(&mut self, epoch: Epoch, deadline: Instant) {
        debug_assert!(
            matches!(
                self.phase,
                Phase::Claiming { .. } | Phase::Serving { .. } | Phase::Suspended { .. }
            ) && self.claim_sent().is_some(),
            "served on an answer while {self:?}"
        );
        self.phase = Phase::Serving {
            epoch,
            deadline,
            reclaim: Reclaim::NotNeeded,
            stray: Stray::None,
        };
    }

    /// A renewal sent before `until` succeeded.
    pub fn extend_deadline(&mut self, until: Instant) {
        if let Phase::Serving { deadline, .. } = &mut self.phase {
            *deadline = (*deadline).max(until);
        } else {
            debug_assert!(false, "renewed {self:?}");
        }
    }

    /// The deadline passed in a cluster-wide outage: keep the connections, re-claim later.
    pub fn move_to_suspended(&mut self) {
        if let Phase::Serving {
            epoch,
            reclaim,
            stray,
            ..
        } = self.phase
        {
            let owed = match reclaim {
                Reclaim::Owed(owed) => owed,
                Reclaim::Overtaken(sent) => Owed::Sent(sent),
                Reclaim::NotNeeded => Owed::Due,
            };
            self.phase = Phase::Suspended { epoch, owed, stray };
        } else {
            debug_assert!(false, "suspended {self:?}");
        }
    }

    /// A renewal of a suspended shard succeeded in time: serve again until `deadline`.
    pub fn resume(&mut self, deadline: Instant) {
        if let Phase::Suspended { epoch, owed, stray } = self.phase {
            self.phase = Phase::Serving {
                epoch,
                deadline,
                reclaim: owed
                    .in_flight()
                    .map_or(Reclaim::NotNeeded, Reclaim::Overtaken),
                stray,
            };
        } else {
            debug_assert!(false, "resumed {self:?}");
        }
    }

    /// The held lease must be re-claimed with `SET NX` (a suspended one always is). A
    /// blocked re-claim is due again: what blocked it may be gone (the store lost its
    /// data, or a terminal reported an epoch worth asking the store about).
    pub fn reclaim_needed(&mut self) {
        match &mut self.phase {
            Phase::Serving { reclaim, .. } => {
                *reclaim = match *reclaim {
                    Reclaim::NotNeeded | Reclaim::Owed(Owed::Blocked) => Reclaim::Owed(Owed::Due),
                    Reclaim::Overtaken(sent) => Reclaim::Owed(Owed::Sent(sent)),
                    due_or_sent => due_or_sent,
                };
            }
            Phase::Suspended { owed, .. } => {
                if *owed == Owed::Blocked {
                    *owed = Owed::Due;
                }
            }
            _ => debug_assert!(false, "re-claim of {self:?}"),
        }
    }

    /// The store shows the held shard's lease with another pod at a lower epoch (see
    /// [`Owed::Blocked`]), in answer to a re-claim or a renewal: the re-claim waits for
    /// the next snapshot. A re-claim a renewal overtook meanwhile is no longer owed.
    pub fn reclaim_blocked(&mut self) {
        match &mut self.phase {
            Phase::Serving { reclaim, .. } => {
                *reclaim = match *reclaim {
                    Reclaim::Overtaken(_) => Reclaim::NotNeeded,
                    _ => Reclaim::Owed(Owed::Blocked),
                };
            }
            Phase::Suspended { owed, .. } => *owed = Owed::Blocked,
            _ => debug_assert!(false, "re-claim blocked for {self:?}"),
        }
    }

    /// A snapshot was read: a blocked re-claim is due again (the lease in its way may be
    /// gone).
    pub fn unblock(&mut self) {
        match &mut self.phase {
            Phase::Serving {
                reclaim: reclaim @ Reclaim::Owed(Owed::Blocked),
                ..
            } => *reclaim = Reclaim::Owed(Owed::Due),
            Phase::Suspended {
                owed: owed @ Owed::Blocked,
                ..
            } => *owed = Owed::Due,
            _ => {}
        }
    }

    /// A snapshot shows a lease of this pod on a shard it neither holds nor claims: a
    /// lease it stopped serving and left to expire, or one the store kept while losing
    /// its release (a failover that lost writes). It may be ours: release it, or claim
    /// it if the placement gives us the shard.
    pub fn lease_found(&mut self) {
        if let Phase::Idle { stray } = &mut self.phase {
            *stray = Stray::MaybeOurs;
        }
    }

    /// Stop serving a held shard; `then` says what follows once its connections are
    /// closed. Returns the epoch it was served with.
    pub fn move_to_stopping(&mut self, then: AfterStop) -> Option<Epoch> {
        let (epoch, unanswered, stray) = match self.phase {
            Phase::Serving {
                epoch,
                reclaim,
                stray,
                ..
            } => (epoch, reclaim.in_flight(), stray),
            Phase::Suspended { epoch, owed, stray } => (epoch, owed.in_flight(), stray),
            _ => {
                debug_assert!(false, "stopped {self:?}");
                return None;
            }
        };
        self.phase = Phase::Stopping {
            epoch,
            then,
            unanswered,
            stray,
        };
        Some(epoch)
    }

    /// The connections of a stopping shard are closed.
    pub fn serving_stopped(&mut self) {
        if let Phase::Stopping {
            then,
            unanswered,
            stray,
            ..
        } = self.phase
        {
            self.phase = match (then, unanswered) {
                (AfterStop::Release, _) => Phase::Releasing {
                    sent: false,
                    unanswered,
                },
                (AfterStop::Forget, Some(sent)) => Phase::Claiming { sent },
                (AfterStop::Forget, None) => Phase::Idle { stray },
            };
        }
    }

    /// Release a lease that is not served on: one that may be stray, or one answered in
    /// time to a claim the pod no longer wants.
    pub fn move_to_releasing(&mut self) {
        debug_assert!(
            matches!(
                self.phase,
                Phase::Idle {
                    stray: Stray::MaybeOurs
                } | Phase::Claiming { .. }
            ),
            "released {self:?}"
        );
        self.phase = Phase::Releasing {
            sent: false,
            unanswered: None,
        };
    }

    pub fn release_sent(&mut self) {
        if let Phase::Releasing { sent, .. } = &mut self.phase {
            debug_assert!(!*sent, "released twice: {self:?}");
            *sent = true;
        } else {
            debug_assert!(false, "release sent for {self:?}");
        }
    }

    /// A release naming this shard was answered (or failed: the lease then expires by
    /// itself). Nothing of ours is left in the store.
    pub fn release_answered(&mut self) {
        match self.phase {
            Phase::Releasing {
                sent: true,
                unanswered,
            } => {
                self.phase = match unanswered {
                    Some(sent) => Phase::Claiming { sent },
                    None => Phase::Idle { stray: Stray::None },
                };
            }
            _ => self.forget_stray(),
        }
    }

    /// Nothing of ours can be stray in the store (it lost its data, or a release for the
    /// shard was answered).
    pub fn forget_stray(&mut self) {
        match &mut self.phase {
            Phase::Idle { stray }
            | Phase::Serving { stray, .. }
            | Phase::Suspended { stray, .. }
            | Phase::Stopping { stray, .. } => *stray = Stray::None,
            Phase::Claiming { .. } | Phase::Releasing { .. } => {}
        }
    }
}
