//! The terminal side of posgate's POS protocol (`docs/pos-protocol.md`), as a library a
//! POS vendor can embed or read as a reference while porting it.
//!
//! A posgate pod dials the terminal over TLS + HTTP/2, opens a session with
//! `POST /hello` carrying its lease's fencing epoch, and sends pushes with an
//! idempotency key. The terminal's part, which this crate implements:
//!
//! - the **fence**: refuse a hello or push whose epoch is below the highest accepted
//!   (`409` with `posgate-stale-epoch`), and close the older connection when a newer
//!   session opens, so a paused or cut-off former owner cannot deliver;
//! - **deduplication**: a (tenant, key) taken within the window `W` is answered as a
//!   duplicate (`200` with `posgate-duplicate: 1`) and not acted on again;
//! - the protocol's answers, and a [`Persist`] hook for keeping the fence and the keys
//!   across a reboot (RECOMMENDED).
//!
//! Layout: [`Terminal`] holds the state and makes every decision without IO (`now` is a
//! parameter), [`wire`] reads headers and writes answers, and [`Server`] drives both over
//! tokio, rustls and hyper, handing each push it may take to your [`Handler`].
//! `examples/terminal.rs` is a whole terminal in a few dozen lines; check yours with
//! `posgate conformance`.
//!
//! This crate depends on no posgate crate on purpose: it is a second implementation of
//! the wire contract, so the conformance kit catches a bug on either side.

mod server;
mod state;
pub mod wire;

pub use server::{tls_config, unix_ms, Config, Handler, Persist, Push, Refusal, Server};
pub use state::{ConnId, DedupWindow, Delivery, HelloOutcome, PushOutcome, Saved, Terminal};
