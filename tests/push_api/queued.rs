//! Pushes with a TTL (`?ttl_s=`) end to end: stored while their terminal is offline
//! (`202`), delivered in acceptance order right after it says hello again, with a
//! status per push and an outcome feed; expiry, collapse keys, cancelling, and a push
//! Redis lost (`lost` to a caller naming its generation).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http::{Request, StatusCode};
use http_body_util::Full;
use posgate::push::PushConfig;
use posgate_pos_sim::FaultConfig;
use serde_json::Value;

use super::{Cluster, ACME};
use crate::support::api::{self, client, push, Http, Push};
use crate::support::wait::{wait_for, wait_for_async};

/// A push as acme with `key`, waiting up to `ttl_s` for its terminal.
fn later<'a>(key: &'a str, query: &'a str) -> Push<'a> {
    Push {
        key: Some(key),
        query,
        ..Push::new(ACME)
    }
}

/// `method url` as acme; the status and JSON body.
async fn call(http: &Http, method: &str, url: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(url)
        .header("authorization", format!("Bearer {ACME}"))
        .body(Full::default())
        .unwrap();
    let (status, _, body) = api::send(http, request).await;
    (status, body)
}

/// The keys a terminal took, in the order it took them (the farm keeps the last 32).
fn taken(c: &Cluster, terminal: &str) -> Vec<String> {
    c.farm
        .terminal_report(terminal)
        .unwrap()
        .recent_pushes
        .into_iter()
        .map(|p| p.idempotency_key.trim_start_matches("acme:").to_string())
        .collect()
}

/// Takes `terminals` offline (every other back online) and waits until their owners see
/// them without a session: a push sent before that may leave on a connection the farm is
/// still tearing down, and rightly end `unknown` (a copy may have arrived) instead of
/// waiting for the terminal.
async fn offline(c: &Cluster, http: &Http, terminals: &[String]) {
    let faults = FaultConfig {
        offline_terminals: terminals.to_vec(),
        ..FaultConfig::default()
    };
    c.farm.set_faults(faults).unwrap();
    for t in terminals {
        let url = format!("{}/v1/terminals/{t}", c.urls[0]);
        let what = format!("{t} without a session at its owner");
        wait_for_async(&what, Duration::from_secs(10), || async {
            call(http, "GET", &url).await.1["connected"] == false
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pushes_wait_for_offline_terminals_and_arrive_in_order_after_their_hello() {
    const DOWN: usize = 200;
    const EACH: usize = 5;
    let c = Cluster::start(3, 400, &[], PushConfig::default()).await;
    let http = client();
    let down: Vec<String> = c.ids()[..DOWN].to_vec();
    offline(&c, &http, &down).await;
    // Sent through every pod in turn: most are forwarded to the owner, which stores them
    // and, its terminal backing off, answers at once.
    let started = Instant::now();
    let mut generations = std::collections::BTreeSet::new();
    for round in 0..EACH {
        // One round at a time (each push's place in its queue is its round), its pushes
        // at once.
        let answers = futures::stream::iter(down.iter().enumerate())
            .map(|(i, t)| {
                let (http, base) = (&http, &c.urls[(i + round) % c.urls.len()]);
                async move {
                    let key = format!("{t}-{round}");
                    let query = "?ttl_s=600&timeout_ms=300";
                    let (status, _, body) = push(http, base, t, later(&key, query)).await;
                    (key, status, body)
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
        for (key, status, body) in answers {
            assert_eq!(status, StatusCode::ACCEPTED, "{key}: {body}");
            assert_eq!(body["state"], "queued", "{body}");
            assert_eq!(body["position"], round + 1, "{body}");
            let accepted = body["accepted_ms"].as_u64().unwrap();
            assert_eq!(body["expires_ms"].as_u64().unwrap() - accepted, 600_000);
            generations.insert(body["generation"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(generations.len(), 1, "{generations:?}");
    eprintln!(
        "[queued] {} pushes to {DOWN} offline terminals answered 202 in {:.1} s",
        DOWN * EACH,
        started.elapsed().as_secs_f64()
    );
    // None reached a terminal; the other terminals still take pushes at once.
    assert!(down.iter().all(|t| taken(&c, t).is_empty()));
    let up = &c.ids()[DOWN];
    let (status, _, body) = push(&http, &c.urls[0], up, later("up-now", "?ttl_s=60")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a connected terminal takes it at once: {body}"
    );
    assert_eq!(taken(&c, up), ["up-now"]);

    // The terminals come back: each gets its five, in acceptance order, soon after its
    // session is up again.
    offline(&c, &http, &[]).await;
    wait_for(
        "every queued push delivered",
        Duration::from_secs(90),
        || down.iter().all(|t| taken(&c, t).len() == EACH),
    )
    .await;
    let mut lags = Vec::new();
    for t in &down {
        let want: Vec<String> = (0..EACH).map(|r| format!("{t}-{r}")).collect();
        assert_eq!(taken(&c, t), want, "{t}: in acceptance order");
        let report = c.farm.terminal_report(t).unwrap();
        let opened = report.open_connections[0].opened_unix_ms;
        let last = report.recent_pushes.last().unwrap().at_unix_ms;
        lags.push(last.saturating_sub(opened));
    }
    lags.sort();
    let worst = *lags.last().unwrap();
    eprintln!(
        "[queued] last push of a terminal after its session opened: p50 {} ms, max {worst} ms",
        lags[lags.len() / 2]
    );
    assert!(
        worst < 10_000,
        "all five within 10 s of the hello: {worst} ms"
    );
    let counters = c.farm.counters();
    assert_eq!(counters.keys_delivered_twice, 0, "{counters:?}");
    // With "up-now", which went through the queue too.
    assert_eq!(
        counters.queued_pushes,
        (DOWN * EACH) as u64 + 1,
        "{counters:?}"
    );
    assert_eq!(counters.pushes_after_expiry, 0, "{counters:?}");

    // Every push says delivered, through any pod.
    let mut states = BTreeMap::new();
    for (i, t) in down.iter().enumerate() {
        for round in 0..EACH {
            let url = format!("{}/v1/terminals/{t}/pushes/{t}-{round}", c.urls[i % 3]);
            let (status, body) = call(&http, "GET", &url).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            *states
                .entry(body["state"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
    }
    assert_eq!(
        states,
        BTreeMap::from([("delivered".to_string(), DOWN * EACH)])
    );
    // A retry of a delivered key is answered from the store, without a second copy.
    let t = &down[0];
    let (status, _, body) =
        push(&http, &c.urls[1], t, later(&format!("{t}-0"), "?ttl_s=600")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(taken(&c, t).len(), EACH);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_push_is_never_sent_and_collapse_keys_and_cancels_keep_only_the_last() {
    let c = Cluster::start(2, 20, &[], PushConfig::default()).await;
    let http = client();
    let t = c.ids()[0].clone();
    offline(&c, &http, std::slice::from_ref(&t)).await;
    let queued = |key: &'static str, query: &'static str| later(key, query);
    let send = |p: Push<'static>| {
        let (http, base, t) = (&http, c.urls[1].clone(), t.clone());
        async move { push(http, &base, &t, p).await }
    };
    let (status, _, body) = send(queued("short", "?ttl_s=3&timeout_ms=200")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    // Counted as kept for later, not as a failure (PosgatePushErrorRatio leaves it out).
    let metrics = api::metrics(&http, &c.urls[1]).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("posgate_push_requests_total{")
                && l.contains("result=\"queued\"")),
        "{metrics}"
    );
    for key in ["menu-1", "menu-2", "menu-3"] {
        let (status, _, body) =
            send(queued(key, "?ttl_s=600&collapse_key=menu&timeout_ms=200")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        // Behind "short"; each replaces the one before it.
        assert_eq!(body["position"], 2, "{key}: {body}");
    }
    let (status, _, body) = send(queued("cancel-me", "?ttl_s=600&timeout_ms=200")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let base = &c.urls[0];
    let url = |key: &str| format!("{base}/v1/terminals/{t}/pushes/{key}");
    let (status, body) = call(&http, "DELETE", &url("cancel-me")).await;
    assert_eq!(
        (status, &body["state"]),
        (StatusCode::OK, &"cancelled".into()),
        "{body}"
    );
    let (status, body) = call(&http, "DELETE", &url("cancel-me")).await;
    assert_eq!(
        (status, &body["error"]),
        (StatusCode::GONE, &"push_ended".into()),
        "{body}"
    );

    // The short one expires while the terminal is down; then it comes back.
    tokio::time::sleep(Duration::from_secs(4)).await;
    offline(&c, &http, &[]).await;
    wait_for("menu-3 delivered", Duration::from_secs(60), || {
        taken(&c, &t).contains(&"menu-3".to_string())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        taken(&c, &t),
        ["menu-3"],
        "only the last menu: never the expired, replaced or cancelled"
    );
    assert_eq!(c.farm.counters().pushes_after_expiry, 0);
    for (key, state) in [
        ("short", "expired"),
        ("menu-1", "replaced"),
        ("menu-2", "replaced"),
        ("menu-3", "delivered"),
        ("cancel-me", "cancelled"),
    ] {
        let (status, body) = call(&http, "GET", &url(key)).await;
        assert_eq!(
            (status, body["state"].as_str()),
            (StatusCode::OK, Some(state)),
            "{key}: {body}"
        );
    }
    let (_, body) = call(&http, "GET", &url("menu-1")).await;
    assert_eq!(body["replaced_by"], "menu-2");
    // A retried POST of an ended push says how it ended.
    let (status, _, body) = send(queued("short", "?ttl_s=3")).await;
    assert_eq!(
        (status, &body["state"]),
        (StatusCode::GONE, &"expired".into()),
        "{body}"
    );
    // The feed has every outcome once, in order, and pages by its cursor.
    let (status, body) = call(&http, "GET", &format!("{base}/v1/feedback?limit=10")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let keys: Vec<(&str, &str)> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["idempotency_key"].as_str().unwrap(),
                e["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            ("menu-1", "replaced"),
            ("menu-2", "replaced"),
            ("cancel-me", "cancelled"),
            ("short", "expired"),
            ("menu-3", "delivered")
        ]
    );
    let cursor = body["cursor"].as_str().unwrap();
    let (_, body) = call(&http, "GET", &format!("{base}/v1/feedback?cursor={cursor}")).await;
    assert_eq!(body["events"], Value::Array(vec![]), "{body}");

    // Redis loses its data (a restart without persistence): a push it held is `lost` to
    // a caller naming the generation its 202 named, and it never reaches the terminal.
    offline(&c, &http, std::slice::from_ref(&t)).await;
    let (status, _, body) = send(queued("wiped", "?ttl_s=600&timeout_ms=200")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let generation = body["generation"].as_str().unwrap().to_string();
    assert_eq!(c.redis.command(&["FLUSHALL"]), "+OK");
    let lookup = format!("{}?generation={generation}", url("wiped"));
    let (status, body) = call(&http, "GET", &lookup).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("lost")),
        "{body}"
    );
    assert_ne!(
        body["generation"].as_str(),
        Some(generation.as_str()),
        "{body}"
    );
    let (status, body) = call(&http, "GET", &url("wiped")).await;
    assert_eq!(
        (status, &body["error"]),
        (StatusCode::NOT_FOUND, &"unknown_push".into()),
        "{body}"
    );
    offline(&c, &http, &[]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!taken(&c, &t).contains(&"wiped".to_string()));
}

/// A copy whose answer is lost is sent again only while the terminal's dedup window
/// (`--idempotency-ttl`, which terminals must honour) still covers it; after that the
/// push ends `unknown` and no copy follows, because a terminal that forgot the key would
/// take it again. Here the terminal takes every push but answers after the pod stopped
/// waiting: the window is 4 s, a copy waits 1 s, the skew allowance is 0.5 s, so a
/// second copy may leave up to 2.5 s after the first, and none after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_answer_is_sent_again_only_within_the_window_then_ends_unknown() {
    const WINDOW: Duration = Duration::from_secs(4);
    let mut farm = crate::support::farm::config(4);
    farm.dedup.window = WINDOW;
    let mut settings = PushConfig {
        idempotency_ttl: WINDOW,
        ..PushConfig::default()
    };
    settings.queue.copy_timeout = Duration::from_secs(1);
    let c = Cluster::start_farm(2, farm, settings).await;
    let http = client();
    let t = c.ids()[0].clone();
    c.farm
        .set_faults(FaultConfig {
            answer_delay_ms: 1_500,
            ..FaultConfig::default()
        })
        .unwrap();
    let (status, _, body) = push(
        &http,
        &c.urls[0],
        &t,
        later("slow", "?ttl_s=120&timeout_ms=300"),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let url = format!("{}/v1/terminals/{t}/pushes/slow", c.urls[1]);
    let ended = Instant::now();
    let mut body = Value::Null;
    while ended.elapsed() < Duration::from_secs(20) {
        (_, body) = call(&http, "GET", &url).await;
        if body["state"] == "unknown" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(body["state"], "unknown", "{body}");
    assert_eq!(
        body["copies"], 2,
        "one copy and one resend within the window: {body}"
    );
    let (sent, at) = (
        body["sent_ms"].as_u64().unwrap(),
        body["final_ms"].as_u64().unwrap(),
    );
    assert!(
        at - sent >= 2_500,
        "given up only once no copy could be covered: {body}"
    );
    // Nothing more reaches the terminal, also after its window has passed.
    tokio::time::sleep(WINDOW + Duration::from_secs(2)).await;
    let copies: Vec<u64> = c
        .farm
        .terminal_report(&t)
        .unwrap()
        .recent_pushes
        .iter()
        .filter(|p| p.idempotency_key == "acme:slow")
        .map(|p| p.at_unix_ms)
        .collect();
    assert_eq!(copies.len(), 2, "{copies:?}");
    assert!(
        copies[1] - copies[0] < WINDOW.as_millis() as u64,
        "the resend was inside the window: {copies:?}"
    );
    let counters = c.farm.counters();
    assert_eq!(
        counters.duplicate_deliveries, 1,
        "the resend was answered as a repeat: {counters:?}"
    );
    assert_eq!(counters.pushes_after_expiry, 0, "{counters:?}");
}
