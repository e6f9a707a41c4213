//! The terminal protocol (`docs/pos-protocol.md`) as posgate speaks it, in one place:
//! the header names, the `hello` and push requests, what a terminal's answer to either
//! means ([`verdict`], and for an accepted push [`receipt`]), and why a dial fails
//! ([`DialError`]).
//!
//! One rule decides both answers: 2xx accepts; `409` with [`STALE_EPOCH_HEADER`] is the
//! fence (a newer owner said hello, nothing was processed); anything else is the
//! terminal's own refusal. A `409` without the header is not a fencing answer, so no
//! shard is ever dropped for it. A 2xx to a push may carry [`DUPLICATE_HEADER`]: the
//! terminal had the key already. The marker only ever adds to a 2xx, so a terminal that
//! predates it, and a pod that predates it, read the same answer as before.
//!
//! Not for: dialing, sessions or retry policy (`dialer`, `session`, `link`), or what a
//! push's transport outcome proves (`push`).

use std::io;

use bytes::Bytes;
use http::uri::Scheme;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};

use crate::api::{IDEMPOTENCY_KEY, TENANT_HEADER};
use crate::core::{Epoch, PodId};
use crate::trace_context::{TraceContext, TRACEPARENT, TRACESTATE};

/// The fencing epoch of the session (hello) or the push.
pub const EPOCH_HEADER: &str = "posgate-epoch";
/// The pod speaking.
pub const POD_HEADER: &str = "posgate-pod";
/// The terminal the request is for (its directory id).
pub const TERMINAL_HEADER: &str = "posgate-terminal";
/// On a `409`: the highest epoch the terminal has seen.
pub const STALE_EPOCH_HEADER: &str = "posgate-stale-epoch";
/// On a 2xx to a push: `1` when the terminal had accepted the push's (tenant, key)
/// within its dedup window and did not take it again.
pub const DUPLICATE_HEADER: &str = "posgate-duplicate";
/// On a push that waited in the queue: when it was accepted and when it expires, Unix
/// milliseconds on the accepting pod's clock. Terminals that do not know them ignore
/// them.
pub const QUEUED_AT_HEADER: &str = "posgate-queued-at";
pub const EXPIRES_AT_HEADER: &str = "posgate-expires-at";
/// Where the hello goes.
pub const HELLO_PATH: &str = "/hello";
/// Where pushes go unless configured otherwise (`--pos-push-path`).
pub const DEFAULT_PUSH_PATH: &str = "/push";

/// What a terminal's answer to a hello or a push means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// The fence: a newer owner exists; nothing was processed.
    Stale {
        highest: Option<Epoch>,
    },
    /// The terminal's own refusal.
    Refused {
        status: StatusCode,
    },
}

/// The meaning of an answer with `status` and `headers`.
pub fn verdict(status: StatusCode, headers: &HeaderMap) -> Verdict {
    if status.is_success() {
        return Verdict::Accepted;
    }
    match headers.get(STALE_EPOCH_HEADER) {
        Some(value) if status == StatusCode::CONFLICT => Verdict::Stale {
            // An unparsable value still says "stale"; only the number is lost.
            highest: value.to_str().ok().and_then(|v| v.trim().parse().ok()),
        },
        _ => Verdict::Refused { status },
    }
}

/// What a 2xx answer to a push says about its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receipt {
    /// No duplicate marker: the terminal took the push now (or predates the marker and
    /// does not say).
    Taken,
    /// `posgate-duplicate: 1`: the terminal had taken this key before (from this or
    /// another pod) and did not take it again.
    Duplicate,
}

/// The receipt of a 2xx push answer with `headers`. Only the value `1` is the marker;
/// any other value is left for later versions of the protocol and read as no marker.
pub fn receipt(headers: &HeaderMap) -> Receipt {
    match headers.get(DUPLICATE_HEADER).map(HeaderValue::as_bytes) {
        Some(b"1") => Receipt::Duplicate,
        _ => Receipt::Taken,
    }
}

/// The hello that opens a session at `origin` (`https://<server_name>`).
pub fn hello(
    origin: &str,
    epoch: Epoch,
    pod: &PodId,
    terminal: &str,
) -> Result<Request<Bytes>, http::Error> {
    Request::builder()
        .method(Method::POST)
        .uri(format!("{origin}{HELLO_PATH}"))
        .header(EPOCH_HEADER, epoch)
        .header(POD_HEADER, pod.as_str())
        .header(TERMINAL_HEADER, terminal)
        .body(Bytes::new())
}

/// One push as it goes on the wire.
#[derive(Clone, Debug)]
pub struct PosPush<'a> {
    pub terminal: &'a str,
    /// The terminal's TLS name: the `:authority` of the request.
    pub server_name: &'a str,
    pub path: &'a str,
    pub tenant: &'a str,
    pub key: &'a str,
    pub epoch: Epoch,
    pub pod: &'a PodId,
    pub content_type: Option<&'a HeaderValue>,
    pub body: Bytes,
    /// A push that waited in the queue.
    pub queued: Option<Queued>,
    /// The trace the push is part of: sent as `traceparent` (and `tracestate`), which a
    /// terminal that does not trace ignores.
    pub trace: Option<&'a TraceContext>,
}

/// When a queued push was accepted and when it expires (Unix ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    pub accepted_ms: u64,
    pub expires_ms: u64,
}

/// The request of `push`. Built in place rather than through `Request::builder`, with
/// header names made at compile time: every push pays for this, and the builder parses
/// (and for non-standard names allocates) each name and the whole URI again.
pub fn push(push: &PosPush<'_>) -> Result<Request<Bytes>, http::Error> {
    const KEY: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);
    const TENANT: HeaderName = HeaderName::from_static(TENANT_HEADER);
    const EPOCH: HeaderName = HeaderName::from_static(EPOCH_HEADER);
    const TERMINAL: HeaderName = HeaderName::from_static(TERMINAL_HEADER);
    const POD: HeaderName = HeaderName::from_static(POD_HEADER);
    let uri = Uri::builder()
        .scheme(Scheme::HTTPS)
        .authority(push.server_name)
        .path_and_query(push.path)
        .build()?;
    let mut headers = HeaderMap::with_capacity(6);
    // Every push has a new key, so entering it into the connection's HPACK table only
    // evicts the entries that do repeat (tenant, epoch, terminal, pod) and makes h2's
    // encoder walk a growing chain of same-named entries comparing values on every
    // push (~8% of a pod's CPU in a `perf` profile of `push_bench`'s throughput step,
    // ~3% once never indexed; `docs/performance.md`, "Pushes"). Marked sensitive, it
    // goes out as a literal never indexed (RFC 7541 section 6.2.3), which every
    // HTTP/2 decoder reads like any other literal.
    let mut key = HeaderValue::from_str(push.key)?;
    key.set_sensitive(true);
    headers.insert(KEY, key);
    headers.insert(TENANT, HeaderValue::from_str(push.tenant)?);
    headers.insert(EPOCH, HeaderValue::from(push.epoch));
    headers.insert(TERMINAL, HeaderValue::from_str(push.terminal)?);
    headers.insert(POD, HeaderValue::from_str(push.pod.as_str())?);
    if let Some(content_type) = push.content_type {
        headers.insert(header::CONTENT_TYPE, content_type.clone());
    }
    if let Some(queued) = push.queued {
        // New on every push, like the key: literals never indexed.
        const QUEUED_AT: HeaderName = HeaderName::from_static(QUEUED_AT_HEADER);
        const EXPIRES_AT: HeaderName = HeaderName::from_static(EXPIRES_AT_HEADER);
        for (name, ms) in [
            (QUEUED_AT, queued.accepted_ms),
            (EXPIRES_AT, queued.expires_ms),
        ] {
            let mut value = HeaderValue::from(ms);
            value.set_sensitive(true);
            headers.insert(name, value);
        }
    }
    if let Some(trace) = push.trace {
        trace.insert(&mut headers, TRACEPARENT, TRACESTATE);
    }
    let mut request = Request::new(push.body.clone());
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
}

/// Which step of a dial timed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Connect,
    Tls,
    Http2,
    Hello,
}

/// Why a dial (or a later hello on a live session) failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The directory entry cannot be dialed as written.
    #[error("bad terminal entry: {0}")]
    BadTerminal(String),
    #[error("connection refused")]
    Refused,
    #[error("timed out ({0:?} step)")]
    Timeout(Stage),
    #[error("cannot connect: {0}")]
    Connect(#[source] io::Error),
    /// The terminal presented a certificate for another name: misrouted address, or
    /// something impersonating the terminal.
    #[error("certificate is not valid for server name {server_name:?}: {detail}")]
    WrongName { server_name: String, detail: String },
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] io::Error),
    #[error("terminal did not negotiate h2 (ALPN: {alpn:?})")]
    NoH2 { alpn: Option<String> },
    #[error("HTTP/2: {0}")]
    Http(#[source] h2::Error),
    /// `409`: a newer owner said hello to this terminal; the shard must be dropped.
    #[error("hello refused: epoch is stale (terminal has seen {highest:?})")]
    StaleEpoch { highest: Option<Epoch> },
    #[error("hello rejected with status {status}")]
    HelloRejected { status: StatusCode },
}

impl DialError {
    /// The `result` label of the dial metric (`ok` is the success label).
    pub fn label(&self) -> &'static str {
        match self {
            DialError::Refused => "refused",
            DialError::Timeout(_) => "timeout",
            DialError::WrongName { .. } | DialError::Tls(_) | DialError::NoH2 { .. } => "tls_error",
            DialError::StaleEpoch { .. } => "stale_epoch",
            DialError::HelloRejected { .. } => "rejected",
            DialError::BadTerminal(_) | DialError::Connect(_) | DialError::Http(_) => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stale(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(STALE_EPOCH_HEADER, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn answers_are_classified() {
        let none = HeaderMap::new();
        assert_eq!(verdict(StatusCode::OK, &none), Verdict::Accepted);
        assert_eq!(
            verdict(StatusCode::NO_CONTENT, &stale("1")),
            Verdict::Accepted
        );
        assert_eq!(
            verdict(StatusCode::CONFLICT, &stale("1700000000123")),
            Verdict::Stale {
                highest: Some(1_700_000_000_123)
            }
        );
        assert_eq!(
            verdict(StatusCode::CONFLICT, &stale("soon")),
            Verdict::Stale { highest: None }
        );
        // A 409 without the header is not a fencing answer: no shard is dropped for it.
        assert_eq!(
            verdict(StatusCode::CONFLICT, &none),
            Verdict::Refused {
                status: StatusCode::CONFLICT
            }
        );
        assert_eq!(
            verdict(StatusCode::SERVICE_UNAVAILABLE, &stale("1")),
            Verdict::Refused {
                status: StatusCode::SERVICE_UNAVAILABLE
            }
        );
    }

    #[test]
    fn the_duplicate_marker_is_read_only_as_written() {
        let marked = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(DUPLICATE_HEADER, HeaderValue::from_static(value));
            receipt(&headers)
        };
        assert_eq!(marked("1"), Receipt::Duplicate);
        // A terminal without the marker (every terminal before it) took the push.
        assert_eq!(receipt(&HeaderMap::new()), Receipt::Taken);
        assert_eq!(marked("0"), Receipt::Taken);
        assert_eq!(marked("yes"), Receipt::Taken);
    }

    #[test]
    fn the_push_carries_the_wire_contract_headers() {
        let pod = PodId::new("pod-a").unwrap();
        let ct = HeaderValue::from_static("application/json");
        let p = PosPush {
            terminal: "pos-1",
            server_name: "pos-1.test",
            path: "/push",
            tenant: "acme",
            key: "k-1",
            epoch: 42,
            pod: &pod,
            content_type: Some(&ct),
            body: Bytes::from_static(b"{}"),
            queued: None,
            trace: None,
        };
        let request = push(&p).unwrap();
        assert_eq!(request.uri(), "https://pos-1.test/push");
        let h = request.headers();
        assert_eq!(h[IDEMPOTENCY_KEY], "k-1");
        assert_eq!(h[TENANT_HEADER], "acme");
        assert_eq!(h[EPOCH_HEADER], "42");
        assert_eq!(h[TERMINAL_HEADER], "pos-1");
        assert_eq!(h[POD_HEADER], "pod-a");
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        // The key, new on every push, stays out of the HPACK table; the rest repeat.
        assert!(h[IDEMPOTENCY_KEY].is_sensitive());
        assert!(!h[TENANT_HEADER].is_sensitive() && !h[TERMINAL_HEADER].is_sensitive());
        assert!(!h.contains_key(QUEUED_AT_HEADER) && !h.contains_key(EXPIRES_AT_HEADER));
        // A push from the queue says when it was accepted and when it expires.
        let queued = Queued {
            accepted_ms: 1_000,
            expires_ms: 61_000,
        };
        let request = push(&PosPush {
            queued: Some(queued),
            trace: None,
            ..p.clone()
        })
        .unwrap();
        let h = request.headers();
        assert_eq!(h[QUEUED_AT_HEADER], "1000");
        assert_eq!(h[EXPIRES_AT_HEADER], "61000");
        assert!(h[QUEUED_AT_HEADER].is_sensitive() && h[EXPIRES_AT_HEADER].is_sensitive());
        // Without a trace no trace headers; with one, its traceparent, never indexed (new
        // on every push), and its tracestate.
        assert!(!h.contains_key(TRACEPARENT));
        let mut trace = TraceContext::start();
        trace.state = Some(HeaderValue::from_static("congo=t61rcWkgMzE"));
        let request = push(&PosPush {
            trace: Some(&trace),
            ..p.clone()
        })
        .unwrap();
        let h = request.headers();
        assert_eq!(h[TRACEPARENT].as_bytes(), &trace.traceparent()[..]);
        assert!(h[TRACEPARENT].is_sensitive());
        assert_eq!(h[TRACESTATE], "congo=t61rcWkgMzE");
        let hello = hello("https://pos-1.test", 7, &pod, "pos-1").unwrap();
        assert_eq!(hello.uri(), "https://pos-1.test/hello");
        assert_eq!(hello.headers()[EPOCH_HEADER], "7");
    }
}
