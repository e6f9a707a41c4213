//! posgate: keeps persistent, fenced push connections to POS terminals, sharded across
//! the pods of a fixed-replica Deployment by shard leases in Redis.
//!
//! # Layout
//! - [`core`]: the sans-IO ownership core (shard hash, ring, lease rules, reconciler).
//! - [`store`]: the `CoordStore` seam with the Redis and in-memory implementations.
//! - [`driver`]: the task that runs the reconciler against a store.
//! - [`pod`]: one pod as a library value (`Pod::run_with_terminals`: HTTP, driver, POS connections).
//! - [`pos`]: terminal directory and connections to POS terminals.
//! - [`http`]: the pod's HTTP surface (health, cluster view, peer endpoints).
//! - [`peer`]: the peer protocol: signed, replay-proof pod-to-pod requests and the client (h2c or TLS).
//! - [`rate_log`]: log lines for refusals a stranger can cause, at most one per second per kind.
//! - [`reload`]: replacing secrets and certificates at run time (`SIGHUP`, changed files).
//! - [`tls`]: TLS material from PEM files, shared by every TLS use.
//! - [`status`]: the status a pod publishes for HTTP and peers.
//! - [`config`]: CLI flags and their validation.
//! - [`sim`]: deterministic simulation of a cluster (reconcilers + in-memory store).
//!
//! `docs/design.md` explains the rules; this crate documents where they live.
#![forbid(unsafe_code)]

pub mod api;
pub mod clock;
pub mod config;
pub mod core;
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
pub mod tls;
