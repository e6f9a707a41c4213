//! posgate: keeps persistent, fenced push connections to POS terminals, sharded across
//! the pods of a fixed-replica Deployment by shard leases in Redis.
//!
//! # Layout
//! Layers, each using only those below it (`layers_tests.rs` checks it):
//! - [`pod`]: the composition root, one pod as a library value; [`reload`] and
//!   [`config`] at the edge (flags parsed once, handed down as each layer's struct).
//! - [`http`]: the pod's HTTP surface (public API, peer endpoints, status page).
//! - [`driver`]: the task that runs the reconciler against a store; [`push`]: routing
//!   pushes to the owner and delivering them.
//! - [`peer`]: the peer protocol (signed, replay-proof requests; wire; client); [`pos`]:
//!   the terminal protocol and connections to terminals.
//! - [`metrics`]: the Prometheus registry and sampler; [`sim`]: deterministic simulation.
//! - [`serving`]: the seam between ownership and delivery.
//! - [`store`]: the `CoordStore` seam (Redis, memory) and the terminal directory;
//!   [`credentials`]: tokens and the cluster secret; [`status`]: what a pod publishes.
//! - [`core`]: the sans-IO ownership core; [`api`]: the public API's names; [`clock`],
//!   [`tls`], [`rate_log`], [`trace_context`], [`telemetry`]: small shared pieces.
//!
//! `docs/design.md` explains the rules; this crate documents where they live.
#![forbid(unsafe_code)]
// The API docs are for the project's developers (`scripts/test` builds them with
// `--document-private-items`): a public item's doc linking to the private item that
// does the work is what they need.
#![allow(rustdoc::private_intra_doc_links)]

pub mod api;
pub mod clock;
pub mod config;
/// The sans-IO ownership core: the crate `posgate-core` (`core/`).
pub use posgate_core as core;
pub mod credentials;
pub mod driver;
pub mod http;
pub mod metrics;
pub mod peer;
pub mod pod;
pub mod pos;
pub mod push;
pub mod rate_log;
pub mod reload;
pub mod serving;
pub mod sim;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod trace_context;

#[cfg(test)]
mod layers_tests;
