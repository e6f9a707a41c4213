//! The peer endpoints (`/internal/...`) and the authentication in front of them.
//!
//! [`authenticated`] checks every request before its handler runs: as the layer over
//! the router's peer routes ([`authenticate`]), and for a forwarded push, answered ahead
//! of the router, in [`serve_forwarded`]. Its order costs a stranger the least of this
//! pod's work: an announced oversize body is `413` before anything else; then the signature over the head (`crate::peer::signing`), so
//! an unsigned or altered request is `401` before its body is read; then the request id
//! against the ones accepted within the clock-skew window (`401` for a copy; reserved
//! while the body is checked, kept only if it matches); then the body, read as it
//! arrives, against the signed digest (`401` when it differs). Only then does the
//! handler see the request, and every header it reads was signed.
//!
//! Protocol 1 requests (pods of the previous release) are accepted only while such a
//! pod is a member, their exact copies refused by signature. Each refusal counts in
//! `posgate_peer_requests_refused_total{reason}` and is logged at most once per second
//! per reason, with the number suppressed since the last line. In insecure mode (no
//! secrets) only the body is bounded.

use std::future::Future;
use std::str::Utf8Error;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, request::Parts, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::errors::{check_head, respond};
use super::push::{record_span, PushLine};
use super::{check_announced, read_body, HttpState};
use crate::api::valid_terminal_id;
use crate::clock;
use crate::core::ShardId;
use crate::credentials::ClusterSecret;
use crate::credentials::Tenant;
use crate::peer::replay::{RequestKey, Reserved};
use crate::peer::signing::{self, claimed, legacy, unix_seconds, AuthError, BodyDigest, Claimed};
use crate::peer::wire::{
    BatchAnswer, BatchResult, Draining, ForwardedBatch, ForwardedPush, ReleaseAnswer,
    ReleaseTerminals,
};
use crate::peer::{PeerAnswer, PEER_PROTOCOL, SIGNATURE_HEADER, VERSION_HEADER};
use crate::pos::handover::Released;
use crate::push::answer::{Answer, ErrorCode};
use crate::push::later::Later;
use crate::push::{Owned, PushRequest, MAX_TIMEOUT};
use crate::trace_context::Trace;

/// Why a peer request goes no further.
enum Refused {
    /// The signature checks failed.
    Auth(AuthError),
    /// An answer that needs no refusal bookkeeping (`413`, an unreadable body, a pod
    /// that is still starting).
    Answer(Answer),
}

impl From<AuthError> for Refused {
    fn from(e: AuthError) -> Self {
        Refused::Auth(e)
    }
}

/// The layer over the router's peer routes: [`authenticated`], then the route.
pub(super) async fn authenticate(
    State(state): State<Arc<HttpState>>,
    request: Request,
    next: Next,
) -> Response {
    authenticated(&state, request, |parts, body| {
        next.run(Request::from_parts(parts, Body::from(body)))
    })
    .await
}

/// Bounds, buffers and authenticates a peer request (see the module docs), then answers
/// it with `handler` over its head and body.
async fn authenticated<F, Fut>(state: &HttpState, request: Request, handler: F) -> Response
where
    F: FnOnce(Parts, Bytes) -> Fut,
    Fut: Future<Output = Response>,
{
    let (parts, body) = request.into_parts();
    let limit = state.internal_body_limit(parts.uri.path());
    let checked = match state.credentials.accepted_secrets() {
        None => match check_announced(&parts.headers, limit) {
            Ok(()) => read_body(body, limit, state.body_read_timeout(), |_| {})
                .await
                .map(|body| (body, None))
                .map_err(Refused::Answer),
            Err(answer) => Err(Refused::Answer(answer)),
        },
        Some(secrets) => checked_body(state, &secrets, &parts, body, limit).await,
    };
    match checked {
        Ok((body, legacy)) => {
            let mut response = handler(parts, body).await;
            // The previous release re-sends a forward after `421` at once, and its
            // signature has whole-second time only: the copy is byte-identical. A
            // request answered `421` acted on nothing, so its signature may be used again.
            if let Some(reserved) = legacy {
                if response.status() != StatusCode::MISDIRECTED_REQUEST {
                    reserved.keep();
                }
            }
            response
                .headers_mut()
                .insert(VERSION_HEADER, HeaderValue::from(PEER_PROTOCOL));
            response
        }
        Err(Refused::Answer(answer)) => respond(answer),
        Err(Refused::Auth(err)) => refuse(state, &parts, err),
    }
}

/// The body of a request whose every check passed; for a protocol-1 request also the
/// reservation of its signature, kept once the handler acted on it.
async fn checked_body<'a>(
    state: &'a HttpState,
    secrets: &[ClusterSecret],
    parts: &Parts,
    body: Body,
    limit: usize,
) -> Result<(Bytes, Option<Reserved<'a>>), Refused> {
    check_announced(&parts.headers, limit).map_err(Refused::Answer)?;
    let now = SystemTime::now();
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let replay = &state.peer.replay;
    match claimed(&parts.headers)? {
        Claimed::Current => {
            let Some(me) = state.status.borrow().pod.clone() else {
                return Err(Refused::Answer(starting()));
            };
            let head = signing::verify_head(
                secrets,
                &parts.method,
                path_and_query,
                &parts.headers,
                now,
                &me,
            )?;
            let id = RequestKey::Id(head.request_id);
            let reserved = replay.reserve(id, head.timestamp, unix_seconds(now))?;
            let mut digest = BodyDigest::default();
            let time = state.body_read_timeout();
            let body = read_body(body, limit, time, |chunk| digest.update(chunk))
                .await
                .map_err(Refused::Answer)?;
            digest.check(&head)?;
            reserved.keep();
            Ok((body, None))
        }
        Claimed::Legacy => {
            if !parts.headers.contains_key(SIGNATURE_HEADER) {
                return Err(AuthError::Missing(SIGNATURE_HEADER).into());
            }
            if !legacy_members(state) {
                return Err(AuthError::LegacyRefused.into());
            }
            let body = read_body(body, limit, state.body_read_timeout(), |_| {})
                .await
                .map_err(Refused::Answer)?;
            let (timestamp, signature) = legacy::verify(
                secrets,
                &parts.method,
                path_and_query,
                &parts.headers,
                &body,
                now,
            )?;
            let reserved =
                replay.reserve(RequestKey::Legacy(signature), timestamp, unix_seconds(now))?;
            state.metrics.peer_legacy_accepted.inc();
            Ok((body, Some(reserved)))
        }
    }
}

/// Whether a member of the last poll speaks only protocol 1: a rolling upgrade from
/// the previous release is under way, and its pods sign the old way.
fn legacy_members(state: &HttpState) -> bool {
    let status = state.status.borrow();
    status
        .members
        .iter()
        .any(|m| m.peer_protocol < PEER_PROTOCOL && status.pod.as_ref() != Some(&m.pod))
}

/// Counts and (rate-limited) logs a refusal, and answers it.
fn refuse(state: &HttpState, parts: &Parts, err: AuthError) -> Response {
    let reason = err.reason();
    state
        .metrics
        .peer_refusals
        .get_or_create(&[("reason", reason)])
        .inc();
    if let Some(suppressed) = state.peer.refusals.admit(reason, Instant::now()) {
        // `from` is what the request claims; it was not verified when the MAC failed.
        let claimed_from = parts
            .headers
            .get(signing::FROM_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.chars().take(64).collect::<String>());
        tracing::warn!(
            path = parts.uri.path(),
            reason,
            error = %err,
            claimed_from,
            suppressed_since_last_line = suppressed,
            "peer request refused"
        );
    }
    let code = match err {
        AuthError::UnsupportedVersion(_) => ErrorCode::InvalidRequest,
        AuthError::WindowFull => ErrorCode::Overloaded,
        _ => ErrorCode::Unauthorized,
    };
    respond(Answer::error(code, err.to_string()))
}

fn starting() -> Answer {
    Answer {
        status: StatusCode::SERVICE_UNAVAILABLE,
        body: Bytes::from_static(
            br#"{"error":"starting","message":"this pod has not published its status yet"}"#,
        ),
    }
}

/// `POST /internal/v1/store-reachable`: does this pod reach the coordination store?
pub(super) async fn store_reachable(State(state): State<Arc<HttpState>>) -> Response {
    // The driver is gone (the pod is stopping or its task died): its last status is no
    // evidence about the store any more, so do not let peers count on it.
    if state.status.has_changed().is_err() {
        return peer_unavailable("stopping", "this pod's coordination loop is not running");
    }
    let status = state.status.borrow();
    match &status.pod {
        Some(pod) => {
            let answer = PeerAnswer {
                pod: pod.clone(),
                store_reachable: status.store.reachable(),
            };
            Json(answer).into_response()
        }
        None => peer_unavailable("starting", "this pod has not published its status yet"),
    }
}

/// `503` to a peer: this pod cannot answer now (`code` says why; internal codes).
fn peer_unavailable(code: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": code, "message": message});
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// The owner's `421`: this pod does not serve the shard; the forwarder looks again.
fn moved() -> Response {
    respond(Answer::error(
        ErrorCode::ShardMoved,
        "this pod does not serve the terminal's shard",
    ))
}

fn bad_forward(message: &str) -> Response {
    respond(Answer::error(ErrorCode::InvalidRequest, message))
}

/// `POST /internal/v1/push/{id}` ahead of the router (`super::Routes`), `terminal` from
/// `super::route_id`: what the router's layers check first (the head's limits, then
/// [`authenticated`]), then [`push`]. Every forwarded push comes this way; the router's
/// path for it (matching, two layers, four extractors, their boxed futures) was ~10k
/// instructions of the owner's share.
pub(super) async fn serve_forwarded(
    state: Arc<HttpState>,
    terminal: Result<String, Utf8Error>,
    request: Request,
) -> Response {
    if let Some(refused) = check_head(&request) {
        return refused;
    }
    let state = &state;
    authenticated(state, request, |parts, body| async move {
        match terminal {
            Ok(terminal) => push(state, terminal, &parts, body).await,
            Err(_) => bad_forward("invalid terminal id"),
        }
    })
    .await
}

/// A push forwarded by another pod, authenticated: delivered here or `421`; never
/// forwarded again.
async fn push(state: &HttpState, terminal: String, parts: &Parts, body: Bytes) -> Response {
    let received = std::time::Instant::now();
    let (request, deadline) = match single(state, terminal, &parts.headers, body, received) {
        Ok(decoded) => decoded,
        Err(why) => return bad_forward(why),
    };
    let line = PushLine::admit(state, &request.trace, &request.terminal, received);
    let answer = state.push.deliver_forwarded(&request, deadline).await;
    if let Some(line) = line {
        line.write("owner", "forwarded", &answer);
    }
    let telemetry = state.push.telemetry();
    record_span(
        telemetry,
        "deliver",
        &request.trace,
        received,
        "forwarded",
        &answer,
    );
    respond(answer)
}

/// `POST /internal/v1/relay/{id}`: the pod that took terminal `{id}`'s shard over
/// relays a push, authenticated, to send on this pod's draining session of the
/// terminal (`PushService::relay_here`): the terminal's answer, or `421` when nothing
/// was sent. Not admitted against `--max-inflight`: the pod that relays holds the
/// push's slot.
pub(super) async fn relay(
    State(state): State<Arc<HttpState>>,
    Path(terminal): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = std::time::Instant::now();
    let (request, deadline) = match single(&state, terminal, &headers, body, received) {
        Ok(decoded) => decoded,
        Err(why) => return bad_forward(why),
    };
    match state.push.relay_here(&request, deadline).await {
        Owned::Answer(answer) => respond(answer),
        Owned::NotHere => respond(Answer::error(
            ErrorCode::ShardMoved,
            "no draining session to the terminal here",
        )),
    }
}

/// The push a forward (or a relay) carries, received at `received`, with its deadline;
/// or what is wrong with it.
fn single(
    state: &HttpState,
    terminal: String,
    headers: &HeaderMap,
    body: Bytes,
    received: std::time::Instant,
) -> Result<(PushRequest, std::time::Instant), &'static str> {
    let forwarded = ForwardedPush::decode(terminal, headers, body)?;
    let deadline = clock::now() + forwarded.deadline.min(MAX_TIMEOUT);
    // The entry pod's request id, which it answers the caller with.
    let serves = signing::serves(headers);
    let trace = Trace::from_peer(serves, headers, state.push.telemetry().is_on());
    Ok((request_of(forwarded, received, trace), deadline))
}

/// The push a forward carries, received at `received`.
fn request_of(f: ForwardedPush, received: std::time::Instant, trace: Trace) -> PushRequest {
    PushRequest {
        tenant: Tenant(f.tenant),
        terminal: f.terminal,
        key: f.key,
        content_type: f.content_type,
        body: f.body,
        received,
        later: f.ttl.map(|ttl| Later {
            ttl,
            collapse_key: f.collapse_key,
        }),
        trace,
    }
}

/// `POST /internal/v1/push-batch`: one owner's share of a batch, authenticated (the
/// route's layer). Each push delivered here as a forwarded one would be, at once; one
/// result per push, `421` for one whose shard this pod does not serve. A batch that
/// does not decode is refused whole (`400`) before any push is acted on.
pub(super) async fn push_batch(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = std::time::Instant::now();
    let exporting = state.push.telemetry().is_on();
    let trace = Trace::from_peer(signing::serves(&headers), &headers, exporting);
    let (budget, forwarded) = match ForwardedBatch::decode(&body) {
        Ok(batch) => batch,
        Err(why) => return bad_forward(why),
    };
    let metrics = &state.metrics;
    metrics
        .push_batches
        .get_or_create(&[("from", "peer")])
        .inc();
    (metrics.push_batch_items.get_or_create(&[("from", "peer")])).inc_by(forwarded.len() as u64);
    let pushes: Vec<PushRequest> = forwarded
        .into_iter()
        .map(|f| request_of(f, received, trace.clone()))
        .collect();
    let deadline = clock::now() + budget.min(MAX_TIMEOUT);
    let push = &state.push;
    let answers =
        futures::future::join_all(pushes.iter().map(|p| push.deliver_forwarded(p, deadline))).await;
    let results = answers
        .into_iter()
        .map(|a| BatchResult {
            status: a.status.as_u16(),
            // Every answer of the push service is JSON text.
            body: String::from_utf8_lossy(&a.body).into_owned(),
        })
        .collect();
    Json(BatchAnswer { results }).into_response()
}

/// `GET /internal/v1/terminals/{id}`: the owner's view of one terminal, or `421`.
pub(super) async fn terminal(
    State(state): State<Arc<HttpState>>,
    Path(terminal): Path<String>,
) -> Response {
    if !valid_terminal_id(&terminal) {
        return bad_forward("invalid terminal id");
    }
    match state.push.terminal_here(&terminal) {
        Owned::Answer(answer) => respond(answer),
        Owned::NotHere => moved(),
    }
}

/// `GET /internal/v1/kept-answers/{id}`: the final push answers this pod keeps for one
/// shard's terminals, for the pod that acquired the shard from it (`push::handover`).
pub(super) async fn kept_answers(
    State(state): State<Arc<HttpState>>,
    Path(shard): Path<String>,
) -> Response {
    let Some(shard) = shard_param(&state, &shard) else {
        return bad_forward("invalid shard");
    };
    let json = [(header::CONTENT_TYPE, "application/json")];
    (json, state.push.kept_answers(shard)).into_response()
}

/// `POST /internal/v1/release-terminals/{id}`: the pod that took shard `{id}` over asks
/// this pod to close the draining sessions of the terminals named (`pos::handover`).
pub(super) async fn release_terminals(
    State(state): State<Arc<HttpState>>,
    Path(shard): Path<String>,
    body: Bytes,
) -> Response {
    let (shard, request) = match shard_request(&state, &shard, ReleaseTerminals::decode(&body)) {
        Ok(parsed) => parsed,
        Err(why) => return bad_forward(why),
    };
    let answer = match state
        .handovers
        .release_terminals(shard, request.terminals)
        .await
    {
        Released::Closed { closed } => ReleaseAnswer {
            draining: true,
            closed,
        },
        Released::NotDraining => ReleaseAnswer {
            draining: false,
            closed: 0,
        },
    };
    Json(answer).into_response()
}

/// `POST /internal/v1/draining/{id}`: a member drains shard `{id}` and says so before it
/// releases the lease; if this pod acquires the shard it asks that member first. `503`
/// when the sender is not a member here or nothing here walks (it then closes instead).
pub(super) async fn draining(
    State(state): State<Arc<HttpState>>,
    Path(shard): Path<String>,
    body: Bytes,
) -> Response {
    let (shard, request) = match shard_request(&state, &shard, Draining::decode(&body)) {
        Ok(parsed) => parsed,
        Err(why) => return bad_forward(why),
    };
    let member = {
        let status = state.status.borrow();
        status
            .members
            .iter()
            .find(|m| m.pod == request.from)
            .cloned()
    };
    let recorded = member.is_some_and(|m| state.handovers.expect_predecessor(shard, m));
    if recorded {
        StatusCode::NO_CONTENT.into_response()
    } else {
        peer_unavailable(
            "not_expected",
            "the announcing pod is not a member here, or this pod does not walk handovers",
        )
    }
}

/// A `{shard}` request's shard and decoded body, or why it is refused (a `400`).
fn shard_request<T>(
    state: &HttpState,
    shard: &str,
    body: Result<T, &'static str>,
) -> Result<(ShardId, T), &'static str> {
    let shard = shard_param(state, shard).ok_or("invalid shard")?;
    Ok((shard, body?))
}

/// A `{shard}` path parameter, if it names a shard of this cluster.
fn shard_param(state: &HttpState, shard: &str) -> Option<ShardId> {
    shard
        .parse::<ShardId>()
        .ok()
        .filter(|&s| s < state.push.shards())
}
