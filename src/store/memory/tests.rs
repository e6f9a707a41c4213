//! The memory store against the contract of the Lua scripts, rule by rule: generations,
//! epochs, owner checks and expiry, membership, placement (the Redis side is compared in
//! `tests/store_differential.rs`).

use super::*;
use crate::core::testing::{member, pod};

const TTL: Duration = Duration::from_millis(1000);

fn call<'a>(generation: &'a str, pod: &'a PodId) -> LeaseCall<'a> {
    LeaseCall {
        generation,
        pod,
        ttl: TTL,
    }
}

/// Claims of `shards` with no floor (the caller knows no epoch of them).
fn claims(shards: &[ShardId]) -> Vec<Claim> {
    shards
        .iter()
        .map(|&shard| Claim { shard, floor: 0 })
        .collect()
}

/// Releases of `shards` that delete them (no handover).
fn deletes(shards: &[ShardId]) -> Vec<Release> {
    shards
        .iter()
        .map(|&shard| Release {
            shard,
            to: None,
            floor: 0,
        })
        .collect()
}

/// Learns the generation the way a pod does: the first call answers it.
fn generation(s: &mut MemoryState, now: u64) -> String {
    match s.acquire(now, &call("", &pod("x")), &claims(&[])).unwrap() {
        Checked::GenerationChanged(g) => g.id,
        Checked::Ok(_) => panic!("the empty generation must never match"),
    }
}

#[test]
fn generation_is_created_once_and_checked() {
    let mut s = MemoryState::new(7);
    let g = generation(&mut s, 1_000);
    assert!(g.starts_with("1.000000-"), "{g}");
    assert_eq!(
        s.acquire(1_500, &call(&g, &pod("a")), &claims(&[0]))
            .unwrap(),
        Checked::Ok(vec![AcquireOutcome::Acquired {
            epoch: 1_500,
            released_by: None
        }])
    );
    match s.renew(2_000, &call("stale", &pod("a")), &[0]).unwrap() {
        Checked::GenerationChanged(info) => {
            assert_eq!(info.id, g);
            assert_eq!(info.age, Duration::from_millis(1_000));
        }
        other => panic!("{other:?}"),
    }
    // Same seed, same ids: the simulation replays.
    assert_eq!(generation(&mut MemoryState::new(7), 1_000), g);
}

#[test]
fn epochs_increase_and_survive_wipe_by_the_clock() {
    let mut s = MemoryState::new(1);
    let g = generation(&mut s, 10);
    let a = pod("a");
    let epoch = |c: Checked<Vec<AcquireOutcome>>| match c {
        Checked::Ok(v) => match v[0] {
            AcquireOutcome::Acquired { epoch, .. } => epoch,
            ref o => panic!("{o:?}"),
        },
        other => panic!("{other:?}"),
    };
    let e1 = epoch(s.acquire(100, &call(&g, &a), &claims(&[3])).unwrap());
    assert_eq!(
        s.release(100, &a, &deletes(&[3]), None, TTL),
        [Released::Deleted]
    );
    // Same millisecond: last + 1 wins over the clock.
    let e2 = epoch(s.acquire(100, &call(&g, &a), &claims(&[3])).unwrap());
    assert_eq!((e1, e2), (100, 101));
    s.wipe();
    let g2 = generation(&mut s, 200);
    assert_ne!(g, g2);
    let e3 = epoch(s.acquire(200, &call(&g2, &a), &claims(&[3])).unwrap());
    assert!(e3 > e2);
}

#[test]
fn epochs_stay_above_the_floor_and_a_held_lease_is_bumped_above_it() {
    let mut s = MemoryState::new(5);
    let g = generation(&mut s, 100);
    let (a, b) = (pod("a"), pod("b"));
    let floored = |shard, floor| [Claim { shard, floor }];
    let outcome = |c: Checked<Vec<AcquireOutcome>>| match c {
        Checked::Ok(mut v) => v.remove(0),
        other => panic!("{other:?}"),
    };
    // A store whose clock is behind an epoch the caller knows grants above it.
    let got = outcome(s.acquire(100, &call(&g, &a), &floored(0, 5_000)).unwrap());
    assert_eq!(got.epoch(), 5_001);
    // A floor at or below the stored epoch changes nothing for the holder.
    let got = outcome(s.acquire(100, &call(&g, &a), &floored(0, 5_001)).unwrap());
    assert_eq!(got, AcquireOutcome::AlreadyMine { epoch: 5_001 });
    // A higher one (a terminal has seen 9,000) bumps the holder's epoch above it...
    let got = outcome(s.acquire(100, &call(&g, &a), &floored(0, 9_000)).unwrap());
    assert_eq!(got, AcquireOutcome::AlreadyMine { epoch: 9_001 });
    // ... owner-checked: another pod's floor moves nothing.
    let got = outcome(s.acquire(100, &call(&g, &b), &floored(0, 20_000)).unwrap());
    assert_eq!(
        got,
        AcquireOutcome::HeldBy {
            owner: a.clone(),
            epoch: 9_001
        }
    );
    assert_eq!(
        s.renew(100, &call(&g, &b), &[0]).unwrap(),
        Checked::Ok(vec![RenewOutcome::HeldBy {
            owner: a.clone(),
            epoch: 9_001
        }])
    );
    // The next holder continues from the bumped epoch.
    s.release(100, &a, &deletes(&[0]), None, TTL);
    let got = outcome(s.acquire(100, &call(&g, &b), &claims(&[0])).unwrap());
    assert_eq!(got.epoch(), 9_002);
}

#[test]
fn owner_checks_and_expiry() {
    let mut s = MemoryState::new(2);
    let g = generation(&mut s, 0);
    let (a, b) = (pod("a"), pod("b"));
    s.acquire(0, &call(&g, &a), &claims(&[1])).unwrap();
    assert_eq!(
        s.acquire(10, &call(&g, &b), &claims(&[1])).unwrap(),
        Checked::Ok(vec![AcquireOutcome::HeldBy {
            owner: a.clone(),
            epoch: 1
        }])
    );
    assert_eq!(
        s.renew(10, &call(&g, &b), &[1, 2]).unwrap(),
        Checked::Ok(vec![
            RenewOutcome::HeldBy {
                owner: a.clone(),
                epoch: 1
            },
            RenewOutcome::Missing { epoch: 0 }
        ])
    );
    assert_eq!(
        s.release(10, &b, &deletes(&[1]), None, TTL),
        [Released::NotHeld]
    );
    assert_eq!(
        s.acquire(20, &call(&g, &a), &claims(&[1])).unwrap(),
        Checked::Ok(vec![AcquireOutcome::AlreadyMine { epoch: 1 }])
    );
    // Extended to 20 + 1000: still live at 1020, gone at 1021.
    assert!(s.snapshot(1_020, 4).leases[1].is_some());
    assert_eq!(
        s.renew(1_021, &call(&g, &a), &[1]).unwrap(),
        Checked::Ok(vec![RenewOutcome::Missing { epoch: 1 }])
    );
    assert_eq!(s.notifications(), 0);
}

#[test]
fn membership_notifications_and_meta() {
    let mut s = MemoryState::new(3);
    let g = generation(&mut s, 0);
    let meta = ClusterMeta::current(64);
    assert_eq!(
        s.heartbeat(0, &g, &member("b"), &meta, TTL).unwrap(),
        Checked::Ok(1)
    );
    s.heartbeat(0, &g, &member("a"), &meta, TTL).unwrap();
    assert_eq!(
        s.heartbeat(500, &g, &member("a"), &meta, TTL).unwrap(),
        Checked::Ok(3),
        "every heartbeat counts"
    );
    assert_eq!(s.notifications(), 2, "a refresh is not a join");
    let snap = s.snapshot(1_000, 2);
    assert_eq!(snap.heartbeats, 3);
    assert_eq!(
        snap.members
            .iter()
            .map(|m| m.pod.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    let snap = s.snapshot(1_001, 2);
    assert_eq!(snap.members.len(), 1, "b expired at 1000");
    s.deregister(1_001, &pod("a"));
    s.deregister(1_001, &pod("a"));
    assert_eq!(s.notifications(), 3, "only a real removal notifies");
    let other = ClusterMeta {
        shards: 32,
        ..meta.clone()
    };
    assert!(matches!(
        s.heartbeat(1_002, &g, &member("c"), &other, TTL),
        Err(StoreError::MetaMismatch { .. })
    ));
    assert!(
        s.snapshot(1_002, 0).members.is_empty(),
        "a refused heartbeat writes nothing"
    );
}

#[tokio::test]
async fn memory_store_bumps_changes() {
    let store = MemoryStore::from_state(MemoryState::new(4));
    let mut rx = store.changes();
    let snap = store.snapshot(1).await.unwrap();
    let g = snap.generation.id;
    let a = pod("a");
    store.acquire(&call(&g, &a), &claims(&[0])).await.unwrap();
    assert!(!rx.has_changed().unwrap());
    assert_eq!(
        store.release(&a, &deletes(&[0]), None, TTL).await.unwrap(),
        [Released::Deleted]
    );
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow_and_update(), 1);
    store.wipe();
    assert_ne!(store.snapshot(1).await.unwrap().generation.id, g);
}

#[test]
fn placement_is_a_version_compare_and_set_lost_on_wipe() {
    use crate::core::placement::Placement;
    let mut s = MemoryState::new(3);
    let p1 = Placement::initial(&[pod("a")], 4);
    let p2 = p1.next(&[pod("a"), pod("b")], 4);
    assert!(!s.place(Some(1), &p1), "nothing stored yet");
    assert!(s.place(None, &p1));
    assert!(!s.place(None, &p2), "a placement is stored");
    assert!(!s.place(Some(2), &p2), "stored is version 1");
    let before = s.notifications();
    assert!(s.place(Some(1), &p2));
    assert_eq!(s.notifications(), before + 1);
    assert_eq!(s.snapshot(10, 4).placement, Some(p2.clone()));
    s.wipe();
    assert_eq!(s.snapshot(10, 4).placement, None);
    assert!(s.place(None, &p2));
}
