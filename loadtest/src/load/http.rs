//! A small pooled HTTP/1 client for pods' and simulators' JSON endpoints and the pushes.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use serde::de::DeserializeOwned;

use super::LoadError;

/// Pooled HTTP/1 client.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client keeping up to 512 idle connections per host.
pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(512)
        .build(connector)
}

/// Status, `Retry-After` (seconds) and body of an answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after_s: Option<u64>,
    pub body: Bytes,
}

/// Why an exchange produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("no answer within the time limit")]
    Timeout,
    #[error("transport: {0}")]
    Transport(String),
}

/// One request with a time limit covering the answer and its body.
pub async fn exchange(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    limit: Duration,
) -> Result<Answer, ExchangeError> {
    let mut builder = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let req = builder
        .body(Full::new(body))
        .map_err(|e| ExchangeError::Transport(e.to_string()))?;
    let fut = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| ExchangeError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let retry_after_s = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ExchangeError::Transport(e.to_string()))?
            .to_bytes();
        Ok(Answer {
            status,
            retry_after_s,
            body,
        })
    };
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| ExchangeError::Timeout)?
}

/// GET a JSON document (status 200 only), with an optional bearer token.
pub async fn get_json<T: DeserializeOwned>(
    client: &HttpClient,
    url: &str,
    token: Option<&str>,
    limit: Duration,
) -> Result<T, LoadError> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    let err = |message: String| LoadError::Http {
        url: url.to_owned(),
        message,
    };
    let body = get_ok(client, url, &headers, limit).await?;
    serde_json::from_slice(&body).map_err(|e| err(e.to_string()))
}

/// GET a text document (status 200 only), such as `/metrics`.
pub async fn get_text(
    client: &HttpClient,
    url: &str,
    limit: Duration,
) -> Result<String, LoadError> {
    let body = get_ok(client, url, &[], limit).await?;
    String::from_utf8(body.to_vec()).map_err(|e| LoadError::Http {
        url: url.to_owned(),
        message: e.to_string(),
    })
}

/// The body of a GET answered 200.
async fn get_ok(
    client: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
    limit: Duration,
) -> Result<Bytes, LoadError> {
    let err = |message: String| LoadError::Http {
        url: url.to_owned(),
        message,
    };
    let answer = exchange(client, Method::GET, url, headers, Bytes::new(), limit)
        .await
        .map_err(|e| err(e.to_string()))?;
    if answer.status != 200 {
        return Err(err(format!("status {}", answer.status)));
    }
    Ok(answer.body)
}

/// Status of a GET, or `None` without an answer.
pub async fn get_status(client: &HttpClient, url: &str, limit: Duration) -> Option<u16> {
    exchange(client, Method::GET, url, &[], Bytes::new(), limit)
        .await
        .ok()
        .map(|a| a.status)
}
