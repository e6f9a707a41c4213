//! Forwarding a push (or a terminal lookup) to the pod that owns the shard: the
//! internal wire format and the client side of it.
//!
//! `POST /internal/v1/push/{terminal}` carries the body and content type as received,
//! plus `posgate-tenant`, `idempotency-key`, `posgate-deadline-ms` (what is left of the
//! caller's deadline) and `posgate-hop: 1`, signed with the cluster secret like every
//! peer request. The owner answers with the public answer (relayed as is) or `421
//! shard_moved`. The owner never forwards further, so one attempt is one hop.
//!
//! What an outcome proves decides what the router may do: a refused connection
//! ([`Forwarded::NotSent`]) or `421` ([`Forwarded::Moved`]) means nothing reached a
//! terminal, so the router tries again; a request that left without an answer is
//! [`Forwarded::Unknown`] — the owner may have delivered it.
//!
//! Not for: the transport (`crate::peer::PeerClient`), deciding whom to forward to
//! (`route`) or serving the endpoint (`crate::http`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};

use super::answer::{Answer, Delivered, ErrorBody, ErrorCode};
use super::PushRequest;
use crate::core::PodId;
use crate::credentials::Credentials;
use crate::peer::{PeerClient, PeerTarget, SendError};

/// Path prefix of the internal push endpoint; the terminal id follows.
pub const PUSH_PREFIX: &str = "/internal/v1/push/";
/// Path prefix of the internal terminal lookup; the terminal id follows.
pub const TERMINAL_PREFIX: &str = "/internal/v1/terminals/";
pub const HEADER_TENANT: &str = "posgate-tenant";
pub const HEADER_DEADLINE_MS: &str = "posgate-deadline-ms";
pub const HEADER_HOP: &str = "posgate-hop";
/// Extra wait beyond the caller's deadline for the owner's answer to arrive: the owner
/// answers by the deadline it was given, and the answer needs time to travel back.
const ANSWER_GRACE: Duration = Duration::from_millis(250);

/// What a forwarding attempt proved.
#[derive(Debug)]
pub enum Forwarded {
    /// The owner's answer, for the caller.
    Answer(Answer),
    /// `421`: the pod asked does not serve the shard.
    Moved,
    /// The request never reached the peer (connection refused, bad URL).
    NotSent(String),
    /// The request may have reached the peer; no answer came.
    Unknown(String),
}

/// The forwarding side of [`PeerClient`]: the same pooled, signed transport, with
/// the push wire format and what each outcome proves. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ForwardClient {
    peers: PeerClient,
}

impl ForwardClient {
    /// The forwarding client of pod `me`.
    pub fn new(me: PodId, credentials: Credentials, connect_timeout: Duration) -> Self {
        ForwardClient {
            peers: PeerClient::new(me, credentials, connect_timeout),
        }
    }

    /// The same client, verifying `https://` owners with `tls`.
    pub fn using_tls(&self, tls: crate::peer::PeerTls) -> Self {
        ForwardClient {
            peers: self.peers.using_tls(tls),
        }
    }

    /// Forwards `push` to `owner`, answering by `deadline` + grace.
    pub async fn push(
        &self,
        owner: &PeerTarget,
        push: &PushRequest,
        deadline: Instant,
    ) -> Forwarded {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let path = format!("{PUSH_PREFIX}{}", push.terminal);
        let mut headers = HeaderMap::new();
        let text = |v: &str| HeaderValue::from_str(v).ok();
        // Tenant and key were validated as visible ASCII, so these always convert.
        if let (Some(tenant), Some(key)) = (text(&push.tenant.0), text(&push.key)) {
            headers.insert(HEADER_TENANT, tenant);
            headers.insert("idempotency-key", key);
        }
        headers.insert(
            HEADER_DEADLINE_MS,
            HeaderValue::from(remaining.as_millis() as u64),
        );
        headers.insert(HEADER_HOP, HeaderValue::from_static("1"));
        if let Some(ct) = &push.content_type {
            headers.insert(header::CONTENT_TYPE, ct.clone());
        }
        let sent = self
            .peers
            .send(
                Method::POST,
                owner,
                &path,
                push.body.clone(),
                headers,
                remaining + ANSWER_GRACE,
            )
            .await;
        match sent {
            Ok((StatusCode::MISDIRECTED_REQUEST, _)) => Forwarded::Moved,
            Ok((StatusCode::UNAUTHORIZED, _)) => {
                tracing::warn!(
                    peer = %owner.pod,
                    "peer refused a forwarded push: cluster secrets differ?"
                );
                // Refused before it was processed: not delivered, and not worth retrying.
                Forwarded::Answer(Answer::error(
                    ErrorCode::TerminalUnavailable,
                    "the owner pod refused the forwarded request",
                ))
            }
            Ok((status, body)) => {
                let answer = Answer { status, body };
                if is_posgate_answer(&answer) {
                    Forwarded::Answer(answer)
                } else {
                    // Not the owner's answer (every one is JSON): something between the
                    // pods answered, and the owner may have got the push or not.
                    Forwarded::Unknown(format!(
                        "HTTP {} from the owner's address without posgate's JSON body",
                        answer.status.as_u16()
                    ))
                }
            }
            Err(SendError::Url(e) | SendError::Connect(e)) => Forwarded::NotSent(e),
            Err(SendError::Transport(e)) => Forwarded::Unknown(e),
            Err(SendError::Timeout(t)) => {
                Forwarded::Unknown(format!("no answer from the peer within {t:?}"))
            }
        }
    }

    /// Asks `owner` about `terminal`; returns its status and JSON body.
    pub async fn terminal(
        &self,
        owner: &PeerTarget,
        terminal: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        self.get(owner, &format!("{TERMINAL_PREFIX}{terminal}"), timeout)
            .await
    }

    /// A signed `GET path` to `peer`; its status and body.
    pub async fn get(
        &self,
        peer: &PeerTarget,
        path: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        self.peers
            .send(
                Method::GET,
                peer,
                path,
                Bytes::new(),
                HeaderMap::new(),
                timeout,
            )
            .await
            .map_err(|e| format!("{e:?}"))
    }
}

/// Whether `answer` is what a posgate owner answers: a `200` with the delivery, or an
/// error with the documented body.
fn is_posgate_answer(answer: &Answer) -> bool {
    if answer.status == StatusCode::OK {
        serde_json::from_slice::<Delivered>(&answer.body).is_ok()
    } else {
        serde_json::from_slice::<ErrorBody>(&answer.body).is_ok()
    }
}
