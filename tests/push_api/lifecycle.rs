//! A pod's readiness waits for the first dial of every terminal; callers that go away
//! leave no push counted in flight.

use std::time::{Duration, Instant};

use http::StatusCode;
use posgate::push::PushConfig;
use posgate_pos_sim::FaultConfig;

use super::{pod_config, Cluster, ACME};
use crate::support::api::{self, client, get};
use crate::support::farm::{self, Farm};
use crate::support::pod;
use crate::support::wait::wait_for_async;
use crate::support::RedisServer;

/// Callers that hang up while their push waits (here for a terminal that never answers)
/// leave nothing counted in flight once the pod notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_that_go_away_leave_no_push_in_flight() {
    use tokio::io::AsyncWriteExt;
    let c = Cluster::start(
        1,
        10,
        &[("pos-offline", "127.0.0.1:1")],
        PushConfig::default(),
    )
    .await;
    let addr = c.urls[0].trim_start_matches("http://").to_string();
    let body = "{}";
    let mut hung_up = Vec::new();
    for i in 0..5 {
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let request = format!(
            "POST /v1/terminals/pos-offline/push?timeout_ms=20000 HTTP/1.1\r\nhost: x\r\n\
             authorization: Bearer {ACME}\r\nidempotency-key: gone-{i}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        hung_up.push(tcp);
    }
    let http = client();
    let in_flight = || async {
        let text = api::metrics(&http, &c.urls[0]).await;
        api::scraped(&text, "posgate_pushes_in_flight")
    };
    let limit = Duration::from_secs(5);
    wait_for_async("the 5 pushes counted in flight", limit, || async {
        in_flight().await >= 5.0
    })
    .await;
    drop(hung_up);
    wait_for_async(
        "posgate_pushes_in_flight back at 0 after every caller went away",
        limit,
        || async { in_flight().await <= 0.0 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_waits_for_the_first_dial_of_every_terminal() {
    const TERMINALS: u64 = 100;
    let redis = RedisServer::start();
    let farm = Farm::with_directory(&redis, farm::config(TERMINALS)).await;
    // Slow handshakes and few at once: dialing everything takes seconds.
    let slow = FaultConfig {
        handshake_delay_ms: 700,
        ..FaultConfig::default()
    };
    farm.set_faults(slow).unwrap();
    let (listener, url) = pod::listen().await;
    let mut config = pod_config("ready-pod", &url, &farm, PushConfig::default());
    config.pos.dial_concurrency = 10;
    let _pod = pod::start_with_terminals(config, &redis.url(), listener);
    let http = client();
    let started = Instant::now();
    let mut reasons: Vec<String> = Vec::new();
    loop {
        let (status, body) = get(&http, &format!("{url}/readyz"), None).await;
        if status == StatusCode::OK {
            break;
        }
        let reason = body["reason"].as_str().unwrap_or_default().to_string();
        // Log each kind of reason once, not every count of undialed terminals.
        let kind = |r: &str| {
            r.trim_start_matches(|c: char| c.is_ascii_digit())
                .to_string()
        };
        if reasons.last().map(|r| kind(r)) != Some(kind(&reason)) {
            eprintln!("[ready] {:.2} s: {reason}", started.elapsed().as_secs_f64());
            reasons.push(reason);
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let accepted = farm.counters().sessions_accepted;
    eprintln!(
        "[ready] ready after {:.2} s with {accepted} sessions",
        started.elapsed().as_secs_f64()
    );
    assert!(
        reasons.iter().any(|r| r.ends_with("not dialed yet")),
        "readiness never waited for dials: {reasons:?}"
    );
    assert_eq!(
        accepted, TERMINALS,
        "ready before every terminal was dialed"
    );
    // Sticky: slower dials later (a rebalance) do not take readiness back.
    assert_eq!(
        get(&http, &format!("{url}/readyz"), None).await.0,
        StatusCode::OK
    );
}
