//! The lease handover with real processes: three `posgate serve` pods, one stopped with
//! SIGTERM. Read straight from Redis (one atomic snapshot) every few milliseconds, the
//! leaving pod first writes the placement without itself while still a member, and each
//! of its shard leases then goes straight to the pod that placement names, with a higher
//! epoch: at no sample is one of those keys free, so no pod races for it and no push
//! waits for a membership debounce.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use posgate::core::membership::Snapshot;
use posgate::core::{Epoch, PodId, ShardId};
use posgate::store::redis::RedisStore;
use posgate::store::CoordStore;

use crate::support::binary::{cluster_pod, BinPod};
use crate::support::pod::{store_options, CLUSTER, SHARDS};
use crate::support::RedisServer;

/// Settled with `members` members (see [`crate::move_budget::settled`]).
fn settled(snap: &Snapshot, members: usize) -> bool {
    snap.members.len() == members && crate::move_budget::settled(snap)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_under_sigterm_hands_each_lease_to_its_next_owner() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), CLUSTER, store_options())
        .await
        .unwrap();
    let mut pods: Vec<BinPod> = (0..3)
        .map(|i| cluster_pod(&redis.url(), &format!("pod-{i}"), &[]))
        .collect();
    let start = Instant::now();
    let before = loop {
        if let Ok(snap) = store.snapshot(SHARDS).await {
            if settled(&snap, 3) {
                break snap;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let leaving = PodId::new("pod-2").unwrap();
    let held: BTreeMap<ShardId, Epoch> = (0..SHARDS)
        .filter_map(|s| {
            let l = before.leases[s as usize].as_ref()?;
            (l.owner == leaving).then_some((s, l.epoch))
        })
        .collect();
    assert!(!held.is_empty());

    pods[2].signal("-TERM");
    let signalled = Instant::now();
    let (mut samples, mut free, mut placed_out_while_member) = (0, BTreeSet::new(), false);
    let mut handed: BTreeMap<ShardId, (PodId, Epoch)> = BTreeMap::new();
    loop {
        tokio::time::sleep(Duration::from_millis(3)).await;
        let Ok(snap) = store.snapshot(SHARDS).await else {
            continue;
        };
        samples += 1;
        let member = snap.members.iter().any(|m| m.pod == leaving);
        let placed = snap
            .placement
            .as_ref()
            .is_some_and(|p| p.assignment.pods().contains(&leaving));
        placed_out_while_member |= member && !placed;
        for (&s, &epoch) in &held {
            match &snap.leases[s as usize] {
                None => {
                    free.insert(s);
                }
                Some(l) if l.owner != leaving => {
                    assert!(l.epoch > epoch, "shard {s}: {l:?} after epoch {epoch}");
                    handed.entry(s).or_insert((l.owner.clone(), l.epoch));
                }
                Some(_) => {}
            }
        }
        if pods[2].exited().is_some() && settled(&snap, 2) {
            break;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(20),
            "the leaving pod never finished: {snap:?}"
        );
    }
    let status = pods[2].exited().unwrap();
    assert!(status.success(), "pod-2 exited {status}");
    println!(
        "[lease handover] {samples} samples; {} shards handed over, all done {:.2} s after \
         SIGTERM",
        handed.len(),
        signalled.elapsed().as_secs_f64()
    );
    assert!(free.is_empty(), "leases seen free: {free:?}");
    assert!(
        placed_out_while_member,
        "pod-2 did not place itself out before it left"
    );
    assert_eq!(handed.len(), held.len());
    let lines = pods[2].log_lines_with(&["lease handed over"]);
    assert_eq!(lines.len(), held.len(), "{}", pods[2].log());
    for pod in &mut pods[..2] {
        pod.assert_running();
    }
}
