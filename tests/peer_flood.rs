//! A stranger on the pod network flooding a `posgate serve` process's peer endpoints
//! with unsigned requests: every one refused and counted, the refusals logged at most
//! once a second, each line saying how many it stands for (on `main` before rate
//! limiting: one WARN line per request, 2,000 lines in 0.2 s).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use crate::support::api::{self, client};
use crate::support::binary;
use crate::support::farm::{self, Farm};
use crate::support::wait::wait_for_async;
use crate::support::RedisServer;

const REQUESTS: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_peer_requests_are_refused_counted_and_logged_once_a_second() {
    let redis = RedisServer::start();
    let t = Farm::with_directory(&redis, farm::config(10)).await;
    let mut pod = binary::terminal_pod("flooded-pod", &redis.url(), &t.ca_file, t.dir.path(), &[]);
    wait_for_async("the pod answers", Duration::from_secs(20), || async {
        pod.serving().await.is_some()
    })
    .await;
    let http = client();
    let started = Instant::now();
    for i in 0..REQUESTS {
        let request = Request::post(format!("{}/internal/v1/push/pos-{i}", pod.url()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let (status, _, _) = api::send(&http, request).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "request {i}");
    }
    let took = started.elapsed();
    // One more after the interval: its line says how many the first one stood for.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let request = Request::post(format!("{}/internal/v1/push/pos-last", pod.url()))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert_eq!(api::send(&http, request).await.0, StatusCode::UNAUTHORIZED);
    pod.assert_running();
    let scrape = api::metrics(&http, &pod.url()).await;
    let counted = api::scraped(
        &scrape,
        "posgate_peer_requests_refused_total{reason=\"unsigned\"}",
    );
    // The log is written as the process goes; the last line may trail the last answer.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = pod.log_lines_with(&["peer request refused", "\"unsigned\""]);
    let suppressed: u64 = lines
        .iter()
        .filter_map(|l| {
            let rest = l.split("\"suppressed_since_last_line\":").nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    eprintln!(
        "[peer-flood] {REQUESTS} unsigned requests in {took:.1?} and one more a second later: \
         {counted} counted, {} log lines standing for {} more",
        lines.len(),
        suppressed
    );
    let sent = REQUESTS as u64 + 1;
    assert_eq!(counted, sent as f64, "every refusal counted");
    let seconds = took.as_secs() as usize + 3;
    assert!(
        lines.len() >= 2 && lines.len() <= seconds,
        "{} lines for a flood of {took:?} and one more: at most one a second",
        lines.len()
    );
    // Every refusal is a line or counted on the next: the last line ends the count.
    assert_eq!(lines.len() as u64 + suppressed, sent, "{lines:#?}");
}
