//! The peer endpoints (`/internal/...`) and the middleware that authenticates them.
//!
//! The middleware bounds the body before buffering it (`413` beyond
//! [`MAX_INTERNAL_BODY`]), checks the HMAC signature with [`crate::peer::verify`] (`401`
//! when missing, wrong or stale) and hands the buffered body on. In insecure mode (no
//! secrets) it only bounds the body.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::LengthLimitError;

use super::{json_error, HttpState};
use crate::peer::{verify, PeerAnswer, MAX_INTERNAL_BODY};

fn too_large() -> Response {
    let message = format!("request body exceeds {MAX_INTERNAL_BODY} bytes");
    json_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
}

/// Bounds, buffers and authenticates a peer request.
pub(super) async fn authenticate(
    State(state): State<Arc<HttpState>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    // Refuse an announced oversize body without reading any of it; `to_bytes` below
    // catches bodies that lie about or omit their length.
    let announced = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|len| len > MAX_INTERNAL_BODY as u64) {
        return too_large();
    }
    let body = match to_bytes(body, MAX_INTERNAL_BODY).await {
        Ok(body) => body,
        Err(err) => {
            let over_limit = std::error::Error::source(&err)
                .is_some_and(|source| source.is::<LengthLimitError>());
            if over_limit {
                return too_large();
            }
            return json_error(StatusCode::BAD_REQUEST, "bad_request", err.to_string());
        }
    };
    if let Some(secrets) = &state.secrets {
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
            return json_error(StatusCode::UNAUTHORIZED, "unauthorized", err.to_string());
        }
    }
    next.run(Request::from_parts(parts, Body::from(body))).await
}

/// `POST /internal/v1/store-reachable`: does this pod reach the coordination store?
pub(super) async fn store_reachable(State(state): State<Arc<HttpState>>) -> Response {
    // The driver is gone (the pod is stopping or its task died): its last status is no
    // evidence about the store any more, so do not let peers count on it.
    if state.status.has_changed().is_err() {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "stopping",
            "this pod's coordination loop is not running",
        );
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
        None => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting",
            "this pod has not published its status yet",
        ),
    }
}
