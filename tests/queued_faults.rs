//! Pushes with a TTL through faults, with real processes: the shard owner killed
//! (`SIGKILL`) while copies of queued pushes are on their way, and the Redis master
//! killed under a Sentinel deployment with `--redis-wait-replicas 1` after its replicas
//! stopped following (the links stalled). What must hold: every push acknowledged with `202` ends
//! `delivered`, and each key is taken by its terminal once; a copy sent again (its
//! answer lost with the owner) reaches the terminal as a repeat it marks, never as a
//! second take; a push the replicas do not have is refused, not acknowledged.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use posgate::core::shard::shard_of;
use posgate::core::ShardId;
use posgate_pos_sim::FaultConfig;
use serde_json::Value;

use crate::support::binary::{request, terminal_pod, BinPod, API_TOKEN};
use crate::support::farm::{self, connect_limit, Farm};
use crate::support::gateway::Gateway;
use crate::support::pod::{Setup, SHARDS, STORE_TIMEOUT};
use crate::support::redis_ha::{HaOptions, RedisHa};
use crate::support::wait::{secs, wait_for};
use crate::support::RedisServer;

/// Terminals offline while the pushes are sent, of the farm's terminals, and pushes
/// with a TTL to each.
const DOWN: usize = 60;
const EACH: usize = 2;

/// `POST` a push with a TTL of 10 minutes to `terminal` with `key` through the pod on
/// `port`; the status and JSON body.
async fn push_later(port: u16, terminal: &str, key: &str) -> (u16, Value) {
    let head = format!(
        "POST /v1/terminals/{terminal}/push?ttl_s=600&timeout_ms=300 HTTP/1.1\r\n\
         Authorization: Bearer {API_TOKEN}\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\n"
    );
    let (status, body) = request(port, &head, "{\"amount\":1}", Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("{key}: no answer"));
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The state of the push with `key` to `terminal`, asked of the pod on `port`.
async fn state_of(port: u16, terminal: &str, key: &str) -> Option<String> {
    let head = format!(
        "GET /v1/terminals/{terminal}/pushes/{key} HTTP/1.1\r\nAuthorization: Bearer {API_TOKEN}\r\n"
    );
    let (_, body) = request(port, &head, "", Duration::from_secs(2)).await?;
    let body: Value = serde_json::from_str(&body).ok()?;
    Some(body["state"].as_str()?.to_string())
}

fn offline(farm: &Farm, terminals: &[String]) {
    let faults = FaultConfig {
        offline_terminals: terminals.to_vec(),
        // Each answer comes a second after the push is taken: copies are on their way
        // when the owner dies.
        answer_delay_ms: 1_000,
        ..FaultConfig::default()
    };
    farm.set_faults(faults).unwrap();
}

/// Every key was taken by its terminal exactly once; repeats are only the marked ones.
fn taken_once(farm: &Farm, keys: usize, test: &str) {
    let c = farm.counters();
    eprintln!(
        "[{test}] the farm: {} pushes answered 2xx, {} of them repeats answered with the marker",
        c.pushes_accepted, c.duplicate_deliveries
    );
    assert_eq!(
        c.pushes_accepted - c.duplicate_deliveries,
        keys as u64,
        "[{test}] each key taken once: {c:?}"
    );
    assert_eq!(
        (c.keys_forgotten_early, c.pushes_after_expiry),
        (0, 0),
        "[{test}] {c:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_killed_with_queued_pushes_on_their_way_loses_none_and_repeats_none() {
    let test = "queued-kill";
    let redis = RedisServer::start();
    let farm = Farm::with_directory(&redis, farm::config(200)).await;
    let mut pods: Vec<BinPod> = (0..3)
        .map(|i| {
            terminal_pod(
                &format!("kill-pod-{i}"),
                &redis.url(),
                &farm.ca_file,
                farm.dir.path(),
                &[],
            )
        })
        .collect();
    wait_for("every terminal connected", connect_limit(), || {
        farm.counters().terminals_connected == 200
    })
    .await;
    let down: Vec<String> = farm.ids[..DOWN].to_vec();
    offline(&farm, &down);
    let mut keys = Vec::new();
    for round in 0..EACH {
        for (i, t) in down.iter().enumerate() {
            let key = format!("{t}-{round}");
            let (status, body) = push_later(pods[i % 3].port, t, &key).await;
            assert_eq!(status, 202, "{key}: {body}");
            keys.push((t.clone(), key));
        }
    }
    // The pod that owns the most of them.
    let mut owned: BTreeMap<usize, usize> = BTreeMap::new();
    let mut serving: Vec<Vec<ShardId>> = Vec::new();
    for pod in &pods {
        let shards = pod.serving().await.expect("a pod answers");
        serving.push(shards.into_iter().map(|(s, _)| s).collect());
    }
    for t in &down {
        let shard = shard_of(t, SHARDS);
        if let Some(i) = serving.iter().position(|s| s.contains(&shard)) {
            *owned.entry(i).or_default() += 1;
        }
    }
    let (&victim, &terminals) = owned.iter().max_by_key(|(_, n)| **n).unwrap();
    // The terminals come back; a moment later, copies of the victim's pushes are on
    // their way (each terminal answers a second after it takes one).
    offline(&farm, &[]);
    let back = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    pods[victim].signal("-KILL");
    eprintln!(
        "[{test}] {} pushes acknowledged; killed the owner of {terminals} of their terminals {:.1} s after they came back",
        keys.len(),
        secs(back.elapsed())
    );
    let live: Vec<u16> = (0..3)
        .filter(|&i| i != victim)
        .map(|i| pods[i].port)
        .collect();
    let mut took = None;
    let started = Instant::now();
    'wait: while started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (t, key) in &keys {
            if state_of(live[0], t, key).await.as_deref() != Some("delivered") {
                continue 'wait;
            }
        }
        took = Some(started.elapsed());
        break;
    }
    let took = took.unwrap_or_else(|| panic!("[{test}] not every push delivered in 60 s"));
    eprintln!(
        "[{test}] every push delivered {:.1} s after the kill",
        secs(took)
    );
    taken_once(&farm, keys.len(), test);
    for (i, pod) in pods.iter_mut().enumerate() {
        if i != victim {
            pod.assert_running();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_with_replica_acknowledgements_loses_no_acknowledged_push() {
    let test = "queued-failover";
    // The stalled links must outlast the setup (see the option).
    let opts = HaOptions {
        failover_timeout: Some(Duration::from_secs(60)),
        ..HaOptions::default()
    };
    let (ha, master) = RedisHa::start(opts).await;
    let url = ha.url();
    let mut setup = Setup::default();
    setup.store.wait = Some(posgate::store::redis::Wait {
        replicas: 1,
        timeout: STORE_TIMEOUT / 4,
    });
    let mut gw = Gateway::start_at(master, &url, setup, 3, farm::config(200), test).await;
    ha.wait_replicated(2).await;
    let down: Vec<String> = gw.farm.ids[..DOWN].to_vec();
    offline(&gw.farm, &down);
    let http = crate::support::api::client();
    let mut acked = Vec::new();
    let mut refused = 0;
    for round in 0..EACH {
        if round == 1 {
            // The replicas stop following: a write now reaches the master only, and a
            // failover loses it. With --redis-wait-replicas 1 such a push is refused
            // (503, retry with the same key), never acknowledged.
            ha.stall_replication();
        }
        for (i, t) in down.iter().enumerate() {
            let key = format!("{t}-{round}");
            let p = crate::support::api::Push {
                token: Some(API_TOKEN),
                key: Some(&key),
                body: "{\"amount\": 1}",
                query: "?ttl_s=600&timeout_ms=300",
            };
            let base = &gw.pods[i % 3].url;
            let (status, _, body) = crate::support::api::push(&http, base, t, p).await;
            match status.as_u16() {
                202 => acked.push((t.clone(), key)),
                503 if round == 1 && body["error"] == "queue_unavailable" => refused += 1,
                other => panic!("{key}: {other} {body}"),
            }
        }
    }
    eprintln!(
        "[{test}] {} pushes acknowledged; after the replicas stopped following, {refused} refused",
        acked.len()
    );
    assert_eq!(
        acked.len(),
        DOWN,
        "[{test}] acknowledged only while the replicas followed"
    );
    // The master dies: with --redis-wait-replicas 1 every acknowledged push is on the
    // replica the sentinels promote.
    let old = ha.master_addr().await;
    gw.redis.stop();
    let (new, promoted) = ha.wait_failed_over(&old, Duration::from_secs(30)).await;
    eprintln!(
        "[{test}] master {old} killed, {new} promoted after {:.1} s",
        secs(promoted)
    );
    offline(&gw.farm, &[]);
    let pods: Vec<String> = gw.pods.iter().map(|p| p.url.clone()).collect();
    let all_delivered = || async {
        for (i, (t, key)) in acked.iter().enumerate() {
            let url = format!("{}/v1/terminals/{t}/pushes/{key}", pods[i % 3]);
            let (_, body) = crate::support::api::get(&http, &url, Some(API_TOKEN)).await;
            if body["state"] != "delivered" {
                return Some(format!("{key}: {body}"));
            }
        }
        None
    };
    let started = Instant::now();
    let mut left = None;
    while started.elapsed() < Duration::from_secs(60) {
        left = all_delivered().await;
        if left.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        left.is_none(),
        "[{test}] not every acknowledged push delivered: {left:?}"
    );
    eprintln!(
        "[{test}] every push delivered {:.1} s after the failover",
        secs(started.elapsed())
    );
    assert_eq!(
        acked.len(),
        DOWN,
        "[{test}] acknowledged only while the replicas followed"
    );
    // Each acknowledged key taken once; the refused ones were lost with the old master.
    taken_once(&gw.farm, acked.len(), test);
    gw.pods.clear();
}
