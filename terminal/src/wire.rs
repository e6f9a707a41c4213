//! The wire of `docs/pos-protocol.md` as a terminal sees it: the header names (§2), the
//! checks of a hello's and a push's headers (§4 and §5, step 1) and the answers.
//!
//! Not for: the fence, session and key decisions ([`crate::Terminal`]), or serving
//! connections ([`crate::Server`]).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::Full;

pub const EPOCH: &str = "posgate-epoch";
pub const POD: &str = "posgate-pod";
pub const TERMINAL: &str = "posgate-terminal";
pub const TENANT: &str = "posgate-tenant";
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const QUEUED_AT: &str = "posgate-queued-at";
pub const EXPIRES_AT: &str = "posgate-expires-at";
pub const TRACEPARENT: &str = "traceparent";
/// On a `409`: the highest epoch the terminal has seen.
pub const STALE_EPOCH: &str = "posgate-stale-epoch";
/// On a `2xx` to a push: `1`, taken before within the dedup window.
pub const DUPLICATE: &str = "posgate-duplicate";

/// Why a request's headers are malformed (`400`), as the answer's body says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// A hello's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub epoch: u64,
    pub pod: String,
}

/// A push's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushHead {
    pub epoch: u64,
    pub pod: String,
    /// `None` only from pods that predate the header: keys are then deduplicated alone.
    pub tenant: Option<String>,
    pub key: String,
    /// The sender's, when it gave one; absent is as good as any (§2).
    pub content_type: Option<HeaderValue>,
    /// A push that waited in posgate's queue: accepted at, expires at (Unix ms).
    pub queued_at_unix_ms: Option<u64>,
    pub expires_at_unix_ms: Option<u64>,
    /// The pod's W3C trace context, as sent (never checked: a malformed one is ignored).
    pub traceparent: Option<HeaderValue>,
}

impl PushHead {
    /// What deduplication is keyed on: (tenant, key), as `tenant:key` (a tenant holds no
    /// `:`), or the key alone without a tenant.
    pub fn dedup_key(&self) -> String {
        match &self.tenant {
            Some(tenant) => format!("{tenant}:{}", self.key),
            None => self.key.clone(),
        }
    }
}

/// §4 step 1: the headers of a hello to `terminal`.
pub fn hello(headers: &HeaderMap, terminal: &str) -> Result<Hello, Malformed> {
    let (epoch, pod) = common(headers, terminal)?;
    Ok(Hello { epoch, pod })
}

/// §5 step 1: the headers of a push to `terminal`. Unknown headers are ignored (§2).
pub fn push(headers: &HeaderMap, terminal: &str) -> Result<PushHead, Malformed> {
    let (epoch, pod) = common(headers, terminal)?;
    let key = single(headers, IDEMPOTENCY_KEY)
        .filter(|k| k.len() <= 128 && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or(Malformed("missing or malformed idempotency-key\n"))?;
    let tenant = optional(headers, TENANT, |t| (!t.contains(':')).then_some(t))
        .ok_or(Malformed("malformed posgate-tenant\n"))?;
    let at = |name| {
        optional(headers, name, decimal).ok_or(Malformed(
            "malformed posgate-queued-at or posgate-expires-at\n",
        ))
    };
    Ok(PushHead {
        epoch,
        pod,
        tenant: tenant.map(str::to_owned),
        key: key.to_owned(),
        content_type: headers.get(http::header::CONTENT_TYPE).cloned(),
        queued_at_unix_ms: at(QUEUED_AT)?,
        expires_at_unix_ms: at(EXPIRES_AT)?,
        traceparent: headers.get(TRACEPARENT).cloned(),
    })
}

/// The epoch and pod of a hello or push, and the check that it names this terminal.
fn common(headers: &HeaderMap, terminal: &str) -> Result<(u64, String), Malformed> {
    let epoch = single(headers, EPOCH)
        .and_then(decimal)
        .ok_or(Malformed("missing or malformed posgate-epoch\n"))?;
    let pod = single(headers, POD).ok_or(Malformed("missing posgate-pod\n"))?;
    if single(headers, TERMINAL) != Some(terminal) {
        return Err(Malformed("posgate-terminal does not name this terminal\n"));
    }
    Ok((epoch, pod.to_owned()))
}

/// The single, non-empty, visible-ASCII value of a header; a repeated header is as
/// malformed as a missing one (which copy would be meant?).
pub fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok().filter(|v| !v.is_empty()),
        _ => None,
    }
}

/// An optional header: `Some(None)` when absent, `Some(Some(v))` when [`single`] and
/// `parse` take it, `None` when it is malformed.
fn optional<'a, T>(
    headers: &'a HeaderMap,
    name: &str,
    parse: impl FnOnce(&'a str) -> Option<T>,
) -> Option<Option<T>> {
    if !headers.contains_key(name) {
        return Some(None);
    }
    single(headers, name).and_then(parse).map(Some)
}

/// A decimal `u64` as §2 writes it: digits only, no sign, no leading zeros.
fn decimal(v: &str) -> Option<u64> {
    let digits = v.bytes().all(|b| b.is_ascii_digit());
    (digits && (v == "0" || !v.starts_with('0')))
        .then(|| v.parse().ok())
        .flatten()
}

/// The terminal's answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `200` to a hello.
    Hello,
    /// `200` to a push: taken now.
    Taken,
    /// `200` with `posgate-duplicate: 1`.
    Duplicate,
    /// `409` with `posgate-stale-epoch`.
    Stale { highest: u64 },
    /// `421` to a hello on a superseded connection.
    Superseded,
    /// `428` to a push without a current session of its epoch.
    NoSession,
    /// `400`.
    Malformed(Malformed),
    /// `413`.
    TooLarge,
    /// `503`: another copy of the key is being acted on.
    InFlight,
    /// A refusal of the terminal's own (non-2xx, neither `409` nor `428`): reported to
    /// the sender as `pos_rejected` with this status.
    Refused { status: StatusCode, reason: String },
    /// `404`: neither the hello path nor the push path.
    NotFound,
}

impl Answer {
    pub fn status(&self) -> StatusCode {
        match self {
            Answer::Hello | Answer::Taken | Answer::Duplicate => StatusCode::OK,
            Answer::Stale { .. } => StatusCode::CONFLICT,
            Answer::Superseded => StatusCode::MISDIRECTED_REQUEST,
            Answer::NoSession => StatusCode::PRECONDITION_REQUIRED,
            Answer::Malformed(_) => StatusCode::BAD_REQUEST,
            Answer::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Answer::InFlight => StatusCode::SERVICE_UNAVAILABLE,
            Answer::Refused { status, .. } => *status,
            Answer::NotFound => StatusCode::NOT_FOUND,
        }
    }

    /// The HTTP response: the status, the protocol's headers, a short text body.
    pub fn response(self) -> Response<Full<Bytes>> {
        let status = self.status();
        let body: Bytes = match &self {
            Answer::Hello => "hello\n".into(),
            Answer::Taken => "accepted\n".into(),
            Answer::Duplicate => "duplicate: accepted before\n".into(),
            Answer::Stale { .. } => "stale epoch\n".into(),
            Answer::Superseded => {
                "this connection's session was superseded; open a new connection\n".into()
            }
            Answer::NoSession => "no accepted hello with this epoch on this connection\n".into(),
            Answer::Malformed(Malformed(why)) => Bytes::from_static(why.as_bytes()),
            Answer::TooLarge => "body too large or broken\n".into(),
            Answer::InFlight => "another copy of this key is being taken; retry\n".into(),
            Answer::Refused { reason, .. } => format!("{reason}\n").into(),
            Answer::NotFound => "not found\n".into(),
        };
        let mut resp = Response::new(Full::new(body));
        *resp.status_mut() = status;
        match self {
            Answer::Stale { highest } => {
                resp.headers_mut()
                    .insert(STALE_EPOCH, HeaderValue::from(highest));
            }
            Answer::Duplicate => {
                resp.headers_mut()
                    .insert(DUPLICATE, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, value.parse().unwrap());
        }
        h
    }

    const OK: [(&str, &str); 5] = [
        (EPOCH, "7"),
        (POD, "pod-a"),
        (TERMINAL, "pos-1"),
        (TENANT, "acme"),
        (IDEMPOTENCY_KEY, "k-1"),
    ];

    #[test]
    fn a_push_head_is_read_and_deduplicated_by_tenant_and_key() {
        let head = push(&headers(&OK), "pos-1").unwrap();
        assert_eq!((head.epoch, head.dedup_key()), (7, "acme:k-1".to_string()));
        assert_eq!(head.content_type, None);
        assert_eq!(hello(&headers(&OK[..3]), "pos-1").unwrap().pod, "pod-a");
    }

    #[test]
    fn malformed_heads_are_refused() {
        for (name, bad) in [
            (EPOCH, "07"),
            (EPOCH, "+7"),
            (EPOCH, "x"),
            (TERMINAL, "pos-2"),
            (IDEMPOTENCY_KEY, "a b"),
        ] {
            let mut h = headers(&OK);
            h.insert(name, bad.parse().unwrap());
            assert!(push(&h, "pos-1").is_err(), "{name}: {bad}");
        }
        let mut h = headers(&OK);
        h.append(EPOCH, "7".parse().unwrap());
        assert!(push(&h, "pos-1").is_err(), "a repeated epoch");
        // Unknown headers, and a malformed traceparent, are ignored.
        let mut h = headers(&OK);
        h.insert("posgate-from-the-future", "x".parse().unwrap());
        h.insert(TRACEPARENT, "not a traceparent".parse().unwrap());
        assert!(push(&h, "pos-1").is_ok());
    }

    #[test]
    fn answers_carry_the_protocol_headers() {
        let r = Answer::Stale { highest: 42 }.response();
        assert_eq!(
            (r.status(), &r.headers()[STALE_EPOCH]),
            (StatusCode::CONFLICT, &HeaderValue::from(42u64))
        );
        assert_eq!(Answer::Duplicate.response().headers()[DUPLICATE], "1");
    }
}
