//! The terminal directory against a real `redis-server`, and the in-memory directory
//! run through the same operations: upserts, removals, replace-all, counts, sorted
//! reads, and versions that change exactly for the shards a write changed.

use std::collections::BTreeSet;

use crate::support::RedisServer;
use posgate::api::Labels;
use posgate::core::shard::shard_of;
use posgate::core::ShardId;
use posgate::store::directory::{Directory, DirectoryAdmin, MemoryDirectory, Terminal};
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate::store::{CoordStore, StoreError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SHARDS: u32 = 8;

fn t(id: &str, port: u16) -> Terminal {
    Terminal::new(id, &format!("pos-{port}.example:{port}"), None).unwrap()
}

async fn connect(redis: &RedisServer) -> RedisStore {
    RedisStore::connect(&redis.url(), "test", RedisOptions::default())
        .await
        .expect("connect")
}

fn all_shards() -> Vec<ShardId> {
    (0..SHARDS).collect()
}

/// Shards whose version differs between two `versions` answers over all shards.
fn moved(before: &[u64], after: &[u64]) -> BTreeSet<ShardId> {
    (0..SHARDS)
        .filter(|&s| before[s as usize] != after[s as usize])
        .collect()
}

async fn everything(d: &impl Directory) -> Vec<Terminal> {
    let mut out = Vec::new();
    for s in 0..SHARDS {
        out.extend(d.terminals(s).await.unwrap());
    }
    out
}

#[tokio::test]
async fn upsert_bumps_only_changed_shards() {
    let redis = RedisServer::start();
    let store = connect(&redis).await;
    let v0 = store.versions(&all_shards()).await.unwrap().versions;
    assert_eq!(v0, vec![0; SHARDS as usize]);

    let batch = vec![t("a", 1), t("b", 2), t("c", 3)];
    let sum = store.upsert(SHARDS, &batch).await.unwrap();
    assert_eq!((sum.added, sum.updated, sum.unchanged), (3, 0, 0));
    let touched: BTreeSet<ShardId> = batch.iter().map(|t| shard_of(&t.id, SHARDS)).collect();
    assert_eq!(sum.changed_shards, touched);
    let v1 = store.versions(&all_shards()).await.unwrap().versions;
    assert_eq!(moved(&v0, &v1), touched);

    // The same terminals again: nothing changes, no version moves.
    let sum = store.upsert(SHARDS, &batch).await.unwrap();
    assert_eq!((sum.added, sum.updated, sum.unchanged), (0, 0, 3));
    assert!(sum.changed_shards.is_empty());
    assert_eq!(store.versions(&all_shards()).await.unwrap().versions, v1);

    // One changed address: only its shard moves, and only forward.
    let sum = store.upsert(SHARDS, &[t("b", 20)]).await.unwrap();
    assert_eq!((sum.added, sum.updated), (0, 1));
    let v2 = store.versions(&all_shards()).await.unwrap().versions;
    let b = shard_of("b", SHARDS);
    assert_eq!(moved(&v1, &v2), BTreeSet::from([b]));
    assert!(v2[b as usize] > v1[b as usize]);
    let mut in_b: Vec<Terminal> = batch
        .iter()
        .filter(|x| x.id != "b" && shard_of(&x.id, SHARDS) == b)
        .cloned()
        .chain([t("b", 20)])
        .collect();
    in_b.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(store.terminals(b).await.unwrap(), in_b);

    // versions answers in the order asked.
    let some = [b, 0, b];
    let answer = store.versions(&some).await.unwrap().versions;
    assert_eq!(answer, vec![v2[b as usize], v2[0], v2[b as usize]]);
    assert_eq!(store.count(SHARDS).await.unwrap(), 3);
}

#[tokio::test]
async fn remove_replace_and_count() {
    let redis = RedisServer::start();
    let store = connect(&redis).await;
    let first: Vec<Terminal> = (0..50)
        .map(|i| t(&format!("pos-{i:03}"), 1000 + i))
        .collect();
    store.upsert(SHARDS, &first).await.unwrap();
    assert_eq!(store.count(SHARDS).await.unwrap(), 50);

    let ids = vec![
        "pos-000".to_string(),
        "pos-001".to_string(),
        "nope".to_string(),
    ];
    let v0 = store.versions(&all_shards()).await.unwrap().versions;
    let sum = store.remove(SHARDS, &ids).await.unwrap();
    assert_eq!((sum.removed, sum.unchanged), (2, 1));
    let expect: BTreeSet<ShardId> = ids[..2].iter().map(|id| shard_of(id, SHARDS)).collect();
    assert_eq!(sum.changed_shards, expect);
    assert_eq!(
        moved(&v0, &store.versions(&all_shards()).await.unwrap().versions),
        expect
    );
    assert_eq!(store.count(SHARDS).await.unwrap(), 48);

    // Replace: keep pos-010..pos-029 (pos-010 with a new address), add pos-100.
    let mut wanted: Vec<Terminal> = (10..30)
        .map(|i| t(&format!("pos-{i:03}"), 1000 + i))
        .collect();
    wanted[0] = t("pos-010", 7);
    wanted.push(t("pos-100", 100));
    let v1 = store.versions(&all_shards()).await.unwrap().versions;
    let sum = store.replace_all(SHARDS, &wanted).await.unwrap();
    assert_eq!(
        (sum.added, sum.updated, sum.removed, sum.unchanged),
        (1, 1, 28, 19)
    );
    assert_eq!(
        moved(&v1, &store.versions(&all_shards()).await.unwrap().versions),
        sum.changed_shards
    );
    assert_eq!(store.count(SHARDS).await.unwrap(), 21);
    let mut expect = wanted.clone();
    expect.sort_by(|a, b| a.id.cmp(&b.id));
    let mut got = everything(&store).await;
    got.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(got, expect);

    // The same replace again changes nothing.
    let v2 = store.versions(&all_shards()).await.unwrap().versions;
    let sum = store.replace_all(SHARDS, &wanted).await.unwrap();
    assert_eq!(
        (sum.added, sum.updated, sum.removed, sum.unchanged),
        (0, 0, 0, 21)
    );
    assert_eq!(store.versions(&all_shards()).await.unwrap().versions, v2);

    // Replacing with nothing empties the directory.
    store.replace_all(SHARDS, &[]).await.unwrap();
    assert_eq!(store.count(SHARDS).await.unwrap(), 0);
}

#[tokio::test]
async fn invalid_input_writes_nothing() {
    let redis = RedisServer::start();
    let store = connect(&redis).await;
    let bad = Terminal {
        id: "bad id".into(),
        addr: "h:1".into(),
        server_name: "h".into(),
        labels: Default::default(),
    };
    let err = store.upsert(SHARDS, &[t("a", 1), bad]).await.unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    let err = store
        .upsert(SHARDS, &[t("a", 1), t("a", 2)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    let err = store
        .remove(SHARDS, &["x y".to_string()])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    assert_eq!(store.count(SHARDS).await.unwrap(), 0);
    assert_eq!(
        store.versions(&all_shards()).await.unwrap().versions,
        vec![0; 8]
    );
}

/// Many terminals per shard: writes go in chunks, reads in HSCAN pages, and a shard
/// comes back whole and sorted.
#[tokio::test]
async fn large_shards_are_paged_and_sorted() {
    let redis = RedisServer::start();
    let store = connect(&redis).await;
    let shards = 4;
    let all: Vec<Terminal> = (0..12_000u32)
        .map(|i| {
            t(
                &format!("t{:05}", (i * 7919) % 12_000),
                (i % 60_000 + 1) as u16,
            )
        })
        .collect();
    let sum = store.upsert(shards, &all).await.unwrap();
    assert_eq!(sum.added, 12_000);
    assert_eq!(store.count(shards).await.unwrap(), 12_000);
    let mut total = 0;
    for s in 0..shards {
        let got = store.terminals(s).await.unwrap();
        assert!(got.len() > 1_000, "shard {s} has {}", got.len());
        assert!(
            got.windows(2).all(|w| w[0].id < w[1].id),
            "sorted, no repeats"
        );
        assert!(got.iter().all(|t| shard_of(&t.id, shards) == s));
        total += got.len();
    }
    assert_eq!(total, 12_000);
    let ids: Vec<String> = all.iter().take(5_000).map(|t| t.id.clone()).collect();
    assert_eq!(store.remove(shards, &ids).await.unwrap().removed, 5_000);
    assert_eq!(store.count(shards).await.unwrap(), 7_000);
}

/// Versions keep moving forward after Redis lost its data (max(previous + 1, now)), and
/// come with the generation they were read in.
#[tokio::test]
async fn versions_never_repeat_after_a_wipe() {
    let redis = RedisServer::start();
    let store = connect(&redis).await;
    let g0 = store.snapshot(SHARDS).await.unwrap().generation.id;
    store.upsert(SHARDS, &[t("a", 1)]).await.unwrap();
    let shard = shard_of("a", SHARDS);
    let read = store.versions(&[shard]).await.unwrap();
    assert_eq!(read.generation.as_deref(), Some(g0.as_str()));
    let before = read.versions[0];
    assert!(before > 1_600_000_000_000, "a ms timestamp, got {before}");
    assert_eq!(redis.command(&["FLUSHALL"]), "+OK");
    let wiped = store.versions(&[shard]).await.unwrap();
    assert_eq!((wiped.generation, wiped.versions), (None, vec![0]));
    store.upsert(SHARDS, &[t("a", 1)]).await.unwrap();
    let after = store.versions(&[shard]).await.unwrap().versions[0];
    assert!(after >= before, "{after} < {before}");
    let g1 = store.snapshot(SHARDS).await.unwrap().generation.id;
    assert_ne!(g1, g0);
    let read = store.versions(&[shard]).await.unwrap();
    assert_eq!(read.generation.as_deref(), Some(g1.as_str()));
}

/// Labels are read, written, changed alone and removed with their terminal; a write of
/// the entry alone (what a previous release's import does: `HSET` of the JSON and a
/// version bump, its `directory_upsert.lua`) keeps them; labels left behind by a
/// previous release's remove count for nothing.
#[tokio::test]
async fn labels_live_beside_the_entry() {
    let redis = RedisServer::start();
    let store = connect(&redis).await;
    let labels = Labels::parse("store=17;region=eu").unwrap();
    let a = t("a", 1).with_labels(labels.clone());
    store.upsert(SHARDS, &[a.clone(), t("b", 2)]).await.unwrap();
    let shard = shard_of("a", SHARDS);
    let read = |id: &'static str| {
        let store = &store;
        async move {
            let shard = shard_of(id, SHARDS);
            let all = store.terminals(shard).await.unwrap();
            all.into_iter().find(|t| t.id == id)
        }
    };
    assert_eq!(read("a").await, Some(a.clone()));
    assert!(read("b").await.unwrap().labels.is_empty());

    // Only the labels change: an update, and the shard's version moves.
    let v1 = store.versions(&all_shards()).await.unwrap().versions;
    let relabeled = t("a", 1).with_labels(Labels::parse("store=18").unwrap());
    let sum = store
        .upsert(SHARDS, std::slice::from_ref(&relabeled))
        .await
        .unwrap();
    assert_eq!((sum.added, sum.updated, sum.unchanged), (0, 1, 0));
    let v2 = store.versions(&all_shards()).await.unwrap().versions;
    assert_eq!(moved(&v1, &v2), BTreeSet::from([shard]));
    assert_eq!(read("a").await, Some(relabeled.clone()));

    // A previous release's import of "a" with a new address rewrites the JSON entry only.
    let key = format!("posgate:{{test}}:terminals:{shard}");
    let json = r#"{"addr":"pos-9.example:9","server_name":"pos-9.example"}"#;
    assert_eq!(redis.command(&["HSET", &key, "a", json]), ":0");
    let a = read("a").await.unwrap();
    assert_eq!(
        (a.addr.as_str(), &a.labels),
        ("pos-9.example:9", &relabeled.labels)
    );

    // Labels left behind (a previous release's remove deletes the entry only) are not
    // read as the terminal's; this release's remove deletes them too.
    assert_eq!(redis.command(&["HDEL", &key, "a"]), ":1");
    assert_eq!(read("a").await, None);
    let labels_key = format!("posgate:{{test}}:terminal-labels:{shard}");
    let client = redis::Client::open(redis.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let left = || {
        let (mut conn, key) = (conn.clone(), labels_key.clone());
        async move {
            let cmd = redis::cmd("HGET").arg(key).arg("a").clone();
            cmd.query_async::<Option<String>>(&mut conn).await.unwrap()
        }
    };
    assert_eq!(left().await.as_deref(), Some("store=18"));
    store.remove(SHARDS, &["a".to_string()]).await.unwrap();
    assert_eq!(left().await, None);
    // An upsert without labels clears them.
    store
        .upsert(SHARDS, &[t("b", 2).with_labels(labels)])
        .await
        .unwrap();
    store.upsert(SHARDS, &[t("b", 2)]).await.unwrap();
    assert!(read("b").await.unwrap().labels.is_empty());
}

fn random_id(rng: &mut StdRng) -> String {
    format!("pos-{}", rng.random_range(0..300u32))
}

/// Up to `max` terminals with distinct random ids and one of three addresses each.
fn random_terminals(rng: &mut StdRng, max: usize) -> Vec<Terminal> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for _ in 0..rng.random_range(0..max) {
        let id = random_id(rng);
        if seen.insert(id.clone()) {
            // No labels, or one of two sets: a write may change only a terminal's labels.
            let labels = ["", "store=1", "store=2;region=eu"][rng.random_range(0..3)];
            let labels = Labels::parse(labels).unwrap();
            out.push(t(&id, rng.random_range(1..4)).with_labels(labels));
        }
    }
    out
}

/// One random script of writes against both implementations: the same summaries, the
/// same terminals, the same counts, and versions moving for the same shards.
#[tokio::test]
async fn memory_and_redis_agree() {
    let redis = RedisServer::start();
    let store = connect(&redis).await;
    let memory = MemoryDirectory::new();
    let mut rng = StdRng::seed_from_u64(7);
    let mut v_redis = store.versions(&all_shards()).await.unwrap().versions;
    let mut v_mem = memory.versions(&all_shards()).await.unwrap().versions;
    for step in 0..40 {
        let op = rng.random_range(0..10u32);
        let (a, b) = if op < 6 {
            let batch = random_terminals(&mut rng, 80);
            (
                store.upsert(SHARDS, &batch).await.unwrap(),
                memory.upsert(SHARDS, &batch).await.unwrap(),
            )
        } else if op < 9 {
            let ids: Vec<String> = (0..rng.random_range(0..40))
                .map(|_| random_id(&mut rng))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            (
                store.remove(SHARDS, &ids).await.unwrap(),
                memory.remove(SHARDS, &ids).await.unwrap(),
            )
        } else {
            let all = random_terminals(&mut rng, 200);
            (
                store.replace_all(SHARDS, &all).await.unwrap(),
                memory.replace_all(SHARDS, &all).await.unwrap(),
            )
        };
        assert_eq!(a, b, "step {step} (op {op})");
        for s in 0..SHARDS {
            assert_eq!(
                store.terminals(s).await.unwrap(),
                memory.terminals(s).await.unwrap(),
                "step {step}, shard {s}"
            );
        }
        assert_eq!(
            store.count(SHARDS).await.unwrap(),
            memory.count(SHARDS).await.unwrap()
        );
        let (nr, nm) = (
            store.versions(&all_shards()).await.unwrap().versions,
            memory.versions(&all_shards()).await.unwrap().versions,
        );
        assert_eq!(moved(&v_redis, &nr), a.changed_shards, "step {step}");
        assert_eq!(moved(&v_mem, &nm), b.changed_shards, "step {step}");
        (v_redis, v_mem) = (nr, nm);
    }
}
