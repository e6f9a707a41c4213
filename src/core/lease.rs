//! Lease results and the local lease deadline rule.
//!
//! The store answers acquire and renew calls with the explicit outcomes below; a lost
//! answer (timeout, connection error) is not an outcome but a store error, handled by the
//! reconciler as "unknown". The deadline rule is the heart of the safety argument:
//!
//! > a pod serves a shard only while `now < sent + ttl - margin - close_budget`, where
//! > `sent` is the local monotonic time at which the last successful acquire or renew
//! > was *sent* ([`crate::core::CoreConfig::serve_window`]).
//!
//! The store sets the key's expiry to `ttl` after it *processes* the command, which is no
//! earlier than the send, so serving stops `margin + close_budget` before the key can
//! expire in the store and the shard's connections are closed at least `margin` before, as long as the local clock does not run more than `margin / ttl`
//! slower than the store's (1 s / 15 s ~ 6.7%; we simulate +-2%).

use std::time::Duration;

use super::membership::{GenerationInfo, Member};
use super::types::{Epoch, PodId};

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
    /// was extended and the epoch is unchanged.
    AlreadyMine { epoch: Epoch },
    /// Someone else holds it.
    HeldBy { owner: PodId, epoch: Epoch },
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

/// The answer to "extend my lease" for one shard (owner-checked `PEXPIRE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewOutcome {
    Renewed,
    /// The key expired or was deleted: the lease is lost.
    Missing,
    /// Another pod holds the key: the lease is lost (and was lost before this call).
    HeldBy {
        owner: PodId,
    },
}

/// A store answer that first checks the caller's idea of the store generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked<T> {
    Ok(T),
    /// The store's generation differs from the caller's (or the store had none and just
    /// created one): nothing was written.
    GenerationChanged(GenerationInfo),
}
