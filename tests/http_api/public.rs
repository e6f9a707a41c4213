//! The probes, the cluster view, and the JSON errors of every layer below the handlers.

use super::*;

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

/// A member of the view at `url`, advertising `peer_protocol`, no handover and no queue.
fn member(id: &str, url: &str, peer_protocol: u32) -> Member {
    Member {
        url: url.to_string(),
        peer_protocol,
        ..crate::support::pod::member(id)
    }
}

#[tokio::test]
async fn cluster_view_shape() {
    let server = Server::start(Some(vec![secret(1)])).await;
    let member = |id: &str, url: &str| member(id, url, 2);
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
                next_owner: Some(pod("pod-b")),
            },
            ShardStatus {
                shard: 1,
                assigned: Some(pod("pod-b")),
                owner: None,
                epoch: None,
                serving: false,
                suspended: true,
                next_owner: None,
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
        // No queue store here: pod-a's queue is unknown; pod-b was not asked.
        "members": [
            {"pod": "pod-a", "url": "http://a:8080", "queue": null},
            {"pod": "pod-b", "url": "http://b:8080", "queue": null},
        ],
        "shards": [
            {"shard": 0, "assigned": "pod-a", "owner": "pod-a", "epoch": 7, "serving": true, "suspended": false, "next_owner": "pod-b", "terminals_connected": null, "terminals_listed": null},
            {"shard": 1, "assigned": "pod-b", "owner": null, "epoch": null, "serving": false, "suspended": true, "next_owner": null, "terminals_connected": null, "terminals_listed": null},
        ],
        // No sampler runs here, so the pod's timeline has no points yet.
        "timelines": [{"pod": "pod-a", "points": []}],
        // No queue store here, so no broadcasts either.
        "broadcasts": [],
    });
    assert_eq!(body, expected);
    server.stop().await;
}

/// With `include=terminals` each member's queue is what it answered: a peer of this
/// release its pushes waiting, one of the previous release (da7c015: no `queue` in its
/// answer) unknown, `null`, not 0, though its shard counts are there.
#[tokio::test]
async fn the_cluster_view_shows_a_queue_a_previous_release_peer_does_not_send_as_unknown() {
    let server = Server::start(Some(vec![secret(1)])).await;
    let current = canned_peer(
        r#"{"pod":"pod-b","shards":[[1,4]],"listed":[[1,5]],"timeline":[],"queue":{"pushes":3,"oldest_ms_ago":1500}}"#,
    )
    .await;
    let previous =
        canned_peer(r#"{"pod":"pod-c","shards":[[2,6]],"listed":[[2,7]],"timeline":[]}"#).await;
    let member = |id: &str, url: &str| member(id, url, PEER_PROTOCOL);
    server.status.send_replace(PodStatus {
        members: vec![
            member("pod-a", "http://a:8080"),
            member("pod-b", &current),
            member("pod-c", &previous),
        ],
        shards: (0..3)
            .map(|shard| ShardStatus {
                shard,
                assigned: None,
                owner: None,
                epoch: None,
                serving: false,
                suspended: false,
                next_owner: None,
            })
            .collect(),
        ..status_of("pod-a", true)
    });
    let (code, body) = get(&format!("{}/v1/cluster?include=terminals", server.base)).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    let queues: Vec<&Value> = body["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["queue"])
        .collect();
    assert_eq!(
        queues,
        [
            &Value::Null,
            &json!({"pushes": 3, "oldest_ms_ago": 1500}),
            &Value::Null
        ],
        "{body}"
    );
    let counted: Vec<&Value> = body["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["terminals_connected"])
        .collect();
    assert_eq!(counted, [&Value::Null, &json!(4), &json!(6)], "{body}");
    server.stop().await;
}

/// `http://` address of a peer that answers every request `200` with `body` (JSON),
/// whatever it asks: the answers of a pod of another release. Over HTTP/2 without TLS
/// (prior knowledge), as the peer client speaks.
async fn canned_peer(body: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let answer = move || async move { ([(http::header::CONTENT_TYPE, "application/json")], body) };
    let serve = axum::serve(listener, axum::Router::new().fallback(answer));
    tokio::spawn(std::future::IntoFuture::into_future(serve));
    base
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
