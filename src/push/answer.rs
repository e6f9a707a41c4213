//! The answers of the push API: the `200` body ([`Delivered`]), the error codes
//! ([`ErrorCode`]) and [`Answer`], an HTTP status with its JSON body, which is what the
//! owner returns, a forwarder relays and the idempotency cache stores.
//!
//! Error bodies name the terminal only when the caller named it; they never carry
//! another tenant's data or a secret.

use bytes::Bytes;
use http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::core::{Epoch, PodId, ShardId};

/// How long a caller should wait before retrying a `503`, in seconds.
pub const RETRY_AFTER_SECS: u32 = 1;

/// Every error code, the internal `shard_moved` last.
pub const ALL_ERROR_CODES: [ErrorCode; 25] = [
    ErrorCode::InvalidRequest,
    ErrorCode::Unauthorized,
    ErrorCode::Forbidden,
    ErrorCode::UnknownTerminal,
    ErrorCode::IdempotencyConflict,
    ErrorCode::PayloadTooLarge,
    ErrorCode::UnsupportedEncoding,
    ErrorCode::RequestTimeout,
    ErrorCode::PosRejected,
    ErrorCode::TerminalUnavailable,
    ErrorCode::Overloaded,
    ErrorCode::PosTimeout,
    ErrorCode::NotFound,
    ErrorCode::MethodNotAllowed,
    ErrorCode::UriTooLong,
    ErrorCode::HeadersTooLarge,
    ErrorCode::Internal,
    ErrorCode::QueueFull,
    ErrorCode::QueueUnavailable,
    ErrorCode::UnknownPush,
    ErrorCode::PushInFlight,
    ErrorCode::PushEnded,
    ErrorCode::ShardMoved,
    ErrorCode::DirectoryUnavailable,
    ErrorCode::UnknownBroadcast,
];

/// The body of a `200`: the terminal answered 2xx, taking the push now or (`duplicate`)
/// from an earlier copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    pub terminal: String,
    pub idempotency_key: String,
    /// The pod that delivered (the shard's owner).
    pub pod: PodId,
    pub shard: ShardId,
    pub epoch: Epoch,
    pub pos_status: u16,
    /// From receiving the request to the terminal's answer, as the answering pod saw it.
    pub latency_ms: u64,
    /// The terminal answered with the duplicate marker: it had this key already (an
    /// earlier copy, delivered by this or another pod) and did not take it again.
    /// `false` also when the terminal predates the marker. Absent from answers of pods
    /// of the previous release, hence the default.
    #[serde(default)]
    pub duplicate: bool,
}

/// The `error` field of an error answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidRequest,
    Unauthorized,
    /// The token may not do this: a terminal outside its patterns, a push with an
    /// operator token, the cluster view with a tenant's.
    Forbidden,
    UnknownTerminal,
    IdempotencyConflict,
    PayloadTooLarge,
    /// A `Content-Encoding` other than `identity`: the body is forwarded as it is, and
    /// a terminal would take compressed bytes for the push.
    UnsupportedEncoding,
    /// The request body did not arrive whole within `--body-read-timeout`.
    RequestTimeout,
    PosRejected,
    TerminalUnavailable,
    Overloaded,
    PosTimeout,
    /// No such route.
    NotFound,
    MethodNotAllowed,
    /// The request target is longer than the pod accepts.
    UriTooLong,
    /// The request head (request line and headers) is larger than the pod accepts.
    HeadersTooLarge,
    /// A bug in posgate: the answer a handler could not produce.
    Internal,
    /// A push with a TTL over one of the queue's bounds (`bound` says which).
    QueueFull,
    /// A push with a TTL cannot be stored now: the store does not answer, or a pod of
    /// the cluster does not keep pushes for later yet (a rolling upgrade).
    QueueUnavailable,
    /// No push with this key is known (never accepted with a TTL, or final and past
    /// its retention).
    UnknownPush,
    /// A cancel of a push that may be on its way to the terminal.
    PushInFlight,
    /// The push with this key ended without delivery (`state`: expired, replaced,
    /// cancelled).
    PushEnded,
    /// Internal only (`421`): the pod asked does not serve the shard; never reaches a
    /// caller of the public API.
    ShardMoved,
    /// A directory change could not be written now (the store does not answer).
    DirectoryUnavailable,
    /// No broadcast of this tenant with this id (never created, or past its retention).
    UnknownBroadcast,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::UnknownTerminal => "unknown_terminal",
            ErrorCode::IdempotencyConflict => "idempotency_conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedEncoding => "unsupported_encoding",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::PosRejected => "pos_rejected",
            ErrorCode::TerminalUnavailable => "terminal_unavailable",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::PosTimeout => "pos_timeout",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::Internal => "internal_error",
            ErrorCode::QueueFull => "queue_full",
            ErrorCode::QueueUnavailable => "queue_unavailable",
            ErrorCode::UnknownPush => "unknown_push",
            ErrorCode::PushInFlight => "push_in_flight",
            ErrorCode::PushEnded => "push_ended",
            ErrorCode::ShardMoved => "shard_moved",
            ErrorCode::DirectoryUnavailable => "directory_unavailable",
            ErrorCode::UnknownBroadcast => "unknown_broadcast",
        }
    }

    /// The code named `code`, if it is one.
    pub fn named(code: &str) -> Option<ErrorCode> {
        ALL_ERROR_CODES.into_iter().find(|c| c.as_str() == code)
    }

    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::UnknownTerminal => StatusCode::NOT_FOUND,
            ErrorCode::IdempotencyConflict => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UnsupportedEncoding => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::PosRejected => StatusCode::BAD_GATEWAY,
            ErrorCode::TerminalUnavailable
            | ErrorCode::Overloaded
            | ErrorCode::QueueUnavailable
            | ErrorCode::DirectoryUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::UnknownPush | ErrorCode::UnknownBroadcast => StatusCode::NOT_FOUND,
            ErrorCode::PushInFlight => StatusCode::CONFLICT,
            ErrorCode::PushEnded => StatusCode::GONE,
            ErrorCode::PosTimeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::UriTooLong => StatusCode::URI_TOO_LONG,
            ErrorCode::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::ShardMoved => StatusCode::MISDIRECTED_REQUEST,
        }
    }

    /// The code for an error `status` produced below the handlers (an extractor's
    /// rejection, the HTTP layer), which carries no code of its own. `404` on a known
    /// route is the handlers' `unknown_terminal`, so this is only asked for answers
    /// without a JSON body.
    pub fn for_status(status: StatusCode) -> ErrorCode {
        match status {
            StatusCode::NOT_FOUND => ErrorCode::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
            StatusCode::URI_TOO_LONG => ErrorCode::UriTooLong,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => ErrorCode::HeadersTooLarge,
            s if s.is_client_error() => ErrorCode::InvalidRequest,
            _ => ErrorCode::Internal,
        }
    }
}

/// The JSON body of every error answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
    /// The push's key, so a caller can retry with it (also when the pod generated it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The terminal's status (`pos_rejected`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pos_status: Option<u16>,
    /// `"unknown"` when the terminal may have received the push (`pos_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// The bound a push was over (`queue_full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<String>,
    /// Where the push stands (`push_ended`, `push_in_flight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// An HTTP answer: status, JSON body, and whether to send `Retry-After`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    /// An answer with `status` and the JSON of `value`.
    pub fn json(status: StatusCode, value: &impl Serialize) -> Answer {
        Answer {
            status,
            body: json(value),
        }
    }

    pub fn delivered(delivered: &Delivered) -> Answer {
        Answer {
            status: StatusCode::OK,
            body: json(delivered),
        }
    }

    pub fn error(code: ErrorCode, message: impl Into<String>) -> Answer {
        Answer::error_with(
            code,
            ErrorBody {
                message: message.into(),
                ..ErrorBody::default()
            },
        )
    }

    /// An error answer with the extra fields of `body` (its `error` is set from `code`).
    pub fn error_with(code: ErrorCode, mut body: ErrorBody) -> Answer {
        body.error = code.as_str().to_string();
        Answer {
            status: code.status(),
            body: json(&body),
        }
    }

    /// `503` and `429` answers tell the caller when to retry.
    pub fn retry_after(&self) -> Option<u32> {
        let busy = [
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
        ];
        busy.contains(&self.status).then_some(RETRY_AFTER_SECS)
    }

    /// The `error` code of an error answer, if the body is one.
    pub fn error_code(&self) -> Option<String> {
        serde_json::from_slice::<ErrorBody>(&self.body)
            .ok()
            .map(|b| b.error)
    }
}

/// Where a push with a TTL stands: the body of a `202`, and of
/// `GET /v1/terminals/{id}/pushes/{key}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushStatus {
    pub terminal: String,
    pub idempotency_key: String,
    /// queued, sending, delivered, rejected, expired, replaced, cancelled, unknown, or
    /// lost (the store lost its data since the push was accepted).
    pub state: String,
    /// When it was accepted and when it expires, Unix ms (the accepting pod's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// The store generation it was looked up in; a different one than the `202` named
    /// means the store lost its data in between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collapse_key: Option<String>,
    /// Copies sent to the terminal so far.
    #[serde(default)]
    pub copies: u32,
    /// Its place in the terminal's queue when accepted (1: next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    /// `sending`: when the first copy whose answer is missing left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_ms: Option<u64>,
    /// A final state: when it was reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_ms: Option<u64>,
    /// The pod that sent the copy (sending, delivered, rejected) and its epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    /// The terminal's status (delivered, rejected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pos_status: Option<u16>,
    /// delivered: the terminal had the key already and did not act again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
    /// replaced: the key of the push that took its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<String>,
}

impl PushStatus {
    /// A status that names only the push and its state (`cancelled`, `lost`).
    pub fn bare(terminal: &str, key: &str, state: &str) -> PushStatus {
        PushStatus {
            terminal: terminal.to_string(),
            idempotency_key: key.to_string(),
            state: state.to_string(),
            accepted_ms: None,
            expires_ms: None,
            generation: None,
            collapse_key: None,
            copies: 0,
            position: None,
            sent_ms: None,
            final_ms: None,
            pod: None,
            epoch: None,
            pos_status: None,
            duplicate: None,
            replaced_by: None,
        }
    }
}

fn json<T: Serialize>(value: &T) -> Bytes {
    // Plain structs of strings and numbers always serialise.
    Bytes::from(serde_json::to_vec(value).expect("answer serialises"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers_carry_code_status_and_retry_after() {
        let a = Answer::error(ErrorCode::Overloaded, "too many");
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(a.retry_after(), Some(RETRY_AFTER_SECS));
        assert_eq!(a.error_code().as_deref(), Some("overloaded"));
        let body: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": "overloaded", "message": "too many"})
        );

        let t = Answer::error_with(
            ErrorCode::PosTimeout,
            ErrorBody {
                message: "no answer".into(),
                delivery: Some("unknown".into()),
                idempotency_key: Some("k".into()),
                ..ErrorBody::default()
            },
        );
        assert_eq!(t.status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(t.retry_after(), None);
        let body: serde_json::Value = serde_json::from_slice(&t.body).unwrap();
        assert_eq!(body["delivery"], "unknown");
        assert_eq!(body["idempotency_key"], "k");
        assert_eq!(ErrorCode::ShardMoved.status().as_u16(), 421);
    }

    #[test]
    fn a_delivery_says_whether_the_terminal_had_the_key_and_old_answers_still_decode() {
        let delivered = Delivered {
            terminal: "pos-1".into(),
            idempotency_key: "k".into(),
            pod: PodId::new("pod-a").unwrap(),
            shard: 3,
            epoch: 9,
            pos_status: 200,
            latency_ms: 4,
            duplicate: true,
        };
        let body: serde_json::Value =
            serde_json::from_slice(&Answer::delivered(&delivered).body).unwrap();
        assert_eq!(body["duplicate"], true);
        // The owner's answer as a pod of the previous release relays it (no field): a
        // forwarder reads it as a delivery that says nothing about a duplicate.
        let old = br#"{"terminal":"pos-1","idempotency_key":"k","pod":"pod-a","shard":3,"epoch":9,"pos_status":200,"latency_ms":4}"#;
        let decoded: Delivered = serde_json::from_slice(old).unwrap();
        assert_eq!(
            decoded,
            Delivered {
                duplicate: false,
                ..delivered
            }
        );
    }
}
