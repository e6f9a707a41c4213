//! Every documented status code of the push API, produced through the real server: one
//! test per answer, each on a cluster of its own (2 pods, 100 terminals of the farm, and
//! `pos-offline`, a directory entry on 127.0.0.1 port 1, which refuses: a terminal that is
//! never reachable). Pushes are capped at 1 KiB and one waiting push per terminal.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use posgate::core::shard::shard_of;
use posgate::push::PushConfig;
use posgate_pos_sim::FaultConfig;

use super::{acme, error_of, Cluster, ACME, BANK, OPERATOR};
use crate::support::api::{self, client, get, push, send, Http, Push};
use crate::support::pod::SHARDS;

/// The cluster of every test here, a client, and the first farm terminal.
pub(super) async fn cluster() -> (Cluster, Http, String) {
    let settings = PushConfig {
        max_push_bytes: 1024,
        max_waiting_per_terminal: 1,
        ..PushConfig::default()
    };
    let c = Cluster::start(2, 100, &[("pos-offline", "127.0.0.1:1")], settings).await;
    let t = c.ids()[0].clone();
    (c, client(), t)
}

/// How often the farm received a push with `key` (`tenant:key`) for `terminal`.
fn deliveries(c: &Cluster, terminal: &str, key: &str) -> usize {
    let report = c.farm.terminal_report(terminal).unwrap();
    report
        .recent_pushes
        .iter()
        .filter(|p| p.idempotency_key == key)
        .count()
}

/// A push of acme's with `key`.
pub(super) fn keyed(key: &str) -> Push<'_> {
    Push {
        key: Some(key),
        ..acme()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_200_from_either_pod_names_the_owner() {
    let (c, http, t) = cluster().await;
    for base in &c.urls {
        let (status, _, body) = push(&http, base, &t, acme()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["terminal"], t.as_str());
        assert_eq!(body["pod"].as_str(), c.owner_of(&t).as_deref());
        assert_eq!(body["shard"], shard_of(&t, SHARDS));
        assert_eq!(body["pos_status"], 200);
        let key = body["idempotency_key"].as_str().unwrap();
        assert_eq!(key.len(), 36, "a generated UUID: {key}");
    }
}

/// The same key and body through the other pod: the stored answer, one delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_through_the_other_pod_answers_the_stored_result_without_a_delivery() {
    let (c, http, t) = cluster().await;
    let (a, b) = (&c.urls[0], &c.urls[1]);
    let (s1, _, first) = push(&http, a, &t, keyed("order-1")).await;
    let (s2, _, second) = push(&http, b, &t, keyed("order-1")).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(first["epoch"], second["epoch"]);
    assert_eq!(
        deliveries(&c, &t, "acme:order-1"),
        1,
        "a replay must not deliver again"
    );
}

/// The same key with another body; another tenant's identical key is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_409_for_a_key_reused_with_another_body_of_the_same_tenant() {
    let (c, http, t) = cluster().await;
    let (a, b) = (&c.urls[0], &c.urls[1]);
    let (status, _, body) = push(&http, a, &t, keyed("order-1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let other = Push {
        body: "{\"amount\": 2}",
        ..keyed("order-1")
    };
    let (status, _, body) = push(&http, b, &t, other).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::CONFLICT, "idempotency_conflict")
    );
    let bank = Push {
        token: Some(BANK),
        key: Some("order-1"),
        body: "{\"amount\": 2}",
        ..acme()
    };
    assert_eq!(push(&http, a, &t, bank).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_400_for_a_bad_terminal_id_key_or_timeout() {
    let (c, http, t) = cluster().await;
    for (terminal, p) in [
        ("bad id!", acme()),
        (t.as_str(), keyed("has space")),
        (
            t.as_str(),
            Push {
                query: "?timeout_ms=0",
                ..acme()
            },
        ),
        (
            t.as_str(),
            Push {
                query: "?timeout_ms=30001",
                ..acme()
            },
        ),
    ] {
        let terminal = terminal.replace(' ', "%20");
        let (status, _, body) = push(&http, &c.urls[0], &terminal, p).await;
        assert_eq!(
            (status, error_of(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{body}"
        );
    }
    // A header that may be sent once, sent twice: which one counts would be a guess.
    let bearer = format!("Bearer {ACME}");
    for (name, values) in [
        (
            "authorization",
            [bearer.as_str(), "Bearer someone-elses-token-0123"],
        ),
        ("idempotency-key", ["twice-1", "twice-2"]),
        ("content-type", ["application/json", "text/plain"]),
    ] {
        let mut request = Request::post(format!("{}/v1/terminals/{t}/push", c.urls[0]));
        for (header, value) in [
            ("authorization", bearer.as_str()),
            ("idempotency-key", "twice-1"),
            ("content-type", "application/json"),
        ] {
            if header != name {
                request = request.header(header, value);
            }
        }
        for value in values {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(Bytes::from("{}"))).unwrap();
        let (status, _, body) = send(&http, request).await;
        assert_eq!(
            (status, error_of(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{name} twice: {body}"
        );
        assert!(body["message"].as_str().unwrap().contains(name), "{body}");
    }
    assert_eq!(deliveries(&c, &t, "acme:twice-1"), 0, "nothing delivered");
}

/// No token or a wrong one; `/v1/cluster` needs one too, an operator's; probes never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_401_without_a_valid_token_and_probes_need_none() {
    let (c, http, t) = cluster().await;
    let a = &c.urls[0];
    for token in [None, Some("wrong-token-0123456789")] {
        let (status, headers, body) = push(&http, a, &t, Push { token, ..acme() }).await;
        assert_eq!(
            (status, error_of(&body)),
            (StatusCode::UNAUTHORIZED, "unauthorized")
        );
        assert_eq!(headers["www-authenticate"], "Bearer");
    }
    assert_eq!(
        get(&http, &format!("{a}/v1/cluster"), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(&http, &format!("{a}/v1/cluster"), Some(ACME)).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get(&http, &format!("{a}/v1/cluster"), Some(OPERATOR))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        get(&http, &format!("{a}/readyz"), None).await.0,
        StatusCode::OK
    );
    // Another method on the push route is a 405 before any token check, as on every
    // other route (a push is answered ahead of the router; the rest is not).
    let request = Request::get(format!("{a}/v1/terminals/{t}/push"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, body) = send(&http, request).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    assert_eq!(headers["allow"], "POST");
}

/// A valid id that is not in the directory, answered by the owner, also via a forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_404_for_a_terminal_not_in_the_directory() {
    let (c, http, _) = cluster().await;
    for base in &c.urls {
        let (status, _, body) = push(&http, base, "pos-nobody", acme()).await;
        assert_eq!(
            (status, error_of(&body)),
            (StatusCode::NOT_FOUND, "unknown_terminal")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_413_over_max_push_bytes_and_415_for_an_encoded_body() {
    let (c, http, t) = cluster().await;
    let big = "x".repeat(2000);
    let p = Push {
        body: &big,
        ..acme()
    };
    let (status, _, body) = push(&http, &c.urls[1], &t, p).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    // A compressed body would reach the terminal as the push itself: refused, and
    // nothing delivered; `identity` is no encoding.
    for (encoding, expected) in [
        ("gzip", StatusCode::UNSUPPORTED_MEDIA_TYPE),
        ("identity", StatusCode::OK),
    ] {
        let key = format!("encoded-{encoding}");
        let request = Request::post(format!("{}/v1/terminals/{t}/push", c.urls[0]))
            .header("authorization", format!("Bearer {ACME}"))
            .header("idempotency-key", key.as_str())
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .body(Full::new(Bytes::from_static(b"\x1f\x8b\x08\x00")))
            .unwrap();
        let (status, _, body) = send(&http, request).await;
        assert_eq!(status, expected, "{encoding}: {body}");
        let delivered = usize::from(expected == StatusCode::OK);
        assert_eq!(deliveries(&c, &t, &format!("acme:{key}")), delivered);
    }
}

/// No session by the deadline; `Retry-After` set.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_503_terminal_unavailable_without_a_session_by_the_deadline() {
    let (c, http, _) = cluster().await;
    let p = Push {
        query: "?timeout_ms=300",
        ..acme()
    };
    let (status, headers, body) = push(&http, &c.urls[0], "pos-offline", p).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "terminal_unavailable")
    );
    assert_eq!(headers["retry-after"], "1");
}

/// A second push waiting for the same terminal (cap 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_503_overloaded_while_another_push_waits_for_the_terminal() {
    let (c, http, _) = cluster().await;
    let (a, b) = (&c.urls[0], &c.urls[1]);
    let slow = Push {
        query: "?timeout_ms=1500",
        ..acme()
    };
    let quick = Push {
        query: "?timeout_ms=300",
        ..acme()
    };
    let (first, second) = tokio::join!(push(&http, a, "pos-offline", slow), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        push(&http, b, "pos-offline", quick).await
    });
    assert_eq!(error_of(&first.2), "terminal_unavailable");
    assert_eq!(
        (second.0, error_of(&second.2)),
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
    );
}

/// One tenant at its share of the pod's in-flight pushes is refused; another is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_503_overloaded_for_a_tenant_at_its_share_only() {
    let settings = PushConfig {
        max_inflight_per_tenant: 1,
        ..PushConfig::default()
    };
    let c = Cluster::start(2, 100, &[("pos-offline", "127.0.0.1:1")], settings).await;
    let (http, t) = (client(), c.ids()[0].clone());
    let a = &c.urls[0];
    let waiting = Push {
        query: "?timeout_ms=2000",
        ..acme()
    };
    let (held, (acme_again, bank)) = tokio::join!(push(&http, a, "pos-offline", waiting), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::join!(
            push(&http, a, &t, acme()),
            push(&http, a, &t, Push::new(BANK))
        )
    });
    assert_eq!(error_of(&held.2), "terminal_unavailable");
    assert_eq!(
        (acme_again.0, error_of(&acme_again.2)),
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
        "{}",
        acme_again.2
    );
    assert!(acme_again.2["message"].as_str().unwrap().contains("tenant"));
    assert_eq!(bank.0, StatusCode::OK, "{}", bank.2);
    // The slot is back once the waiting push ended.
    assert_eq!(push(&http, a, &t, acme()).await.0, StatusCode::OK);
}

/// The terminal answers non-2xx; stored, so a retry replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_502_pos_rejected_is_stored_and_replayed() {
    let (c, http, t) = cluster().await;
    let (a, b) = (&c.urls[0], &c.urls[1]);
    let refusing = FaultConfig {
        push_status: 503,
        ..FaultConfig::default()
    };
    c.farm.set_faults(refusing).unwrap();
    let (status, _, body) = push(&http, b, &t, keyed("refused-1")).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::BAD_GATEWAY, "pos_rejected")
    );
    assert_eq!(body["pos_status"], 503);
    c.farm.set_faults(FaultConfig::default()).unwrap();
    let (status, _, _) = push(&http, a, &t, keyed("refused-1")).await;
    assert_eq!(
        status,
        StatusCode::BAD_GATEWAY,
        "the stored answer is replayed"
    );
}

/// The terminal answers after the deadline: 504, delivery unknown; the same key while
/// that attempt is in flight: 409; a retry after the 504 is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_504_delivery_unknown_then_409_in_flight_then_a_retry_delivers() {
    let (c, http, t) = cluster().await;
    // The first attempt enters at the owner, where the key is reserved, the second at
    // the other pod, which forwards it there.
    let owner = c.owner_index(&t);
    let (a, b) = (&c.urls[owner], &c.urls[1 - owner]);
    let late = FaultConfig {
        response_latency_ms: 1_500,
        ..FaultConfig::default()
    };
    c.farm.set_faults(late).unwrap();
    let timed = || Push {
        query: "?timeout_ms=700",
        ..keyed("slow-1")
    };
    // The second attempt goes out once the first is in flight at the owner (not after a
    // fixed sleep, which a loaded machine can outrun; and not through a forward that
    // could still be on its way when the second one reserves the key).
    let (first, second) = tokio::join!(push(&http, a, &t, timed()), async {
        let waited = Instant::now();
        while !api::metrics(&http, a)
            .await
            .lines()
            .any(|l| l.starts_with("posgate_pushes_in_flight ") && !l.ends_with(" 0"))
        {
            assert!(
                waited.elapsed() < Duration::from_secs(5),
                "first push never in flight"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        push(&http, b, &t, timed()).await
    });
    assert_eq!(
        (first.0, error_of(&first.2)),
        (StatusCode::GATEWAY_TIMEOUT, "pos_timeout"),
        "{}",
        first.2
    );
    assert_eq!(first.2["delivery"], "unknown");
    assert_eq!(first.2["idempotency_key"], "slow-1");
    assert_eq!(
        (second.0, error_of(&second.2)),
        (StatusCode::CONFLICT, "idempotency_conflict")
    );
    c.farm.set_faults(FaultConfig::default()).unwrap();
    // After a 504 the caller may retry with the same key; it is delivered.
    let (status, _, _) = push(&http, b, &t, keyed("slow-1")).await;
    assert_eq!(status, StatusCode::OK);

    // Only the key the caller itself re-sent after its 504 may reach the terminal twice
    // (the terminal dedupes it by key); wait for the slow first attempt to land.
    let slow_deliveries = || {
        let report = c.farm.terminal_report(&t).unwrap();
        let n = deliveries(&c, &t, "acme:slow-1");
        (n, report.stats.keys_delivered_twice)
    };
    let waited = Instant::now();
    while slow_deliveries().0 < 2 && waited.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "[push] slow-1 deliveries, keys twice on {t}: {:?}",
        slow_deliveries()
    );
    assert!(slow_deliveries().0 >= 1);
    assert_eq!(
        c.farm.counters().keys_delivered_twice,
        u64::from(slow_deliveries().0 == 2),
        "no key but the one retried after a 504 reached a terminal twice"
    );
}

/// A forwarded push without a signature is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_401_for_an_unsigned_forwarded_push() {
    let (c, http, t) = cluster().await;
    let request = Request::post(format!("{}/internal/v1/push/{t}", c.urls[0]))
        .header("posgate-hop", "1")
        .header("posgate-tenant", "acme")
        .header("idempotency-key", "forged")
        .header("posgate-deadline-ms", "1000")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let (status, _, body) = send(&http, request).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
}
