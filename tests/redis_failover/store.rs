//! The store through failovers, without pods: where calls go, and that they come back.

use crate::support::leases::Deletes;
use std::time::{Duration, Instant};

use posgate::core::lease::{Checked, RenewOutcome};
use posgate::core::PodId;
use posgate::store::redis::{RedisOptions, RedisStore, Wait};
use posgate::store::{CoordStore, StoreError};

use crate::support::leases;
use crate::support::redis_ha::{HaOptions, RedisHa};
use crate::support::wait::{secs, wait_for_async};
use crate::support::{RedisProxy, RedisServer};

const TTL: Duration = Duration::from_secs(30);

fn options() -> RedisOptions {
    RedisOptions {
        response_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    }
}

/// Renews `shard` for `pod` until the store answers `Renewed`; returns how long it took.
async fn renewed_within(
    store: &RedisStore,
    generation: &str,
    pod: &PodId,
    limit: Duration,
) -> Duration {
    wait_for_async("a renewal answered by the master", limit, || async {
        matches!(
            leases::renew(store, generation, pod, &[0], TTL).await,
            Ok(Checked::Ok(outcomes)) if outcomes == [RenewOutcome::Renewed]
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_store_follows_a_planned_failover_and_a_killed_master() {
    let (mut ha, _first) = RedisHa::start(HaOptions::default()).await;
    let store = RedisStore::connect(&ha.url(), "ha", options())
        .await
        .expect("connect through the sentinels");
    let a = PodId::new("a").unwrap();
    let generation = store.snapshot(4).await.unwrap().generation.id;
    leases::acquire(&store, &generation, &a, &[0], TTL)
        .await
        .unwrap();
    ha.wait_replicated(2).await;
    let mut changes = store.changes();
    changes.borrow_and_update();

    // Planned: the old master is demoted; a call that reaches it says READONLY.
    let first = ha.master_addr().await;
    ha.failover().await;
    let (second, promoted) = ha.wait_failed_over(&first, Duration::from_secs(20)).await;
    let back = renewed_within(&store, &generation, &a, Duration::from_secs(10)).await;
    eprintln!(
        "[ha-store] planned failover {first} -> {second}: promoted after {:.3} s, renewals \
         answered {:.3} s later",
        secs(promoted),
        secs(back)
    );
    // The same data (nothing was lost), and the event subscription moved too.
    assert_eq!(store.snapshot(4).await.unwrap().generation.id, generation);
    assert_eq!(store.delete(&a, &[0], None).await.unwrap(), vec![true]);
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("the release is heard from the new master")
        .unwrap();

    // Unplanned: the master is killed; the sentinels promote the other replica.
    leases::acquire(&store, &generation, &a, &[0], TTL)
        .await
        .unwrap();
    // The old master is a replica now too.
    ha.wait_replicated(2).await;
    let killed = Instant::now();
    let master = ha.master_port().await;
    ha.kill_replica(master);
    let (third, promoted) = ha.wait_failed_over(&second, Duration::from_secs(30)).await;
    let back = renewed_within(&store, &generation, &a, Duration::from_secs(10)).await;
    eprintln!(
        "[ha-store] master {second} killed: {third} promoted after {:.3} s, renewals \
         answered {:.3} s later ({:.3} s after the kill)",
        secs(promoted),
        secs(back),
        secs(killed.elapsed())
    );
    assert_eq!(store.snapshot(4).await.unwrap().generation.id, generation);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_store_reconnects_when_its_node_becomes_a_replica() {
    // A managed Redis: one name (here a proxy), a primary that moves. The node the name
    // led to becomes a replica of another, promoted, and the name leads there for new
    // connections; the store's connection still reaches the old node.
    let old = RedisServer::start();
    let new = RedisServer::start();
    let name = RedisProxy::start(old.addr()).await.unwrap();
    let store = RedisStore::connect(&name.url(), "ha", options())
        .await
        .unwrap();
    let a = PodId::new("a").unwrap();
    let generation = store.snapshot(4).await.unwrap().generation.id;
    leases::acquire(&store, &generation, &a, &[0], TTL)
        .await
        .unwrap();
    new.command(&["REPLICAOF", "127.0.0.1", &old.port().to_string()]);
    wait_for_async(
        "the new node has the data",
        Duration::from_secs(10),
        || async { new.command(&["EXISTS", "posgate:{ha}:lease:0"]) == ":1" },
    )
    .await;
    new.command(&["REPLICAOF", "NO", "ONE"]);
    old.command(&["REPLICAOF", "127.0.0.1", &new.port().to_string()]);
    name.retarget(new.addr());
    // The old node answers READONLY; the store reconnects (paced), and reaches the new
    // primary through the name: calls fail only until the first lookup's new connection
    // is in use, not an error storm, and none is taken for an answer. How many calls
    // this loop fits in that time is the scheduler's (1-3 on an idle machine, 36 within
    // 5 ms under CI's load once); that a second lookup (250 ms later) was not needed is
    // the store's.
    let started = Instant::now();
    let mut refused = 0;
    loop {
        match leases::renew(&store, &generation, &a, &[0], TTL).await {
            Err(StoreError::Refused { code, .. }) if code == "READONLY" => refused += 1,
            Err(other) => panic!("unexpected error {other}"),
            Ok(Checked::Ok(outcomes)) => {
                assert_eq!(outcomes, [RenewOutcome::Renewed]);
                break;
            }
            Ok(other) => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "still READONLY");
    }
    eprintln!(
        "[ha-direct] {refused} calls refused READONLY, the new primary answered after {:.3} s",
        secs(started.elapsed())
    );
    assert!(
        refused >= 1,
        "the old node never refused: no failover to follow"
    );
    assert!(
        started.elapsed() < LOOK_EVERY,
        "{refused} calls refused over {:.3} s: more than one lookup",
        secs(started.elapsed())
    );
}

/// The store's pace of master lookups (`src/store/redis/follow.rs`).
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Latency of `calls` renewals of one lease, sequential: (mean, p99).
async fn renewal_latency(
    store: &RedisStore,
    generation: &str,
    pod: &PodId,
    calls: usize,
) -> (Duration, Duration) {
    let mut took = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        let answer = leases::renew(store, generation, pod, &[0], TTL).await;
        took.push(started.elapsed());
        assert!(matches!(answer, Ok(Checked::Ok(_))), "{answer:?}");
    }
    took.sort();
    let mean = took.iter().sum::<Duration>() / calls as u32;
    (mean, took[calls * 99 / 100])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_write_counts_only_once_a_replica_acknowledged_it() {
    let (ha, master) = RedisHa::start(HaOptions::default()).await;
    let plain = RedisStore::connect(&ha.url(), "ha", options())
        .await
        .unwrap();
    let wait = Wait {
        replicas: 1,
        timeout: Duration::from_millis(100),
    };
    let waiting = RedisOptions {
        wait: Some(wait),
        ..options()
    };
    let acked = RedisStore::connect(&ha.url(), "ha", waiting).await.unwrap();
    let a = PodId::new("a").unwrap();
    let generation = acked.snapshot(4).await.unwrap().generation.id;
    leases::acquire(&acked, &generation, &a, &[0], TTL)
        .await
        .unwrap();
    // What the acknowledgement costs: still one round trip (WAIT is pipelined behind the
    // script), plus the replicas' acknowledgement.
    let before = acked.round_trips();
    let (mean_acked, p99_acked) = renewal_latency(&acked, &generation, &a, 500).await;
    assert_eq!(acked.round_trips() - before, 500, "one round trip per call");
    let (mean_plain, p99_plain) = renewal_latency(&plain, &generation, &a, 500).await;
    eprintln!(
        "[ha-wait] 500 renewals on loopback: without WAIT mean {:.3} ms, p99 {:.3} ms; \
         with WAIT 1 mean {:.3} ms, p99 {:.3} ms",
        secs(mean_plain) * 1e3,
        secs(p99_plain) * 1e3,
        secs(mean_acked) * 1e3,
        secs(p99_acked) * 1e3,
    );
    // No replica takes the writes: applied, not acknowledged, so not counted.
    ha.cut_replication();
    let started = Instant::now();
    match leases::renew(&acked, &generation, &a, &[0], TTL).await {
        Err(StoreError::NotReplicated {
            acked: 0,
            wanted: 1,
        }) => {}
        other => panic!("a renewal no replica acknowledged answered {other:?}"),
    }
    assert!(started.elapsed() < options().response_timeout);
    // Without the option the same renewal counts.
    let answer = leases::renew(&plain, &generation, &a, &[0], TTL).await;
    assert!(matches!(answer, Ok(Checked::Ok(ref o)) if o == &[RenewOutcome::Renewed]));
    // Reads and the other writes are not waited for.
    plain.snapshot(4).await.unwrap();
    acked.snapshot(4).await.unwrap();
    drop(master);
}
