//! The sans-IO ownership core: which pod should own which shard, and what a pod must do
//! about it right now.
//!
//! Nothing in here performs IO, spawns tasks or reads a clock. Inputs are plain data
//! (membership snapshots, lease results, peer answers) plus `now`; outputs are
//! [`reconciler::Action`]s for a driver to perform. The same code therefore runs in the
//! real pod (driven by `crate::driver` against Redis) and in the deterministic simulation
//! (driven by a virtual clock against the in-memory store).
//!
//! This module must never import tokio, redis or hyper.

pub mod config;
pub mod delivery;
pub mod lease;
pub mod membership;
pub mod placement;
pub mod reconciler;
pub mod ring;
pub mod route;
pub mod shard;
#[cfg(test)]
pub(crate) mod testing;
pub mod types;

pub use config::CoreConfig;
pub use types::{Epoch, PodId, ShardId};
