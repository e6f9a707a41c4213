//! Connections to POS terminals: the terminal directory, the paced TLS + HTTP/2 dialer,
//! fenced sessions, and the per-shard connection manager the driver starts and stops.
//!
//! The wire contract with terminals is documented in `docs/pos-protocol.md`.

pub mod backoff;
pub mod dialer;
pub mod directory;
mod link;
pub mod manager;
mod pacer;
pub mod push;
pub mod session;
pub mod tls;

#[cfg(test)]
mod tests;

pub use self::link::{LinkState, WaitingPush};
