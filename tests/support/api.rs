//! A pod's HTTP API from an integration test, over one HTTP/1 client: pushes
//! (`POST /v1/terminals/{id}/push`, [`Push`]), GETs with a bearer token, any other
//! request ([`send`]; answers read as JSON), and the `/metrics` text and its values.
//!
//! Not for: requests to a `posgate serve` process that may be frozen (raw HTTP/1.1 with a
//! time limit: [`super::binary::request`]).

use bytes::Bytes;
use http::{header, HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// The HTTP/1 client of the tests.
pub type Http = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends `request`; the status, the headers and the JSON body. Panics if the pod does not
/// answer, or not with JSON.
pub async fn send(http: &Http, request: Request<Full<Bytes>>) -> (StatusCode, HeaderMap, Value) {
    let response = http.request(request).await.expect("the pod answers");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("a JSON answer, got {:?}", String::from_utf8_lossy(&body)));
    (parts.status, parts.headers, json)
}

/// `GET url`, with a bearer `token` if one is given; the status and the JSON body.
pub async fn get(http: &Http, url: &str, token: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::get(url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let (status, _, body) = send(http, request.body(Full::new(Bytes::new())).unwrap()).await;
    (status, body)
}

/// The `/metrics` text of the pod at `base` (`http://host:port`), asked for without an
/// `Accept` header (the classic text format); panics unless it is served with 200.
pub async fn metrics(http: &Http, base: &str) -> String {
    metrics_as(http, base, None).await.1
}

/// The `/metrics` answer of the pod at `base` to `accept`: its `Content-Type` and text;
/// panics unless it is served with 200.
pub async fn metrics_as(http: &Http, base: &str, accept: Option<&str>) -> (String, String) {
    let mut request = Request::get(format!("{base}/metrics"));
    if let Some(accept) = accept {
        request = request.header(header::ACCEPT, accept);
    }
    let response = http
        .request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("the pod answers /metrics");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()[header::CONTENT_TYPE]
        .to_str()
        .expect("an ASCII content type")
        .to_string();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        content_type,
        String::from_utf8(body.to_vec()).expect("a UTF-8 scrape"),
    )
}

/// The value of `series` (its name and labels exactly as scraped, e.g.
/// `posgate_store_verdict{verdict="reachable"}`) in the `/metrics` text `scrape`.
pub fn value(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split(' ').next()?.parse().ok()
    })
}

/// [`value`] of a series that must be there; panics (with the scrape) when it is not.
pub fn scraped(scrape: &str, series: &str) -> f64 {
    value(scrape, series).unwrap_or_else(|| panic!("{series} missing from /metrics:\n{scrape}"))
}

/// A push request; `None` fields are left out (a request may lack them on purpose).
pub struct Push<'a> {
    pub token: Option<&'a str>,
    /// The `Idempotency-Key`; without one the pod generates a key.
    pub key: Option<&'a str>,
    /// JSON.
    pub body: &'a str,
    /// Appended to the path, e.g. `?timeout_ms=300`.
    pub query: &'a str,
}

impl<'a> Push<'a> {
    /// `{"amount": 1}` with the bearer `token`, no key, no query.
    pub fn new(token: &'a str) -> Self {
        Push {
            token: Some(token),
            key: None,
            body: "{\"amount\": 1}",
            query: "",
        }
    }
}

/// Sends `p` to `terminal` through the pod at `base` (`http://host:port`); the status,
/// headers and JSON body of the answer.
pub async fn push(
    http: &Http,
    base: &str,
    terminal: &str,
    p: Push<'_>,
) -> (StatusCode, HeaderMap, Value) {
    let mut request = Request::post(format!("{base}/v1/terminals/{terminal}/push{}", p.query))
        .header("content-type", "application/json");
    if let Some(token) = p.token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if let Some(key) = p.key {
        request = request.header("idempotency-key", key);
    }
    let request = request
        .body(Full::new(Bytes::from(p.body.to_string())))
        .unwrap();
    send(http, request).await
}
