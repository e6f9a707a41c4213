//! Forwarding a push (or a terminal lookup) to the pod that owns the shard, and what
//! each outcome proves. The wire format is `crate::peer::wire`; the transport
//! `crate::peer::PeerClient`.
//!
//! What an outcome proves decides what the router may do: a refused connection
//! ([`Forwarded::NotSent`]) or `421` ([`Forwarded::Moved`]) means nothing reached a
//! terminal, so the router tries again; a request that left without an answer, or whose
//! answer is not an owner's, is [`Forwarded::Unknown`] — the owner may have delivered it.
//!
//! Not for: deciding whom to forward to (`route`) or serving the endpoint
//! (`crate::http`).

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;

use super::answer::{Answer, Delivered, ErrorBody, ErrorCode, PushStatus};
use super::{PushRequest, Trace};
use crate::peer::wire::{BatchAnswer, ForwardedBatch, ForwardedPush, PUSH_ROUTE, RELAY_ROUTE};
use crate::peer::{PeerClient, PeerTarget, SendError};
use crate::telemetry::Telemetry;

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
    /// Where each forward's span goes.
    pub(super) telemetry: Telemetry,
}

impl ForwardClient {
    /// Forwards over `peers` (this pod's signing client).
    pub fn new(peers: PeerClient) -> Self {
        ForwardClient {
            peers,
            telemetry: Telemetry::off(),
        }
    }

    /// The transport, for the peer calls that are not pushes.
    pub fn peers(&self) -> &PeerClient {
        &self.peers
    }

    /// Forwards `push` to `owner`, answering by `deadline` + grace.
    pub async fn push(
        &self,
        owner: &PeerTarget,
        push: &PushRequest,
        deadline: Instant,
    ) -> Forwarded {
        self.send((owner, PUSH_ROUTE), push, deadline).await
    }

    /// Relays `push` through `predecessor`, which drains the terminal's session
    /// (`owner`), answering by `deadline` + grace. Its outcomes prove what a forward's
    /// do: `421` ([`Forwarded::Moved`]) is a push the predecessor did not send.
    pub async fn relay(
        &self,
        predecessor: &PeerTarget,
        push: &PushRequest,
        deadline: Instant,
    ) -> Forwarded {
        self.send((predecessor, RELAY_ROUTE), push, deadline).await
    }

    async fn send(
        &self,
        (owner, route): (&PeerTarget, &str),
        push: &PushRequest,
        deadline: Instant,
    ) -> Forwarded {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let wire = on_the_wire(push, remaining);
        let hop = push.trace.hop();
        let started = hop.context.is_some().then(SystemTime::now);
        let sent = self
            .peers
            .push((owner, route), &wire, &hop, remaining + ANSWER_GRACE)
            .await;
        let status = sent.as_ref().map_or(0, |(s, _)| i64::from(s.as_u16()));
        self.record(
            &hop,
            started,
            owner,
            KeyValue::new("http.response.status_code", status),
        );
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
            Ok((status, body)) => match owner_answer(status, body, push) {
                Some(answer) => Forwarded::Answer(answer),
                // Not the owner's answer (every one is JSON): something between the pods
                // answered, and the owner may have got the push or not.
                None => Forwarded::Unknown(format!(
                    "HTTP {} from the owner's address without posgate's JSON body",
                    status.as_u16()
                )),
            },
            Err(SendError::Url(e) | SendError::Connect(e)) => Forwarded::NotSent(e),
            Err(SendError::Transport(e)) => Forwarded::Unknown(e),
            Err(SendError::Timeout(t)) => {
                Forwarded::Unknown(format!("no answer from the peer within {t:?}"))
            }
        }
    }

    /// Forwards `pushes` (all for shards `owner` serves) in one request, answering by
    /// `deadline` + grace: one outcome per push, in order. A batch refused whole before
    /// the owner acted on it (any answer but `200` in posgate's JSON) reached no
    /// terminal: every push is [`Forwarded::NotSent`], and the router sends each again.
    pub async fn push_batch(
        &self,
        owner: &PeerTarget,
        pushes: &[&PushRequest],
        deadline: Instant,
    ) -> Vec<Forwarded> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let wire: Vec<ForwardedPush> = pushes.iter().map(|p| on_the_wire(p, remaining)).collect();
        let batch = ForwardedBatch::new(wire.iter(), remaining);
        // The pushes of a batch came in one request: one trace.
        let Some(first) = pushes.first() else {
            return Vec::new();
        };
        let hop = first.trace.hop();
        let started = hop.context.is_some().then(SystemTime::now);
        let sent = self
            .peers
            .push_batch(owner, &batch, &hop, remaining + ANSWER_GRACE)
            .await;
        let count = KeyValue::new("posgate.pushes", pushes.len() as i64);
        self.record(&hop, started, owner, count);
        let all = |outcome: &dyn Fn() -> Forwarded| pushes.iter().map(|_| outcome()).collect();
        match sent {
            Ok((StatusCode::OK, body)) => {
                let answer = serde_json::from_slice::<BatchAnswer>(&body)
                    .ok()
                    .filter(|a| a.results.len() == pushes.len());
                let Some(answer) = answer else {
                    let why = "a batch answer without one result per push";
                    return all(&|| Forwarded::Unknown(why.into()));
                };
                answer
                    .results
                    .into_iter()
                    .zip(pushes)
                    .map(|(result, push)| {
                        let status = StatusCode::from_u16(result.status).ok();
                        match status {
                            Some(StatusCode::MISDIRECTED_REQUEST) => Forwarded::Moved,
                            Some(status) => {
                                let body = Bytes::from(result.body);
                                owner_answer(status, body, push).map_or_else(
                                    || {
                                        Forwarded::Unknown(
                                            "a batch result that is not an owner's answer".into(),
                                        )
                                    },
                                    Forwarded::Answer,
                                )
                            }
                            None => Forwarded::Unknown("a batch result without a status".into()),
                        }
                    })
                    .collect()
            }
            Ok((status, body)) if serde_json::from_slice::<ErrorBody>(&body).is_ok() => {
                let why = format!("the owner refused the batch with {}", status.as_u16());
                all(&|| Forwarded::NotSent(why.clone()))
            }
            Ok((status, _)) => {
                let why = format!(
                    "HTTP {} from the owner's address without posgate's JSON body",
                    status.as_u16()
                );
                all(&|| Forwarded::Unknown(why.clone()))
            }
            Err(SendError::Url(e) | SendError::Connect(e)) => {
                all(&|| Forwarded::NotSent(e.clone()))
            }
            Err(SendError::Transport(e)) => all(&|| Forwarded::Unknown(e.clone())),
            Err(SendError::Timeout(t)) => {
                all(&|| Forwarded::Unknown(format!("no answer from the peer within {t:?}")))
            }
        }
    }

    /// The span of a forward to `owner` (one push or a batch) sent at `started`.
    /// `started` is `None` when the push is not traced: no span, and no clock read for it.
    fn record(&self, hop: &Trace, started: Option<SystemTime>, owner: &PeerTarget, what: KeyValue) {
        let (context, Some(started)) = (hop.context.as_deref(), started) else {
            return;
        };
        self.telemetry
            .record("forward", SpanKind::Client, context, started, || {
                vec![KeyValue::new("posgate.peer", owner.pod.to_string()), what]
            });
    }

    /// Asks `owner` about `terminal`; returns its status and JSON body.
    pub async fn terminal(
        &self,
        owner: &PeerTarget,
        terminal: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        self.peers
            .terminal(owner, terminal, timeout)
            .await
            .map_err(|e| format!("{e:?}"))
    }
}

/// `push` as it travels to its owner, with `remaining` of its deadline.
fn on_the_wire(push: &PushRequest, remaining: Duration) -> ForwardedPush {
    ForwardedPush {
        tenant: push.tenant.0.clone(),
        terminal: push.terminal.clone(),
        key: push.key.clone(),
        deadline: remaining,
        content_type: push.content_type.clone(),
        body: push.body.clone(),
        ttl: push.later.as_ref().map(|l| l.ttl),
        collapse_key: push.later.as_ref().and_then(|l| l.collapse_key.clone()),
    }
}

/// The answer for the caller if `status` and `body` are what a posgate owner answers:
/// a `200` with the delivery, reporting the latency the caller saw rather than only the
/// owner's part (decoded once, for both), a `202` with a waiting push's status, or an
/// error with the documented body, as is.
fn owner_answer(status: StatusCode, body: Bytes, push: &PushRequest) -> Option<Answer> {
    if status == StatusCode::OK {
        let mut delivered = serde_json::from_slice::<Delivered>(&body).ok()?;
        delivered.latency_ms = push.received.elapsed().as_millis() as u64;
        Some(Answer::delivered(&delivered))
    } else if status == StatusCode::ACCEPTED {
        serde_json::from_slice::<PushStatus>(&body).ok()?;
        Some(Answer { status, body })
    } else {
        serde_json::from_slice::<ErrorBody>(&body).ok()?;
        Some(Answer { status, body })
    }
}
