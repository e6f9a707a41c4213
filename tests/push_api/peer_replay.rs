//! A man in the middle on the pod network: a forwarded push captured by a [`PeerTap`]
//! cannot be replayed or altered.
//!
//! [`PeerTap`]: crate::support::peer_tap::PeerTap

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;

use super::{acme, error_of, Cluster};
use crate::support::api::{self, client, push, send, Push};

/// A man in the middle on the pod network holds a forwarded push back and sends it on
/// altered: with each signed part changed, to another pod, downgraded to the previous
/// protocol. Each altered copy is refused; the untouched one is delivered, once; its
/// copy after that is refused as a replay. The terminal received the push exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_captured_forwarded_push_cannot_be_replayed_or_altered() {
    let c = Cluster::start_tapped(2, 50).await;
    let http = client();
    let owner = "push-pod-1";
    let t = c
        .ids()
        .iter()
        .find(|t| c.owner_of(t).as_deref() == Some(owner))
        .expect("a terminal of pod 1")
        .clone();
    c.taps[1].intercept();
    let keyed = Push {
        key: Some("captured-1"),
        query: "?timeout_ms=1000",
        ..acme()
    };
    let (status, _, body) = push(&http, &c.urls[0], &t, keyed).await;
    // The tap's bare 503 is not an owner's answer: the push may have arrived, so the
    // caller is told the delivery is unknown, not that it failed.
    assert_eq!(
        (status, error_of(&body), body["delivery"].as_str()),
        (StatusCode::GATEWAY_TIMEOUT, "pos_timeout", Some("unknown")),
        "held back by the tap: {body}"
    );
    let wire = c.taps[1]
        .captured()
        .into_iter()
        .find(|r| r.target.starts_with("/internal/v1/push/"))
        .expect("the forwarded push crossed pod 1's tap");
    assert_eq!(c.farm.counters().pushes_accepted, 0);

    let replay = |headers: HeaderMap, target: String, body: Bytes, base: String| {
        let http = http.clone();
        async move {
            let mut request = Request::post(format!("{base}{target}"))
                .body(Full::new(body))
                .unwrap();
            *request.headers_mut() = headers;
            send(&http, request).await
        }
    };
    let mut original = wire.headers.clone();
    original.remove("content-length");
    let owner_url = c.urls[1].clone();
    let header = |name: &'static str, value: &str| (name, value.to_string());
    let changed_headers: Vec<(&str, (&'static str, String))> = vec![
        (
            "a new idempotency key",
            header("idempotency-key", "captured-2"),
        ),
        ("another tenant", header("posgate-tenant", "bank")),
        (
            "a tenant that does not exist",
            header("posgate-tenant", "nobody"),
        ),
        ("a longer deadline", header("posgate-deadline-ms", "29000")),
        ("another content type", header("content-type", "text/plain")),
        ("a content encoding", header("content-encoding", "gzip")),
        ("no hop marker", header("posgate-hop", "0")),
        (
            "a new request id",
            header("posgate-request-id", "0123456789abcdef0123456789abcdef"),
        ),
        ("a new timestamp", header("posgate-timestamp", "1")),
        ("another sender", header("posgate-from", "push-pod-0x")),
        ("an added posgate header", header("posgate-epoch", "1")),
    ];
    let mut copies: Vec<(&str, HeaderMap, String, Bytes, String)> = Vec::new();
    for (case, (name, value)) in changed_headers {
        let mut headers = original.clone();
        headers.insert(name, value.parse().unwrap());
        copies.push((
            case,
            headers,
            wire.target.clone(),
            wire.body.clone(),
            owner_url.clone(),
        ));
    }
    let other_terminal = c.ids().iter().find(|x| **x != t).unwrap();
    copies.push((
        "another terminal's path",
        original.clone(),
        format!("/internal/v1/push/{other_terminal}"),
        wire.body.clone(),
        owner_url.clone(),
    ));
    copies.push((
        "another body",
        original.clone(),
        wire.target.clone(),
        Bytes::from_static(b"{\"amount\": 9}"),
        owner_url.clone(),
    ));
    let mut downgraded = original.clone();
    downgraded.remove("posgate-peer-version");
    copies.push((
        "downgraded to protocol 1",
        downgraded,
        wire.target.clone(),
        wire.body.clone(),
        owner_url.clone(),
    ));
    copies.push((
        "sent to the other pod",
        original.clone(),
        wire.target.clone(),
        wire.body.clone(),
        c.urls[0].clone(),
    ));
    let altered = copies.len();
    for (case, headers, target, body, base) in copies {
        let (status, _, answer) = replay(headers, target, body, base).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}: {answer}");
        assert_eq!(error_of(&answer), "unauthorized", "{case}");
    }
    assert_eq!(
        c.farm.counters().pushes_accepted,
        0,
        "no altered copy was delivered"
    );

    // The request as it was signed is good, once.
    let (status, _, answer) = replay(
        original.clone(),
        wire.target.clone(),
        wire.body.clone(),
        owner_url.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the untouched request: {answer}");
    let (status, _, answer) =
        replay(original, wire.target.clone(), wire.body.clone(), owner_url).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "its copy: {answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("replay"),
        "{answer}"
    );

    let report = c.farm.terminal_report(&t).unwrap();
    let delivered: Vec<&str> = report
        .recent_pushes
        .iter()
        .map(|p| p.idempotency_key.as_str())
        .collect();
    assert_eq!(delivered, ["acme:captured-1"], "one delivery, the original");
    assert_eq!(
        c.farm.counters().pushes_accepted,
        1,
        "no copy reached any terminal"
    );
    let refused_by = |base: &str| {
        let http = http.clone();
        let base = base.to_string();
        async move {
            api::metrics(&http, &base)
                .await
                .lines()
                .filter(|l| l.starts_with("posgate_peer_requests_refused_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as usize
        }
    };
    // All but the one sent to pod 0, plus the replay, were counted by pod 1.
    assert_eq!(refused_by(&c.urls[1]).await, altered - 1 + 1);
    assert_eq!(refused_by(&c.urls[0]).await, 1);
}
