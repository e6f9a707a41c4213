//! The public push API: `POST /v1/terminals/{id}/push`, `GET /v1/terminals/{id}`, and
//! the bearer-token middleware in front of every `/v1/*` route. A push does not go
//! through the router (`super::Routes`): [`serve_push`] checks what the router's layers
//! would, in their order (the head's limits, then the token), before anything else.
//!
//! This module only checks and parses (id, key, deadline, body size, tenant) and turns
//! [`Answer`]s into responses; what happens to a push is `crate::push`. Checks run
//! cheapest first, and an announced oversize body is refused before any of it is read.

use std::str::Utf8Error;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::Response;
use axum::Extension;
use rand::Rng;
use serde::Deserialize;

use super::caller::Caller;
use super::errors::{check_head, method_not_allowed, respond};
use super::{read_bounded, HttpState};
use crate::api::{
    valid_collapse_key, valid_key, valid_terminal_id, COLLAPSE_PARAM, IDEMPOTENCY_KEY,
    TIMEOUT_PARAM, TTL_PARAM,
};
use crate::clock;
use crate::credentials::ApiTokens;
use crate::metrics::{GaugeUnit, Metrics};
use crate::push::answer::{Answer, ErrorBody, ErrorCode, ALL_ERROR_CODES};
use crate::push::later::Later;
use crate::push::slots::Full;
use crate::push::{PushRequest, PushService, Trace, DEFAULT_TIMEOUT, MAX_TIMEOUT};
use crate::telemetry::Telemetry;
use crate::trace_context::RequestId;

fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    respond(Answer::error(code, message))
}

/// Authenticates `/v1/*`: a valid bearer token says what the request may do
/// ([`Caller`]); none or a wrong one is `401`. Without configured tokens every request
/// may do everything ([`Caller::Insecure`]).
pub(super) async fn require_token(
    State(state): State<Arc<HttpState>>,
    mut request: Request,
    next: Next,
) -> Response {
    match authenticate(&state, request.headers()) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refused) => refused.response(),
    }
}

/// Why [`authenticate`] refused a request.
enum Refused {
    /// A malformed `Authorization` header: `400`.
    Malformed(Answer),
    /// No token, or one not listed: `401`.
    Unauthorized,
}

impl Refused {
    fn response(self) -> Response {
        match self {
            Refused::Malformed(answer) => respond(answer),
            Refused::Unauthorized => {
                let mut response =
                    error(ErrorCode::Unauthorized, "missing or invalid bearer token");
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                response
            }
        }
    }
}

/// Who sent `headers` ([`require_token`]).
fn authenticate(state: &HttpState, headers: &HeaderMap) -> Result<Caller, Refused> {
    let presented = single(headers, &header::AUTHORIZATION)
        .map_err(Refused::Malformed)?
        .and_then(|v| v.to_str().ok())
        .and_then(ApiTokens::bearer);
    match state.credentials.grant_of(presented) {
        None => Ok(Caller::Insecure),
        Some(Some(grant)) => Ok(Caller::Granted(grant)),
        Some(None) => Err(Refused::Unauthorized),
    }
}

/// `POST /v1/terminals/{id}/push` ahead of the router ([`super::Routes`]), `terminal`
/// from `super::route_id`: the head's limits and the bearer token are checked first, as
/// the router's layers check them for every other route, then [`push`].
pub(super) async fn serve_push(
    state: Arc<HttpState>,
    terminal: Result<String, Utf8Error>,
    id: RequestId,
    request: Request,
) -> Response {
    if let Some(refused) = check_head(&request) {
        return refused;
    }
    let caller = match authenticate(&state, request.headers()) {
        Ok(caller) => caller,
        Err(refused) => return refused.response(),
    };
    match terminal {
        Ok(terminal) => push(state, caller, terminal, id, request).await,
        Err(_) => error(ErrorCode::InvalidRequest, BAD_ID),
    }
}

/// Any method but `POST` on the push route (a `POST` never reaches the router:
/// [`super::Routes`]): `405`, naming the one allowed.
pub(super) async fn post_only(method: Method, uri: Uri) -> Response {
    let mut response = method_not_allowed(method, uri).await;
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

/// The value of a header that may be sent once, if sent. Two or more are a `400`:
/// which one counts would be a guess, and proxies guess differently (one keeps the
/// first, another the last), so a key or a token could mean one thing to a proxy and
/// another here. The name is a `HeaderName`, not text: text is parsed on every lookup.
fn single<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a HeaderValue>, Answer> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        let message = format!("the {name} header is sent more than once");
        return Err(Answer::error(ErrorCode::InvalidRequest, message));
    }
    Ok(first)
}

/// A fresh UUID v4 for a push sent without a key.
pub(super) fn new_key() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// The push's query: `timeout_ms`, and for a push that may wait `ttl_s` and
/// `collapse_key`; nothing else, so a misspelt parameter is an error, not a silently
/// ignored wish (and a pod of an earlier release refuses `ttl_s` the same way: a
/// rolling upgrade cannot turn a push meant to wait into one that does not).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PushQuery {
    timeout_ms: Option<String>,
    ttl_s: Option<String>,
    collapse_key: Option<String>,
}

/// The longest `ttl_s` the API takes at all (a pod's `--queue-max-ttl` may be lower).
pub const MAX_TTL_S: u64 = 366 * 24 * 3600;

/// The query parameters, checked: the deadline and, with `ttl_s`, what makes the push
/// wait; any other parameter is refused.
fn query_of(uri: &Uri) -> Result<(Duration, Option<Later>), String> {
    let Query(query) = Query::<PushQuery>::try_from_uri(uri).map_err(|e| e.body_text())?;
    let timeout = timeout_param(query.timeout_ms)?;
    let ttl_s = match query.ttl_s {
        None => None,
        Some(raw) => Some(raw.parse::<u64>().map_err(|_| ttl_range())?),
    };
    Ok((timeout, later_of(ttl_s, query.collapse_key)?))
}

fn ttl_range() -> String {
    format!("{TTL_PARAM} must be an integer from 1 to {MAX_TTL_S}")
}

/// What makes a push wait, checked (a single push's query, a batch's item): `ttl_s` in
/// range, and a `collapse_key` only with it and of the allowed characters.
pub(super) fn later_of(
    ttl_s: Option<u64>,
    collapse_key: Option<String>,
) -> Result<Option<Later>, String> {
    match (ttl_s, collapse_key) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(format!("{COLLAPSE_PARAM} needs {TTL_PARAM}")),
        (Some(s), _) if !(1..=MAX_TTL_S).contains(&s) => Err(ttl_range()),
        (Some(_), Some(c)) if !valid_collapse_key(&c) => Err(format!(
            "{COLLAPSE_PARAM} must match [A-Za-z0-9._:-]{{1,64}}"
        )),
        (Some(s), collapse_key) => Ok(Some(Later {
            ttl: Duration::from_secs(s),
            collapse_key,
        })),
    }
}

/// Whether this cluster keeps `later` now: `503 queue_unavailable` while a member does
/// not keep pushes for later, `400` for a TTL over `--queue-max-ttl`.
pub(super) fn keepable(service: &PushService, later: &Later) -> Result<(), Answer> {
    service
        .queue_ready()
        .map_err(|why| Answer::error(ErrorCode::QueueUnavailable, why))?;
    let max = service.settings().queue.max_ttl;
    if later.ttl > max {
        let message = format!(
            "{TTL_PARAM} must be at most {} on this cluster (--queue-max-ttl)",
            max.as_secs()
        );
        return Err(Answer::error(ErrorCode::InvalidRequest, message));
    }
    Ok(())
}

/// `?timeout_ms=` checked: [`DEFAULT_TIMEOUT`] when absent.
pub(super) fn timeout_param(raw: Option<String>) -> Result<Duration, String> {
    let max = MAX_TIMEOUT.as_millis() as u64;
    match raw {
        None => Ok(DEFAULT_TIMEOUT),
        Some(raw) => match raw.parse::<u64>() {
            Ok(ms) if (1..=max).contains(&ms) => Ok(Duration::from_millis(ms)),
            _ => Err(format!(
                "{TIMEOUT_PARAM} must be an integer from 1 to {max}"
            )),
        },
    }
}

/// A request that takes no query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NoQuery {}

/// A push from `caller` to `terminal` (decoded from the path), request `id`.
async fn push(
    state: Arc<HttpState>,
    caller: Caller,
    terminal: String,
    id: RequestId,
    request: Request,
) -> Response {
    let received = Instant::now();
    let service = &state.push;
    // Held until the answer is ready; dropped with the future if the caller goes away.
    let in_flight = GaugeUnit::hold(&state.metrics.pushes_in_flight);
    let (head, body) = request.into_parts();
    let exporting = service.telemetry().is_on();
    let trace = Trace::entry(Some(id), &head.headers, exporting);
    let line = PushLine::admit(&state, &trace, &terminal, received);
    let span = exporting.then(|| trace.clone());
    let checked = checked(
        service,
        &caller,
        terminal,
        &head.uri,
        &head.headers,
        body,
        trace,
    )
    .await;
    let (answer, path) = match checked {
        Ok((request, timeout)) => match service.admit(&request.tenant) {
            Ok(_slot) => {
                let deadline = clock::now() + timeout;
                service.push(request, deadline).await
            }
            Err(full) => (overloaded(&request, full), "none"),
        },
        Err(answer) => (answer, "none"),
    };
    drop(in_flight);
    count(&state.metrics, path, &answer, received);
    if let Some(line) = line {
        line.write("entry", path, &answer);
    }
    if let Some(trace) = span {
        record_span(service.telemetry(), "push", &trace, received, path, &answer);
    }
    respond(answer)
}

/// Records the span of a push this pod answered: `push` at the entry pod, `deliver` at
/// the owner of a forwarded one (`crate::telemetry`).
pub(super) fn record_span(
    telemetry: &Telemetry,
    name: &'static str,
    trace: &Trace,
    received: Instant,
    path: &'static str,
    answer: &Answer,
) {
    // An untraced push has no span: no clock read for one.
    if trace.context.is_none() {
        return;
    }
    let start = SystemTime::now() - received.elapsed();
    telemetry.record(
        name,
        SpanKind::Server,
        trace.context.as_deref(),
        start,
        || {
            vec![
                KeyValue::new("posgate.request_id", trace.request_id.to_string()),
                KeyValue::new(
                    "http.response.status_code",
                    i64::from(answer.status.as_u16()),
                ),
                KeyValue::new("posgate.result", result_of(answer)),
                KeyValue::new("posgate.path", path),
            ]
        },
    );
}

/// Push log lines per second and pod before they turn into a count: every push of a
/// quiet pod, a sample with the number left out of a busy one.
const PUSH_LINES_PER_SECOND: u32 = 100;

/// The one info line (target `posgate::push`) a pod writes for a push it answered: as
/// the entry pod, and as the owner of a forwarded one, both with the entry pod's
/// request id, so the push can be followed across pods. Admitted when the push arrives,
/// so a line's `suppressed` counts pushes, not answers.
pub(super) struct PushLine {
    request_id: RequestId,
    trace_id: Option<u128>,
    terminal: String,
    received: Instant,
    suppressed: u64,
}

impl PushLine {
    pub(super) fn admit(
        state: &HttpState,
        trace: &Trace,
        terminal: &str,
        received: Instant,
    ) -> Option<Box<Self>> {
        // Nothing to count or copy when the filter drops the line. Boxed: the push's
        // future holds it, and is copied whole when moved.
        if !tracing::enabled!(target: "posgate::push", tracing::Level::INFO) {
            return None;
        }
        let suppressed = state
            .push_lines
            .admit_up_to("push", received, PUSH_LINES_PER_SECOND)?;
        Some(Box::new(PushLine {
            request_id: trace.request_id,
            trace_id: trace.context.as_ref().map(|c| c.trace_id),
            terminal: terminal.to_string(),
            received,
            suppressed,
        }))
    }

    pub(super) fn write(self, role: &'static str, path: &'static str, answer: &Answer) {
        tracing::info!(
            target: "posgate::push",
            role,
            request_id = %self.request_id,
            trace_id = self.trace_id.map(|t| format!("{t:032x}")).as_deref(),
            terminal = %self.terminal,
            status = answer.status.as_u16(),
            result = result_of(answer),
            path,
            latency_ms = self.received.elapsed().as_millis() as u64,
            suppressed = self.suppressed,
            "push answered"
        );
    }
}

/// The push and its timeout, or the `400`/`403`/`413`/`415`/`408` answer.
async fn checked(
    service: &PushService,
    caller: &Caller,
    terminal: String,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
    trace: Trace,
) -> Result<(PushRequest, Duration), Answer> {
    let received = Instant::now();
    let head = push_head(&terminal, uri, headers)?;
    let tenant = caller.tenant_for(&terminal)?;
    let settings = service.settings();
    let body = read_bounded(
        headers,
        body,
        settings.max_push_bytes,
        settings.body_read_timeout,
    )
    .await?;
    if let Some(later) = &head.later {
        keepable(service, later)?;
    }
    let request = PushRequest {
        tenant,
        terminal,
        key: head.key,
        content_type: head.content_type,
        body,
        received,
        later: head.later,
        trace,
    };
    Ok((request, head.timeout))
}

/// What a push's target and headers say, checked.
#[derive(Debug)]
pub struct PushHead {
    /// `Idempotency-Key`, or a fresh UUID when it is absent.
    pub key: String,
    /// `timeout_ms`, or [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    pub content_type: Option<HeaderValue>,
    /// `ttl_s` (and `collapse_key`): the push may wait for its terminal.
    pub later: Option<Later>,
}

/// Checks a push's terminal id, query and headers, without IO (a fuzz target's entry,
/// `fuzz/`): an invalid id, key or `timeout_ms`, an unknown query parameter or a
/// repeated singleton header is `400`, a `Content-Encoding` other than identity `415`.
pub fn push_head(terminal: &str, uri: &Uri, headers: &HeaderMap) -> Result<PushHead, Answer> {
    if !valid_terminal_id(terminal) {
        return Err(Answer::error(ErrorCode::InvalidRequest, BAD_ID));
    }
    let (key, content_type) = body_headers(headers)?;
    let (timeout, later) =
        query_of(uri).map_err(|m| Answer::error(ErrorCode::InvalidRequest, m))?;
    // A push that waits is stored with its content type as text.
    if later.is_some() && content_type.as_ref().is_some_and(|c| c.to_str().is_err()) {
        return Err(Answer::error(
            ErrorCode::InvalidRequest,
            "a push with ttl_s needs a Content-Type of visible ASCII",
        ));
    }
    Ok(PushHead {
        key,
        timeout,
        content_type,
        later,
    })
}

/// The headers of a request that carries a body to terminals (a push, a broadcast): its
/// `Idempotency-Key` (a fresh UUID when absent) and `Content-Type`, each sent at most
/// once, and no `Content-Encoding` but identity (`415`: the body is delivered as sent).
pub(super) fn body_headers(headers: &HeaderMap) -> Result<(String, Option<HeaderValue>), Answer> {
    const KEY: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);
    let key = match single(headers, &KEY)? {
        None => new_key(),
        Some(value) => match value.to_str() {
            Ok(key) if valid_key(key) => key.to_string(),
            _ => {
                return Err(Answer::error(
                    ErrorCode::InvalidRequest,
                    "Idempotency-Key must be 1-128 visible ASCII characters",
                ))
            }
        },
    };
    if let Some(encoding) = single(headers, &header::CONTENT_ENCODING)? {
        if !encoding.as_bytes().eq_ignore_ascii_case(b"identity") {
            return Err(Answer::error(
                ErrorCode::UnsupportedEncoding,
                "Content-Encoding must be absent or identity: the body is delivered as sent",
            ));
        }
    }
    Ok((key, single(headers, &header::CONTENT_TYPE)?.cloned()))
}

pub(super) fn overloaded(request: &PushRequest, full: Full) -> Answer {
    Answer::error_with(
        ErrorCode::Overloaded,
        ErrorBody {
            message: full.message().into(),
            idempotency_key: Some(request.key.clone()),
            ..ErrorBody::default()
        },
    )
}

const BAD_ID: &str = "terminal id must match [A-Za-z0-9._:-]{1,64}";

/// Every `result` of a failed push that [`count`] writes: an error code, or `other`.
/// The status page's timeline sums them.
pub static PUSH_FAILURES: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    ALL_ERROR_CODES
        .into_iter()
        .map(ErrorCode::as_str)
        .chain([OTHER_FAILURE])
        .collect()
});

/// The `result` of an error answer without a known code.
const OTHER_FAILURE: &str = "other";

/// The `result` of a `202`: a push with a TTL kept for its terminal.
const QUEUED: &str = "queued";

/// Counts a push API answer by path and result, with its latency.
pub(super) fn count(metrics: &Metrics, path: &'static str, answer: &Answer, received: Instant) {
    let result = result_of(answer);
    let series = &metrics.push_series;
    match series.ok(path).filter(|_| result == "ok") {
        Some(counter) => counter.inc(),
        None => metrics
            .push_requests
            .get_or_create(&[("path", path), ("result", result)])
            .inc(),
    };
    let seconds = received.elapsed().as_secs_f64();
    match series.duration(path) {
        Some(histogram) => histogram.observe(seconds),
        None => metrics
            .push_duration
            .get_or_create(&[("path", path)])
            .observe(seconds),
    }
}

/// The `result` of a push answer: `ok`, `queued`, or its error code.
fn result_of(answer: &Answer) -> &'static str {
    if answer.status == StatusCode::OK {
        "ok"
    } else if answer.status == StatusCode::ACCEPTED {
        // Kept for later: not delivered yet, and no failure either (its outcome is
        // counted by posgate_queue_finals_total).
        QUEUED
    } else {
        // The code comes from our own answers, so it is one of a fixed set.
        answer
            .error_code()
            .and_then(|code| ErrorCode::named(&code))
            .map_or(OTHER_FAILURE, ErrorCode::as_str)
    }
}

/// `GET /v1/terminals/{id}`.
pub(super) async fn terminal(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Path(terminal): Path<String>,
    Query(NoQuery {}): Query<NoQuery>,
) -> Response {
    if !valid_terminal_id(&terminal) {
        return error(ErrorCode::InvalidRequest, BAD_ID);
    }
    if let Err(answer) = caller.tenant_for(&terminal) {
        return respond(answer);
    }
    respond(state.push.terminal_view(&terminal, DEFAULT_TIMEOUT).await)
}

/// `413` for a body over `limit` bytes.
pub(super) fn too_large(limit: usize) -> Answer {
    Answer::error(
        ErrorCode::PayloadTooLarge,
        format!("request body exceeds {limit} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_and_deadlines() {
        let key = new_key();
        assert_eq!(key.len(), 36);
        assert_eq!(&key[14..15], "4", "a v4 UUID");
        let uri = |q: &str| format!("/v1/terminals/x/push{q}").parse::<Uri>().unwrap();
        let deadline_of = |u: &Uri| query_of(u).map(|(timeout, _)| timeout);
        assert_eq!(deadline_of(&uri("")), Ok(DEFAULT_TIMEOUT));
        assert_eq!(
            deadline_of(&uri("?timeout_ms=250")),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(
            deadline_of(&uri("?timeout_ms=30000")),
            Ok(Duration::from_millis(30_000))
        );
        for bad in [
            "?timeout_ms=0",
            "?timeout_ms=30001",
            "?timeout_ms=soon",
            "?timeout_ms=",
            "?a=1&timeout_ms=30000",
            "?timeout_ms=1&timeout_ms=2",
        ] {
            assert!(deadline_of(&uri(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_push_may_ask_to_wait_with_a_ttl_and_a_collapse_key() {
        let uri = |q: &str| format!("/v1/terminals/x/push{q}").parse::<Uri>().unwrap();
        let later = |q: &str| query_of(&uri(q)).map(|(_, later)| later);
        assert_eq!(later(""), Ok(None));
        assert_eq!(
            later("?ttl_s=3600&timeout_ms=100"),
            Ok(Some(Later {
                ttl: Duration::from_secs(3_600),
                collapse_key: None
            }))
        );
        assert_eq!(
            later("?ttl_s=1&collapse_key=price-list:eu"),
            Ok(Some(Later {
                ttl: Duration::from_secs(1),
                collapse_key: Some("price-list:eu".into())
            }))
        );
        for bad in [
            "?ttl_s=0",
            "?ttl_s=-1",
            "?ttl_s=1h",
            &format!("?ttl_s={}", MAX_TTL_S + 1),
            "?collapse_key=menu",
            "?ttl_s=60&collapse_key=",
            "?ttl_s=60&collapse_key=has%20space",
            "?ttl=60",
        ] {
            assert!(later(bad).is_err(), "{bad}");
        }
    }
}
