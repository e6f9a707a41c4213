//! The broadcasts' store calls (`store::broadcast`): one scripted sequence runs against
//! the in-memory model and against a real Redis running the Lua scripts; both must
//! answer what the rules say, call for call.
//!
//! It fails when either side differs in a rule: creation idempotent by id (an existing
//! record is answered, not replaced), the cap on unexpired broadcasts, the lease and
//! epoch check of every mark write, a `sending` mark never replacing another mark (a new
//! owner keeps the first copy's time and a final outcome), a final mark replacing
//! `sending`, an unsent copy's mark removed only while it is that copy's, progress per
//! shard.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use posgate::core::{Epoch, PodId, ShardId};
use posgate::store::broadcast::{
    broadcast_id, Broadcast, BroadcastStore, Create, Created, Mark, MarkWrite, MarksWritten,
    ShardProgress,
};
use posgate::store::memory::MemoryStore;
use posgate::store::redis::RedisStore;
use posgate::store::CoordStore;

use crate::support::pod::store_options;
use crate::support::{leases, RedisServer};

const SHARD: ShardId = 3;
const SHARDS: u32 = 8;
/// An epoch floor far above either store's clock, so both grant the same epoch.
const FAR: Epoch = 4_000_000_000_000;

fn pod(name: &str) -> PodId {
    PodId::new(name).unwrap()
}

fn wall() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The lease of [`SHARD`] for `pod-a`, with its epoch.
async fn lease(store: &impl CoordStore) -> Epoch {
    leases::held_above(store, SHARDS, SHARD, &pod("pod-a"), FAR).await
}

fn create(key: &str, now: u64, expires_in: u64, max_active: usize) -> Create {
    let broadcast = Broadcast {
        id: broadcast_id("acme", key),
        tenant: "acme".into(),
        key: key.into(),
        digest: format!("digest-{key}"),
        selector: "store=17".into(),
        patterns: vec!["pos-*".into()],
        content_type: Some("application/json".into()),
        created_ms: now,
        expires_ms: now + expires_in,
        created_by: "pod-a".into(),
        bytes: 3,
    };
    Create {
        broadcast,
        body: Bytes::from_static(b"one"),
        keep_until_ms: now + expires_in + 60_000,
        now_ms: now,
        max_active,
    }
}

fn marks(id: &str, pod_name: &str, epoch: Epoch, marks: &[(&str, Mark)]) -> MarkWrite {
    MarkWrite {
        id: id.into(),
        shard: SHARD,
        pod: pod(pod_name),
        epoch,
        keep_until_ms: wall() + 120_000,
        marks: marks.iter().map(|(t, m)| (t.to_string(), *m)).collect(),
        unsent: Vec::new(),
        progress: None,
    }
}

/// The scripted sequence, asserting every answer.
async fn script<S: BroadcastStore + CoordStore>(store: &S) {
    let epoch = lease(store).await;
    let now = wall();
    let a = create("k1", now, 60_000, 2);
    let id = a.broadcast.id.clone();
    assert_eq!(store.create(&a).await.unwrap(), Created::New);
    // The same id again: the stored record is answered, whatever this one says.
    let mut again = create("k1", now + 5, 90_000, 2);
    again.broadcast.digest = "other".into();
    assert_eq!(
        store.create(&again).await.unwrap(),
        Created::Existing(Box::new(a.broadcast.clone()))
    );
    // The cap counts unexpired ones only.
    let expired = create("k0", now - 10_000, 5_000, 2);
    assert_eq!(store.create(&expired).await.unwrap(), Created::New);
    let b = create("k2", now, 30_000, 2);
    assert_eq!(store.create(&b).await.unwrap(), Created::New);
    let c = create("k3", now, 30_000, 2);
    assert_eq!(store.create(&c).await.unwrap(), Created::Full { active: 2 });
    let active = store.active(now).await.unwrap();
    assert_eq!(
        active,
        [b.broadcast.id.clone(), id.clone()],
        "unexpired, soonest expiry first"
    );
    assert_eq!(
        store.body(&id).await.unwrap(),
        Some(Bytes::from_static(b"one"))
    );
    assert_eq!(
        store.body(&broadcast_id("acme", "none")).await.unwrap(),
        None
    );

    // Only the holder with its epoch writes.
    let first = Mark::Sending { since_ms: now };
    for (who, e) in [("pod-b", epoch), ("pod-a", epoch - 1)] {
        let refused = store
            .write_marks(&marks(&id, who, e, &[("pos-1", first)]))
            .await;
        assert_eq!(refused.unwrap(), MarksWritten::NotHolder, "{who} {e}");
    }
    let done = store
        .write_marks(&marks(
            &id,
            "pod-a",
            epoch,
            &[("pos-1", first), ("pos-2", first)],
        ))
        .await
        .unwrap();
    assert_eq!(
        done,
        MarksWritten::Done {
            kept: vec![None, None]
        }
    );
    // A later `sending` keeps the first; a final replaces it; `sending` keeps a final.
    let later = Mark::Sending { since_ms: now + 1 };
    let delivered = Mark::Delivered { duplicate: false };
    let kept = store
        .write_marks(&marks(
            &id,
            "pod-a",
            epoch,
            &[("pos-1", later), ("pos-2", delivered)],
        ))
        .await
        .unwrap();
    assert_eq!(
        kept,
        MarksWritten::Done {
            kept: vec![Some(first), None]
        }
    );
    let kept = store
        .write_marks(&marks(&id, "pod-a", epoch, &[("pos-2", later)]))
        .await
        .unwrap();
    assert_eq!(
        kept,
        MarksWritten::Done {
            kept: vec![Some(delivered)]
        }
    );
    // An unsent copy's mark goes only while it is that copy's.
    let mut unsent = marks(&id, "pod-a", epoch, &[]);
    unsent.unsent = vec![("pos-1".into(), now + 1), ("pos-2".into(), now)];
    assert_eq!(
        store.write_marks(&unsent).await.unwrap(),
        MarksWritten::Done { kept: vec![] }
    );
    let stored = store.marks(&id, SHARD).await.unwrap();
    assert_eq!(stored.get("pos-1"), Some(&first));
    assert_eq!(stored.get("pos-2"), Some(&delivered));
    unsent.unsent = vec![("pos-1".into(), now)];
    store.write_marks(&unsent).await.unwrap();
    let stored = store.marks(&id, SHARD).await.unwrap();
    assert_eq!((stored.len(), stored.get("pos-1")), (1, None));

    // Progress per shard, read with the record.
    let progress = ShardProgress {
        pod: "pod-a".into(),
        epoch,
        at_ms: now,
        matched: 2,
        delivered: 1,
        offline: 1,
        ..ShardProgress::default()
    };
    let mut with = marks(&id, "pod-a", epoch, &[]);
    with.progress = Some(progress.clone());
    store.write_marks(&with).await.unwrap();
    let found = store.find(&id).await.unwrap().unwrap();
    assert_eq!(found.broadcast, a.broadcast);
    assert_eq!(
        found.shards.into_iter().collect::<Vec<_>>(),
        [(SHARD, progress)]
    );
    assert!(store.find(&c.broadcast.id).await.unwrap().is_none());
}

#[tokio::test]
async fn redis_runs_the_broadcast_model_call_for_call() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), "test", store_options())
        .await
        .unwrap();
    script(&store).await;
    script(&MemoryStore::new()).await;
}
