//! The pod's HTTP surface: health (`/healthz`, `/readyz`), the cluster view
//! (`/v1/cluster`) and the peer endpoints under `/internal/` that other pods call.
//!
//! Handlers only read the latest [`PodStatus`] from the driver's `watch` channel; they
//! never touch the store or the reconciler, so a slow or unreachable store cannot stall
//! a health probe. Every error answer is JSON `{"error": code, "message": text}`.
//!
//! [`serve`] speaks HTTP/1.1 and HTTP/2 with prior knowledge (h2c) on one port; peers use
//! h2c (see [`crate::peer::PeerClient`]), probes and people HTTP/1.1.
//!
//! What it does not do: terminal traffic, TLS, or deciding anything about shards.

mod internal;

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::core::PodId;
use crate::peer::{ClusterSecret, STORE_REACHABLE_PATH};
use crate::status::{PodStatus, ShardStatus};

/// What the HTTP handlers read.
#[derive(Debug)]
pub struct HttpState {
    /// The driver's latest status.
    pub status: watch::Receiver<PodStatus>,
    /// Secrets peer requests may be signed with (current first, then previous ones).
    /// `None` is insecure mode: peer requests are accepted unsigned.
    pub secrets: Option<Vec<ClusterSecret>>,
}

/// The pod's routes. See the module docs.
pub fn router(state: HttpState) -> Router {
    let state = Arc::new(state);
    // `route_layer` authenticates only requests that matched an internal route, so an
    // unknown `/internal/...` path is a plain 404.
    let internal = Router::new()
        .route(STORE_REACHABLE_PATH, post(internal::store_reachable))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            internal::authenticate,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/cluster", get(cluster))
        .merge(internal)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Serves `router` on `listener` (HTTP/1.1 and h2c) until `shutdown` resolves, then stops
/// accepting and waits for in-flight requests to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "http listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A JSON error answer: `{"error": code, "message": message}`.
fn json_error(status: StatusCode, error: &str, message: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct ErrorBody<'a> {
        error: &'a str,
        message: String,
    }
    (
        status,
        Json(ErrorBody {
            error,
            message: message.into(),
        }),
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
    reason: Option<&'static str>,
}

/// Readiness: `200` once the pod registered and served its first assignment (sticky, see
/// [`PodStatus::ready`]), `503` with the reason before.
async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    let reason = {
        let status = state.status.borrow();
        if status.ready {
            None
        } else if status.pod.is_none() {
            Some("pod is starting")
        } else if !status.store_reachable {
            Some("coordination store unreachable")
        } else if !status.registered {
            Some("not registered in the coordination store yet")
        } else {
            Some("assigned shards are not all served yet")
        }
    };
    let code = if reason.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(Readiness {
            ready: reason.is_none(),
            reason,
        }),
    )
        .into_response()
}

#[derive(Serialize)]
struct ClusterView<'a> {
    pod: Option<&'a PodId>,
    members: Vec<MemberView<'a>>,
    shards: &'a [ShardStatus],
}

#[derive(Serialize)]
struct MemberView<'a> {
    pod: &'a PodId,
    url: &'a str,
}

/// This pod's view of members and shard ownership.
async fn cluster(State(state): State<Arc<HttpState>>) -> Response {
    let status = state.status.borrow();
    let view = ClusterView {
        pod: status.pod.as_ref(),
        members: status
            .members
            .iter()
            .map(|m| MemberView {
                pod: &m.pod,
                url: &m.url,
            })
            .collect(),
        shards: &status.shards,
    };
    // Serialised while the borrow is held; nothing here awaits.
    Json(view).into_response()
}

async fn not_found(method: Method, uri: Uri) -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let message = format!("{method} is not allowed on {}", uri.path());
    json_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        message,
    )
}
