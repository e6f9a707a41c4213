//! Writing a shard's directory back from its owner's memory after the store lost its
//! data ([`Directory::restore`](super::Directory::restore)).
//!
//! When Redis restarts empty the directory goes with everything else, but every owner
//! still holds the terminals of the shards it serves (its links). The write-back puts
//! them back, and only where that cannot undo anybody's decision, so the store checks,
//! in one atomic step:
//!
//! 1. the caller names the store's current generation (else
//!    [`Checked::GenerationChanged`](crate::core::lease::Checked), as for every write);
//! 2. the caller read the directory in an **earlier generation**
//!    ([`Refusal::SameGeneration`] otherwise): an empty shard in the generation it was
//!    read in is an operator's removal, not a loss;
//! 3. the caller is the **current epoch holder**: the shard's lease names the caller and
//!    the shard's last epoch is the caller's ([`Refusal::NotHolder`]): a pod that lost
//!    the shard, or has not re-claimed it in the new generation yet, writes nothing;
//! 4. the shard's directory is **untouched in this generation**: no terminals and no
//!    version ([`Refusal::Present`]): an import, a removal or another write-back came
//!    first, and that one stands.
//!
//! A written-back shard gets a version like any write (`max(previous + 1, store ms)`),
//! and a record of who wrote it (`terminals-restored` in Redis, see `store::keys`).
//!
//! What it does not do: merge. The shard is written whole or not at all.

use crate::core::{Epoch, PodId, ShardId};

use super::Terminal;

/// One shard's write-back, as its owner asks for it.
#[derive(Clone, Copy, Debug)]
pub struct Restore<'a> {
    pub shard: ShardId,
    /// The caller, and the epoch it holds the shard's lease with.
    pub pod: &'a PodId,
    pub epoch: Epoch,
    /// The store generation the caller found the directory missing in (the current
    /// one, as far as it knows).
    pub generation: &'a str,
    /// The generation the caller read the shard's directory in; `""` for a read made
    /// while the store had no generation yet.
    pub read_in: &'a str,
    /// What to write: the shard's terminals as the caller last read them.
    pub terminals: &'a [Terminal],
}

/// What the store did with a [`Restore`] (in the generation the caller named).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restored {
    /// The shard's directory was written with this version.
    Written {
        version: u64,
    },
    Refused(Refusal),
}

/// Why a write-back wrote nothing. Each is a state a later try may find changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the directory was read in the store's current generation: nothing was lost")]
    SameGeneration,
    #[error(
        "not the shard's current epoch holder (lease {owner:?}, epoch {epoch:?} in the store)"
    )]
    NotHolder {
        owner: Option<PodId>,
        epoch: Option<Epoch>,
    },
    #[error("the shard's directory was already written in this generation")]
    Present,
}
