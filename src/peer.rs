//! Pod-to-pod authentication (HMAC request signing) and the client a pod uses to ask its
//! peers questions.
//!
//! # Signing
//! A signed request carries two headers: [`TIMESTAMP_HEADER`] (Unix seconds) and
//! [`SIGNATURE_HEADER`], the lowercase hex of
//! `HMAC-SHA256(secret, METHOD "\n" PATH_AND_QUERY "\n" TIMESTAMP "\n" hex(sha256(body)))`.
//! A signature is accepted for [`MAX_CLOCK_SKEW`] either side of the receiver's clock, so
//! moderately skewed clocks still work. Within that window a captured request can be
//! replayed; the peer endpoints are idempotent reads, so a replay only repeats an answer.
//!
//! Verification takes a list of secrets (current and previous), so a secret can be
//! rotated without a window in which pods reject each other.
//!
//! # Insecure mode
//! Without a cluster secret (`posgate serve --insecure`) the client sends requests
//! unsigned and the server accepts them unsigned: anyone who reaches the port can ask the
//! peer questions. Only for local development.
//!
//! # Transport
//! [`PeerClient`] speaks HTTP/2: h2c to `http://` peers, TLS with ALPN `h2` to `https://`
//! peers (pods serving with `--tls-cert`), verified as [`PeerTls`] says (`tls.rs`).
//!
//! What this module does not do: routing or HTTP serving. The axum middleware that
//! applies [`verify`] to the internal endpoints lives in `crate::http`.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::PodId;
use crate::credentials::Credentials;

pub mod tls;

use self::tls::PeerConnector;
pub use self::tls::PeerTls;

/// Request header with the signing time, Unix seconds.
pub const TIMESTAMP_HEADER: &str = "posgate-timestamp";
/// Request header with the hex HMAC-SHA256 signature.
pub const SIGNATURE_HEADER: &str = "posgate-signature";
/// How far a signature's timestamp may be from the verifier's clock, either way.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);
/// Largest body the internal endpoints buffer, and the largest answer the client reads.
pub const MAX_INTERNAL_BODY: usize = 64 * 1024;
/// Minimum length of a cluster secret, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// Path of the "do you reach the store?" peer endpoint.
pub const STORE_REACHABLE_PATH: &str = "/internal/v1/store-reachable";

type HmacSha256 = Hmac<Sha256>;

/// The shared secret pods sign their requests to each other with. `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterSecret(Arc<[u8]>);

/// Why bytes cannot be a [`ClusterSecret`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("cluster secret must be at least {MIN_SECRET_LEN} bytes, got {0}")]
pub struct SecretTooShort(pub usize);

impl ClusterSecret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, SecretTooShort> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretTooShort(bytes.len()));
        }
        Ok(ClusterSecret(bytes.into()))
    }

    /// Whether both hold the same bytes (constant time).
    pub fn same_as(&self, other: &ClusterSecret) -> bool {
        use subtle::ConstantTimeEq;
        self.0.len() == other.0.len() && bool::from(self.0.ct_eq(&other.0))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC is defined for keys of any length (long keys are hashed), so this cannot fail.
        <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC accepts keys of any length")
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

/// The two signature headers of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Unix seconds, the value of [`TIMESTAMP_HEADER`].
    pub timestamp: u64,
    /// Lowercase hex HMAC, the value of [`SIGNATURE_HEADER`].
    pub signature: String,
}

impl Signature {
    /// Sets both signature headers on `headers`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        headers.insert(TIMESTAMP_HEADER, HeaderValue::from(self.timestamp));
        // Hex digits are always a valid header value.
        let value = HeaderValue::from_str(&self.signature).expect("hex is a valid header value");
        headers.insert(SIGNATURE_HEADER, value);
    }
}

/// Why a request's signature was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing {0} header")]
    Missing(&'static str),
    #[error("malformed {0} header")]
    Malformed(&'static str),
    #[error(
        "timestamp is {skew_secs} s away from this pod's clock (at most {} s allowed)",
        MAX_CLOCK_SKEW.as_secs()
    )]
    Stale { skew_secs: u64 },
    #[error("signature does not match any cluster secret")]
    BadSignature,
}

fn unix_seconds(at: SystemTime) -> u64 {
    // A clock before 1970 is broken; 0 makes every signature stale instead of panicking.
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn signed_mac(
    secret: &ClusterSecret,
    method: &Method,
    path_and_query: &str,
    timestamp: u64,
    body: &[u8],
) -> HmacSha256 {
    let mut mac = secret.mac();
    let body_hash = hex::encode(Sha256::digest(body));
    mac.update(format!("{method}\n{path_and_query}\n{timestamp}\n{body_hash}").as_bytes());
    mac
}

/// Signs a request made at `at`.
pub fn sign(
    secret: &ClusterSecret,
    method: &Method,
    path_and_query: &str,
    at: SystemTime,
    body: &[u8],
) -> Signature {
    let timestamp = unix_seconds(at);
    let mac = signed_mac(secret, method, path_and_query, timestamp, body);
    Signature {
        timestamp,
        signature: hex::encode(mac.finalize().into_bytes()),
    }
}

/// Checks the signature headers in `headers` against each of `secrets` (constant-time
/// comparison) and the timestamp against `now`.
pub fn verify(
    secrets: &[ClusterSecret],
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), AuthError> {
    let header = |name: &'static str| -> Result<&str, AuthError> {
        let value = headers.get(name).ok_or(AuthError::Missing(name))?;
        value.to_str().map_err(|_| AuthError::Malformed(name))
    };
    let timestamp: u64 = header(TIMESTAMP_HEADER)?
        .parse()
        .map_err(|_| AuthError::Malformed(TIMESTAMP_HEADER))?;
    let signature = hex::decode(header(SIGNATURE_HEADER)?)
        .map_err(|_| AuthError::Malformed(SIGNATURE_HEADER))?;
    let skew_secs = unix_seconds(now).abs_diff(timestamp);
    if skew_secs > MAX_CLOCK_SKEW.as_secs() {
        return Err(AuthError::Stale { skew_secs });
    }
    let matches = secrets.iter().any(|secret| {
        signed_mac(secret, method, path_and_query, timestamp, body)
            .verify_slice(&signature)
            .is_ok()
    });
    if matches {
        Ok(())
    } else {
        Err(AuthError::BadSignature)
    }
}

/// A peer's answer to "do you reach the store?".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerAnswer {
    pub pod: PodId,
    pub store_reachable: bool,
}

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
    credentials: Credentials,
    timeout: Duration,
}

impl PeerClient {
    /// `secret: None` sends unsigned requests (insecure mode). `timeout` bounds each
    /// probe as a whole (connecting, sending and reading the answer) and each connect.
    pub fn new(secret: Option<ClusterSecret>, timeout: Duration) -> Self {
        PeerClient::with_credentials(Credentials::new(None, secret), timeout)
    }

    /// Signs with the current secret of `credentials` (replaced on reload); verifies
    /// `https://` peers against the system roots.
    pub fn with_credentials(credentials: Credentials, timeout: Duration) -> Self {
        PeerClient::build(credentials, timeout, PeerTls::default())
    }

    /// The same client (credentials, timeout) verifying `https://` peers with `tls`, on a
    /// pool of its own.
    pub fn using_tls(&self, tls: PeerTls) -> Self {
        PeerClient::build(self.credentials.clone(), self.timeout, tls)
    }

    fn build(credentials: Credentials, timeout: Duration, tls: PeerTls) -> Self {
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
            credentials,
            timeout,
        }
    }

    /// Asks the pod at `base_url` (e.g. `http://10.1.2.3:8080`) whether it reaches the
    /// coordination store.
    pub async fn store_reachable(&self, base_url: &str) -> Result<PeerAnswer, PeerError> {
        let body = self.post(base_url, STORE_REACHABLE_PATH).await?;
        serde_json::from_slice(&body).map_err(|e| PeerError::Decode(e.to_string()))
    }

    /// Sends a signed, empty `POST` and returns the body of a `200` answer.
    async fn post(&self, base_url: &str, path: &str) -> Result<Bytes, PeerError> {
        let sent = self
            .send(
                Method::POST,
                base_url,
                path,
                Bytes::new(),
                HeaderMap::new(),
                self.timeout,
            )
            .await;
        let (status, body) = sent.map_err(|e| match e {
            SendError::Url(reason) => PeerError::Url {
                url: base_url.to_string(),
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

    /// Sends `method path` with `body` and `headers` to the pod at `base_url`, signed
    /// with the current cluster secret, and returns the status and (at most
    /// [`MAX_INTERNAL_BODY`] of) the body of whatever it answers, within `timeout`. The
    /// one transport of every pod-to-pod call (probes, forwarded pushes, lookups).
    pub(crate) async fn send(
        &self,
        method: Method,
        base_url: &str,
        path: &str,
        body: Bytes,
        headers: HeaderMap,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), SendError> {
        let base = base_url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SendError::Url(
                "only http:// and https:// peer URLs are supported".into(),
            ));
        }
        let uri: http::Uri = format!("{base}{path}")
            .parse()
            .map_err(|_| SendError::Url("not a URL".into()))?;
        let path_and_query = uri
            .path_and_query()
            .map_or(path, |pq| pq.as_str())
            .to_string();
        let mut request = Request::builder()
            .method(method.clone())
            .uri(uri)
            .body(Full::new(body.clone()))
            .map_err(|e| SendError::Url(e.to_string()))?;
        request.headers_mut().extend(headers);
        if let Some(secret) = &self.credentials.signing_secret() {
            sign(secret, &method, &path_and_query, SystemTime::now(), &body)
                .apply(request.headers_mut());
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
            let body = Limited::new(response.into_body(), MAX_INTERNAL_BODY)
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
pub(crate) enum SendError {
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
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(byte: u8) -> ClusterSecret {
        ClusterSecret::new(vec![byte; 32]).unwrap()
    }

    fn signed_headers(secret: &ClusterSecret, at: SystemTime, body: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        sign(secret, &Method::POST, "/p?q=1", at, body).apply(&mut headers);
        headers
    }

    #[test]
    fn accepts_a_good_signature_with_any_listed_secret() {
        let now = SystemTime::now();
        let headers = signed_headers(&secret(2), now, b"body");
        let secrets = [secret(1), secret(2)];
        assert_eq!(
            verify(&secrets, &Method::POST, "/p?q=1", &headers, b"body", now),
            Ok(())
        );
        // Skew within the window, either way.
        let later = now + Duration::from_secs(29);
        assert_eq!(
            verify(&secrets, &Method::POST, "/p?q=1", &headers, b"body", later),
            Ok(())
        );
    }

    #[test]
    fn refuses_tampering_wrong_secrets_and_stale_timestamps() {
        let now = SystemTime::now();
        let headers = signed_headers(&secret(1), now, b"body");
        let ok = [secret(1)];
        let check = |secrets: &[ClusterSecret], method: Method, pq: &str, body: &[u8], at| {
            verify(secrets, &method, pq, &headers, body, at)
        };
        assert_eq!(
            check(&[secret(3)], Method::POST, "/p?q=1", b"body", now),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            check(&[], Method::POST, "/p?q=1", b"body", now),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            check(&ok, Method::GET, "/p?q=1", b"body", now),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            check(&ok, Method::POST, "/p?q=2", b"body", now),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            check(&ok, Method::POST, "/p?q=1", b"bodx", now),
            Err(AuthError::BadSignature)
        );
        let late = now + Duration::from_secs(31);
        assert!(matches!(
            check(&ok, Method::POST, "/p?q=1", b"body", late),
            Err(AuthError::Stale { .. })
        ));
    }

    #[test]
    fn refuses_missing_and_malformed_headers() {
        let now = SystemTime::now();
        let ok = [secret(1)];
        let verify_with = |headers: &HeaderMap| verify(&ok, &Method::POST, "/", headers, b"", now);
        assert_eq!(
            verify_with(&HeaderMap::new()),
            Err(AuthError::Missing(TIMESTAMP_HEADER))
        );
        let mut headers = HeaderMap::new();
        headers.insert(TIMESTAMP_HEADER, HeaderValue::from_static("soon"));
        headers.insert(SIGNATURE_HEADER, HeaderValue::from_static("00"));
        assert_eq!(
            verify_with(&headers),
            Err(AuthError::Malformed(TIMESTAMP_HEADER))
        );
        headers.insert(TIMESTAMP_HEADER, HeaderValue::from(unix_seconds(now)));
        headers.insert(SIGNATURE_HEADER, HeaderValue::from_static("not-hex"));
        assert_eq!(
            verify_with(&headers),
            Err(AuthError::Malformed(SIGNATURE_HEADER))
        );
    }

    #[test]
    fn secret_is_redacted_and_must_be_long_enough() {
        let s = ClusterSecret::new(*b"super-secret-value-1234").unwrap();
        assert!(!format!("{s:?}").contains("super"));
        assert_eq!(
            ClusterSecret::new(*b"short").unwrap_err(),
            SecretTooShort(5)
        );
    }
}
