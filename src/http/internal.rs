//! The peer endpoints (`/internal/...`) and the middleware that authenticates them.
//!
//! The middleware bounds the body before buffering it (`413` beyond
//! [`MAX_INTERNAL_BODY`], or the push size limit when larger), checks the HMAC signature with [`crate::peer::verify`] (`401`
//! when missing, wrong or stale) and hands the buffered body on. In insecure mode (no
//! secrets) it only bounds the body.

use std::sync::Arc;
use std::time::SystemTime;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::errors::respond;
use super::{read_bounded, valid_key, HttpState};
#[cfg(doc)]
use crate::peer::MAX_INTERNAL_BODY;
use crate::peer::{verify, PeerAnswer};
use crate::pos::directory::valid_id;
use crate::push::answer::{Answer, ErrorCode};
use crate::push::auth::Tenant;
use crate::push::{Owned, PushRequest, HEADER_DEADLINE_MS, HEADER_HOP, HEADER_TENANT, MAX_TIMEOUT};

/// Bounds, buffers and authenticates a peer request.
pub(super) async fn authenticate(
    State(state): State<Arc<HttpState>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = match read_bounded(&parts.headers, body, state.internal_body_limit()).await {
        Ok(body) => body,
        Err(answer) => return respond(answer),
    };
    if let Some(secrets) = &state.credentials.accepted_secrets() {
        let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let checked = verify(
            secrets,
            &parts.method,
            path_and_query,
            &parts.headers,
            &body,
            SystemTime::now(),
        );
        if let Err(err) = checked {
            // A peer with a different secret shows up here; worth an operator's attention.
            tracing::warn!(path = parts.uri.path(), reason = %err, "peer request refused");
            return respond(Answer::error(ErrorCode::Unauthorized, err.to_string()));
        }
    }
    next.run(Request::from_parts(parts, Body::from(body))).await
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
                store_reachable: status.store_reachable,
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

/// `POST /internal/v1/push/{id}`: a push forwarded by another pod. Delivered here or
/// `421`; never forwarded again.
pub(super) async fn push(
    State(state): State<Arc<HttpState>>,
    Path(terminal): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = std::time::Instant::now();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if text(HEADER_HOP) != Some("1") {
        return bad_forward("a forwarded push must carry posgate-hop: 1");
    }
    let Some(tenant) = text(HEADER_TENANT).filter(|t| !t.is_empty()) else {
        return bad_forward("missing posgate-tenant");
    };
    let Some(key) = text("idempotency-key").filter(|k| valid_key(k)) else {
        return bad_forward("missing or invalid idempotency-key");
    };
    let Some(deadline_ms) = text(HEADER_DEADLINE_MS).and_then(|v| v.parse::<u64>().ok()) else {
        return bad_forward("missing or invalid posgate-deadline-ms");
    };
    if !valid_id(&terminal) {
        return bad_forward("invalid terminal id");
    }
    let Some(_slot) = state.push.admit() else {
        return respond(Answer::error(
            ErrorCode::Overloaded,
            "the owner pod is at its in-flight push limit",
        ));
    };
    let request = PushRequest {
        tenant: Tenant(tenant.to_string()),
        terminal,
        key: key.to_string(),
        content_type: headers.get(header::CONTENT_TYPE).cloned(),
        body,
        received,
    };
    let budget = Duration::from_millis(deadline_ms).min(MAX_TIMEOUT);
    let deadline = tokio::time::Instant::now().into_std() + budget;
    match state.push.deliver_here(&request, deadline).await {
        Owned::Answer(answer) => respond(answer),
        Owned::NotHere => moved(),
    }
}

/// `GET /internal/v1/terminals/{id}`: the owner's view of one terminal, or `421`.
pub(super) async fn terminal(
    State(state): State<Arc<HttpState>>,
    Path(terminal): Path<String>,
) -> Response {
    if !valid_id(&terminal) {
        return bad_forward("invalid terminal id");
    }
    match state.push.terminal_here(&terminal) {
        Owned::Answer(answer) => respond(answer),
        Owned::NotHere => moved(),
    }
}
