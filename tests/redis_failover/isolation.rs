//! An old master isolated with one pod (issue 16, point 4). The master is cut off from
//! its replicas and the sentinels; one pod reaches it directly (`redis://`), the other
//! two through the sentinels, which promote a replica. The pods run with
//! `--redis-wait-replicas 1`: a renewal the old master applies but no replica
//! acknowledges does not count, so the lone pod's deadlines stay those of its last
//! renewal the new master has, and it stops before its leases expire there and the
//! others take its shards: never two pods serving one shard, no session overlap, no key
//! taken twice. The nodes run `min-replicas-to-write 1` / `min-replicas-max-lag 2` too,
//! as `docs/operations.md` recommends: the old master then refuses the lone pod's other
//! writes (`NOREPLICAS`) as well. Without the acknowledgement (`wait` off) the old
//! master takes the lone pod's renewals for two or three seconds more, and the pod
//! serves its shards while the others acquire them: this test fails.

use std::time::{Duration, Instant};

use posgate::store::redis::Wait;
use posgate_loadtest::load::unix_ms;

use crate::support::farm;
use crate::support::gateway::{open_loop, sent_between, summary, Gateway};
use crate::support::pod::{served, Setup, STORE_TIMEOUT};
use crate::support::redis_ha::{HaOptions, RedisHa};
use crate::support::wait::{secs, wait_for};

const TERMINALS: u64 = 300;
const RATE: f64 = 100.0;

/// The test pods with `--redis-wait-replicas 1` (a quarter of the store timeout).
fn acknowledged() -> Setup {
    let mut setup = Setup::default();
    setup.store.wait = Some(Wait {
        replicas: 1,
        timeout: STORE_TIMEOUT / 4,
    });
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_isolated_old_master_stops_taking_its_pods_renewals() {
    let test = "ha-isolated";
    let test_started = Instant::now();
    let opts = HaOptions {
        min_replicas_max_lag: Some(2),
        isolable: true,
        ..HaOptions::default()
    };
    let (ha, master) = RedisHa::start(opts).await;
    let direct = master.url();
    let farm = farm::config(TERMINALS);
    let mut gw = Gateway::start_at(master, &ha.url(), acknowledged(), 2, farm, test).await;
    let lone = gw.add_pod_at(&direct).await;
    wait_for(
        "three pods share the shards",
        Duration::from_secs(30),
        || gw.balanced(),
    )
    .await;
    let lone_id = gw.pods[lone].id.clone();
    let load = open_loop(gw.all_targets(), RATE, TERMINALS, test);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let old = ha.master_addr().await;
    let isolated = unix_ms();
    ha.isolate_master();
    let (new, promoted) = ha.wait_failed_over(&old, Duration::from_secs(30)).await;
    eprintln!(
        "[{test}] master isolated with {lone_id}; {new} promoted after {:.3} s",
        secs(promoted)
    );
    // The lone pod is refused, judges itself cut off, and gives its shards up; the
    // others take them over.
    let refused = wait_for(
        "the old master refuses the lone pod",
        Duration::from_secs(10),
        || {
            gw.pods[lone]
                .handle
                .metrics
                .store_errors
                .get_or_create(&[("op", "renew")])
                .get()
                > 0
        },
    )
    .await;
    let over = wait_for(
        "the other two serve every shard",
        Duration::from_secs(40),
        || {
            served(&gw.pods[lone].handle).is_empty()
                && gw
                    .pods
                    .iter()
                    .map(|p| served(&p.handle).len())
                    .sum::<usize>()
                    == 64
        },
    )
    .await;
    eprintln!(
        "[{test}] the lone pod's renewals failed {:.3} s after the failover; the others \
         served everything {:.3} s later",
        secs(refused),
        secs(over)
    );
    wait_for("every terminal current", Duration::from_secs(20), || {
        gw.farm.all_settled()
    })
    .await;
    let settled = unix_ms();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pushes = load.stop().await;
    let after = summary(
        test,
        "sent after the takeover",
        &sent_between(&pushes, settled, unix_ms()),
    );
    summary(
        test,
        "sent from the isolation on",
        &sent_between(&pushes, isolated, unix_ms()),
    );
    assert!(after.final_ok_ratio >= 0.99, "{:?}", after.by_final_outcome);
    let counters = gw.farm.counters();
    assert_eq!(counters.session_overlaps, 0, "session overlaps");
    assert_eq!(counters.keys_delivered_twice, 0, "keys delivered twice");
    gw.assert_no_overlap(test);
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}
