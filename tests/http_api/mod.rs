//! The pod's HTTP surface (`posgate::http`) and the peer client (`posgate::peer`) over
//! real sockets, with a status channel the test feeds itself instead of a driver:
//!
//! - `public`: the probes, the cluster view, and the JSON errors of every layer, from
//!   unknown routes to bodies that never arrive;
//! - `peer`: the peer endpoints' signatures (fresh, addressed, unaltered, never
//!   replayed; protocol 1 only during a rolling upgrade) and the peer client's failures.

mod peer;
mod public;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use crate::support::router::{self, assert_json_error, raw_exchange, Server};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use posgate::core::membership::Member;
use posgate::core::reconciler::Outage;
use posgate::core::PodId;
use posgate::credentials::{ClusterSecret, Credentials};
use posgate::peer::signing::{self, legacy};
use posgate::peer::wire::STORE_REACHABLE_ROUTE;
use posgate::peer::{
    PeerAnswer, PeerClient, PeerError, PeerTarget, MAX_INTERNAL_BODY, PEER_PROTOCOL,
};
use posgate::status::{PlacementStatus, PodStatus, ShardStatus, StoreStatus};
use serde_json::{json, Value};
use tokio::net::TcpListener;

fn secret(byte: u8) -> ClusterSecret {
    ClusterSecret::new(vec![byte; 32]).unwrap()
}

fn pod(id: &str) -> PodId {
    PodId::new(id).unwrap()
}

fn status_of(id: &str, store_reachable: bool) -> PodStatus {
    let store = if store_reachable {
        StoreStatus::Reachable
    } else {
        StoreStatus::Unreachable {
            since: Instant::now(),
            outage: Outage::Unknown,
        }
    };
    PodStatus {
        pod: Some(pod(id)),
        registered: true,
        store,
        ..PodStatus::default()
    }
}

type TestBody = BoxBody<Bytes, Infallible>;

/// An HTTP/1.1 client, as probes and operators use.
fn http1() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(request: Request<TestBody>) -> (StatusCode, HeaderMap, String) {
    let response = http1().request(request).await.expect("request completes");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

fn full(body: impl Into<Bytes>) -> TestBody {
    Full::new(body.into()).boxed()
}

async fn get(url: &str) -> (StatusCode, String) {
    let (status, _, body) = send(Request::get(url).body(full("")).unwrap()).await;
    (status, body)
}

async fn post(url: &str, headers: HeaderMap, body: TestBody) -> (StatusCode, Value) {
    let mut request = Request::post(url).body(body).unwrap();
    *request.headers_mut() = headers;
    let (status, _, body) = send(request).await;
    (status, serde_json::from_str(&body).expect("JSON body"))
}

/// Headers of an empty store-reachable probe signed at `at` for pod "pod-a".
fn signed(secret: &ClusterSecret, at: SystemTime) -> HeaderMap {
    signed_for(secret, at, "pod-a", b"")
}

/// Headers of a store-reachable probe with `body`, signed at `at` for pod `to`.
fn signed_for(secret: &ClusterSecret, at: SystemTime, to: &str, body: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    signing::sign(
        secret,
        &Method::POST,
        STORE_REACHABLE_ROUTE,
        &mut headers,
        body,
        at,
        (&pod("test-client"), &pod(to)),
        None,
    );
    headers
}

/// `pod` listening at `base`, speaking this build's protocol.
fn target(base: &str, pod_id: &str) -> PeerTarget {
    PeerTarget {
        pod: pod(pod_id),
        url: base.to_string(),
        protocol: PEER_PROTOCOL,
        batches: true,
    }
}

/// A peer client of pod "test-client" signing with `secret` (none: insecure).
fn peer_client(secret: Option<ClusterSecret>, timeout: Duration) -> PeerClient {
    PeerClient::new(pod("test-client"), Credentials::new(None, secret), timeout)
}
