//! End to end: two whole pods (`Pod::start_with_terminals`: driver, HTTP and the POS
//! connection manager) against a real `redis-server` and a `PosFarm` of 2,000 simulated
//! terminals (TLS + HTTP/2 on loopback), the terminals imported into the Redis directory.
//!
//! Checks that every terminal gets a session from the owner of its shard, and that a
//! graceful shutdown of one pod moves its terminals to the other without two connections
//! to one terminal at any moment (the farm's `raw_overlaps`). Pushes to a sample of
//! terminals before and after the move, each retried with the same key (before the move
//! through the other pod), reach every terminal once per key: the owner's idempotency
//! cache answers the retry. Measured durations and the farm counters are printed
//! (`--nocapture`).
//!
//! Timings are `CoreConfig::fast()` (lease TTL 3 s, renew 1 s, close budget 300 ms);
//! each pod dials at most 1,000 terminals per second.

use std::time::{Duration, Instant};

use posgate::pod::PodHandle;
use posgate::store::directory::DirectoryAdmin;
use posgate::store::redis::RedisStore;

use crate::support::api::{self, Http, Push};
use crate::support::farm::{self, Farm};
use crate::support::pod::{self, store_options, Setup, CLUSTER, SHARDS};
use crate::support::wait::wait_for;
use crate::support::RedisServer;

const TERMINALS: u64 = 2_000;
const API_TOKEN: &str = "pos-connections-test-token-0123456789";
/// Terminals pushed to before and after the move, one key each, every key sent twice.
const PUSHED: usize = 100;

/// A pod dialing at most 1,000 terminals per second, and the base URL of its HTTP API.
async fn start_pod(i: usize, redis_url: &str, farm: &Farm) -> (PodHandle, String) {
    let name = format!("pos-pod-{i}");
    let tokens = format!("e2e:{API_TOKEN}");
    pod::start_with_api(&Setup::default(), &name, redis_url, farm, 1_000, &tokens).await
}

/// Pushes to each of `terminals` with its own key `{tag}-{i}` through `first[i % 2]`,
/// then again with the same key and body through `retry[i % 2]`: both must be 200 and
/// name the same owner and epoch. Returns the keys sent.
async fn push_with_retries(
    http: &Http,
    terminals: &[&String],
    tag: &str,
    first: [&str; 2],
    retry: [&str; 2],
) -> usize {
    for (i, terminal) in terminals.iter().enumerate() {
        let key = format!("{tag}-{i}");
        let body = format!("{{\"amount\": {i}}}");
        let keyed = || Push {
            key: Some(&key),
            body: &body,
            ..Push::new(API_TOKEN)
        };
        let (status, _, mut sent) = api::push(http, first[i % 2], terminal, keyed()).await;
        assert_eq!(status, 200, "{terminal} {key}: {sent}");
        let (status, _, mut again) = api::push(http, retry[i % 2], terminal, keyed()).await;
        assert_eq!(status, 200, "{terminal} {key} again: {again}");
        // The answering pod sets its own latency; the rest is the owner's answer.
        for answer in [&mut sent, &mut again] {
            answer.as_object_mut().unwrap().remove("latency_ms");
        }
        assert_eq!(again, sent, "{terminal} {key}: the same delivery");
    }
    terminals.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pods_connect_every_terminal_and_hand_over_gracefully() {
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let farm = Farm::start(farm::config(TERMINALS)).await;
    let admin = RedisStore::connect(&redis.url(), CLUSTER, store_options())
        .await
        .unwrap();
    let summary = admin.upsert(SHARDS, &farm.entries()).await.unwrap();
    eprintln!("[pos] directory import: {summary}");
    assert_eq!(admin.count(SHARDS).await.unwrap(), TERMINALS);

    let started = Instant::now();
    let (pod0, url0) = start_pod(0, &redis.url(), &farm).await;
    let (pod1, url1) = start_pod(1, &redis.url(), &farm).await;
    let mut pods = vec![pod0, pod1];
    let took = wait_for("2,000 accepted sessions", Duration::from_secs(20), || {
        farm.counters().sessions_accepted >= TERMINALS
    })
    .await;
    eprintln!(
        "[pos] 2 pods: {TERMINALS} accepted sessions after {:.3} s",
        took.as_secs_f64()
    );
    wait_for(
        "every terminal with a session from its shard's owner",
        Duration::from_secs(15),
        || farm.all_sessions_current(&[&pods[0], &pods[1]]),
    )
    .await;
    let served = |p: &PodHandle| pod::served(p).len();
    eprintln!(
        "[pos] every terminal current after {:.3} s; shards served: {} + {}",
        started.elapsed().as_secs_f64(),
        served(&pods[0]),
        served(&pods[1])
    );
    // Every retry goes through the pod the first push did not: for about half of the
    // terminals that is the owner itself, for the others a forward to it.
    let http = api::client();
    let ids = &farm.ids;
    let sample: Vec<&String> = ids.iter().step_by(ids.len() / PUSHED).collect();
    let pushed = Instant::now();
    let mut keys =
        push_with_retries(&http, &sample, "before", [&url0, &url1], [&url1, &url0]).await;
    eprintln!(
        "[pos] {keys} keys pushed twice each (retry through the other pod) in {:.3} s",
        pushed.elapsed().as_secs_f64()
    );
    let before = farm.counters();
    eprintln!("[pos] counters before the move: {before:?}");
    assert_eq!(before.raw_overlaps, 0, "raw overlaps before the move");
    assert_eq!(before.terminals_connected, TERMINALS);

    // Graceful shutdown of pod 0: its shards move to pod 1.
    let moved = Instant::now();
    pods[0].shutdown();
    tokio::time::timeout(Duration::from_secs(10), pods[0].wait())
        .await
        .expect("graceful shutdown ends in time")
        .unwrap();
    eprintln!(
        "[pos] pod 0 shut down gracefully in {:.3} s",
        moved.elapsed().as_secs_f64()
    );
    let survivor = pods.pop().unwrap();
    wait_for(
        "every terminal with a session from the remaining pod",
        Duration::from_secs(20),
        || served(&survivor) == SHARDS as usize && farm.all_sessions_current(&[&survivor]),
    )
    .await;
    eprintln!(
        "[pos] all {TERMINALS} terminals on the remaining pod {:.3} s after the shutdown began",
        moved.elapsed().as_secs_f64()
    );
    keys += push_with_retries(&http, &sample, "after", [&url1; 2], [&url1; 2]).await;
    let after = farm.counters();
    eprintln!("[pos] counters after the move: {after:?}");
    assert_eq!(
        after.raw_overlaps, 0,
        "raw overlaps during the graceful move"
    );
    assert_eq!(
        after.keys_delivered_twice, 0,
        "a retried key delivered twice"
    );
    assert_eq!(after.pushes_accepted, keys as u64, "one delivery per key");
    assert_eq!(after.terminals_connected, TERMINALS);
    assert!(
        after.sessions_accepted >= before.sessions_accepted,
        "sessions accepted went backwards"
    );

    let mut survivor = survivor;
    survivor.shutdown();
    tokio::time::timeout(Duration::from_secs(10), survivor.wait())
        .await
        .expect("graceful shutdown ends in time")
        .unwrap();
    eprintln!(
        "[pos] test took {:.3} s",
        test_started.elapsed().as_secs_f64()
    );
}
