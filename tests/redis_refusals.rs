//! A Redis that answers but cannot serve now, produced for real with `redis-server`: a
//! read-only replica (`READONLY`), out of memory (`OOM`), loading its data set
//! (`LOADING`), a replica cut from its master that does not serve stale data
//! (`MASTERDOWN`), busy with someone else's script (`BUSY`). Every `RedisStore` call
//! fails as `StoreError::Refused` with that code — the snapshot too, which reads almost
//! only, so the pod never sees a store that answers and fails by turns — and every call
//! succeeds again once the condition ends. A flushed script cache (`NOSCRIPT`) is
//! reloaded within the call.
//!
//! The pod treats `Refused` like an unreachable store (`outage_pods.rs` shows a pod
//! holding its shards through `READONLY`).

use crate::support::leases::Deletes;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::redis_server::free_port;
use crate::support::RedisServer;
use crate::support::{leases, pod};
use posgate::core::lease::Checked;
use posgate::core::membership::Member;
use posgate::core::placement::Placement;
use posgate::core::PodId;
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate::store::{ClusterMeta, CoordStore, StoreError};

const SHARDS: u32 = 4;
const TTL: Duration = Duration::from_secs(30);
const OPTIONS: RedisOptions = RedisOptions {
    response_timeout: Duration::from_millis(500),
    connect_timeout: Duration::from_millis(500),
    ca_file: None,
    client_cert: None,
    sentinel_password: None,
    wait: None,
};

fn pod() -> PodId {
    PodId::new("pod-a").unwrap()
}

fn member() -> Member {
    pod::member(pod().as_str())
}

/// A store on `redis` holding shard 0 and a placement; the generation id.
async fn holding(redis: &RedisServer) -> (RedisStore, String) {
    let store = RedisStore::connect(&redis.url(), "test", OPTIONS)
        .await
        .expect("connect");
    let generation = store.snapshot(SHARDS).await.unwrap().generation.id;
    let meta = ClusterMeta::current(SHARDS);
    store.pin_meta(&meta).await.unwrap();
    let beat = store.heartbeat(&generation, &member(), &meta, TTL).await;
    assert!(matches!(beat, Ok(Checked::Ok(_))), "{beat:?}");
    let claim = leases::acquire(&store, &generation, &pod(), &[0], TTL).await;
    assert!(matches!(claim, Ok(Checked::Ok(_))), "{claim:?}");
    let placement = Placement::initial(&[pod()], SHARDS);
    assert!(store.place(None, &placement).await.unwrap());
    (store, generation)
}

/// Every `CoordStore` call once (none of them would change anything that matters here
/// if it succeeded), by name.
async fn every_call(
    store: &RedisStore,
    generation: &str,
) -> Vec<(&'static str, Result<(), StoreError>)> {
    let meta = ClusterMeta::current(SHARDS);
    let placement = Placement::initial(&[pod()], SHARDS).next(&[pod()], SHARDS);
    vec![
        ("snapshot", store.snapshot(SHARDS).await.map(drop)),
        ("pin_meta", store.pin_meta(&meta).await),
        (
            "heartbeat",
            store
                .heartbeat(generation, &member(), &meta, TTL)
                .await
                .map(drop),
        ),
        (
            "acquire",
            leases::acquire(store, generation, &pod(), &[1], TTL)
                .await
                .map(drop),
        ),
        (
            "renew",
            leases::renew(store, generation, &pod(), &[0], TTL)
                .await
                .map(drop),
        ),
        ("place", store.place(Some(1), &placement).await.map(drop)),
        ("release", store.delete(&pod(), &[2], None).await.map(drop)),
        (
            "deregister",
            store.deregister(&PodId::new("pod-gone").unwrap()).await,
        ),
    ]
}

/// Every call fails as `Refused` with `code`.
async fn assert_refused(store: &RedisStore, generation: &str, code: &str) {
    for (op, result) in every_call(store, generation).await {
        match result {
            Err(StoreError::Refused { code: c, .. }) if c == code => {}
            other => panic!("{op}: expected a {code} refusal, got {other:?}"),
        }
    }
}

/// Every call succeeds again, once the first one does (within `within`).
async fn assert_served_again(store: &RedisStore, generation: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while let Err(e) = store.snapshot(SHARDS).await {
        assert!(
            Instant::now() < deadline,
            "the store did not come back: {e}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (op, result) in every_call(store, generation).await {
        assert!(result.is_ok(), "{op} after the refusal ended: {result:?}");
    }
}

/// `REPLICAOF` a port nothing listens on: a replica that keeps its data and never syncs.
fn demote(redis: &RedisServer) {
    let dead = free_port().to_string();
    assert_eq!(redis.command(&["REPLICAOF", "127.0.0.1", &dead]), "+OK");
}

#[tokio::test]
async fn a_read_only_replica_refuses_every_call_the_snapshot_included() {
    let redis = RedisServer::start();
    let (store, generation) = holding(&redis).await;
    demote(&redis);
    assert_refused(&store, &generation, "READONLY").await;
    assert_eq!(redis.command(&["REPLICAOF", "NO", "ONE"]), "+OK");
    assert_served_again(&store, &generation, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn out_of_memory_refuses_every_call_the_snapshot_included() {
    let redis = RedisServer::start();
    let (store, generation) = holding(&redis).await;
    assert_eq!(
        redis.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]),
        "+OK"
    );
    assert_eq!(redis.command(&["CONFIG", "SET", "maxmemory", "1"]), "+OK");
    assert_refused(&store, &generation, "OOM").await;
    assert_eq!(redis.command(&["CONFIG", "SET", "maxmemory", "0"]), "+OK");
    assert_served_again(&store, &generation, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_replica_cut_from_its_master_refuses_with_masterdown() {
    let redis = RedisServer::start();
    let (store, generation) = holding(&redis).await;
    // Writable, so the stale-data rule is what refuses.
    assert_eq!(
        redis.command(&["CONFIG", "SET", "replica-read-only", "no"]),
        "+OK"
    );
    assert_eq!(
        redis.command(&["CONFIG", "SET", "replica-serve-stale-data", "no"]),
        "+OK"
    );
    demote(&redis);
    assert_refused(&store, &generation, "MASTERDOWN").await;
    assert_eq!(redis.command(&["REPLICAOF", "NO", "ONE"]), "+OK");
    assert_served_again(&store, &generation, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_redis_busy_with_a_long_script_refuses_with_busy() {
    let redis = RedisServer::start();
    let (store, generation) = holding(&redis).await;
    assert_eq!(
        redis.command(&["CONFIG", "SET", "busy-reply-threshold", "50"]),
        "+OK"
    );
    // Someone else's script that never ends; its connection is never read from.
    let mut hog = TcpStream::connect(redis.addr()).unwrap();
    hog.write_all(b"*3\r\n$4\r\nEVAL\r\n$17\r\nwhile true do end\r\n$1\r\n0\r\n")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_refused(&store, &generation, "BUSY").await;
    assert_eq!(redis.command(&["SCRIPT", "KILL"]), "+OK");
    assert_served_again(&store, &generation, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_redis_loading_its_data_refuses_with_loading() {
    let mut redis = RedisServer::start();
    let (store, generation) = holding(&redis).await;
    // Enough keys, loaded 1 ms each with the events served every KB, for a few seconds of
    // LOADING after the restart.
    let fill = "for i = 1, 3000 do redis.call('SET', 'filler:' .. i, i) end";
    assert_eq!(redis.command(&["EVAL", fill, "0"]), "$-1");
    assert_eq!(redis.command(&["SAVE"]), "+OK");
    redis.restart_with(&[
        "--key-load-delay",
        "1000",
        "--loading-process-events-interval-bytes",
        "1024",
    ]);
    let loading = Instant::now();
    // The restart dropped the connection: the first calls may report that.
    while let Err(StoreError::Unavailable(_) | StoreError::Timeout(_)) =
        store.snapshot(SHARDS).await
    {
        assert!(
            loading.elapsed() < Duration::from_secs(2),
            "no answer after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_refused(&store, &generation, "LOADING").await;
    assert!(
        loading.elapsed() < Duration::from_secs(2),
        "the refusals took {:?}: the test needs a longer load",
        loading.elapsed()
    );
    // The data came back: the same generation, shard 0 still ours.
    assert_served_again(&store, &generation, Duration::from_secs(20)).await;
    let snapshot = store.snapshot(SHARDS).await.unwrap();
    assert_eq!(snapshot.generation.id, generation);
    assert_eq!(snapshot.leases[0].as_ref().map(|l| &l.owner), Some(&pod()));
}

#[tokio::test]
async fn a_flushed_script_cache_is_reloaded_within_the_call() {
    let redis = RedisServer::start();
    let (store, generation) = holding(&redis).await;
    assert_eq!(redis.command(&["SCRIPT", "FLUSH"]), "+OK");
    for (op, result) in every_call(&store, &generation).await {
        assert!(result.is_ok(), "{op} after SCRIPT FLUSH: {result:?}");
    }
}
