//! Pushes sent round-robin to all pods reach each terminal exactly once, from the
//! owner, also while a pod joins and when an owner crashes; an idempotency key belongs to
//! its terminal.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use posgate::push::PushConfig;

use super::{acme, error_of, start_pod, Cluster};
use crate::support::api::{client, push, Push};
use crate::support::pod;
use crate::support::wait::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn round_robin_pushes_reach_each_terminal_once_from_the_owner() {
    const PUSHES: usize = 10_000;
    const CONCURRENCY: usize = 64;
    let c = Arc::new(Cluster::start(3, 300, &[], PushConfig::default()).await);
    let http = client();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..CONCURRENCY {
        let (c, http, next) = (c.clone(), http.clone(), next.clone());
        tasks.spawn(async move {
            let mut wrong_owner = Vec::new();
            let mut failures = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= PUSHES {
                    return (wrong_owner, failures);
                }
                // A fixed pseudo-random terminal per push, so runs are repeatable.
                let t = &c.ids()[(i * 7919 + 13) % c.ids().len()];
                let key = format!("rr-{i}");
                let p = Push {
                    key: Some(&key),
                    ..acme()
                };
                let (status, _, body) = push(&http, &c.urls[i % c.urls.len()], t, p).await;
                if status != StatusCode::OK {
                    failures.push(format!("{i}: {status} {body}"));
                } else if body["pod"].as_str() != c.owner_of(t).as_deref() {
                    wrong_owner.push(i);
                }
            }
        });
    }
    let (mut wrong_owner, mut failures) = (Vec::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (w, f) = done.unwrap();
        wrong_owner.extend(w);
        failures.extend(f);
    }
    let took = started.elapsed();
    eprintln!(
        "[push] {PUSHES} pushes round-robin over 3 pods, {CONCURRENCY} at once: {:.2} s ({:.0}/s)",
        took.as_secs_f64(),
        PUSHES as f64 / took.as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        wrong_owner.is_empty(),
        "delivered by a pod that is not the owner: {wrong_owner:?}"
    );
    let counters = c.farm.counters();
    assert_eq!(counters.pushes_accepted, PUSHES as u64, "{counters:?}");
    assert_eq!(counters.keys_delivered_twice, 0);

    // The same key at once through two pods: one delivery; the other gets it too or 409.
    let t = c.ids()[1].clone();
    let (x, y) = tokio::join!(
        push(
            &http,
            &c.urls[0],
            &t,
            Push {
                key: Some("twice"),
                ..acme()
            }
        ),
        push(
            &http,
            &c.urls[1],
            &t,
            Push {
                key: Some("twice"),
                ..acme()
            }
        ),
    );
    let statuses = [x.0, y.0];
    assert!(statuses.contains(&StatusCode::OK), "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::CONFLICT),
        "{statuses:?}"
    );
    let delivered: HashMap<&str, usize> = c
        .farm
        .terminal_report(&t)
        .unwrap()
        .recent_pushes
        .iter()
        .filter(|p| p.idempotency_key == "acme:twice")
        .fold(HashMap::new(), |mut m, _| {
            *m.entry("twice").or_default() += 1;
            m
        });
    assert_eq!(delivered.get("twice"), Some(&1));
}

/// One tenant's key reused for a second terminal of the same owner is a second push: it
/// reaches that terminal, and never answers with the first terminal's stored result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idempotency_key_belongs_to_its_terminal() {
    let c = Cluster::start(2, 100, &[], PushConfig::default()).await;
    let http = client();
    let first = c.ids()[0].clone();
    let owner = c.owner_of(&first);
    let second = c.ids()[1..]
        .iter()
        .find(|t| c.owner_of(t) == owner)
        .expect("another terminal of the same owner")
        .clone();
    let keyed = || Push {
        key: Some("order-7"),
        ..acme()
    };
    for (base, terminal) in [(&c.urls[0], &first), (&c.urls[1], &second)] {
        let (status, _, body) = push(&http, base, terminal, keyed()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["terminal"], terminal.as_str(), "{body}");
    }
    for terminal in [&first, &second] {
        let report = c.farm.terminal_report(terminal).unwrap();
        let got = report
            .recent_pushes
            .iter()
            .filter(|p| p.idempotency_key == "acme:order-7")
            .count();
        assert_eq!(got, 1, "{terminal} received the push once");
    }
    // A deadline too short to send and hear the answer is refused as not delivered,
    // never sent as a push whose outcome would be unknown.
    let short = Push {
        key: Some("order-8"),
        query: "?timeout_ms=15",
        ..acme()
    };
    let (status, _, body) = push(&http, &c.urls[0], &first, short).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "terminal_unavailable"),
        "{body}"
    );
    let report = c.farm.terminal_report(&first).unwrap();
    assert!(!report
        .recent_pushes
        .iter()
        .any(|p| p.idempotency_key == "acme:order-8"));
    // And each terminal's own retry is still a replay.
    let (status, _, body) = push(&http, &c.urls[1], &first, keyed()).await;
    assert_eq!(
        (status, body["terminal"].as_str()),
        (StatusCode::OK, Some(first.as_str()))
    );
    assert_eq!(c.farm.counters().keys_delivered_twice, 0);
}

/// Outcome counts of a stream of pushes.
#[derive(Debug, Default)]
struct Tally {
    by_status: HashMap<u16, u64>,
    /// Answers that came later than the caller's deadline plus a grace.
    late: u64,
    slowest_ms: u128,
}

/// Sends pushes from `workers` loops (keys `{tag}-{worker}-{n}`, random terminals,
/// round-robin over `urls`) until `stop` is set; `timeout_ms` per push.
async fn push_stream(
    c: Arc<Cluster>,
    urls: Vec<String>,
    tag: &'static str,
    workers: usize,
    timeout_ms: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Tally {
    let http = client();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (c, urls, http, stop) = (c.clone(), urls.clone(), http.clone(), stop.clone());
        tasks.spawn(async move {
            let mut tally = Tally::default();
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = &c.ids()[(w * 7919 + n * 104_729) % c.ids().len()];
                let key = format!("{tag}-{w}-{n}");
                let query = format!("?timeout_ms={timeout_ms}");
                let p = Push {
                    key: Some(&key),
                    query: &query,
                    ..acme()
                };
                let sent = Instant::now();
                let (status, _, _) = push(&http, &urls[n % urls.len()], t, p).await;
                let took = sent.elapsed().as_millis();
                *tally.by_status.entry(status.as_u16()).or_default() += 1;
                // The answer is due by the deadline; allow scheduling slack on a busy
                // machine (the forwarder itself allows 250 ms for the owner's answer).
                if took > u128::from(timeout_ms) + 1_000 {
                    tally.late += 1;
                }
                tally.slowest_ms = tally.slowest_ms.max(took);
                n += 1;
            }
            tally
        });
    }
    let mut total = Tally::default();
    while let Some(done) = tasks.join_next().await {
        let t = done.unwrap();
        for (k, v) in t.by_status {
            *total.by_status.entry(k).or_default() += v;
        }
        total.late += t.late;
        total.slowest_ms = total.slowest_ms.max(t.slowest_ms);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pushes_survive_a_join_and_an_owner_crash() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut cluster = Cluster::start(3, 300, &[], PushConfig::default()).await;
    // A 4th pod joins while pushes flow to the first three.
    let (fourth, _) = start_pod(
        "push-pod-3",
        &cluster.redis.url(),
        &cluster.farm,
        PushConfig::default(),
    )
    .await;
    cluster.pods.push(fourth);
    let c = Arc::new(cluster);
    let urls = c.urls.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let stream = tokio::spawn(push_stream(
        c.clone(),
        urls,
        "join",
        16,
        5_000,
        stop.clone(),
    ));
    let joined = Instant::now();
    wait_for("the 4th pod to serve", Duration::from_secs(20), || {
        c.settled() && !pod::served(&c.pods[3]).is_empty()
    })
    .await;
    // Keep pushing a little past the handover.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let join = stream.await.unwrap();
    eprintln!(
        "[push] during the join ({:.2} s to settle): {join:?}",
        joined.elapsed().as_secs_f64()
    );
    assert_eq!(
        join.by_status.keys().copied().collect::<Vec<_>>(),
        [200],
        "{join:?}"
    );
    assert_eq!(join.late, 0);

    // The owner of some shards crashes (no release) while pushes are in flight, sent to
    // the survivors only: every caller gets an answer by its deadline.
    let stop = Arc::new(AtomicBool::new(false));
    let survivors = c.urls[1..].to_vec();
    let stream = tokio::spawn(push_stream(
        c.clone(),
        survivors,
        "crash",
        16,
        5_000,
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let crashed = Instant::now();
    c.pods[0].abort();
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    let crash = stream.await.unwrap();
    eprintln!(
        "[push] across the crash ({:.2} s of pushing after it): {crash:?}",
        crashed.elapsed().as_secs_f64()
    );
    assert_eq!(crash.late, 0, "every caller is answered by its deadline");
    let unexpected: Vec<u16> = crash
        .by_status
        .keys()
        .copied()
        .filter(|s| ![200, 503, 504].contains(s))
        .collect();
    assert!(unexpected.is_empty(), "{crash:?}");
    assert!(crash.by_status.get(&200).copied().unwrap_or(0) > 0);
    // No caller retried, so no key may reach a terminal twice.
    assert_eq!(c.farm.counters().keys_delivered_twice, 0);
}
