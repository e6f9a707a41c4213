//! The terminal directory written back after Redis lost its data (`directory_restore.lua`,
//! `pos/manager/directory_sync.rs`):
//!
//! - the script against a real `redis-server`: it writes a shard only into a new
//!   generation, only for the current epoch holder, only where the shard's directory is
//!   untouched in that generation, and then exactly what was asked;
//! - end to end: two pods over a `PosFarm`, Redis killed and restarted empty while pushes
//!   flow through both pods: every push is answered 200 (none 404), no terminal is
//!   disconnected, and afterwards every shard's directory is back in Redis, exactly as
//!   imported, each written by the pod holding the shard's lease with that epoch.

use crate::support::leases::Deletes;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use posgate::core::lease::{AcquireOutcome, Checked};
use posgate::core::shard::shard_of;
use posgate::core::{CoreConfig, Epoch, PodId, ShardId};
use posgate::pod::PodHandle;
use posgate::store::directory::{Directory, DirectoryAdmin, Refusal, Restore, Restored, Terminal};
use posgate::store::redis::RedisStore;
use posgate::store::CoordStore;
use serde_json::Value;

use posgate_loadtest::load::pods::{TENANT, TOKEN};
use posgate_loadtest::load::pushgen::Targets;

use crate::support::farm::{self, connect_limit, Farm};
use crate::support::gateway::{open_loop, summary};
use crate::support::leases;
use crate::support::pod::{self, store_options, Setup, CLUSTER, SHARDS};
use crate::support::wait::{secs, wait_for};
use crate::support::RedisServer;

async fn connect(redis: &RedisServer) -> RedisStore {
    RedisStore::connect(&redis.url(), CLUSTER, store_options())
        .await
        .unwrap()
}

/// `HGETALL terminals-restored`: shard -> the write-back record.
async fn records(redis: &RedisServer) -> BTreeMap<ShardId, Value> {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = posgate::store::keys::Keys::new(CLUSTER)
        .unwrap()
        .terminals_restored();
    let all: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    all.into_iter()
        .map(|(s, json)| (s.parse().unwrap(), serde_json::from_str(&json).unwrap()))
        .collect()
}

/// The first `n` terminals `t-0`, `t-1`... of `shard` (of [`SHARDS`]), sorted by id as
/// the directory reads them; every other one with labels, which a write-back keeps.
fn of_shard(shard: ShardId, n: usize) -> Vec<Terminal> {
    let mut out: Vec<Terminal> = (0..)
        .map(|i| format!("t-{i}"))
        .filter(|id| shard_of(id, SHARDS) == shard)
        .take(n)
        .enumerate()
        .map(|(i, id)| {
            let labels = if i % 2 == 0 { "store=17;region=eu" } else { "" };
            Terminal::new(&id, "pos.example:443", None)
                .unwrap()
                .with_labels(posgate::api::Labels::parse(labels).unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

async fn generation(store: &RedisStore) -> String {
    store.snapshot(SHARDS).await.unwrap().generation.id
}

/// Takes `shard`'s lease for `pod` in `generation`; its epoch.
async fn acquire(store: &RedisStore, generation: &str, pod: &PodId, shard: ShardId) -> Epoch {
    let ttl = Duration::from_secs(60);
    match leases::acquire(store, generation, pod, &[shard], ttl)
        .await
        .unwrap()
    {
        Checked::Ok(outcomes) => match outcomes[..] {
            [AcquireOutcome::Acquired { epoch, .. }] => epoch,
            ref other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_script_writes_only_a_lost_shard_for_its_current_epoch_holder() {
    let redis = RedisServer::start();
    let store = connect(&redis).await;
    let (a, b) = (PodId::new("pod-a").unwrap(), PodId::new("pod-b").unwrap());
    let (lost, other) = (3, 5);
    let terminals = of_shard(lost, 4);

    // Generation 0: the directory was read while pod A held the shard.
    let g0 = generation(&store).await;
    store.upsert(SHARDS, &terminals).await.unwrap();
    let e0 = acquire(&store, &g0, &a, lost).await;
    let restore = |pod, epoch, generation, read_in, shard, terminals| Restore {
        shard,
        pod,
        epoch,
        generation,
        read_in,
        terminals,
    };
    let answer = |r: Result<Checked<Restored>, _>| r.unwrap();

    // In the generation it was read in, an empty shard is a removal, not a loss.
    let ids: Vec<String> = terminals.iter().map(|t| t.id.clone()).collect();
    store.remove(SHARDS, &ids).await.unwrap();
    let same = restore(&a, e0, &g0, &g0, lost, &terminals);
    assert_eq!(
        answer(store.restore(&same).await),
        Checked::Ok(Restored::Refused(Refusal::SameGeneration))
    );

    // Redis loses everything: generation 1. Epochs then start again from the store's
    // clock in ms (docs/design.md, "Recovery"): a wipe and an acquisition within the
    // millisecond of the last one would repeat its epoch, which a real restart never
    // does, and this test can on a fast machine; so it lets the clock move first.
    tokio::time::sleep(Duration::from_millis(3)).await;
    redis.command(&["FLUSHALL"]);
    let g1 = generation(&store).await;
    assert_ne!(g0, g1);
    // Named the old generation: written nowhere.
    let stale_generation = restore(&a, e0, &g0, &g0, lost, &terminals);
    assert!(matches!(
        answer(store.restore(&stale_generation).await),
        Checked::GenerationChanged(g) if g.id == g1
    ));
    // Nobody holds the lease in generation 1 yet.
    let unclaimed = restore(&a, e0, &g1, &g0, lost, &terminals);
    assert_eq!(
        answer(store.restore(&unclaimed).await),
        Checked::Ok(Restored::Refused(Refusal::NotHolder {
            owner: None,
            epoch: None
        }))
    );
    // Another pod holds it.
    let e1 = acquire(&store, &g1, &b, lost).await;
    assert_eq!(
        answer(store.restore(&unclaimed).await),
        Checked::Ok(Restored::Refused(Refusal::NotHolder {
            owner: Some(b.clone()),
            epoch: Some(e1)
        }))
    );
    // A held it again and let it go: the shard's last epoch is still A's, the lease is not.
    assert_eq!(store.delete(&b, &[lost], None).await.unwrap(), vec![true]);
    let e2 = acquire(&store, &g1, &a, lost).await;
    assert_eq!(store.delete(&a, &[lost], None).await.unwrap(), vec![true]);
    let released = restore(&a, e2, &g1, &g0, lost, &terminals);
    assert_eq!(
        answer(store.restore(&released).await),
        Checked::Ok(Restored::Refused(Refusal::NotHolder {
            owner: None,
            epoch: Some(e2)
        }))
    );
    // A holds it once more, but asks with its old epoch.
    let e3 = acquire(&store, &g1, &a, lost).await;
    assert!(e3 > e2 && e2 > e1 && e1 > e0);
    let old_epoch = restore(&a, e2, &g1, &g0, lost, &terminals);
    assert_eq!(
        answer(store.restore(&old_epoch).await),
        Checked::Ok(Restored::Refused(Refusal::NotHolder {
            owner: Some(a.clone()),
            epoch: Some(e3)
        }))
    );
    // Nothing refused wrote anything.
    assert!(store.terminals(lost).await.unwrap().is_empty());
    assert_eq!(store.versions(&[lost]).await.unwrap().versions, vec![0]);
    assert!(records(&redis).await.is_empty());

    // The current holder, into a new generation, where the shard is untouched: written.
    let right = restore(&a, e3, &g1, &g0, lost, &terminals);
    let Checked::Ok(Restored::Written { version }) = answer(store.restore(&right).await) else {
        panic!("the current holder's write-back was refused");
    };
    assert_eq!(store.terminals(lost).await.unwrap(), terminals);
    let read = store.versions(&[lost]).await.unwrap();
    assert_eq!(
        (read.generation.as_deref(), read.versions),
        (Some(&*g1), vec![version])
    );
    let record = &records(&redis).await[&lost];
    assert_eq!(record["pod"], "pod-a");
    assert_eq!(record["epoch"], e3);
    assert_eq!(record["generation"], g1.as_str());
    assert_eq!(record["read_in"], g0.as_str());
    assert_eq!(record["version"], version);
    assert_eq!(record["terminals"], 4);
    // Once written, the shard is no longer untouched.
    assert_eq!(
        answer(store.restore(&right).await),
        Checked::Ok(Restored::Refused(Refusal::Present))
    );

    // A shard imported in the new generation keeps the import: one terminal...
    let e4 = acquire(&store, &g1, &a, other).await;
    let others = of_shard(other, 3);
    store.upsert(SHARDS, &others[..1]).await.unwrap();
    let over_import = restore(&a, e4, &g1, &g0, other, &others);
    assert_eq!(
        answer(store.restore(&over_import).await),
        Checked::Ok(Restored::Refused(Refusal::Present))
    );
    // ...and an import removed again left its version: still not untouched.
    store.remove(SHARDS, &[others[0].id.clone()]).await.unwrap();
    assert_eq!(
        answer(store.restore(&over_import).await),
        Checked::Ok(Restored::Refused(Refusal::Present))
    );
    assert!(store.terminals(other).await.unwrap().is_empty());
    assert_eq!(records(&redis).await.len(), 1);
}

// ----- end to end ----------------------------------------------------------------------

/// Pod `restore-pod-{i}` with the push API open to the load harness's token (the push
/// generator's).
async fn start_pod(i: usize, redis: &RedisServer, farm: &Farm) -> (PodHandle, String) {
    let name = format!("restore-pod-{i}");
    let tokens = format!("{TENANT}:{TOKEN}");
    pod::start_with_api(&Setup::default(), &name, &redis.url(), farm, 1_000, &tokens).await
}

/// The shard's lease holder and epoch, as the pods serve it now.
fn holders(pods: &[PodHandle]) -> BTreeMap<ShardId, (String, Epoch)> {
    let names: Vec<String> = (0..pods.len())
        .map(|i| format!("restore-pod-{i}"))
        .collect();
    pod::owners(names.iter().zip(pods))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_empty_gets_the_directory_back_and_no_push_404s() {
    const N: u64 = 200;
    let test = "restore";
    let mut redis = RedisServer::start();
    let t = Farm::with_directory(&redis, farm::config(N)).await;
    let mut pods = Vec::new();
    let mut urls = Vec::new();
    for i in 0..2 {
        let (p, url) = start_pod(i, &redis, &t).await;
        pods.push(p);
        urls.push(url);
    }
    wait_for("every terminal current", connect_limit(), || {
        t.all_sessions_current(&pods.iter().collect::<Vec<_>>())
    })
    .await;
    let before = t.counters();
    let by_shard = {
        let mut m: BTreeMap<ShardId, Vec<Terminal>> = BTreeMap::new();
        for entry in t.entries() {
            m.entry(shard_of(&entry.id, SHARDS))
                .or_default()
                .push(entry);
        }
        m.values_mut()
            .for_each(|v| v.sort_by(|a, b| a.id.cmp(&b.id)));
        m
    };

    // A push every 25 ms through either pod, to random terminals, a key each.
    let targets: Targets = Arc::new(RwLock::new(
        urls.iter()
            .enumerate()
            .map(|(i, url)| (format!("restore-pod-{i}"), url.clone()))
            .collect(),
    ));
    let load = open_loop(targets, 40.0, N, test);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Killed for twice the lease TTL (the pods hold their shards: both cannot reach it),
    // then back without its data.
    let killed = Instant::now();
    redis.stop();
    tokio::time::sleep(2 * CoreConfig::fast().lease_ttl).await;
    tokio::task::block_in_place(|| redis.restart_empty());
    eprintln!(
        "[{test}] redis back, empty, after {:.3} s",
        secs(killed.elapsed())
    );

    let store = connect(&redis).await;
    // Shards without terminals have nothing to write back. Not asserted yet: what the
    // pushes saw meanwhile is asserted first.
    let back = Instant::now();
    let written_back = loop {
        if records(&redis).await.len() == by_shard.len() {
            break true;
        }
        if back.elapsed() > Duration::from_secs(20) {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "[{test}] every shard written back: {written_back}, {:.3} s after the restart",
        secs(back.elapsed())
    );
    // Pushes keep flowing a while after the write-back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pushes = load.stop().await;
    let after = t.counters();
    let sent = summary(test, "in all", &pushes);
    let by_outcome = &sent.by_outcome;
    assert!(sent.sent > 300, "only {} pushes were sent", sent.sent);
    assert!(
        !by_outcome.keys().any(|k| k.starts_with("404")),
        "pushes answered 404: {by_outcome:?}"
    );
    assert_eq!(
        by_outcome.get("200 ok"),
        Some(&sent.attempts),
        "pushes not answered 200: {by_outcome:?}"
    );
    assert_eq!(
        after.connections_closed, before.connections_closed,
        "terminals were disconnected"
    );
    assert_eq!(after.connections_opened, before.connections_opened);
    assert!(
        written_back,
        "not every shard's directory came back within 20 s"
    );

    // Exactly what was imported, shard by shard, each written by its epoch holder.
    let holders = holders(&pods);
    assert_eq!(holders.len(), SHARDS as usize, "every shard is served");
    let records = records(&redis).await;
    for shard in 0..SHARDS {
        let expected = by_shard.get(&shard).cloned().unwrap_or_default();
        assert_eq!(
            store.terminals(shard).await.unwrap(),
            expected,
            "shard {shard}"
        );
        let Some(record) = records.get(&shard) else {
            assert!(expected.is_empty(), "shard {shard} was not written back");
            continue;
        };
        let (pod, epoch) = &holders[&shard];
        assert_eq!(
            (record["pod"].as_str(), record["epoch"].as_u64()),
            (Some(pod.as_str()), Some(*epoch)),
            "shard {shard} written back by {record}, held by {pod} with epoch {epoch}"
        );
        assert_eq!(record["terminals"], expected.len());
    }
    assert_eq!(store.count(SHARDS).await.unwrap(), N);
    pod::stop(pods).await;
}
