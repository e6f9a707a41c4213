//! The peer protocol: how pods call each other, and how a pod knows a call came from a
//! pod of its cluster, unaltered and only once.
//!
//! - `signing`: every request is signed with the cluster secret over everything the
//!   receiver acts on (protocol 2; protocol 1 of the previous release during a rolling
//!   upgrade). The exact rules are in its docs and `docs/design.md` "Peer requests".
//! - `replay`: the receiver's memory of request ids, so a copy is refused.
//! - `wire`: every internal endpoint's path, request and answer, encoded and decoded.
//! - `client`: [`PeerClient`], the one transport of every pod-to-pod call (HTTP/2: h2c
//!   to `http://` peers, TLS to `https://` ones, `tls.rs`), which signs each request for
//!   the protocol its target advertises in its member record.
//!
//! # Insecure mode
//! Without a cluster secret (`posgate serve --insecure`) requests go unsigned and are
//! accepted unsigned: anyone who reaches the port can ask the peer questions and forward
//! pushes. Only for local development.
//!
//! What this module does not do: routing or HTTP serving. The middleware that checks
//! requests on the internal endpoints lives in `crate::http`.

mod client;
pub mod replay;
pub mod signing;
pub mod tls;
pub mod wire;

use crate::core::membership::Member;
use crate::core::PodId;

pub use self::client::{PeerClient, PeerError, SendError};
pub use self::signing::{
    legacy, AuthError, MAX_CLOCK_SKEW, PEER_PROTOCOL, SIGNATURE_HEADER, TIMESTAMP_HEADER,
    VERSION_HEADER,
};
pub use self::tls::PeerTls;
pub use self::wire::{PeerAnswer, QueueDepth, ShardTerminals};

/// Largest body the internal endpoints buffer, and the largest answer the client reads.
pub const MAX_INTERNAL_BODY: usize = 64 * 1024;

/// What the receiving side of the peer endpoints remembers: the ids of requests it
/// accepted (so copies are refused), and when it last logged a refusal of each kind.
#[derive(Debug, Default)]
pub struct PeerReceiver {
    pub replay: replay::ReplayWindow,
    pub refusals: crate::rate_log::RateLog,
}

/// A pod a request goes to: who it is (signed into the request, so it cannot be
/// replayed to another pod), where it listens, and which peer protocol it speaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTarget {
    pub pod: PodId,
    pub url: String,
    pub protocol: u32,
    /// Takes a batch's pushes in one request (`Member::batch`).
    pub batches: bool,
}

impl From<&Member> for PeerTarget {
    fn from(member: &Member) -> Self {
        PeerTarget {
            pod: member.pod.clone(),
            url: member.url.clone(),
            protocol: member.peer_protocol,
            batches: member.batch >= crate::core::membership::BATCH_PEER_ROUTE,
        }
    }
}
