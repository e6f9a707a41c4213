//! One push over a terminal's live session: the request the wire contract prescribes
//! (`docs/pos-protocol.md`) and what its outcome proves about delivery.
//!
//! The classification is the heart of "at most once per attempt": only an outcome that
//! proves the terminal never processed the push ([`PushFailure::NotSent`],
//! [`PushFailure::StaleEpoch`]) may be retried by the gateway; once the request may have
//! reached the terminal without an answer, the outcome is [`PushFailure::Unknown`].
//!
//! Not for: choosing the session, waiting for one, or retrying (the push service).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::Full;

use super::session::{classify_hello, RequestSender, HEADER_EPOCH, HEADER_POD, HEADER_TERMINAL};
use crate::core::{Epoch, PodId};
use crate::pos::dialer::DialError;

/// Request header carrying the push's idempotency key.
pub const HEADER_IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Request header naming the tenant that sent the push: keys are unique per tenant, so
/// a terminal dedupes on (tenant, key).
pub const HEADER_TENANT: &str = "posgate-tenant";
/// Path pushes are posted to unless configured otherwise (`--pos-push-path`).
pub const DEFAULT_PUSH_PATH: &str = "/push";

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
}

/// Why a push did not get a terminal's answer, by what it proves.
#[derive(Debug, thiserror::Error)]
pub enum PushFailure {
    /// The request never left: the connection was closed or not ready. Safe to retry.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The terminal refused our epoch (`409` with `posgate-stale-epoch`): it did not
    /// process the push, and a newer owner exists.
    #[error("terminal refused the epoch as stale (it has seen {highest:?})")]
    StaleEpoch { highest: Option<Epoch> },
    /// The request may have reached the terminal and no answer came.
    #[error("no answer: {0}")]
    Unknown(String),
}

/// Sends `push` on `sender` and waits up to `timeout` for the status. `Ok` is the
/// terminal's own answer (2xx or not); the body of the answer is not read.
pub async fn send(
    sender: &mut RequestSender,
    push: PosPush<'_>,
    timeout: Duration,
) -> Result<StatusCode, PushFailure> {
    let request = build(&push).map_err(|e| PushFailure::NotSent(e.to_string()))?;
    let exchange = async {
        // `ready` fails only when the connection is closed: nothing was sent.
        sender
            .ready()
            .await
            .map_err(|e| PushFailure::NotSent(e.to_string()))?;
        sender.try_send_request(request).await.map_err(|mut e| {
            if e.take_message().is_some() {
                PushFailure::NotSent(e.error().to_string())
            } else {
                PushFailure::Unknown(e.into_error().to_string())
            }
        })
    };
    let response = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| PushFailure::Unknown(format!("no answer within {timeout:?}")))??;
    let status = response.status();
    // The same rule as for the hello: only a 409 with the header is a fencing answer.
    match classify_hello(
        status,
        response.headers().get(super::session::HEADER_STALE_EPOCH),
    ) {
        Err(DialError::StaleEpoch { highest }) => Err(PushFailure::StaleEpoch { highest }),
        _ => Ok(status),
    }
}

fn build(push: &PosPush<'_>) -> Result<Request<Full<Bytes>>, http::Error> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("https://{}{}", push.server_name, push.path))
        .header(HEADER_IDEMPOTENCY_KEY, push.key)
        .header(HEADER_TENANT, push.tenant)
        .header(HEADER_EPOCH, push.epoch)
        .header(HEADER_TERMINAL, push.terminal)
        .header(HEADER_POD, push.pod.as_str());
    if let Some(content_type) = push.content_type {
        request = request.header(header::CONTENT_TYPE, content_type);
    }
    request.body(Full::new(push.body.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_carries_the_wire_contract_headers() {
        let pod = PodId::new("pod-a").unwrap();
        let ct = HeaderValue::from_static("application/json");
        let push = PosPush {
            terminal: "pos-1",
            server_name: "pos-1.test",
            path: "/push",
            tenant: "acme",
            key: "k-1",
            epoch: 42,
            pod: &pod,
            content_type: Some(&ct),
            body: Bytes::from_static(b"{}"),
        };
        let request = build(&push).unwrap();
        assert_eq!(request.uri(), "https://pos-1.test/push");
        let h = request.headers();
        assert_eq!(h[HEADER_IDEMPOTENCY_KEY], "k-1");
        assert_eq!(h[HEADER_TENANT], "acme");
        assert_eq!(h[HEADER_EPOCH], "42");
        assert_eq!(h[HEADER_TERMINAL], "pos-1");
        assert_eq!(h[HEADER_POD], "pod-a");
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
    }
}
