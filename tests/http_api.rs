//! The pod's HTTP surface (`posgate::http`) and the peer client (`posgate::peer`) over
//! real sockets, with a status channel the test feeds itself instead of a driver.

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
        &pod("test-client"),
        &pod(to),
    );
    headers
}

/// `pod` listening at `base`, speaking this build's protocol.
fn target(base: &str, pod_id: &str) -> PeerTarget {
    PeerTarget {
        pod: pod(pod_id),
        url: base.to_string(),
        protocol: PEER_PROTOCOL,
    }
}

/// A peer client of pod "test-client" signing with `secret` (none: insecure).
fn peer_client(secret: Option<ClusterSecret>, timeout: Duration) -> PeerClient {
    PeerClient::new(pod("test-client"), Credentials::new(None, secret), timeout)
}

#[tokio::test]
async fn health_and_readiness() {
    let server = Server::start(Some(vec![secret(1)])).await;
    assert_eq!(
        get(&format!("{}/healthz", server.base)).await,
        (StatusCode::OK, "ok".into())
    );

    let readyz = format!("{}/readyz", server.base);
    let (code, body) = get(&readyz).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["ready"], false);
    assert!(
        body["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{body}"
    );

    server.status.send_modify(|s| {
        *s = PodStatus {
            ready: true,
            ..status_of("pod-a", true)
        };
    });
    let (code, body) = get(&readyz).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"ready": true})
    );
    server.stop().await;
}

#[tokio::test]
async fn cluster_view_shape() {
    let server = Server::start(Some(vec![secret(1)])).await;
    let member = |id: &str, url: &str| Member {
        pod: pod(id),
        url: url.to_string(),
        version: "0.1.0".to_string(),
        ring_version: "test".to_string(),
        started_ms: 1,
        peer_protocol: 2,
        handover: 0,
    };
    let learned = Instant::now() - Duration::from_millis(1500);
    server.status.send_replace(PodStatus {
        placement: Some(PlacementStatus {
            version: 3,
            since: learned,
        }),
        members: vec![
            member("pod-a", "http://a:8080"),
            member("pod-b", "http://b:8080"),
        ],
        shards: vec![
            ShardStatus {
                shard: 0,
                assigned: Some(pod("pod-a")),
                owner: Some(pod("pod-a")),
                epoch: Some(7),
                serving: true,
                suspended: false,
            },
            ShardStatus {
                shard: 1,
                assigned: Some(pod("pod-b")),
                owner: None,
                epoch: None,
                serving: false,
                suspended: true,
            },
        ],
        ..status_of("pod-a", true)
    });
    let (code, body) = get(&format!("{}/v1/cluster", server.base)).await;
    assert_eq!(code, StatusCode::OK);
    let mut body: Value = serde_json::from_str(&body).unwrap();
    let ago = body["placement"]["changed_ms_ago"]
        .as_u64()
        .unwrap_or_else(|| panic!("no placement age: {body}"));
    assert!(
        (1500..=learned.elapsed().as_millis() as u64).contains(&ago),
        "{ago}"
    );
    body["placement"]["changed_ms_ago"] = json!(1500);
    let expected = json!({
        "pod": "pod-a",
        "store": {"verdict": "reachable", "unreachable_ms": null, "recovery_hold_ms": null},
        "placement": {"version": 3, "changed_ms_ago": 1500},
        "members": [{"pod": "pod-a", "url": "http://a:8080"}, {"pod": "pod-b", "url": "http://b:8080"}],
        "shards": [
            {"shard": 0, "assigned": "pod-a", "owner": "pod-a", "epoch": 7, "serving": true, "suspended": false, "terminals_connected": null, "terminals_listed": null},
            {"shard": 1, "assigned": "pod-b", "owner": null, "epoch": null, "serving": false, "suspended": true, "terminals_connected": null, "terminals_listed": null},
        ],
        // No sampler runs here, so the pod's timeline has no points yet.
        "timelines": [{"pod": "pod-a", "points": []}],
    });
    assert_eq!(body, expected);
    server.stop().await;
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json_errors() {
    let server = Server::start(Some(vec![secret(1)])).await;
    let (code, body) = get(&format!("{}/nope", server.base)).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "not_found"
    );
    let (code, body) = post(
        &format!("{}/healthz", server.base),
        HeaderMap::new(),
        full(""),
    )
    .await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["error"], "method_not_allowed");
    server.stop().await;
}

/// A body that announces more than it sends, or never ends, holds nothing for long: the
/// request is answered `408` once the body read timeout passes, and the connection ends.
#[tokio::test]
async fn a_body_that_never_arrives_whole_is_a_408() {
    let server = Server::start(None).await;
    for path in ["/v1/terminals/pos-1/push", "/internal/v1/push/pos-1"] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: 100\r\n\r\n{{\"partial\""
        );
        let started = std::time::Instant::now();
        let answer = raw_exchange(&server.base, request.as_bytes()).await;
        let took = started.elapsed();
        assert_json_error(path, &answer, 408, "request_timeout");
        assert!(
            took < router::BODY_READ_TIMEOUT + Duration::from_secs(5),
            "{path}: answered after {took:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn errors_below_the_handlers_are_json() {
    let server = Server::start(None).await;
    let long_target = format!("/v1/cluster?x={}", "a".repeat(70_000));
    let big_header = "a".repeat(500_000);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "a header line without a colon (hyper)",
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n".to_vec(),
            400,
            "invalid_request",
        ),
        (
            "a request line that is not HTTP (hyper)",
            b"GET /healthz HTTX/1.1\r\n\r\n".to_vec(),
            400,
            "invalid_request",
        ),
        (
            "a target over 64 KiB (hyper)",
            format!("GET {long_target} HTTP/1.1\r\nhost: x\r\n\r\n").into_bytes(),
            414,
            "uri_too_long",
        ),
        (
            "a target over the pod's limit",
            format!(
                "GET /v1/cluster?x={} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                "a".repeat(10_000)
            )
            .into_bytes(),
            414,
            "uri_too_long",
        ),
        (
            "a head over hyper's buffer (hyper; the pod's limit when it arrives whole)",
            format!("GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-big: {big_header}\r\n\r\n")
                .into_bytes(),
            431,
            "headers_too_large",
        ),
        (
            "headers over the pod's limit",
            format!(
                "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-big: {}\r\n\r\n",
                "a".repeat(70_000)
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
        (
            "a path that is not UTF-8 (axum's rejection)",
            b"POST /v1/terminals/%FF/push HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                .to_vec(),
            400,
            "invalid_request",
        ),
        (
            "an undefined include value",
            b"GET /v1/cluster?include=AAA HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                .to_vec(),
            400,
            "invalid_request",
        ),
        (
            "an undefined cluster parameter",
            b"GET /v1/cluster?verbose=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                .to_vec(),
            400,
            "invalid_request",
        ),
        (
            "an undefined push parameter",
            b"POST /v1/terminals/t1/push?timeout_ms=5&retry=1 HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                .to_vec(),
            400,
            "invalid_request",
        ),
        // A `POST` to the push route is served ahead of the router (`http::Routes`),
        // with the limits the router's edge layer checks for every other route.
        (
            "a push target over the pod's limit",
            format!(
                "POST /v1/terminals/t1/push?x={} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                "a".repeat(10_000)
            )
            .into_bytes(),
            414,
            "uri_too_long",
        ),
        (
            "a push's headers over the pod's limit",
            format!(
                "POST /v1/terminals/t1/push HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\nx-big: {}\r\n\r\n",
                "a".repeat(70_000)
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
        (
            "an empty terminal id on the push route",
            b"POST /v1/terminals//push HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                .to_vec(),
            400,
            "invalid_request",
        ),
        (
            "a parameter on the terminal view",
            b"GET /v1/terminals/t1?x=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_vec(),
            400,
            "invalid_request",
        ),
    ];
    for (case, request, status, code) in &cases {
        let answer = raw_exchange(&server.base, request).await;
        assert_json_error(case, &answer, *status, code);
    }
    // Another method on the push route: 405 naming the one allowed (RFC 9110 15.5.6).
    let get_push = b"GET /v1/terminals/t1/push HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let answer = raw_exchange(&server.base, get_push).await;
    assert_json_error("GET on the push route", &answer, 405, "method_not_allowed");
    assert_eq!(answer.1["allow"], "POST");
    // A malformed request after a good one on the same keep-alive connection.
    let rest = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = server.base.trim_start_matches("http://");
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = vec![0u8; 1024];
        let n = tcp.read(&mut first).await.unwrap();
        assert!(
            first[..n].starts_with(b"HTTP/1.1 200"),
            "the health check answers"
        );
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nbad\r\n\r\n")
            .await
            .unwrap();
        let mut second = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut second))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&second).into_owned()
    };
    assert_json_error(
        "a malformed request after a good one",
        &router::parse_raw(&rest),
        400,
        "invalid_request",
    );
    server.stop().await;
}

#[tokio::test]
async fn internal_endpoint_requires_a_fresh_signature() {
    let good = secret(1);
    let server = Server::start(Some(vec![secret(9), good.clone()])).await;
    server.status.send_replace(status_of("pod-a", true));
    let url = format!("{}{STORE_REACHABLE_ROUTE}", server.base);
    let now = SystemTime::now();

    let refused = [
        ("unsigned", HeaderMap::new()),
        ("wrong secret", signed(&secret(2), now)),
        ("stale", signed(&good, now - Duration::from_secs(120))),
        (
            "from the future",
            signed(&good, now + Duration::from_secs(120)),
        ),
    ];
    for (case, headers) in refused {
        let (code, body) = post(&url, headers, full("")).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{case}: {body}");
        assert_eq!(body["error"], "unauthorized", "{case}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{case}: {body}"
        );
    }

    // Signed by hand over HTTP/1.1 ...
    let (code, body) = post(&url, signed(&good, now), full("")).await;
    assert_eq!(
        (code, body),
        (
            StatusCode::OK,
            json!({"pod": "pod-a", "store_reachable": true})
        )
    );
    // ... and by the peer client over h2c, with any of the accepted secrets.
    let client = peer_client(Some(good), Duration::from_secs(2));
    let answer = client
        .store_reachable(&target(&server.base, "pod-a"))
        .await
        .unwrap();
    assert_eq!(
        answer,
        PeerAnswer {
            pod: pod("pod-a"),
            store_reachable: true
        }
    );
    server.status.send_replace(status_of("pod-a", false));
    let answer = client
        .store_reachable(&target(&format!("{}/", server.base), "pod-a"))
        .await
        .unwrap();
    assert!(!answer.store_reachable);

    let stranger = peer_client(Some(secret(3)), Duration::from_secs(2));
    let err = stranger
        .store_reachable(&target(&server.base, "pod-a"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, PeerError::Status { status: 401, .. }),
        "{err}"
    );
    server.stop().await;
}

/// A signed request is good once: its exact copy, a copy addressed to another pod, a
/// body that does not match the signed digest and an unknown protocol are refused, and
/// each refusal is counted by reason.
#[tokio::test]
async fn signed_requests_cannot_be_replayed_redirected_or_altered() {
    let good = secret(1);
    let server = Server::start(Some(vec![good.clone()])).await;
    server.status.send_replace(status_of("pod-a", true));
    let url = format!("{}{STORE_REACHABLE_ROUTE}", server.base);
    let now = SystemTime::now();

    let once = signed(&good, now);
    let (code, body) = post(&url, once.clone(), full("")).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = post(&url, once, full("")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "the exact copy: {body}");
    assert!(
        body["message"].as_str().unwrap().contains("replay"),
        "{body}"
    );

    let elsewhere = signed_for(&good, now, "pod-b", b"");
    let (code, body) = post(&url, elsewhere, full("")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "for another pod: {body}");

    let altered = signed_for(&good, now, "pod-a", b"{\"a\":1}");
    let (code, body) = post(&url, altered, full("{\"a\":2}")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "another body: {body}");
    assert!(
        body["message"].as_str().unwrap().contains("digest"),
        "{body}"
    );

    let mut future = signed(&good, now);
    future.insert("posgate-peer-version", http::HeaderValue::from_static("3"));
    let (code, body) = post(&url, future, full("")).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request")),
        "{body}"
    );

    let (_, metrics) = get(&format!("{}/metrics", server.base)).await;
    for reason in [
        "replay",
        "wrong_recipient",
        "digest_mismatch",
        "unsupported_version",
    ] {
        let line = format!("posgate_peer_requests_refused_total{{reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
    server.stop().await;
}

/// Protocol 1 (the previous release) is accepted only while a member speaks nothing
/// newer, and even then its exact copies are refused.
#[tokio::test]
async fn protocol_1_is_accepted_only_during_a_rolling_upgrade() {
    let good = secret(1);
    let server = Server::start(Some(vec![good.clone()])).await;
    let url = format!("{}{STORE_REACHABLE_ROUTE}", server.base);
    let old_signed = |at: SystemTime| {
        let mut headers = HeaderMap::new();
        legacy::sign(&good, &Method::POST, STORE_REACHABLE_ROUTE, at, b"").apply(&mut headers);
        headers
    };
    let member = |id: &str, protocol: u32| Member {
        pod: pod(id),
        url: "http://x:1".into(),
        version: "0.1.0".into(),
        ring_version: "test".into(),
        started_ms: 1,
        peer_protocol: protocol,
        handover: 0,
    };
    server.status.send_replace(PodStatus {
        members: vec![
            member("pod-a", PEER_PROTOCOL),
            member("pod-b", PEER_PROTOCOL),
        ],
        ..status_of("pod-a", true)
    });
    let (code, body) = post(&url, old_signed(SystemTime::now()), full("")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "no old member: {body}");

    server.status.send_replace(PodStatus {
        members: vec![member("pod-a", PEER_PROTOCOL), member("pod-old", 1)],
        ..status_of("pod-a", true)
    });
    let at = SystemTime::now();
    let (code, body) = post(&url, old_signed(at), full("")).await;
    assert_eq!(code, StatusCode::OK, "an old member is there: {body}");
    let (code, body) = post(&url, old_signed(at), full("")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "its exact copy: {body}");

    // The previous release re-sends a forward answered 421 at once; within the same
    // second its copy is byte-identical, and since the first acted on nothing it is
    // accepted again (here: 421 again, no pod serves anything).
    let path = "/internal/v1/push/pos-1";
    let forward = |at: SystemTime| {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("posgate-hop", "1"),
            ("posgate-tenant", "acme"),
            ("idempotency-key", "order-1"),
            ("posgate-deadline-ms", "500"),
        ] {
            headers.insert(name, value.parse().unwrap());
        }
        legacy::sign(&good, &Method::POST, path, at, b"{}").apply(&mut headers);
        headers
    };
    let url = format!("{}{path}", server.base);
    let at = SystemTime::now();
    for attempt in ["first", "re-sent"] {
        let (code, body) = post(&url, forward(at), full("{}")).await;
        assert_eq!(code, StatusCode::MISDIRECTED_REQUEST, "{attempt}: {body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn oversize_bodies_are_refused_before_authentication() {
    let good = secret(1);
    let server = Server::start(Some(vec![good.clone()])).await;
    server.status.send_replace(status_of("pod-a", true));
    let url = format!("{}{STORE_REACHABLE_ROUTE}", server.base);

    let announced = full(vec![b'x'; MAX_INTERNAL_BODY + 1]);
    let (code, body) = post(&url, signed(&good, SystemTime::now()), announced).await;
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"], "payload_too_large");

    // Chunked, without a length up front: caught while reading, after the signed head.
    let chunks = (0..20).map(|_| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; 4096]))));
    let streamed = StreamBody::new(futures::stream::iter(chunks)).boxed();
    let (code, _) = post(&url, signed(&good, SystemTime::now()), streamed).await;
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);
    // Unsigned, its body is not read at all.
    let chunks = (0..20).map(|_| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; 4096]))));
    let streamed = StreamBody::new(futures::stream::iter(chunks)).boxed();
    let (code, _) = post(&url, HeaderMap::new(), streamed).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    server.stop().await;
}

#[tokio::test]
async fn insecure_mode_accepts_unsigned_peers() {
    let server = Server::start(None).await;
    let client = peer_client(None, Duration::from_secs(2));
    let peer = target(&server.base, "pod-b");
    // No status published yet: the pod cannot answer for itself.
    let err = client.store_reachable(&peer).await.unwrap_err();
    assert!(
        matches!(err, PeerError::Status { status: 503, .. }),
        "{err}"
    );
    server.status.send_replace(status_of("pod-b", true));
    let answer = client.store_reachable(&peer).await.unwrap();
    assert_eq!(
        answer,
        PeerAnswer {
            pod: pod("pod-b"),
            store_reachable: true
        }
    );
    server.stop().await;
}

#[tokio::test]
async fn a_pod_whose_driver_is_gone_does_not_vouch_for_the_store() {
    let server = Server::start(None).await;
    server.status.send_replace(status_of("pod-b", true));
    let client = peer_client(None, Duration::from_secs(2));
    let peer = target(&server.base, "pod-b");
    assert!(client.store_reachable(&peer).await.unwrap().store_reachable);
    // The driver owns the sender; it is dropped when the pod's coordination loop ends.
    let mut server = server;
    server.drop_status();
    let err = client.store_reachable(&peer).await.unwrap_err();
    assert!(
        matches!(err, PeerError::Status { status: 503, .. }),
        "{err}"
    );
    server.stop().await;
}

#[tokio::test]
async fn peer_client_fails_fast_without_a_listener() {
    let addr: SocketAddr = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let client = peer_client(Some(secret(1)), Duration::from_secs(5));
    let started = Instant::now();
    let err = client
        .store_reachable(&target(&format!("http://{addr}"), "pod-a"))
        .await
        .unwrap_err();
    assert!(matches!(err, PeerError::Transport(_)), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );

    let err = client
        .store_reachable(&target("ftp://example.invalid", "pod-a"))
        .await
        .unwrap_err();
    assert!(matches!(err, PeerError::Url { .. }), "{err}");
}

#[tokio::test]
async fn peer_client_times_out_on_a_silent_peer() {
    // Accepts connections (kernel backlog) but never speaks HTTP.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", silent.local_addr().unwrap());
    let client = peer_client(Some(secret(1)), Duration::from_millis(300));
    let started = Instant::now();
    let err = client
        .store_reachable(&target(&base, "pod-a"))
        .await
        .unwrap_err();
    assert!(matches!(err, PeerError::Timeout(_)), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    drop(silent);
}
