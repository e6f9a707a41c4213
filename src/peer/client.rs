//! [`PeerClient`]: the one transport of every pod-to-pod call (probes, forwarded
//! pushes, lookups), signing each request for the protocol its target speaks.
//!
//! Not for: what the calls mean (`crate::push::forward`, `crate::driver`), or checking
//! them on arrival (`crate::http`).

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::signing::{self, legacy, PEER_PROTOCOL};
use super::tls::PeerConnector;
use super::wire::{
    self, Draining, ForwardedBatch, ForwardedPush, PeerAnswer, ReleaseAnswer, ReleaseTerminals,
    ShardTerminals, DRAINING_ROUTE, KEPT_ANSWERS_ROUTE, MAX_BATCH_ANSWER_BYTES,
    MAX_HANDED_OVER_BYTES, PUSH_BATCH_ROUTE, RELEASE_TERMINALS_ROUTE, SHARD_TERMINALS_ROUTE,
    STORE_REACHABLE_ROUTE, TERMINAL_ROUTE,
};
use super::{PeerTarget, PeerTls, MAX_INTERNAL_BODY};
use crate::core::{PodId, ShardId};
use crate::credentials::Credentials;
use crate::trace_context::Trace;

/// Why a peer request produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("invalid peer url {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("peer request timed out after {0:?}")]
    Timeout(Duration),
    #[error("peer request failed: {0}")]
    Transport(String),
    #[error("peer answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("unreadable peer answer: {0}")]
    Decode(String),
}

/// Client for the peer endpoints of other pods.
///
/// Speaks HTTP/2 over pooled keep-alive connections, so asking a peer repeatedly costs
/// one connection: with prior knowledge (h2c) to `http://` URLs, over TLS (ALPN `h2`,
/// certificate verified) to `https://` URLs. Cloning is cheap and shares the pool.
#[derive(Clone, Debug)]
pub struct PeerClient {
    client: Client<PeerConnector, Full<Bytes>>,
    /// The pod requests are signed as coming from.
    me: PodId,
    credentials: Credentials,
    timeout: Duration,
}

impl PeerClient {
    /// A client for pod `me`, signing with the current secret of `credentials`
    /// (replaced on reload; none: insecure mode, unsigned requests) and verifying
    /// `https://` peers against the system roots. `timeout` bounds each probe as a whole
    /// (connecting, sending and reading the answer) and each connect.
    pub fn new(me: PodId, credentials: Credentials, timeout: Duration) -> Self {
        PeerClient::build(me, credentials, timeout, PeerTls::default())
    }

    /// The pod requests are signed as coming from.
    pub fn me(&self) -> &PodId {
        &self.me
    }

    /// The same client (pod, credentials, timeout) verifying `https://` peers with
    /// `tls`, on a pool of its own.
    pub fn using_tls(&self, tls: PeerTls) -> Self {
        PeerClient::build(self.me.clone(), self.credentials.clone(), self.timeout, tls)
    }

    fn build(me: PodId, credentials: Credentials, timeout: Duration, tls: PeerTls) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_timer(TokioTimer::new())
            // Peers are called every few seconds; keep the connection between calls, and
            // find out by PING when a peer vanished without closing it.
            .pool_idle_timeout(Duration::from_secs(90))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .http2_keep_alive_timeout(Duration::from_secs(5))
            .timer(TokioTimer::new())
            .build(PeerConnector::new(connector, tls));
        PeerClient {
            client,
            me,
            credentials,
            timeout,
        }
    }

    /// Asks `peer` whether it reaches the coordination store.
    pub async fn store_reachable(&self, peer: &PeerTarget) -> Result<PeerAnswer, PeerError> {
        let body = self
            .call(
                Method::POST,
                peer,
                STORE_REACHABLE_ROUTE,
                Bytes::new(),
                self.timeout,
                MAX_INTERNAL_BODY,
            )
            .await?;
        serde_json::from_slice(&body).map_err(|e| PeerError::Decode(e.to_string()))
    }

    /// Asks `peer` how many terminals it has connected per shard it serves.
    pub async fn shard_terminals(
        &self,
        peer: &PeerTarget,
        timeout: Duration,
    ) -> Result<ShardTerminals, PeerError> {
        let body = self
            .call(
                Method::GET,
                peer,
                SHARD_TERMINALS_ROUTE,
                Bytes::new(),
                timeout,
                MAX_INTERNAL_BODY,
            )
            .await?;
        serde_json::from_slice(&body).map_err(|e| PeerError::Decode(e.to_string()))
    }

    /// Asks `peer` for the final push answers it keeps for `shard`'s terminals: the body
    /// of its `200` (`wire::HandedOver`, decoded by the caller, which knows the shards).
    pub async fn kept_answers(
        &self,
        peer: &PeerTarget,
        shard: ShardId,
        timeout: Duration,
    ) -> Result<Bytes, PeerError> {
        let path = wire::path_of(KEPT_ANSWERS_ROUTE, &shard.to_string());
        self.call(
            Method::GET,
            peer,
            &path,
            Bytes::new(),
            timeout,
            MAX_HANDED_OVER_BYTES,
        )
        .await
    }

    /// Asks `peer`, the previous owner of `shard`, to close the draining sessions of
    /// `terminals` before this pod dials them.
    pub async fn release_terminals(
        &self,
        peer: &PeerTarget,
        shard: ShardId,
        terminals: Vec<String>,
        timeout: Duration,
    ) -> Result<ReleaseAnswer, PeerError> {
        let path = wire::path_of(RELEASE_TERMINALS_ROUTE, &shard.to_string());
        let body = ReleaseTerminals { terminals }.encode();
        let answer = self
            .call(Method::POST, peer, &path, body, timeout, MAX_INTERNAL_BODY)
            .await?;
        serde_json::from_slice(&answer).map_err(|e| PeerError::Decode(e.to_string()))
    }

    /// Tells `peer` that this pod drains `shard` (before releasing its lease).
    pub async fn announce_draining(
        &self,
        peer: &PeerTarget,
        shard: ShardId,
        timeout: Duration,
    ) -> Result<(), PeerError> {
        let path = wire::path_of(DRAINING_ROUTE, &shard.to_string());
        let body = Draining {
            from: self.me.clone(),
        }
        .encode();
        self.call(Method::POST, peer, &path, body, timeout, MAX_INTERNAL_BODY)
            .await
            .map(|_| ())
    }

    /// Asks `owner` for its view of `terminal`: the status and JSON body it answers.
    pub async fn terminal(
        &self,
        owner: &PeerTarget,
        terminal: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), SendError> {
        let path = wire::path_of(TERMINAL_ROUTE, terminal);
        self.send(
            Method::GET,
            owner,
            &path,
            Bytes::new(),
            (HeaderMap::new(), None),
            (timeout, MAX_INTERNAL_BODY),
        )
        .await
    }

    /// Sends `push` to `owner` on `route` (`wire::PUSH_ROUTE`, or `wire::RELAY_ROUTE`
    /// to a shard's previous owner): the status and body it answers within `timeout`.
    pub async fn push(
        &self,
        (owner, route): (&PeerTarget, &str),
        push: &ForwardedPush,
        trace: &Trace,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), SendError> {
        let (path, headers) = push.encode(route);
        self.send(
            Method::POST,
            owner,
            &path,
            push.body.clone(),
            (headers, Some(trace)),
            (timeout, MAX_INTERNAL_BODY),
        )
        .await
    }

    /// Sends `batch` to `owner` ([`PUSH_BATCH_ROUTE`]); returns its status and body.
    pub async fn push_batch(
        &self,
        owner: &PeerTarget,
        batch: &ForwardedBatch,
        trace: &Trace,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), SendError> {
        // Room for the signature's headers too (`ForwardedPush::encode` says why).
        let mut headers = HeaderMap::with_capacity(10);
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let limit = (timeout, MAX_BATCH_ANSWER_BYTES);
        self.send(
            Method::POST,
            owner,
            PUSH_BATCH_ROUTE,
            batch.encode(),
            (headers, Some(trace)),
            limit,
        )
        .await
    }

    /// Sends a signed request with `body` and returns the body (at most `limit` bytes)
    /// of a `200` answer.
    async fn call(
        &self,
        method: Method,
        peer: &PeerTarget,
        path: &str,
        body: Bytes,
        timeout: Duration,
        limit: usize,
    ) -> Result<Bytes, PeerError> {
        let sent = self
            .send(
                method,
                peer,
                path,
                body,
                (HeaderMap::new(), None),
                (timeout, limit),
            )
            .await;
        let (status, body) = sent.map_err(|e| match e {
            SendError::Url(reason) => PeerError::Url {
                url: peer.url.clone(),
                reason,
            },
            SendError::Connect(text) | SendError::Transport(text) => PeerError::Transport(text),
            SendError::Timeout(t) => PeerError::Timeout(t),
        })?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            return Err(PeerError::Status {
                status: status.as_u16(),
                body: text,
            });
        }
        Ok(body)
    }

    /// Sends `method path` with `body` and `headers` to `peer`, signed with the current
    /// cluster secret for the protocol `peer` speaks, and returns the status and (at
    /// most `limit` bytes of) the body of whatever it answers, within `timeout`.
    /// The one transport of every pod-to-pod call (probes, forwarded pushes, lookups).
    /// A call that forwards pushes carries their `trace` (`Trace::insert_peer`) and
    /// their API request's id (`signing::sign`).
    async fn send(
        &self,
        method: Method,
        peer: &PeerTarget,
        path: &str,
        body: Bytes,
        (mut headers, trace): (HeaderMap, Option<&Trace>),
        (timeout, limit): (Duration, usize),
    ) -> Result<(StatusCode, Bytes), SendError> {
        if let Some(trace) = trace {
            trace.insert_peer(&mut headers);
        }
        let base = peer.url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SendError::Url(
                "only http:// and https:// peer URLs are supported".into(),
            ));
        }
        let uri: http::Uri = format!("{base}{path}")
            .parse()
            .map_err(|_| SendError::Url("not a URL".into()))?;
        // Shares the URI's bytes: no copy unless the request is signed.
        let path_and_query = uri.path_and_query().cloned();
        let mut request = Request::new(Full::new(body.clone()));
        *request.method_mut() = method.clone();
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        if let Some(secret) = &self.credentials.signing_secret() {
            let path_and_query = path_and_query.as_ref().map_or(path, |pq| pq.as_str());
            let now = SystemTime::now();
            if peer.protocol >= PEER_PROTOCOL {
                let headers = request.headers_mut();
                signing::sign(
                    secret,
                    &method,
                    path_and_query,
                    headers,
                    &body,
                    now,
                    (&self.me, &peer.pod),
                    trace.map(|t| t.request_id),
                );
            } else {
                // A pod of the previous release, during a rolling upgrade.
                legacy::sign(secret, &method, path_and_query, now, &body)
                    .apply(request.headers_mut());
            }
        }
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                let text = error_chain(&e);
                if e.is_connect() {
                    SendError::Connect(text)
                } else {
                    SendError::Transport(text)
                }
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| SendError::Transport(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| SendError::Timeout(timeout))?
    }
}

/// Why [`PeerClient::send`] got no answer, by what it proves about the request.
#[derive(Debug)]
pub enum SendError {
    /// Not sent: the URL cannot be used.
    Url(String),
    /// Not sent: no connection to the peer.
    Connect(String),
    /// The request may have reached the peer; the exchange failed.
    Transport(String),
    /// The request may have reached the peer; no answer in time.
    Timeout(Duration),
}

/// `err` and its sources joined by `": "`: hyper's top-level errors alone ("client
/// error (Connect)") do not say what went wrong.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
