//! The terminal directory written back after Redis lost its data
//! (`directory_restore.lua`), against a real `redis-server`: the script writes a shard
//! only into a new generation, only for the current epoch holder, only where the shard's
//! directory is untouched in that generation, and then exactly what was asked.

use std::collections::BTreeMap;
use std::time::Duration;

use posgate::core::lease::{AcquireOutcome, Checked};
use posgate::core::shard::shard_of;
use posgate::core::{Epoch, PodId, ShardId};
use posgate::store::directory::{Directory, DirectoryAdmin, Refusal, Restore, Restored, Terminal};
use posgate::store::redis::RedisStore;
use posgate::store::CoordStore;
use serde_json::Value;

use crate::support::pod::{store_options, CLUSTER, SHARDS};
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
/// the directory reads them.
fn of_shard(shard: ShardId, n: usize) -> Vec<Terminal> {
    let mut out: Vec<Terminal> = (0..)
        .map(|i| format!("t-{i}"))
        .filter(|id| shard_of(id, SHARDS) == shard)
        .take(n)
        .map(|id| Terminal::new(&id, "pos.example:443", None).unwrap())
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
    match store.acquire(generation, pod, &[shard], ttl).await.unwrap() {
        Checked::Ok(outcomes) => match outcomes[..] {
            [AcquireOutcome::Acquired { epoch }] => epoch,
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

    // Redis loses everything: generation 1.
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
    assert_eq!(store.release(&b, &[lost]).await.unwrap(), vec![true]);
    let e2 = acquire(&store, &g1, &a, lost).await;
    assert_eq!(store.release(&a, &[lost]).await.unwrap(), vec![true]);
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
