//! The move budget with real processes: six `posgate serve` pods with
//! `--max-moving-shards 4`, three more started at once. Read straight from Redis (one
//! atomic snapshot) every few milliseconds, never more than four shards are assigned to one live pod and leased by
//! another, the placement gets there in several steps and settles balanced; one of the
//! six (not the stepper) is killed with SIGKILL meanwhile, and its shards are held again by live pods
//! within the lease TTL plus a few seconds, whatever the budget.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use posgate::core::membership::Snapshot;
use posgate::core::{CoreConfig, PodId, ShardId};
use posgate::store::redis::RedisStore;
use posgate::store::CoordStore;

use crate::support::binary::{cluster_pod, BinPod};
use crate::support::pod::{store_options, CLUSTER, SHARDS};
use crate::support::RedisServer;

const BUDGET: usize = 4;

fn serve(redis: &RedisServer, id: &str) -> BinPod {
    cluster_pod(
        &redis.url(),
        id,
        &["--max-moving-shards", &BUDGET.to_string()],
    )
}

/// Shards leased by a live member other than the one the placement assigns them to.
fn in_motion(snap: &Snapshot) -> Vec<ShardId> {
    let live: BTreeSet<&PodId> = snap.members.iter().map(|m| &m.pod).collect();
    let Some(placement) = &snap.placement else {
        return Vec::new();
    };
    (0..SHARDS)
        .filter(|&s| {
            snap.leases[s as usize].as_ref().is_some_and(|l| {
                live.contains(&l.owner) && placement.assignment.owner(s) != Some(&l.owner)
            })
        })
        .collect()
}

/// Every member is in the placement, which is balanced, and every shard is leased by the
/// pod it is assigned to.
pub(crate) fn settled(snap: &Snapshot) -> bool {
    let Some(placement) = &snap.placement else {
        return false;
    };
    let members: Vec<&PodId> = snap.members.iter().map(|m| &m.pod).collect();
    let pods: Vec<&PodId> = placement.assignment.pods().iter().collect();
    pods == members
        && placement.assignment.max_load() == (SHARDS as usize).div_ceil(members.len())
        && (0..SHARDS).all(|s| {
            snap.leases[s as usize].as_ref().map(|l| &l.owner) == placement.assignment.owner(s)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_out_moves_at_most_the_budget_and_a_killed_pods_shards_never_wait() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), CLUSTER, store_options())
        .await
        .unwrap();
    let read = || async { store.snapshot(SHARDS).await.ok() };
    let mut pods: Vec<BinPod> = (0..6).map(|i| serve(&redis, &format!("pod-{i}"))).collect();
    let start = Instant::now();
    loop {
        let snap = read().await;
        if snap
            .as_ref()
            .is_some_and(|s| s.members.len() == 6 && settled(s))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "six pods never settled"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    pods.extend((6..9).map(|i| serve(&redis, &format!("pod-{i}"))));
    let lease_ttl = CoreConfig::fast().lease_ttl;
    let (mut most, mut versions, mut samples) = (0, BTreeSet::new(), 0);
    let mut killed: Option<(Instant, Vec<ShardId>)> = None;
    let mut reowned = None;
    let start = Instant::now();
    loop {
        // Far more often than the acceptance's 200 ms: with no terminals to hand over,
        // a step completes in a few tens of milliseconds.
        tokio::time::sleep(Duration::from_millis(5)).await;
        for (i, pod) in pods.iter_mut().enumerate() {
            if i != 1 {
                pod.assert_running();
            }
        }
        let Some(snap) = read().await else {
            continue;
        };
        samples += 1;
        let moving = in_motion(&snap);
        assert!(moving.len() <= BUDGET, "in motion: {moving:?}");
        most = most.max(moving.len());
        let version = snap.placement.as_ref().map_or(0, |p| p.version);
        versions.insert(version);
        // Not pod-0, the stepper: the steps go on while the killed pod's shards wait for
        // its registration to expire.
        let dead = PodId::new("pod-1").unwrap();
        match &killed {
            // Mid-way through the steps (three pods joined, some shards moved), pod-1 goes.
            None if snap.members.len() == 9 && !moving.is_empty() => {
                let held: Vec<ShardId> = (0..SHARDS)
                    .filter(|&s| {
                        snap.leases[s as usize]
                            .as_ref()
                            .is_some_and(|l| l.owner == dead)
                    })
                    .collect();
                pods[1].signal("-KILL");
                killed = Some((Instant::now(), held));
            }
            Some((at, held)) if reowned.is_none() => {
                let live: BTreeSet<&PodId> = snap.members.iter().map(|m| &m.pod).collect();
                let all_live = held.iter().all(|&s| {
                    snap.leases[s as usize]
                        .as_ref()
                        .is_some_and(|l| l.owner != dead && live.contains(&l.owner))
                });
                if all_live {
                    reowned = Some(at.elapsed());
                }
            }
            _ => {}
        }
        if reowned.is_some() && snap.members.len() == 8 && settled(&snap) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never settled: {snap:?}"
        );
    }
    let reowned = reowned.unwrap();
    println!(
        "[move budget] {samples} samples, at most {most} shards in motion, {} placement \
         versions, settled after {:.1} s; the killed pod's shards held again after {:.1} s",
        versions.len(),
        start.elapsed().as_secs_f64(),
        reowned.as_secs_f64()
    );
    assert!(most >= 2, "the steps moved shards: {most}");
    // 64 shards over 6 -> 9 pods moves about 21: with 4 slots, several steps.
    assert!(versions.len() >= 4, "placement versions {versions:?}");
    assert!(
        reowned <= lease_ttl + Duration::from_secs(4),
        "the killed pod's shards waited {reowned:?}"
    );
}
