//! Lease results and the local lease deadline rule.
//!
//! The store answers acquire and renew calls with the explicit outcomes below; a lost
//! answer (timeout, connection error) is not an outcome but a store error, handled by the
//! reconciler as "unknown". The deadline rule is the heart of the safety argument:
//!
//! > a pod serves a shard only while `now < sent + ttl - margin - close_budget`, where
//! > `sent` is the local monotonic time at which the last successful acquire or renew
//! > was *sent* ([`crate::CoreConfig::serve_window`]).
//!
//! The store sets the key's expiry to `ttl` after it *processes* the command, which is no
//! earlier than the send, so serving stops `margin + close_budget` before the key can
//! expire in the store and the shard's connections are closed at least `margin` before, as long as the local clock does not run more than `margin / ttl`
//! slower than the store's (1 s / 15 s ~ 6.7%; we simulate +-2%).

use std::time::Duration;

use super::membership::{GenerationInfo, Member};
use super::types::{Epoch, PodId, ShardId};

/// The largest epoch a store can hand out exactly: Redis scripts compute epochs as Lua
/// numbers (doubles). Today's epochs are Unix milliseconds, about 2^41; a floor above
/// this (a terminal reporting an absurd epoch) is not passed on.
pub const MAX_EPOCH: Epoch = (1 << 53) - 1;

/// Who asks the store for leases, in which store generation, and for how long: what an
/// acquire and a renewal share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseCall<'a> {
    pub generation: &'a str,
    pub pod: &'a PodId,
    pub ttl: Duration,
}

/// The epoch a store hands out for a shard whose last epoch is `last`, at store time
/// `now_ms`, for a claim with `floor` (`acquire.lua`, `MemoryState::acquire`): above the
/// last one (epochs of a shard only grow while the store keeps them), at least the
/// store's clock (they keep growing after it lost them), and above the floor (they keep
/// growing when it lost the last ones and its clock is behind).
pub fn next_epoch(last: Epoch, now_ms: u64, floor: Epoch) -> Epoch {
    last.saturating_add(1)
        .max(now_ms)
        .max(floor.saturating_add(1))
}

/// One shard to acquire, and the highest epoch the caller knows it was handed out with
/// (0: none). The store grants above it, and bumps a lease the caller already holds to
/// above it, so a store that lost writes or whose clock went back (a promoted replica)
/// never hands out an epoch a terminal would refuse as stale or take from two pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub shard: ShardId,
    pub floor: Epoch,
}

/// The answer to "give me this shard" (`SET NX PX` plus epoch, in one script).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The key was free; it is ours now with a new, strictly larger epoch. `released_by`:
    /// the pod whose release freed it, if that release left a [`ReleaseNote`] that has
    /// not expired (it drains the shard's sessions: ask it before dialing).
    Acquired {
        epoch: Epoch,
        released_by: Option<Member>,
    },
    /// The key already named us (e.g. an earlier acquire whose answer was lost); its TTL
    /// was extended. The epoch is the shard's last one, unchanged, unless the claim's
    /// floor was higher: then it was bumped above the floor (owner-checked, in the same
    /// script), because a terminal has seen a newer epoch than the store remembers.
    AlreadyMine { epoch: Epoch },
    /// Someone else holds it; `epoch` is the shard's last epoch in the store.
    HeldBy { owner: PodId, epoch: Epoch },
}

impl AcquireOutcome {
    /// The shard's epoch the answer names: ours, or the holder's.
    pub fn epoch(&self) -> Epoch {
        match self {
            AcquireOutcome::Acquired { epoch, .. }
            | AcquireOutcome::AlreadyMine { epoch }
            | AcquireOutcome::HeldBy { epoch, .. } => *epoch,
        }
    }
}

/// One lease to give up (owner-checked, `release.lua`): deleted, or, with `to`, handed
/// to that pod in the same script with a new epoch above `floor` (a planned move to a
/// live member that takes handovers, [`crate::membership::HANDOVER_LEASE`]): the key
/// never is free, so nobody waits for a debounce or races a `SET NX` for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub shard: ShardId,
    pub to: Option<PodId>,
    /// The highest epoch the releaser knows for the shard (see [`Claim::floor`]).
    pub floor: Epoch,
}

/// What one [`Release`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// The lease did not name the caller: nothing changed.
    NotHeld,
    /// Deleted (its note, if any, left for the next acquire).
    Deleted,
    /// Now `to`'s, with this new epoch; `to` learns it from its next acquire
    /// (`AlreadyMine`).
    HandedOver { epoch: Epoch },
}

/// What a pod that drains leaves with its release of a lease, written in the same script
/// as the delete: who released it (the drainer the next holder must ask before it dials)
/// and for how long that is worth knowing (the drain budget: the drain is over by then).
/// The next acquire returns it, so a pod that joined after the drain was announced to
/// the members still knows whom to ask (`docs/design.md` "Planned moves, per terminal").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseNote {
    pub member: Member,
    pub ttl: Duration,
}

/// The answer to "extend my lease" for one shard (owner-checked `PEXPIRE`). `epoch` is
/// the shard's last epoch in the store (0: none): compared with the epoch the renewing
/// pod holds, it tells a newer owner (higher) from a store that lost the pod's
/// acquisition (lower; a failover that lost writes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewOutcome {
    Renewed,
    /// The key expired or was deleted.
    Missing {
        epoch: Epoch,
    },
    /// Another pod holds the key.
    HeldBy {
        owner: PodId,
        epoch: Epoch,
    },
}

/// A terminal refused `epoch` of `shard` as stale (`409` with `posgate-stale-epoch`):
/// it has accepted a hello with a higher epoch, `highest` when its answer said which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleEpoch {
    pub shard: ShardId,
    pub epoch: Epoch,
    pub highest: Option<Epoch>,
}

/// A store answer that first checks the caller's idea of the store generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked<T> {
    Ok(T),
    /// The store's generation differs from the caller's (or the store had none and just
    /// created one): nothing was written.
    GenerationChanged(GenerationInfo),
}
