//! The queue's store calls (`store::queue`): one scripted sequence runs against the
//! in-memory model and against a real Redis running the Lua scripts, and the two
//! transcripts must be equal (generation ids and feed cursors normalized), as must the
//! bytes each charged. Then what only Redis can show: the directory check of an entry
//! pod's enqueue, and a feed read while Redis is out of memory.
//!
//! It fails when either side differs in a rule: idempotency by key and digest, the
//! bounds, collapse keys (only a queued push is replaced), the lease and epoch check of
//! a mark, compare-and-set by revision, cancel and purge leaving what may be on its
//! way, retention, the feed's order and paging.

use std::collections::HashMap;

use bytes::Bytes;
use posgate::core::{Epoch, PodId, ShardId};
use posgate::store::directory::{DirectoryAdmin, Terminal};
use posgate::store::memory::MemoryStore;
use posgate::store::queue::{
    charge_of, push_id, Change, Enqueue, Enqueued, Limits, QueueStore, Record, State, Write,
    Written, RECORD_CHARGE,
};
use posgate::store::redis::RedisStore;
use posgate::store::CoordStore;

use crate::support::pod::store_options;
use crate::support::{leases, RedisServer};

const SHARD: ShardId = 3;
const SHARDS: u32 = 8;
const T0: u64 = 1_900_000_000_000;
/// An epoch floor far above either store's clock, so both grant the same epoch.
const FAR: Epoch = 4_000_000_000_000;
const LIMITS: Limits = Limits {
    per_terminal: 3,
    tenant_bytes: 1_000_000,
    cluster_bytes: 1_000_000,
    retention_ms: 60_000,
};

fn pod(name: &str) -> PodId {
    PodId::new(name).unwrap()
}

fn record(tenant: &str, key: &str, collapse: Option<&str>, body: &[u8], at: u64) -> Record {
    Record {
        tenant: tenant.into(),
        terminal: "pos-1".into(),
        key: key.into(),
        rev: 1,
        accepted_ms: at,
        expires_ms: at + 3_600_000,
        accepted_by: "pod-a".into(),
        collapse_key: collapse.map(str::to_string),
        digest: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body)),
        bytes: charge_of(body.len() as u64),
        content_type: Some("application/json".into()),
        copies: 0,
        state: State::Queued,
    }
}

fn enqueue(record: Record, body: &'static [u8], limits: Limits) -> Enqueue {
    Enqueue {
        shard: SHARD,
        id: push_id(&record.tenant, &record.terminal, &record.key),
        record,
        body: Bytes::from_static(body),
        limits,
        check_directory: false,
        pod: pod("pod-a"),
    }
}

/// A transcript with generation ids normalized.
#[derive(Default)]
struct Transcript {
    lines: Vec<String>,
    gens: HashMap<String, usize>,
}

impl Transcript {
    fn gen(&mut self, id: &str) -> String {
        let n = self.gens.len();
        format!("G{}", self.gens.entry(id.to_string()).or_insert(n))
    }

    fn enqueued(&mut self, what: &str, e: Enqueued) {
        let line = match e {
            Enqueued::Accepted {
                position,
                replaced,
                generation,
            } => format!(
                "accepted at {position}, replaced {replaced:?}, {}",
                self.gen(&generation)
            ),
            Enqueued::Existing { record, generation } => {
                format!("existing {record:?} {}", self.gen(&generation))
            }
            other => format!("{other:?}"),
        };
        self.lines.push(format!("{what}: {line}"));
    }

    fn line(&mut self, what: &str, v: impl std::fmt::Debug) {
        self.lines.push(format!("{what}: {v:?}"));
    }
}

/// The lease of [`SHARD`] for `pod-a`, with its epoch.
async fn lease(store: &impl CoordStore) -> Epoch {
    leases::held_above(store, SHARDS, SHARD, &pod("pod-a"), FAR).await
}

fn write(record: &Record, expect: u64, next: Record, change: Change, now: u64) -> Write {
    Write {
        shard: SHARD,
        id: push_id(&record.tenant, &record.terminal, &record.key),
        expect,
        record: next,
        change,
        now,
    }
}

/// The scripted sequence; returns its transcript.
async fn script<S: QueueStore + CoordStore>(store: &S) -> Transcript {
    let mut t = Transcript::default();
    let epoch = lease(store).await;
    assert_eq!(epoch, FAR + 1, "both stores grant above the floor");
    let a = record("acme", "k1", None, b"one", T0);
    let b = record("acme", "k2", Some("price"), b"two", T0 + 1);
    let c = record("acme", "k3", Some("price"), b"three", T0 + 2);
    for (name, r, body) in [
        ("k1", &a, &b"one"[..]),
        ("k2", &b, b"two"),
        ("k3 replaces k2", &c, b"three"),
    ] {
        let body: &'static [u8] = Box::leak(body.to_vec().into_boxed_slice());
        let e = store
            .enqueue(&enqueue(r.clone(), body, LIMITS))
            .await
            .unwrap();
        t.enqueued(name, e);
    }
    let again = store.enqueue(&enqueue(a.clone(), b"one", LIMITS)).await;
    t.enqueued("k1 again", again.unwrap());
    let other = record("acme", "k1", None, b"other", T0 + 3);
    let conflict = store.enqueue(&enqueue(other, b"other", LIMITS)).await;
    t.enqueued("k1 other body", conflict.unwrap());
    let d = record("acme", "k4", None, b"four", T0 + 4);
    t.enqueued(
        "k4",
        store
            .enqueue(&enqueue(d.clone(), b"four", LIMITS))
            .await
            .unwrap(),
    );
    let e = record("bank", "k5", None, b"five", T0 + 5);
    t.enqueued(
        "k5 over the terminal bound",
        store.enqueue(&enqueue(e, b"five", LIMITS)).await.unwrap(),
    );
    let tight = Limits {
        per_terminal: 10,
        tenant_bytes: 3 * charge_of(5) + RECORD_CHARGE,
        ..LIMITS
    };
    let f = record("acme", "k6", None, b"six", T0 + 6);
    t.enqueued(
        "k6 over the tenant bound",
        store
            .enqueue(&enqueue(f.clone(), b"six", tight))
            .await
            .unwrap(),
    );
    let cluster = Limits {
        per_terminal: 10,
        cluster_bytes: 100,
        ..LIMITS
    };
    t.enqueued(
        "k6 over the cluster bound",
        store.enqueue(&enqueue(f, b"six", cluster)).await.unwrap(),
    );
    t.line("pending", store.pending("pos-1").await.unwrap());
    t.line("waiting", store.waiting(&[SHARD, SHARD + 1]).await.unwrap());

    // Marks: only the lease holder with its epoch, only at the revision read.
    let me = pod("pod-a");
    let marked = a.marked(&me, epoch, T0 + 10);
    let stranger = Change::Mark {
        pod: pod("pod-b"),
        epoch,
    };
    let cases = [
        (
            "mark by another pod",
            write(&a, 1, marked.clone(), stranger, T0 + 10),
        ),
        (
            "mark with an old epoch",
            write(
                &a,
                1,
                marked.clone(),
                Change::Mark {
                    pod: me.clone(),
                    epoch: epoch - 1,
                },
                T0 + 10,
            ),
        ),
        (
            "mark at an old revision",
            write(
                &a,
                0,
                marked.clone(),
                Change::Mark {
                    pod: me.clone(),
                    epoch,
                },
                T0 + 10,
            ),
        ),
        (
            "mark",
            write(
                &a,
                1,
                marked.clone(),
                Change::Mark {
                    pod: me.clone(),
                    epoch,
                },
                T0 + 10,
            ),
        ),
    ];
    for (what, w) in cases {
        t.line(what, store.write(&w).await.unwrap());
    }
    // The copy was not taken: back to queued; marked again; delivered.
    let unsent = marked.unsent(&a);
    t.line(
        "unsent",
        store
            .write(&write(&a, 2, unsent.clone(), Change::Unsent, T0 + 11))
            .await
            .unwrap(),
    );
    let again = unsent.marked(&me, epoch, T0 + 12);
    let mark = Change::Mark {
        pod: me.clone(),
        epoch,
    };
    t.line(
        "mark again",
        store
            .write(&write(&a, 3, again.clone(), mark.clone(), T0 + 12))
            .await
            .unwrap(),
    );
    let delivered = again.moved_to(State::Delivered {
        at_ms: T0 + 13,
        pod: me.to_string(),
        epoch,
        pos_status: 200,
        duplicate: false,
    });
    let retention = Change::Final {
        retention_ms: 60_000,
    };
    t.line(
        "delivered",
        store
            .write(&write(&a, 4, delivered, retention.clone(), T0 + 13))
            .await
            .unwrap(),
    );
    t.line(
        "write a final one",
        store
            .write(&write(&a, 5, a.clone(), mark.clone(), T0 + 14))
            .await
            .unwrap(),
    );
    // k4 is marked (may be on its way): a purge leaves it, cancels k3.
    let d_marked = d.marked(&me, epoch, T0 + 15);
    store
        .write(&write(&d, 1, d_marked.clone(), mark.clone(), T0 + 15))
        .await
        .unwrap();
    t.line(
        "cancel k4 (sending)",
        store
            .cancel(SHARD, "acme", "pos-1", "k4", T0 + 16, 60_000)
            .await
            .unwrap(),
    );
    t.line(
        "purge another tenant",
        store
            .purge(SHARD, "bank", "pos-1", T0 + 16, 60_000)
            .await
            .unwrap(),
    );
    t.line(
        "purge",
        store
            .purge(SHARD, "acme", "pos-1", T0 + 17, 60_000)
            .await
            .unwrap(),
    );
    let unknown = d_marked.moved_to(State::Unknown {
        at_ms: T0 + 18,
        since_ms: T0 + 15,
    });
    t.line(
        "give up on k4",
        store
            .write(&write(&d, 2, unknown, retention.clone(), T0 + 18))
            .await
            .unwrap(),
    );
    t.line("pending after", store.pending("pos-1").await.unwrap());
    t.line(
        "waiting after",
        store.waiting(&[SHARD, SHARD + 1]).await.unwrap(),
    );
    for key in ["k1", "k2", "k3", "k4", "nope"] {
        let found = store.find("acme", "pos-1", key, T0 + 20).await.unwrap();
        let gen = found.generation.map(|g| t.gen(&g));
        t.line(&format!("find {key}"), (found.record, gen));
    }
    // The feed: every final record in order, paged by its cursors.
    let all = store.feed("acme", None, 100).await.unwrap();
    let states: Vec<(String, &'static str)> = all
        .events
        .iter()
        .map(|(_, r)| (r.key.clone(), r.state.name()))
        .collect();
    t.line("feed", (&states, all.gap));
    let first = store.feed("acme", None, 2).await.unwrap();
    let (cursor, _) = first.events.last().unwrap().clone();
    let rest = store.feed("acme", Some(&cursor), 100).await.unwrap();
    let keys = |f: &posgate::store::queue::Feed| -> Vec<String> {
        f.events.iter().map(|(_, r)| r.key.clone()).collect()
    };
    t.line("feed paged", (keys(&first), keys(&rest), rest.gap));
    t.line(
        "feed of another tenant",
        store.feed("nobody", None, 10).await.unwrap().events,
    );
    // Past their retention, final records are gone from lookups at once and dropped by
    // the tenant's next calls; a key whose record was dropped is new again.
    let late = T0 + 120_000;
    t.line(
        "find k1 past its retention",
        store
            .find("acme", "pos-1", "k1", late)
            .await
            .unwrap()
            .record,
    );
    let reused = record("acme", "k1", None, b"one", late);
    let e = store
        .enqueue(&enqueue(reused, b"one", LIMITS))
        .await
        .unwrap();
    t.enqueued("k1 after its retention", e);
    t
}

/// Bytes and pushes the store charges now: (cluster bytes, acme's bytes, not final).
async fn redis_usage(redis: &RedisServer) -> (u64, u64, u64) {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let usage: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg("posgate:{test}:queue-usage")
        .query_async(&mut conn)
        .await
        .unwrap();
    let get = |f: &str| usage.get(f).copied().unwrap_or(0) as u64;
    (get("bytes"), get("t:acme"), get("n"))
}

#[tokio::test]
async fn redis_runs_the_queue_model_call_for_call() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), "test", store_options())
        .await
        .unwrap();
    let memory = MemoryStore::new();
    let (got, want) = (script(&store).await, script(&memory).await);
    if std::env::var_os("POSGATE_TEST_TRANSCRIPT").is_some() {
        println!("{}", want.lines.join("\n"));
    }
    for (i, (g, w)) in got.lines.iter().zip(&want.lines).enumerate() {
        assert_eq!(g, w, "line {i} differs (left: Redis, right: the model)");
    }
    assert_eq!(got.lines.len(), want.lines.len());
    // Bytes charged: the same in both, and what the rules say.
    let model = memory.queue_usage("acme");
    let redis_usage = redis_usage(&redis).await;
    assert_eq!(
        redis_usage, model,
        "(cluster bytes, acme's bytes, not final)"
    );
    // Left: the reused k1 (3 bytes); the four final records were past their retention
    // and dropped by that enqueue.
    assert_eq!((model.0, model.2), (charge_of(3), 1));
}

#[tokio::test]
async fn an_entry_pods_enqueue_needs_the_terminal_in_the_directory() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), "test", store_options())
        .await
        .unwrap();
    let mut e = enqueue(record("acme", "k1", None, b"x", T0), b"x", LIMITS);
    e.check_directory = true;
    let refused = store.enqueue(&e).await.unwrap();
    assert_eq!(refused, Enqueued::UnknownTerminal);
    let listed = Terminal::new("pos-1", "127.0.0.1:9", Some("pos-1.test")).unwrap();
    store.upsert(SHARDS, &[listed]).await.unwrap();
    // Hashes of the shard: the directory's shard is that of pos-1 in 8 shards.
    let shard = posgate::core::shard::shard_of("pos-1", SHARDS);
    e.shard = shard;
    let accepted = store.enqueue(&e).await.unwrap();
    assert!(
        matches!(accepted, Enqueued::Accepted { .. }),
        "{accepted:?}"
    );
    assert_eq!(
        store.waiting(&[shard]).await.unwrap(),
        vec![(shard, "pos-1".to_string(), 1)]
    );
}

#[tokio::test]
async fn a_status_and_the_feed_are_read_while_redis_is_out_of_memory() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), "test", store_options())
        .await
        .unwrap();
    let e = enqueue(record("acme", "k1", None, b"x", T0), b"x", LIMITS);
    store.enqueue(&e).await.unwrap();
    assert_eq!(redis.command(&["CONFIG", "SET", "maxmemory", "1"]), "+OK");
    let refused = store
        .enqueue(&enqueue(record("acme", "k2", None, b"y", T0), b"y", LIMITS))
        .await;
    assert!(
        matches!(&refused, Err(posgate::store::StoreError::Refused { code, .. }) if code == "OOM"),
        "{refused:?}"
    );
    let found = store.find("acme", "pos-1", "k1", T0).await.unwrap();
    assert_eq!(found.record.map(|r| r.state), Some(State::Queued));
    assert!(store
        .feed("acme", None, 10)
        .await
        .unwrap()
        .events
        .is_empty());
}

/// Redis's `used_memory` now.
async fn used_memory(redis: &RedisServer) -> u64 {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// The charge the bounds count (`docs/operations.md`, "Sizing Redis memory") covers what
/// Redis really spends (`used_memory`), for bodies from 1 byte to the largest push, one
/// push per terminal (the most keys per push): a queued push less than [`charge_of`] its
/// body, a final one (its record kept for the retention, its feed entry) less than
/// [`RECORD_CHARGE`], and a tenant's feed less than 600 bytes per outcome (the doc's
/// "about 5 MB" for 10,000). Were the charge too low, `--queue-max-bytes` at a quarter
/// of `maxmemory` would not protect the leases.
#[tokio::test]
async fn the_charge_covers_what_redis_spends_per_push() {
    let limits = Limits {
        per_terminal: 100,
        tenant_bytes: 1 << 40,
        cluster_bytes: 1 << 40,
        retention_ms: 3_600_000,
    };
    for (size, pushes) in [(1_usize, 2_000_u64), (1_024, 2_000), (65_536, 300)] {
        let body: &'static [u8] = Box::leak(vec![b'x'; size].into_boxed_slice());
        let redis = RedisServer::start();
        let store = RedisStore::connect(&redis.url(), "test", store_options())
            .await
            .unwrap();
        let records: Vec<Record> = (0..=pushes)
            .map(|i| Record {
                terminal: format!("pos-{i:05}"),
                ..record("acme", &format!("order-{i:06}"), None, body, T0)
            })
            .collect();
        let id = |r: &Record| push_id(&r.tenant, &r.terminal, &r.key);
        let mut before = 0;
        for (i, r) in records.iter().enumerate() {
            let got = store
                .enqueue(&Enqueue {
                    id: id(r),
                    ..enqueue(r.clone(), body, limits)
                })
                .await
                .unwrap();
            assert!(matches!(got, Enqueued::Accepted { .. }), "{got:?}");
            if i == 0 {
                // The generation, usage and sequence keys exist from here on.
                before = used_memory(&redis).await;
            }
        }
        let queued = used_memory(&redis).await - before;
        let charged = pushes * charge_of(size as u64);
        println!(
            "body {size}: Redis spends {} bytes per queued push, charged {}",
            queued / pushes,
            charged / pushes
        );
        assert!(
            queued < charged,
            "body {size}: {queued} bytes in Redis for {pushes} queued pushes, charged {charged}"
        );

        for r in &records[1..] {
            let expired = r.moved_to(State::Expired { at_ms: T0 + 1 });
            let w = Write {
                id: id(r),
                ..write(
                    r,
                    1,
                    expired,
                    Change::Final {
                        retention_ms: 3_600_000,
                    },
                    T0 + 1,
                )
            };
            assert_eq!(store.write(&w).await.unwrap(), Written::Done { body: None });
        }
        let finals = used_memory(&redis).await.saturating_sub(before);
        let feed: u64 = redis
            .command(&[
                "MEMORY",
                "USAGE",
                "posgate:{test}:queue-feed:acme",
                "SAMPLES",
                "0",
            ])
            .trim_start_matches(':')
            .parse()
            .expect("MEMORY USAGE of the feed");
        println!(
            "body {size}: {} bytes per final push, {} of them its feed entry",
            finals / pushes,
            feed / pushes
        );
        assert!(
            finals < pushes * RECORD_CHARGE,
            "body {size}: {finals} bytes for {pushes} final pushes"
        );
        assert!(
            feed < pushes * 600,
            "body {size}: the feed takes {feed} bytes for {pushes} outcomes"
        );
    }
}
