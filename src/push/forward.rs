//! Forwarding a push (or a terminal lookup) to the pod that owns the shard: the
//! internal wire format and the client side of it.
//!
//! `POST /internal/v1/push/{terminal}` carries the body and content type as received,
//! plus `posgate-tenant`, `idempotency-key`, `posgate-deadline-ms` (what is left of the
//! caller's deadline) and `posgate-hop: 1`, signed with the cluster secret like every
//! peer request. The owner answers with the public answer (relayed as is) or `421
//! shard_moved`. The owner never forwards further, so one attempt is one hop.
//!
//! What an outcome proves decides what the router may do: a refused connection
//! ([`Forwarded::NotSent`]) or `421` ([`Forwarded::Moved`]) means nothing reached a
//! terminal, so the router tries again; a request that left without an answer is
//! [`Forwarded::Unknown`] — the owner may have delivered it.
//!
//! Not for: deciding whom to forward to (`route`) or serving the endpoint (`crate::http`).

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::answer::{Answer, ErrorCode};
use super::PushRequest;
use crate::credentials::Credentials;
use crate::peer::sign;

/// Path prefix of the internal push endpoint; the terminal id follows.
pub const PUSH_PREFIX: &str = "/internal/v1/push/";
/// Path prefix of the internal terminal lookup; the terminal id follows.
pub const TERMINAL_PREFIX: &str = "/internal/v1/terminals/";
pub const HEADER_TENANT: &str = "posgate-tenant";
pub const HEADER_DEADLINE_MS: &str = "posgate-deadline-ms";
pub const HEADER_HOP: &str = "posgate-hop";
/// Largest answer read from a peer.
const MAX_ANSWER: usize = 64 * 1024;
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

/// Pooled keep-alive HTTP/2 (h2c) client to peers. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ForwardClient {
    client: Client<HttpConnector, Full<Bytes>>,
    credentials: Credentials,
}

impl ForwardClient {
    pub fn new(credentials: Credentials, connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .http2_keep_alive_timeout(Duration::from_secs(5))
            .timer(TokioTimer::new())
            .build(connector);
        ForwardClient {
            client,
            credentials,
        }
    }

    /// Forwards `push` to the pod at `base_url`, answering by `deadline` + grace.
    pub async fn push(&self, base_url: &str, push: &PushRequest, deadline: Instant) -> Forwarded {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let path = format!("{PUSH_PREFIX}{}", push.terminal);
        let mut request = match self.request(Method::POST, base_url, &path, push.body.clone()) {
            Ok(r) => r,
            Err(e) => return Forwarded::NotSent(e),
        };
        let headers = request.headers_mut();
        let text = |v: &str| HeaderValue::from_str(v).ok();
        // Tenant and key were validated as visible ASCII, so these always convert.
        if let (Some(tenant), Some(key)) = (text(&push.tenant.0), text(&push.key)) {
            headers.insert(HEADER_TENANT, tenant);
            headers.insert("idempotency-key", key);
        }
        headers.insert(
            HEADER_DEADLINE_MS,
            HeaderValue::from(remaining.as_millis() as u64),
        );
        headers.insert(HEADER_HOP, HeaderValue::from_static("1"));
        if let Some(ct) = &push.content_type {
            headers.insert(header::CONTENT_TYPE, ct.clone());
        }
        self.sign(&mut request, &path, &push.body);
        match self.exchange(request, remaining + ANSWER_GRACE).await {
            Ok((StatusCode::MISDIRECTED_REQUEST, _)) => Forwarded::Moved,
            Ok((StatusCode::UNAUTHORIZED, _)) => {
                tracing::warn!(
                    peer = base_url,
                    "peer refused a forwarded push: cluster secrets differ?"
                );
                // Refused before it was processed: not delivered, and not worth retrying.
                Forwarded::Answer(Answer::error(
                    ErrorCode::TerminalUnavailable,
                    "the owner pod refused the forwarded request",
                ))
            }
            Ok((status, body)) => Forwarded::Answer(Answer { status, body }),
            Err(e) => e,
        }
    }

    /// Asks the pod at `base_url` about `terminal`; returns its status and JSON body.
    pub async fn terminal(
        &self,
        base_url: &str,
        terminal: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        self.get(base_url, &format!("{TERMINAL_PREFIX}{terminal}"), timeout)
            .await
    }

    /// A signed `GET path` to the pod at `base_url`; its status and body.
    pub async fn get(
        &self,
        base_url: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        let mut request = self.request(Method::GET, base_url, path, Bytes::new())?;
        self.sign(&mut request, path, b"");
        self.exchange(request, timeout).await.map_err(|e| match e {
            Forwarded::NotSent(e) | Forwarded::Unknown(e) => e,
            other => format!("{other:?}"),
        })
    }

    fn request(
        &self,
        method: Method,
        base_url: &str,
        path: &str,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, String> {
        let base = base_url.trim_end_matches('/');
        if !base.starts_with("http://") {
            return Err(format!("peer url {base_url:?} is not http://"));
        }
        Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .body(Full::new(body))
            .map_err(|e| format!("peer url {base_url:?}: {e}"))
    }

    fn sign(&self, request: &mut Request<Full<Bytes>>, path: &str, body: &[u8]) {
        if let Some(secret) = &self.credentials.signing_secret() {
            let method = request.method().clone();
            sign(secret, &method, path, SystemTime::now(), body).apply(request.headers_mut());
        }
    }

    async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), Forwarded> {
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                let text = crate::peer::error_chain(&e);
                if e.is_connect() {
                    Forwarded::NotSent(text)
                } else {
                    Forwarded::Unknown(text)
                }
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| Forwarded::Unknown(format!("reading the peer's answer: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, exchange).await.map_err(|_| {
            Forwarded::Unknown(format!("no answer from the peer within {timeout:?}"))
        })?
    }
}
