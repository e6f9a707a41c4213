//! `PeerTap`: an attacker's vantage point on the pod network. An HTTP/2 (h2c) relay
//! placed in front of a pod (the pod advertises the tap's URL), which records every
//! request as it crossed the wire (target, headers, body) and relays it
//! unchanged, so a test can replay or alter real captured peer traffic. With
//! [`PeerTap::intercept`] it keeps requests instead of relaying them (answering `503`),
//! as a man in the middle would before sending an altered copy on. With
//! [`PeerTap::unknown_route`] it answers one path `404` as a pod that does not know it
//! would (a pod of an earlier release).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One request as it crossed the tap.
#[derive(Clone, Debug)]
pub struct Captured {
    /// Path and query.
    pub target: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// See the module docs. Dropping it stops accepting.
pub struct PeerTap {
    pub url: String,
    captured: Arc<Mutex<Vec<Captured>>>,
    intercepting: Arc<AtomicBool>,
    unknown: Arc<Mutex<Option<String>>>,
    accept: JoinHandle<()>,
}

type H2Client = Client<HttpConnector, Full<Bytes>>;

impl PeerTap {
    /// A tap relaying to the pod listening at `upstream` (`http://host:port`).
    pub async fn start(upstream: String) -> PeerTap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let captured = Arc::new(Mutex::new(Vec::new()));
        let client: H2Client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http();
        let log = captured.clone();
        let intercepting = Arc::new(AtomicBool::new(false));
        let held = intercepting.clone();
        let unknown = Arc::new(Mutex::new(None::<String>));
        let unknown_path = unknown.clone();
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (client, log, upstream) = (client.clone(), log.clone(), upstream.clone());
                let (held, unknown_path) = (held.clone(), unknown_path.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let hold = held.load(Ordering::SeqCst);
                        let path = request.uri().path();
                        let unknown = unknown_path.lock().unwrap().as_deref() == Some(path);
                        relay(
                            client.clone(),
                            log.clone(),
                            upstream.clone(),
                            request,
                            hold,
                            unknown,
                        )
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        PeerTap {
            url: format!("http://{addr}"),
            captured,
            intercepting,
            unknown,
            accept,
        }
    }

    /// From now on answer requests to `path` `404` in posgate's JSON (recorded, never
    /// relayed), as a pod of a release without that route does.
    pub fn unknown_route(&self, path: &str) {
        *self.unknown.lock().unwrap() = Some(path.to_string());
    }

    /// From now on keep requests (recorded, never relayed) instead of relaying them.
    pub fn intercept(&self) {
        self.intercepting.store(true, Ordering::SeqCst);
    }

    /// Every request seen so far.
    pub fn captured(&self) -> Vec<Captured> {
        self.captured.lock().unwrap().clone()
    }
}

impl Drop for PeerTap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(
    client: H2Client,
    log: Arc<Mutex<Vec<Captured>>>,
    upstream: String,
    request: Request<Incoming>,
    hold: bool,
    unknown: bool,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_string();
    log.lock().unwrap().push(Captured {
        target: target.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    if unknown {
        let body = r#"{"error":"not_found","message":"no such route"}"#;
        let refused = Response::builder()
            .status(404)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())));
        return Ok(refused.unwrap());
    }
    if hold {
        let refused = Response::builder()
            .status(503)
            .body(Full::new(Bytes::new()));
        return Ok(refused.unwrap());
    }
    let mut forward = Request::builder()
        .method(parts.method)
        .uri(format!("{upstream}{target}"))
        .body(Full::new(body))
        .unwrap();
    *forward.headers_mut() = parts.headers;
    let answer = match client.request(forward).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Response::from_parts(parts, Full::new(body))
        }
        Err(_) => Response::builder()
            .status(502)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    };
    Ok(answer)
}
