//! `POST /v1/pushes`: up to 1,000 pushes in one request, one result per push.
//!
//! The request is JSON: `{"pushes": [{"terminal", "idempotency_key", "body" or
//! "body_base64", "content_type", "ttl_s", "collapse_key"}, ...]}` with `?timeout_ms=`
//! for every push. What is wrong with the request as a whole (not JSON, no pushes or
//! more than 1,000, over `--max-batch-bytes`, an operator token) is its answer; what is
//! wrong with one push (its id, key, body, TTL, or a terminal the token's patterns do not
//! reach) is that push's result, and the others go on. Each result is the status and the
//! JSON body the same push sent alone would have got, in the request's order.
//!
//! This module only checks and parses; the pushes go their way in `crate::push::batch`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Extension, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;

use super::caller::Caller;
use super::errors::respond;
use super::push::{count, keepable, later_of, new_key, overloaded, timeout_param};
use super::{read_bounded, HttpState};
use crate::api::{valid_key, valid_terminal_id};
use crate::clock;
use crate::metrics::GaugeUnit;
use crate::peer::wire::MAX_BATCH_PUSHES;
use crate::push::answer::{Answer, ErrorCode};
use crate::push::slots::Slot;
use crate::push::{PushRequest, Trace};

/// The batch's query: the deadline of every push, nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchQuery {
    timeout_ms: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    pushes: Vec<BatchItem>,
}

/// One push of a batch, as the sender wrote it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchItem {
    terminal: String,
    /// As the `Idempotency-Key` header of a single push; a fresh UUID when absent.
    idempotency_key: Option<String>,
    /// The body as text (delivered as its UTF-8 bytes), or ...
    body: Option<String>,
    /// ... as base64 (standard alphabet), for bytes that are not text.
    body_base64: Option<String>,
    content_type: Option<String>,
    ttl_s: Option<u64>,
    collapse_key: Option<String>,
}

/// `POST /v1/pushes` (behind the token layer).
pub(super) async fn batch(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    request: Request,
) -> Response {
    let received = Instant::now();
    let (head, body) = request.into_parts();
    // One request, one span: every push of the batch hangs under it.
    let exporting = state.push.telemetry().is_on();
    let trace = Trace::entry(head.extensions.get().copied(), &head.headers, exporting);
    let query = match axum::extract::Query::<BatchQuery>::try_from_uri(&head.uri) {
        Ok(q) => q.0,
        Err(e) => return invalid(e.body_text()),
    };
    let timeout = match timeout_param(query.timeout_ms) {
        Ok(t) => t,
        Err(message) => return invalid(message),
    };
    // An operator token pushes nothing; refused before the body is read.
    if let Err(answer) = caller.tenant() {
        return respond(answer);
    }
    let settings = state.push.settings();
    let limit = settings.max_batch_bytes;
    let body = match read_bounded(&head.headers, body, limit, settings.body_read_timeout).await {
        Ok(body) => body,
        Err(answer) => return respond(answer),
    };
    let items = match serde_json::from_slice::<BatchBody>(&body) {
        Ok(b) if (1..=MAX_BATCH_PUSHES).contains(&b.pushes.len()) => b.pushes,
        Ok(_) => return invalid(format!("a batch carries 1 to {MAX_BATCH_PUSHES} pushes")),
        Err(e) => return invalid(format!("not a batch of pushes: {e}")),
    };
    let metrics = &state.metrics;
    metrics
        .push_batches
        .get_or_create(&[("from", "sender")])
        .inc();
    (metrics
        .push_batch_items
        .get_or_create(&[("from", "sender")]))
    .inc_by(items.len() as u64);
    let _in_flight = GaugeUnit::hold(&metrics.pushes_in_flight);

    // Each push checked and given its slot of --max-inflight; `answers[i]` is set for the
    // ones that end here, the rest go out together.
    let mut answers: Vec<Option<Answer>> = (0..items.len()).map(|_| None).collect();
    let mut pushes = Vec::with_capacity(items.len());
    let mut sent = Vec::with_capacity(items.len());
    let mut slots: Vec<Slot> = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let checked = checked(&state, &caller, item, received, &trace);
        match checked.and_then(|p| match state.push.admit(&p.tenant) {
            Ok(slot) => Ok((p, slot)),
            Err(full) => Err(overloaded(&p, full)),
        }) {
            Ok((push, slot)) => {
                pushes.push(push);
                sent.push(i);
                slots.push(slot);
            }
            Err(answer) => answers[i] = Some(answer),
        }
    }
    let deadline = clock::now() + timeout;
    let delivered = state.push.push_batch(pushes, deadline).await;
    drop(slots);
    for (i, (answer, path)) in sent.into_iter().zip(delivered) {
        count(metrics, path, &answer, received);
        answers[i] = Some(answer);
    }
    // The results as the single answers' own JSON, each kept as the service wrote it.
    let answers: Vec<Answer> = answers.into_iter().flatten().collect();
    let room = answers.iter().map(|a| a.body.len() + 32).sum::<usize>() + 16;
    let mut out = BytesMut::with_capacity(room);
    out.put_slice(b"{\"results\":[");
    for (n, answer) in answers.iter().enumerate() {
        if n > 0 {
            out.put_u8(b',');
        }
        out.put_slice(format!("{{\"status\":{},\"answer\":", answer.status.as_u16()).as_bytes());
        out.put_slice(&answer.body);
        out.put_u8(b'}');
    }
    out.put_slice(b"]}");
    let json = HeaderValue::from_static("application/json");
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, json)],
        Bytes::from(out),
    )
        .into_response()
}

fn invalid(message: impl Into<String>) -> Response {
    respond(Answer::error(ErrorCode::InvalidRequest, message))
}

/// One push of the batch as a [`PushRequest`], or its result: `400` for what is wrong
/// with it, `413` for a body over `--max-push-bytes`, `403` for a terminal the token
/// does not reach, `503 queue_unavailable` for a TTL this cluster cannot keep now.
fn checked(
    state: &HttpState,
    caller: &Caller,
    item: BatchItem,
    received: Instant,
    trace: &Trace,
) -> Result<PushRequest, Answer> {
    let bad = |m: String| Answer::error(ErrorCode::InvalidRequest, m);
    if !valid_terminal_id(&item.terminal) {
        return Err(bad("terminal must match [A-Za-z0-9._:-]{1,64}".into()));
    }
    let key = match item.idempotency_key {
        None => new_key(),
        Some(k) if valid_key(&k) => k,
        Some(_) => {
            return Err(bad(
                "idempotency_key must be 1-128 visible ASCII characters".into(),
            ))
        }
    };
    let body = match (item.body, item.body_base64) {
        (Some(_), Some(_)) => return Err(bad("body and body_base64 are exclusive".into())),
        (Some(text), None) => Bytes::from(text),
        (None, Some(b64)) => match BASE64.decode(b64.as_bytes()) {
            Ok(bytes) => Bytes::from(bytes),
            Err(_) => return Err(bad("body_base64 is not base64".into())),
        },
        (None, None) => Bytes::new(),
    };
    let settings = state.push.settings();
    if body.len() > settings.max_push_bytes {
        return Err(super::push::too_large(settings.max_push_bytes));
    }
    let content_type = match item.content_type {
        None => None,
        Some(c) => match HeaderValue::from_str(&c) {
            Ok(v) if v.to_str().is_ok() => Some(v),
            _ => return Err(bad("content_type must be visible ASCII".into())),
        },
    };
    let later = later_of(item.ttl_s, item.collapse_key).map_err(bad)?;
    if let Some(later) = &later {
        keepable(&state.push, later)?;
    }
    let tenant = caller.tenant_for(&item.terminal)?;
    Ok(PushRequest {
        tenant,
        terminal: item.terminal,
        key,
        content_type,
        body,
        received,
        later,
        trace: trace.clone(),
    })
}
