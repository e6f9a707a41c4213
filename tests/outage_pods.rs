//! Whole pods through Redis outages that are not a cut network, with a real
//! `redis-server`:
//!
//! - Redis turns into a read-only replica (`REPLICAOF` a dead port): every store call is
//!   refused with `READONLY` (the snapshot too), which the pods treat like an unreachable
//!   store, so a one-pod cluster (its own majority) and a three-pod one (every peer says
//!   "unreachable") keep serving every shard past the lease TTL and, after `REPLICAOF NO
//!   ONE`, re-claim them with higher epochs; nothing is given up;
//! - Redis frozen (SIGSTOP) under a running pod while a second pod starts: the new pod
//!   waits (not ready, no shard, no terminal dialed) and changes nothing for the running
//!   pod, which keeps every shard and keeps delivering pushes; once Redis is thawed the
//!   new pod joins like any other and the shards are shared without a session overlap.
//!
//! Timings are `CoreConfig::fast()` (lease TTL 3 s); each outage lasts 2.5 lease TTLs.
//! Measured values are printed (`--nocapture`).

use std::time::{Duration, Instant};

use http::StatusCode;
use posgate::pod::PodHandle;

use crate::support::api::{self, Push};
use crate::support::cluster::{core, Cluster, Kind, TestPod};
use crate::support::farm::{self, connect_limit, Farm};
use crate::support::pod::{self, served, Setup, SHARDS};
use crate::support::redis_server::free_port;
use crate::support::wait::{secs, wait_for, wait_for_async};
use crate::support::RedisServer;

/// How long each outage lasts: well past every lease deadline.
fn outage() -> Duration {
    core().lease_ttl * 5 / 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_whose_redis_turns_read_only_holds_its_shards_and_recovers() {
    read_only_redis_holds_every_shard(1, "readonly-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pods_whose_redis_turns_read_only_hold_their_shards_and_recover() {
    read_only_redis_holds_every_shard(3, "readonly-3").await;
}

/// `pods` pods converge, Redis becomes a read-only replica for [`outage`], then a
/// primary again: every shard is served by its owner throughout, held past its lease,
/// and re-claimed by the same owner with a higher epoch; nothing is given up.
async fn read_only_redis_holds_every_shard(pods: usize, test: &str) {
    let (cluster, _) = Cluster::converged_start(pods).await;
    let before = cluster.owners();

    let demoted = Instant::now();
    let dead = free_port().to_string();
    assert_eq!(
        cluster.redis.command(&["REPLICAOF", "127.0.0.1", &dead]),
        "+OK"
    );
    // What each pod tells its peers must be "unreachable" from the first refusal on,
    // never "reachable" for a moment in between (a read that a replica answered).
    let refused = |pod: &TestPod| !pod.handle.status.borrow().store.reachable();
    wait_for(
        "every pod to see the refusal",
        Duration::from_secs(2),
        || cluster.pods.iter().all(refused),
    )
    .await;
    let (mut fewest, mut samples, mut reachable) = (SHARDS as usize, 0, 0);
    while demoted.elapsed() < outage() {
        fewest = fewest.min(cluster.owners().len());
        reachable += cluster.pods.iter().filter(|p| !refused(p)).count();
        samples += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held: usize = cluster
        .pods
        .iter()
        .map(|p| {
            p.handle
                .status
                .borrow()
                .shards
                .iter()
                .filter(|s| s.suspended)
                .count()
        })
        .sum();
    eprintln!(
        "[{test}] {:.1} s of READONLY: at least {fewest} of {SHARDS} shards served throughout, \
         {held} held past their lease; store reported reachable in {reachable} of {samples} \
         samples",
        secs(outage())
    );
    assert_eq!(reachable, 0, "a READONLY redis counted as reachable");
    // A shard that stopped delivering for a while was parked (`Suspend`, then `Start`
    // again) or given up (`Stop`): the transitions say which, and when.
    let transitions: Vec<String> = cluster
        .events
        .since(demoted)
        .iter()
        .filter(|e| e.shard == 0 || e.kind != Kind::Start)
        .map(|e| {
            format!(
                "{:.3}s {} {:?} {}",
                secs(e.at - demoted),
                e.pod,
                e.kind,
                e.shard
            )
        })
        .collect();
    assert_eq!(
        fewest, SHARDS as usize,
        "shards not served during the refusal; transitions: {transitions:?}"
    );
    assert_eq!(
        held, SHARDS as usize,
        "every shard is held past its lease TTL"
    );
    let stops = cluster.events.stops_since(demoted);
    assert!(stops.is_empty(), "shards given up: {stops:?}");

    assert_eq!(cluster.redis.command(&["REPLICAOF", "NO", "ONE"]), "+OK");
    let took = cluster.wait_reclaimed_by_owners(&before).await;
    eprintln!(
        "[{test}] all shards re-claimed {:.3} s after REPLICAOF NO ONE",
        secs(took)
    );
    let c = core();
    tokio::time::sleep(c.member_ttl + c.debounce).await;
    assert!(cluster.converged().await);
    let stops = cluster.events.stops_since(demoted);
    assert!(stops.is_empty(), "shards given up: {stops:?}");
    cluster.shutdown(test).await;
}

/// Bearer token of the push API.
const TOKEN: &str = "outage-pods-token-0123456789";

/// A pod with terminals from `farm` and the push API, against `redis`.
async fn start_pod(name: &str, redis: &RedisServer, farm: &Farm) -> (PodHandle, String) {
    let tokens = format!("outage:{TOKEN}");
    pod::start_with_api(&Setup::default(), name, &redis.url(), farm, 1_000, &tokens).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_started_while_redis_is_frozen_waits_and_changes_nothing_then_joins() {
    const N: u64 = 200;
    let test = "start-in-outage";
    let redis = RedisServer::start();
    let farm = Farm::with_directory(&redis, farm::config(N)).await;
    let (a, a_url) = start_pod("pod-a", &redis, &farm).await;
    wait_for("pod-a to serve every terminal", connect_limit(), || {
        a.status.borrow().ready && farm.all_sessions_current(&[&a])
    })
    .await;
    let before = farm.counters();
    let http = api::client();

    let frozen = Instant::now();
    redis.freeze();
    let (b, b_url) = start_pod("pod-b", &redis, &farm).await;
    let mut sent = 0;
    while frozen.elapsed() < outage() {
        let (ready, _) = api::get(&http, &format!("{b_url}/readyz"), None).await;
        assert_ne!(ready, StatusCode::OK, "pod-b ready without redis");
        assert!(served(&b).is_empty(), "pod-b serves shards without redis");
        let status = b.status.borrow().clone();
        assert!(!status.registered && status.shards.iter().all(|s| !s.suspended));
        if served(&a).len() != SHARDS as usize {
            let metrics = api::metrics(&http, &a_url).await;
            let stops: Vec<&str> = metrics
                .lines()
                .filter(|l| l.contains("shard_stops"))
                .collect();
            panic!(
                "pod-a serves {} shards {:.3} s into the outage; stops: {stops:?}",
                served(&a).len(),
                secs(frozen.elapsed())
            );
        }
        // Every terminal still has its one session with pod-a: pod-b dialed nobody.
        assert!(farm.all_sessions_current(&[&a]), "sessions changed");
        let terminal = &farm.ids[sent % farm.ids.len()];
        let key = format!("{test}-{sent}");
        let push = Push {
            key: Some(&key),
            query: "?timeout_ms=2000",
            ..Push::new(TOKEN)
        };
        let (code, _, body) = api::push(&http, &a_url, terminal, push).await;
        assert_eq!(code, StatusCode::OK, "push {sent} to {terminal}: {body}");
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let during = farm.counters();
    eprintln!(
        "[{test}] {:.1} s frozen: pod-b not ready, no shard; pod-a served all {SHARDS} shards \
         and delivered all {sent} pushes sent through it",
        secs(outage())
    );
    assert_eq!(during.connections_opened, before.connections_opened);
    assert_eq!(during.connections_closed, before.connections_closed);

    redis.thaw();
    let took = wait_for_async(
        "pod-b to join and serve its share",
        Duration::from_secs(30),
        || async {
            let (ready, _) = api::get(&http, &format!("{b_url}/readyz"), None).await;
            let (ours, theirs) = (served(&a), served(&b));
            ready == StatusCode::OK
                && !theirs.is_empty()
                && ours.len() + theirs.len() == SHARDS as usize
                && farm.all_sessions_current(&[&a, &b])
        },
    )
    .await;
    let after = farm.counters();
    eprintln!(
        "[{test}] pod-b joined {:.3} s after the thaw and serves {} shards",
        secs(took),
        served(&b).len()
    );
    assert_eq!(after.raw_overlaps, 0);
    assert_eq!(after.session_overlaps, 0);
    assert_eq!(after.keys_delivered_twice, 0);
    pod::stop(vec![a, b]).await;
}
