//! The peer endpoints' authentication (a signature that is fresh, addressed to this pod,
//! over the body sent, and used once; protocol 1 only while a member speaks nothing
//! newer) and how the peer client fails.

use super::*;
use posgate::peer::wire::{ForwardedPush, RELAY_ROUTE};

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

    // A relayed push (`posgate::push` `owner`) is behind the same check; signed, it is
    // `421` where no draining session to the terminal exists: nothing was sent.
    let relay = format!("{}/internal/v1/relay/pos-1", server.base);
    let (code, _) = post(&relay, HeaderMap::new(), full("")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let push = ForwardedPush {
        tenant: "acme".into(),
        terminal: "pos-1".into(),
        key: "k-1".into(),
        deadline: Duration::from_secs(2),
        content_type: None,
        body: Bytes::from_static(b"{}"),
        ttl: None,
        collapse_key: None,
    };
    let trace = posgate::push::Trace::entry(None, &HeaderMap::new(), false);
    let to = target(&server.base, "pod-a");
    let (status, body) = client
        .push((&to, RELAY_ROUTE), &push, &trace, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{body:?}");

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
        peer_protocol: protocol,
        ..crate::support::pod::member(id)
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
