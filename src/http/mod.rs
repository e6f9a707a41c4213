//! The pod's HTTP surface: health (`/healthz`, `/readyz`), the push API, the directory
//! API (`directory.rs`) and cluster view under `/v1/` (bearer tokens, `push.rs`), and
//! the peer endpoints under `/internal/` that other pods call (HMAC, `internal.rs`).
//!
//! [`Routes`] answers a push ahead of the router (the one route with a rate) and every
//! other request through it.
//!
//! The probes and the cluster view only read the latest [`PodStatus`] from the driver's
//! `watch` channel; they never touch the store or the reconciler, so a slow or
//! unreachable store cannot stall a health probe. What does go to the store (pushes with
//! a TTL, directory changes) is bounded in time and answers `503` when it cannot. Every error answer is JSON `{"error": code, "message": text}`.
//!
//! [`serve()`] speaks HTTP/1.1 and HTTP/2 with prior knowledge (h2c) on one port; peers use
//! h2c (see [`crate::peer::PeerClient`]), probes and people HTTP/1.1; or the same over
//! TLS (`--tls-cert`, `tls.rs`), HTTP/2 or HTTP/1.1 chosen by ALPN. It holds client
//! connections under [`ConnectionLimits`] (`connections.rs`, `serve.rs`).
//!
//! What it does not do: terminal traffic, or deciding anything about shards.

mod batch;
mod broadcast;
mod caller;
mod cluster;
mod connections;
mod directory;
mod errors;
mod head_errors;
mod internal;
mod push;
mod pushes;
mod serve;
mod status_page;
pub mod tls;

use std::borrow::Cow;
use std::future::Future;
use std::str::Utf8Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::serve::ListenerExt;
use axum::{middleware, Json, Router};
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use percent_encoding::percent_decode_str;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use self::head_errors::JsonHeadErrorsListener;
use crate::api;
use crate::credentials::Credentials;
use crate::metrics::{Exposition, Metrics};
use crate::peer::{wire, PeerClient, PeerReceiver, MAX_INTERNAL_BODY};
use crate::push::answer::{Answer, ErrorCode};
use crate::push::PushService;
use crate::serving::SessionStats;
use crate::status::PodStatus;
use crate::trace_context::{RequestId, REQUEST_ID};

pub use self::caller::INSECURE_TENANT;
pub use self::connections::{ConnectionLimits, MAX_CLOSING};
pub use self::directory::MAX_IMPORT_BYTES;
pub use self::errors::MAX_URI_BYTES;
pub use self::push::{push_head, PushHead, MAX_TTL_S, PUSH_FAILURES};
pub use self::serve::{bind, LISTEN_BACKLOG};

/// What the HTTP handlers read.
pub struct HttpState {
    /// The driver's latest status.
    pub status: watch::Receiver<PodStatus>,
    /// API tokens and the cluster secrets peer requests may be signed with; without
    /// them (insecure mode) requests are accepted unauthenticated.
    pub credentials: Credentials,
    pub push: Arc<PushService>,
    /// The connection layer's counts (readiness, the cluster view).
    pub stats: Arc<dyn SessionStats>,
    /// The connection layer's side of planned moves it hands over (the release and
    /// draining peer endpoints).
    pub handovers: Arc<dyn crate::pos::handover::Handovers>,
    pub metrics: Arc<Metrics>,
    /// Asks the other pods for their counts (`/v1/cluster?include=terminals`).
    pub peers: PeerClient,
    /// `/readyz`'s memory; start with `ReadyLatch::default()`.
    pub ready: ReadyLatch,
    /// The peer endpoints' memory of accepted request ids; start with the default.
    pub peer: PeerReceiver,
    /// The directory API's writes; `None` for a pod without a terminal directory.
    pub directory: Option<Arc<dyn crate::store::directory::DirectoryEdits>>,
    /// The per-push log lines' budget; start with the default.
    pub push_lines: crate::rate_log::RateLog,
}

impl HttpState {
    /// Largest body a peer request to `path` may carry: a forwarded push is as large as
    /// a push; one owner's share of a batch as large as the batch, its bodies in base64
    /// (4/3) and each push's fields beside them.
    fn internal_body_limit(&self, path: &str) -> usize {
        let settings = self.push.settings();
        if path == wire::PUSH_BATCH_ROUTE {
            return settings.max_batch_bytes / 3 * 4 + wire::MAX_BATCH_PUSHES * 1024;
        }
        MAX_INTERNAL_BODY.max(settings.max_push_bytes)
    }

    /// How long any request body may take to arrive (`--body-read-timeout`).
    fn body_read_timeout(&self) -> Duration {
        self.push.settings().body_read_timeout
    }
}

/// What answers the pod's requests: a `POST` to [`api::PUSH_ROUTE`] or to the peer
/// protocol's [`wire::PUSH_ROUTE`] goes straight to its handler, every other request
/// through the router. Pushes are the routes with a rate: the router's path for them
/// (matching, the edge and token or signature layers, extractors, their boxed futures)
/// was ~10% of a pod's instructions per push. Each handler checks what those layers
/// check, first (`push::serve_push`, `internal::serve_forwarded`).
#[derive(Clone)]
pub struct Routes {
    state: Arc<HttpState>,
    router: Router,
}

impl Routes {
    /// The pod's routes over `state`. See the module docs.
    pub fn new(state: HttpState) -> Routes {
        let state = Arc::new(state);
        Routes {
            router: router(state.clone()),
            state,
        }
    }

    /// The answer to `request`, boxed once here: a push's future is several KiB (it
    /// holds every state of the delivery), and each move of it is a copy of all of it.
    /// Every request gets a [`RequestId`] for the handlers' log lines (a push's as an
    /// argument, the router's handlers' in the request's extensions) and in the answer's
    /// [`REQUEST_ID`] header; but a forwarded push, answered to the entry pod, not to a
    /// caller, goes by the entry pod's id.
    fn answer(&mut self, mut request: Request) -> BoxFuture<'static, Response> {
        use futures::future::FutureExt;
        use tower_service::Service;
        let id = RequestId::new();
        let with_id = move |mut response: Response| {
            response.headers_mut().insert(REQUEST_ID, id.header_value());
            response
        };
        if request.method() == Method::POST {
            let path = request.uri().path();
            if let Some(terminal) = route_id(api::PUSH_ROUTE, path) {
                let answer = push::serve_push(self.state.clone(), terminal, id, request);
                return Box::pin(answer.map(with_id));
            }
            if let Some(terminal) = route_id(wire::PUSH_ROUTE, path) {
                let state = self.state.clone();
                return Box::pin(internal::serve_forwarded(state, terminal, request));
            }
        }
        // Not before: the extensions are a map allocated on the first insert, a cost
        // every push would pay for an id it gets as an argument.
        request.extensions_mut().insert(id);
        let routed = self.router.call(request);
        Box::pin(routed.map(move |answer| match answer {
            Ok(response) => with_id(response),
            Err(never) => match never {},
        }))
    }
}

/// `listener`, its connections accepted with `TCP_NODELAY`, as the TLS listener's are:
/// answers are small and latency-sensitive, and Nagle held a response's second write
/// back for the caller's delayed ACK (~40 ms on Linux) on fresh connections.
fn without_nagle(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    })
}

/// The `{id}` segment of `path` when `route` (a route with one `{id}` segment) matches
/// it, decoded as the router's `Path` extractor decodes it (`Err` when that is not
/// UTF-8, which the handlers answer only after the caller is authenticated). What the
/// router matches: one segment, even an empty one unless it ends the path.
fn route_id(route: &str, path: &str) -> Option<Result<String, Utf8Error>> {
    let (prefix, suffix) = route
        .split_once("{id}")
        .expect("the route has an {id} segment");
    let id = path.strip_prefix(prefix)?.strip_suffix(suffix)?;
    // An empty segment that ends the path is no match (`/internal/v1/push/`).
    let empty_last = id.is_empty() && suffix.is_empty();
    (!id.contains('/') && !empty_last)
        .then(|| percent_decode_str(id).decode_utf8().map(Cow::into_owned))
}

fn router(state: Arc<HttpState>) -> Router {
    // `route_layer` authenticates only requests that matched an internal route, so an
    // unknown `/internal/...` path is a plain 404.
    let internal = Router::new()
        .route(wire::STORE_REACHABLE_ROUTE, post(internal::store_reachable))
        // As on the public push route, a `POST` never reaches the router (`Routes`).
        .route(wire::PUSH_ROUTE, any(push::post_only))
        .route(wire::TERMINAL_ROUTE, get(internal::terminal))
        .route(wire::SHARD_TERMINALS_ROUTE, get(cluster::shard_terminals))
        .route(wire::KEPT_ANSWERS_ROUTE, get(internal::kept_answers))
        .route(
            wire::RELEASE_TERMINALS_ROUTE,
            post(internal::release_terminals),
        )
        .route(wire::DRAINING_ROUTE, post(internal::draining))
        .route(wire::RELAY_ROUTE, post(internal::relay))
        .route(wire::PUSH_BATCH_ROUTE, post(internal::push_batch))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            internal::authenticate,
        ));
    let api = Router::new()
        .route(api::CLUSTER_ROUTE, get(cluster::cluster))
        .route(api::TERMINAL_ROUTE, directory::terminal_route())
        .route(api::TERMINALS_ROUTE, post(directory::import))
        .route(api::PUSH_STATUS_ROUTE, pushes::push_status_route())
        .route(api::PUSHES_ROUTE, delete(pushes::purge))
        .route(api::FEEDBACK_ROUTE, get(pushes::feedback))
        .route(api::BATCH_ROUTE, post(batch::batch))
        .route(api::BROADCASTS_ROUTE, post(broadcast::create))
        .route(api::BROADCAST_ROUTE, get(broadcast::status))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            push::require_token,
        ));
    Router::new()
        .route("/", get(status_page::serve))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        // A `POST` never reaches the router (`Routes`); any other method is answered
        // here, before any token check, as on every other route.
        .route(api::PUSH_ROUTE, any(push::post_only))
        .merge(api)
        .merge(internal)
        .fallback(errors::not_found)
        .method_not_allowed_fallback(errors::method_not_allowed)
        .layer(middleware::from_fn(errors::edge))
        .with_state(state)
}

/// Serves `routes` on `listener` until `shutdown` resolves, then stops accepting and
/// waits for the requests in flight: HTTP/1.1 and h2c, or with `tls` (see
/// [`tls::ServerCert::server_config`]) HTTP/2 or HTTP/1.1 by ALPN, only connections
/// whose handshake finished reaching the routes. Connections are held under `limits`
/// (`serve.rs`).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    routes: Routes,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(
        %addr,
        tls = tls.is_some(),
        max_connections = limits.max_connections,
        header_read_timeout = ?limits.header_read_timeout,
        idle_timeout = ?limits.idle_timeout,
        "http listening"
    );
    match tls {
        None => {
            let listener = JsonHeadErrorsListener(without_nagle(listener));
            serve::run(listener, routes, limits, metrics, shutdown).await;
        }
        Some(tls) => {
            let listener = JsonHeadErrorsListener(tls::TlsListener::new(listener, tls));
            serve::run(listener, routes, limits, metrics, shutdown).await;
        }
    }
    Ok(())
}

/// Reads a request body of at most `limit` bytes within `time`. An announced oversize
/// body is refused (`413`) before any of it is read; one that lies about or omits its
/// length is cut off at the limit.
async fn read_bounded(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    time: Duration,
) -> Result<Bytes, Answer> {
    check_announced(headers, limit)?;
    read_body(body, limit, time, |_| {}).await
}

/// `413` when `headers` announce a body over `limit` bytes.
fn check_announced(headers: &HeaderMap, limit: usize) -> Result<(), Answer> {
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|len| len > limit as u64) {
        return Err(push::too_large(limit));
    }
    Ok(())
}

/// Reads `body` (at most `limit` bytes, `413` beyond), showing each chunk to `seen` as
/// it arrives. A body not whole within `time` (`--body-read-timeout`) is `408`: a client
/// that announces more than it sends, or sends it a byte at a time, would otherwise hold
/// the request, its connection and an in-flight slot for as long as it likes.
async fn read_body(
    body: Body,
    limit: usize,
    time: Duration,
    seen: impl FnMut(&[u8]),
) -> Result<Bytes, Answer> {
    tokio::time::timeout(time, read_limited(body, limit, seen))
        .await
        .unwrap_or_else(|_| {
            let message = format!("the request body did not arrive whole within {time:?}");
            Err(Answer::error(ErrorCode::RequestTimeout, message))
        })
}

async fn read_limited(
    body: Body,
    limit: usize,
    mut seen: impl FnMut(&[u8]),
) -> Result<Bytes, Answer> {
    let mut body = Limited::new(body, limit);
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|err| {
            if err.is::<LengthLimitError>() {
                push::too_large(limit)
            } else {
                Answer::error(ErrorCode::InvalidRequest, err.to_string())
            }
        })?;
        if let Ok(data) = frame.into_data() {
            seen(&data);
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

/// Prometheus scrape: OpenMetrics text when the scraper asks for it, the classic text
/// format otherwise ([`Exposition::negotiate`]). No token: metrics carry no tenant data.
async fn metrics(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Exposition::negotiate(accept);
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::VARY, "accept"),
        ],
        state.metrics.encode(format),
    )
        .into_response()
}

/// Liveness: the process answers HTTP. Deliberately independent of the store, so a Redis
/// outage does not make Kubernetes restart every pod.
async fn healthz() -> &'static str {
    "ok"
}

#[derive(Serialize)]
struct Readiness {
    ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// Readiness: `200` once the pod registered, served its first assignment (see
/// [`PodStatus::ready`]) and dialed each terminal of its shards once — or
/// [`READY_SETTLE_TIMEOUT`] passed since the shards were served, so a few unreachable
/// terminals cannot hold a rollout forever. Sticky: it never flips back, so a rebalance
/// does not take the pod out of its Service. `503` with the reason before.
async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    let reason = not_ready_reason(&state);
    let code = if reason.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        ready: reason.is_none(),
        reason,
    };
    (code, Json(body)).into_response()
}

fn not_ready_reason(state: &HttpState) -> Option<String> {
    let latch = &state.ready;
    if latch.latched.load(Ordering::Acquire) {
        return None;
    }
    {
        let status = state.status.borrow();
        let reason = if status.ready {
            None
        } else if status.pod.is_none() {
            Some("pod is starting")
        } else if !status.store.reachable() {
            Some("coordination store unreachable")
        } else if !status.registered {
            Some("not registered in the coordination store yet")
        } else {
            Some("assigned shards are not all served yet")
        };
        if let Some(reason) = reason {
            return Some(reason.to_string());
        }
    }
    let served_at = *latch.served_at.get_or_init(Instant::now);
    let pending = state.stats.pending_first_dials();
    if pending == Some(0) || served_at.elapsed() >= READY_SETTLE_TIMEOUT {
        latch.latched.store(true, Ordering::Release);
        return None;
    }
    Some(match pending {
        None => "terminal lists of assigned shards are loading".to_string(),
        Some(n) => format!("{n} terminals of assigned shards not dialed yet"),
    })
}

/// How long readiness waits for the first dial of every terminal once the shards are
/// served: at the default 200 dials/s a pod dials its ~2,500 terminals in ~13 s.
pub const READY_SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The sticky part of `/readyz`.
#[derive(Debug, Default)]
pub struct ReadyLatch {
    latched: AtomicBool,
    /// When readiness first saw every assigned shard served.
    served_at: OnceLock<Instant>,
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::extract::{Path, Request};
    use axum::http::StatusCode;
    use axum::routing::post;
    use tower_service::Service;

    use super::{api, route_id, wire, without_nagle};

    /// A plain connection is accepted with Nagle off (the TLS listener sets it too).
    #[tokio::test]
    async fn plain_connections_are_accepted_without_nagle() {
        use axum::serve::Listener;
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut listener = without_nagle(tcp);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await;
        assert!(accepted.nodelay().unwrap());
    }

    /// The fast lane takes exactly the paths the router's push routes would match, and
    /// its id is the segment the router's `Path` extractor would see.
    #[tokio::test]
    async fn route_id_matches_what_the_router_matches() {
        let ids = [
            "pos-1",
            "a:b.c_d-e",
            "a%2Fb",
            "%70os",
            "",
            "a/b",
            "%FF",
            "a/",
            "a%3Fb",
        ];
        for route in [api::PUSH_ROUTE, wire::PUSH_ROUTE] {
            let router =
                axum::Router::new().route(route, post(|Path(id): Path<String>| async move { id }));
            let (prefix, suffix) = route.split_once("{id}").unwrap();
            let mut paths: Vec<String> = ids
                .iter()
                .map(|id| format!("{prefix}{id}{suffix}"))
                .collect();
            paths.extend([
                format!("/{prefix}a{suffix}"),
                format!("{prefix}a{suffix}/"),
                format!("{prefix}a{suffix}x"),
                prefix.trim_end_matches('/').to_string(),
                format!("{}a{suffix}", prefix.trim_end_matches('/')),
            ]);
            for path in &paths {
                let request = Request::post(path.as_str()).body(Body::empty()).unwrap();
                let answer = router.clone().call(request).await.unwrap();
                let routed = answer.status() != StatusCode::NOT_FOUND;
                assert_eq!(route_id(route, path).is_some(), routed, "{path}");
                if let Some(Ok(terminal)) = route_id(route, path) {
                    assert_eq!(answer.status(), StatusCode::OK, "{path}");
                    let body = axum::body::to_bytes(answer.into_body(), 1024)
                        .await
                        .unwrap();
                    assert_eq!(terminal.as_bytes(), &body[..], "{path}");
                }
            }
        }
    }
}
