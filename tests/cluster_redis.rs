//! Whole pods (`Pod::start`: driver + HTTP + peer probes) against a real `redis-server`,
//! each pod behind its own `RedisProxy` so its network to Redis can be cut.
//!
//! Every test runs the overlap sampler of [`support::cluster`](crate::support::cluster) (no shard served by two
//! pods at once, checked every 20 ms) and records serving transitions with timestamps.
//! Measured durations are printed (`--nocapture`) for the issue notes.
//!
//! Timings are `CoreConfig::fast()`: lease TTL 3 s, renew 1 s, member TTL 3 s, poll
//! 500 ms, debounce 300 ms, serve window 2.2 s. Bounds are generous; the printed
//! numbers are the real measurement.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::support::cluster::*;
use crate::support::pod::{self, store_options, CLUSTER, SHARDS, STORE_TIMEOUT};
use crate::support::wait::{secs, wait_for};
use crate::support::{RedisProxy, RedisServer};
use posgate::core::reconciler::StopReason;
use posgate::core::ShardId;
use posgate::pod::{Pod, PodError};
use posgate::store::redis::RedisStore;
use posgate::store::{ClusterMeta, CoordStore, StoreError};
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pods_converge_on_the_ring_assignment() {
    let test = "converge";
    let (cluster, took) = Cluster::converged_start(3).await;
    eprintln!("[{test}] 3 pods converged (all ready, every shard served by its assigned pod) after {:.3} s", secs(took));

    // Redis agrees: every lease is held by the assigned pod, every pod is registered.
    let snapshot = cluster.redis_snapshot().await;
    let assignment = cluster
        .assignment()
        .await
        .expect("a placement for the live pods");
    for (shard, lease) in snapshot.leases.iter().enumerate() {
        let lease = lease
            .as_ref()
            .unwrap_or_else(|| panic!("shard {shard} has no lease"));
        assert_eq!(
            Some(&lease.owner),
            assignment.owner(shard as ShardId),
            "shard {shard}"
        );
        assert_eq!(
            cluster.pod(&lease.owner).serving(shard as ShardId),
            Some(lease.epoch)
        );
    }
    assert_eq!(snapshot.members.len(), 3);
    let status = cluster.pods[0].handle.status.borrow().clone();
    assert!(status.registered && status.ready && status.store.reachable());
    assert_eq!(status.members.len(), 3);
    cluster.shutdown(test).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joining_pod_takes_exactly_the_moved_shards_after_their_release() {
    let test = "join";
    let (mut cluster, _) = Cluster::converged_start(3).await;
    let before = cluster.assignment().await.expect("a placement for 3 pods");
    let owners_before = cluster.owners();

    let joined = Instant::now();
    let new = cluster.add_pod().await;
    let took = cluster
        .wait_converged("4 pods to converge", Duration::from_secs(10))
        .await;
    let after = cluster.assignment().await.expect("a placement for 4 pods");
    let moved: BTreeSet<ShardId> = (0..SHARDS)
        .filter(|&s| before.owner(s) != after.owner(s))
        .collect();
    eprintln!(
        "[{test}] 4th pod joined; {} shards moved; converged after {:.3} s",
        moved.len(),
        secs(took)
    );
    assert!(!moved.is_empty());

    let events = cluster.events.since(joined);
    let stops: BTreeMap<ShardId, &Event> = events
        .iter()
        .filter(|e| matches!(e.kind, Kind::Stop(_)))
        .map(|e| (e.shard, e))
        .collect();
    let starts: BTreeMap<ShardId, &Event> = events
        .iter()
        .filter(|e| e.kind == Kind::Start)
        .map(|e| (e.shard, e))
        .collect();
    let stop_count = events
        .iter()
        .filter(|e| matches!(e.kind, Kind::Stop(_)))
        .count();
    let start_count = events.iter().filter(|e| e.kind == Kind::Start).count();
    assert_eq!(
        stop_count,
        moved.len(),
        "one stop per moved shard: {events:?}"
    );
    assert_eq!(
        start_count,
        moved.len(),
        "one start per moved shard: {events:?}"
    );
    assert_eq!(stops.keys().copied().collect::<BTreeSet<_>>(), moved);
    assert_eq!(starts.keys().copied().collect::<BTreeSet<_>>(), moved);
    let mut gaps = Vec::new();
    for &s in &moved {
        let (stop, start) = (stops[&s], starts[&s]);
        assert_eq!(stop.kind, Kind::Stop(StopReason::Rebalance));
        assert_eq!(Some(&stop.pod), before.owner(s));
        assert_eq!(Some(&start.pod), after.owner(s));
        assert!(
            stop.at < start.at,
            "shard {s}: started at the new owner before the old one stopped"
        );
        assert!(
            start.epoch > owners_before[&s].1,
            "shard {s}: epoch did not increase"
        );
        gaps.push(start.at - stop.at);
    }
    gaps.sort();
    eprintln!(
        "[{test}] stop -> start handover per moved shard: min {:.3} s, median {:.3} s, max {:.3} s",
        secs(gaps[0]),
        secs(gaps[gaps.len() / 2]),
        secs(gaps[gaps.len() - 1])
    );
    // Shards that did not move kept owner and epoch.
    let owners_after = cluster.owners();
    for s in (0..SHARDS).filter(|s| !moved.contains(s)) {
        assert_eq!(
            owners_after[&s], owners_before[&s],
            "unmoved shard {s} changed"
        );
    }
    assert!(cluster.pods[new].ready());
    cluster.shutdown(test).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shards_of_a_killed_pod_are_reowned_after_the_ttls() {
    let test = "kill";
    let (mut cluster, _) = Cluster::converged_start(3).await;
    let victim = 1;
    let orphans: Vec<ShardId> = cluster.pods[victim].served().into_keys().collect();

    let killed = Instant::now();
    cluster.kill(victim);
    let c = core();
    let bound =
        c.lease_ttl.max(c.member_ttl) + c.poll_interval + c.debounce + Duration::from_secs(1);
    let took = cluster
        .wait_converged(
            "2 pods to re-own every shard",
            bound + Duration::from_secs(5),
        )
        .await;
    eprintln!(
        "[{test}] {} shards of the killed pod re-owned after {:.3} s (bound {:.1} s)",
        orphans.len(),
        secs(took),
        secs(bound)
    );
    assert!(
        took <= bound,
        "re-owned after {took:?}, more than {bound:?}"
    );
    let first_start = cluster
        .events
        .since(killed)
        .iter()
        .filter(|e| e.kind == Kind::Start)
        .map(|e| e.at - killed)
        .min()
        .unwrap();
    eprintln!(
        "[{test}] first orphan re-served after {:.3} s",
        secs(first_start)
    );
    cluster.shutdown(test).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_empty_changes_no_owner_and_raises_epochs() {
    let test = "restart";
    let (mut cluster, _) = Cluster::converged_start(3).await;
    let before = cluster.owners();

    let restarted = Instant::now();
    tokio::task::block_in_place(|| cluster.redis.restart_empty());
    eprintln!(
        "[{test}] redis restarted empty in {:.3} s",
        secs(restarted.elapsed())
    );
    let recovered = cluster.wait_reclaimed_by_owners(&before).await;
    eprintln!(
        "[{test}] all 64 shards re-claimed by their owners with higher epochs after {:.3} s",
        secs(recovered)
    );

    // Past the claim hold (one member TTL) and a rebalance debounce: still nothing moved.
    let c = core();
    tokio::time::sleep(c.member_ttl + c.debounce + c.poll_interval).await;
    assert!(cluster.converged().await);
    let after = cluster.owners();
    for (s, (pod, epoch)) in &after {
        assert_eq!(&before[s].0, pod, "shard {s} changed owner");
        assert!(
            *epoch > before[s].1,
            "shard {s}: epoch {epoch} not above {}",
            before[s].1
        );
    }
    let stops = cluster.events.stops_since(restarted);
    assert!(
        stops.is_empty(),
        "shards stopped during the restart: {stops:?}"
    );
    let snapshot = cluster.redis_snapshot().await;
    for (s, lease) in snapshot.leases.iter().enumerate() {
        let lease = lease
            .as_ref()
            .unwrap_or_else(|| panic!("shard {s} has no lease in redis"));
        assert_eq!((lease.owner.clone(), lease.epoch), after[&(s as ShardId)]);
    }
    let min_raise = after
        .iter()
        .map(|(s, (_, e))| e - before[s].1)
        .min()
        .unwrap();
    eprintln!("[{test}] epochs after restart exceed the old ones by at least {min_raise}");
    cluster.shutdown(test).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_cut_off_from_redis_stops_by_its_deadline_and_others_take_over() {
    let test = "cut-one";
    let (cluster, _) = Cluster::converged_start(3).await;
    let victim = 2;
    let theirs: Vec<ShardId> = cluster.pods[victim].served().into_keys().collect();

    let cut = Instant::now();
    cluster.pods[victim].proxy.cut();
    let stopped = wait_for(
        "the cut-off pod to stop serving",
        Duration::from_secs(10),
        || cluster.pods[victim].served().is_empty(),
    )
    .await;
    // The last renewal that succeeded was sent at most one renew interval (+ a call)
    // before the cut, and serving ends one serve window after it was sent.
    let c = core();
    let deadline_bound = c.renew_interval + STORE_TIMEOUT + c.serve_window();
    eprintln!(
        "[{test}] cut-off pod stopped serving its {} shards {:.3} s after the cut (bound {:.1} s)",
        theirs.len(),
        secs(stopped),
        secs(deadline_bound)
    );
    assert!(
        stopped <= deadline_bound,
        "stopped {stopped:?} after the cut"
    );

    let alive: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    wait_for(
        "the others to serve the cut-off pod's shards",
        Duration::from_secs(15),
        || {
            theirs
                .iter()
                .all(|&s| alive.iter().any(|&i| cluster.pods[i].serving(s).is_some()))
        },
    )
    .await;
    let took_over = cut.elapsed();
    eprintln!(
        "[{test}] other pods serve all of its shards {:.3} s after the cut",
        secs(took_over)
    );
    let events = cluster.events.since(cut);
    for e in events.iter().filter(|e| e.pod == cluster.pods[victim].id) {
        assert!(
            matches!(
                e.kind,
                Kind::Stop(StopReason::Expired | StopReason::Isolated)
            ),
            "unexpected transition of the cut-off pod: {e:?}"
        );
    }
    for &s in &theirs {
        let stop = events
            .iter()
            .find(|e| e.shard == s && matches!(e.kind, Kind::Stop(_)))
            .unwrap();
        let start = events
            .iter()
            .find(|e| e.shard == s && e.kind == Kind::Start)
            .unwrap();
        assert!(
            stop.at < start.at,
            "shard {s} started elsewhere before the cut-off pod stopped"
        );
    }

    // Healed: the pod re-registers and the cluster converges on three pods again.
    let healed = Instant::now();
    cluster.pods[victim].proxy.restore();
    let took = cluster
        .wait_converged("3 pods to converge after the heal", Duration::from_secs(15))
        .await;
    eprintln!(
        "[{test}] after the heal, 3 pods converged again in {:.3} s (from {:.3} s after the cut)",
        secs(took),
        secs(healed - cut)
    );
    cluster.shutdown(test).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_pods_cut_off_hold_and_keep_delivering_on_the_same_shards() {
    let test = "cut-all";
    let (cluster, _) = Cluster::converged_start(3).await;
    let before = cluster.owners();

    let cut = Instant::now();
    for pod in &cluster.pods {
        pod.proxy.cut();
    }
    let outage = core().lease_ttl * 2;
    tokio::time::sleep(outage).await;
    // Static stability: the deadlines passed, but the pods agree the outage is
    // cluster-wide (nobody can acquire), so every shard is still served by its owner
    // with the epoch it holds, and nothing was given up or parked.
    for (s, (owner, epoch)) in &before {
        let pod = cluster.pod(owner);
        assert_eq!(
            pod.serving(*s),
            Some(*epoch),
            "shard {s} not delivering at {owner} after {outage:?} without redis"
        );
        assert_eq!(
            pod.handle.serving.suspended(*s),
            Some(*epoch),
            "shard {s} at {owner} is not held past its lease"
        );
    }
    let stops = cluster.events.stops_since(cut);
    assert!(
        stops.is_empty(),
        "shards given up during a cluster-wide outage: {stops:?}"
    );
    let parked: Vec<_> = cluster
        .events
        .since(cut)
        .into_iter()
        .filter(|e| e.kind == Kind::Suspend)
        .collect();
    assert!(
        parked.is_empty(),
        "shards parked during a cluster-wide outage: {parked:?}"
    );
    eprintln!(
        "[{test}] all 64 shards held and delivering (none stopped or parked) through the {:.1} s outage",
        secs(outage),
    );
    for pod in &cluster.pods {
        assert!(!pod.handle.status.borrow().store.reachable());
    }

    let restored = Instant::now();
    for pod in &cluster.pods {
        pod.proxy.restore();
    }
    let took = wait_for(
        "every shard served again by its owner",
        Duration::from_secs(15),
        || {
            let now = cluster.owners();
            now.len() == before.len() && now.iter().all(|(s, (pod, _))| &before[s].0 == pod)
        },
    )
    .await;
    eprintln!(
        "[{test}] after restore, all shards served again by the same owners in {:.3} s",
        secs(took)
    );
    let c = core();
    tokio::time::sleep(c.member_ttl + c.debounce).await;
    assert!(cluster.converged().await);
    for (s, (pod, _)) in cluster.owners() {
        assert_eq!(
            before[&s].0, pod,
            "shard {s} changed owner after the outage"
        );
    }
    let stops = cluster.events.stops_since(restored);
    assert!(
        stops.is_empty(),
        "shards given up after the outage: {stops:?}"
    );
    cluster.shutdown(test).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_refuses_to_join_a_cluster_pinned_with_other_settings() {
    let redis = RedisServer::start();
    let other = RedisStore::connect(&redis.url(), CLUSTER, store_options())
        .await
        .unwrap();
    other
        .pin_meta(&ClusterMeta::current(SHARDS / 2))
        .await
        .unwrap();

    let store = RedisStore::connect(&redis.url(), CLUSTER, store_options())
        .await
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let run = Pod::run(
        pod::config("pod-mismatch", "http://127.0.0.1:1"),
        store,
        listener,
        std::future::pending(),
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("refuses at once");
    match ended {
        Err(PodError::Meta(StoreError::MetaMismatch { stored, ours })) => {
            assert_eq!(stored.shards, SHARDS / 2);
            assert_eq!(ours.shards, SHARDS);
        }
        other => panic!("expected a metadata mismatch, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_started_while_redis_is_unreachable_waits_and_then_joins() {
    let test = "late-redis";
    let redis = RedisServer::start();
    let proxy = RedisProxy::start(redis.addr()).await.unwrap();
    let store = RedisStore::connect(&proxy.url(), CLUSTER, store_options())
        .await
        .unwrap();
    proxy.cut();
    let (listener, url) = pod::listen().await;
    let pod = Pod::start(pod::config("pod-early", &url), store, listener, ()).unwrap();

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !pod.status.borrow().registered,
        "registered without a store"
    );
    proxy.restore();
    let took = wait_for("the pod to serve every shard", startup_limit(), || {
        pod.status.borrow().ready
    })
    .await;
    let now = now();
    assert!((0..SHARDS).all(|s| pod.serving.serving(s, now).is_some()));
    eprintln!(
        "[{test}] pod waited for redis, then was ready {:.3} s after it became reachable",
        secs(took)
    );
}
