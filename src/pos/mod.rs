//! Connections to POS terminals: the paced TLS + HTTP/2 dialer,
//! fenced sessions, and the per-shard connection manager the driver starts and stops.
//!
//! The wire contract with terminals is documented in `docs/pos-protocol.md`; the
//! terminal directory (who to dial) is `crate::store::directory`.

pub mod backoff;
pub mod conformance;
pub mod dialer;
pub mod handover;
mod link;
pub mod manager;
mod pacer;
pub mod push;
pub mod session;
pub mod tls;
pub mod wire;

#[cfg(test)]
mod tests;

pub use self::link::{Delivery, LinkState, WaitingPush};
