//! The sans-IO ownership core: which pod should own which shard, and what a pod must do
//! about it right now.
//!
//! Nothing in here performs IO, spawns tasks or reads a clock. Inputs are plain data
//! (membership snapshots, lease results, peer answers) plus `now`; outputs are
//! [`reconciler::Action`]s for a driver to perform. The same code therefore runs in the
//! real pod (driven by the gateway's `posgate::driver` against Redis) and in the
//! deterministic simulation (`posgate::sim`, a virtual clock and the in-memory store).
//!
//! This crate must never depend on tokio, redis or hyper (`cargo tree -p posgate-core`
//! shows it); the gateway re-exports it as `posgate::core`.
#![forbid(unsafe_code)]
// As in posgate: the API docs are the developers' (`--document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

pub mod config;
pub mod delivery;
pub mod lease;
pub mod membership;
pub mod placement;
pub mod reconciler;
pub mod ring;
pub mod route;
pub mod shard;
/// Helpers for tests of the core and of the crates built on it (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod types;

pub use config::CoreConfig;
pub use types::{Epoch, PodId, ShardId};
