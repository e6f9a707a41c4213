//! Sending pushes to a pod's HTTP API (`POST /v1/terminals/{id}/push`) from an
//! integration test, and reading the JSON answer.
//!
//! Not for: requests that must be malformed on purpose (missing headers, wrong types);
//! build those by hand.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A pod's answer to a push.
#[derive(Debug)]
pub struct PushAnswer {
    pub status: StatusCode,
    pub body: Value,
}

/// An HTTP/1 client for the push API, with one bearer token.
pub struct PushClient {
    http: Client<HttpConnector, Full<Bytes>>,
    token: String,
}

impl PushClient {
    pub fn new(token: &str) -> Self {
        PushClient {
            http: Client::builder(TokioExecutor::new()).build_http(),
            token: token.to_string(),
        }
    }

    /// Pushes `body` (JSON) to `terminal` through the pod at `base` (`http://host:port`)
    /// with `key` as the `Idempotency-Key`. Panics if the pod does not answer with JSON.
    pub async fn push(&self, base: &str, terminal: &str, key: &str, body: &str) -> PushAnswer {
        let request = Request::post(format!("{base}/v1/terminals/{terminal}/push"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", self.token))
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = self.http.request(request).await.expect("the pod answers");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&body)
            .unwrap_or_else(|_| panic!("a JSON answer, got {:?}", String::from_utf8_lossy(&body)));
        PushAnswer {
            status: parts.status,
            body,
        }
    }
}
