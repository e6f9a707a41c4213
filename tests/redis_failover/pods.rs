//! Three pods over 300 simulated terminals and a Sentinel deployment, under open-loop
//! pushes (100/s, a key of its own each, retried with the same key through another pod
//! when not answered 200), through five failovers of the master. What each must keep:
//! pushes answered 200 (at least 99.9% in the end), no terminal disconnected or
//! redialed, no session overlap, no key taken twice, no epoch a terminal refused (the
//! store never handed out one below what a terminal had seen), the same owner for every
//! shard afterwards; and how long until ownership may change again (every pod reaches
//! the store, no recovery hold) is printed.

use std::time::{Duration, Instant};

use posgate_loadtest::load::unix_ms;
use posgate_pos_sim::FarmCounters;

use crate::support::farm;
use crate::support::gateway::{moved, open_loop, sent_between, summary, Gateway};
use crate::support::pod::Setup;
use crate::support::redis_ha::{HaOptions, RedisHa};
use crate::support::wait::{secs, wait_for};

/// Terminals of every case.
const TERMINALS: u64 = 300;
/// Open-loop pushes per second.
const RATE: f64 = 100.0;
/// How far behind the real clock the replicas of case (d) run: more than a failover
/// takes, so the promoted one's `TIME` is older than every epoch the old master gave.
const CLOCK_BEHIND_SECS: i64 = -60;

/// The failover each test puts the cluster through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failover {
    /// (a) `SENTINEL FAILOVER`: the old master is demoted, nothing is lost.
    Planned,
    /// (b) `kill -9` of the master.
    Killed,
    /// (c) The replication links cut, a pod joins (its registration, the placement, the
    /// releases and acquisitions of the move reach only the master), then the master is
    /// killed: the promoted replica never saw any of it, and its clock is
    /// [`CLOCK_BEHIND_SECS`] off, so only the pods' floors keep the epochs it hands out
    /// above the lost ones.
    LosingWrites,
    /// (d) The master killed; the promoted replica's clock is [`CLOCK_BEHIND_SECS`] off.
    /// Afterwards a pod joins, so shards are acquired on it.
    ClockBehind,
    /// (e) The replication links stalled for longer than a member TTL, then a planned
    /// failover: the promoted replica shows every registration and lease expired, but
    /// the same placement. Only the heartbeat count it lost tells the pods the store
    /// went back; without it they place the shards on whoever registered again first.
    LosingRegistrations,
}

/// Fails the test if a terminal connection closed or opened since `before`.
fn assert_connections_kept(now: &FarmCounters, before: &FarmCounters, test: &str) {
    assert!(
        now.connections_closed == before.connections_closed
            && now.connections_opened == before.connections_opened,
        "[{test}] terminal connections changed: {}",
        now.changes_since(before)
    );
}

async fn through(failover: Failover, test: &str) {
    let test_started = Instant::now();
    let behind = matches!(failover, Failover::LosingWrites | Failover::ClockBehind);
    let opts = HaOptions {
        replica_clock: behind.then_some(CLOCK_BEHIND_SECS),
        // The stalled links must outlast the setup and the stall: see the option.
        failover_timeout: (failover == Failover::LosingRegistrations)
            .then_some(Duration::from_secs(60)),
        ..HaOptions::default()
    };
    let (ha, master) = RedisHa::start(opts).await;
    let url = ha.url();
    let pods = if failover == Failover::LosingWrites {
        2
    } else {
        3
    };
    let farm = farm::config(TERMINALS);
    let mut gw = Gateway::start_at(master, &url, Setup::default(), pods, farm, test).await;
    ha.wait_replicated(2).await;
    let load = open_loop(gw.all_targets(), RATE, TERMINALS, test);
    tokio::time::sleep(Duration::from_secs(1)).await;
    if failover == Failover::LosingWrites {
        ha.cut_replication();
        gw.add_pod().await;
        let joined = wait_for(
            "the third pod's share moved to it",
            Duration::from_secs(30),
            || gw.balanced(),
        )
        .await;
        eprintln!(
            "[{test}] replication cut; a pod joined and took its share in {:.3} s (none of it replicated)",
            secs(joined)
        );
    }
    if failover == Failover::LosingRegistrations {
        ha.stall_replication();
        let core = Setup::default().core;
        tokio::time::sleep(core.member_ttl + core.heartbeat_interval).await;
        eprintln!("[{test}] replication stalled for a member TTL and a heartbeat interval");
    }
    let owners = gw.owners();
    let before = gw.farm.counters();
    let old = ha.master_addr().await;
    let began = unix_ms();
    let failed_at = Instant::now();
    match failover {
        Failover::Planned | Failover::LosingRegistrations => ha.failover().await,
        _ => gw.redis.stop(),
    }
    let (new, promoted) = ha.wait_failed_over(&old, Duration::from_secs(30)).await;
    if behind {
        let lag = ha.clock_lag(&new).await;
        eprintln!(
            "[{test}] the new master's clock is {:.1} s behind",
            secs(lag)
        );
        assert!(
            lag > Duration::from_secs(50),
            "the clock shift did not take"
        );
    }
    let serving = wait_for(
        "every pod reaches the store again, with no recovery hold",
        Duration::from_secs(30),
        || {
            gw.handles().iter().all(|h| {
                let status = h.status.borrow();
                status.store.reachable() && status.recovery_hold.is_none()
            })
        },
    )
    .await;
    eprintln!(
        "[{test}] {failover:?}: {old} -> {new} promoted after {:.3} s; ownership may change \
         again {:.3} s after the failover began",
        secs(promoted),
        secs(failed_at.elapsed()),
    );
    let _ = serving;
    // Every terminal current again (new epochs said hello on the same connections where
    // the store forgot a lease), and pushes go on a little longer.
    wait_for(
        "every shard served once, every terminal current",
        Duration::from_secs(20),
        || gw.current(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ended = unix_ms();
    let pushes = load.stop().await;

    let during = summary(
        test,
        "sent from the failover on",
        &sent_between(&pushes, began, ended),
    );
    summary(test, "sent in all", &pushes);
    assert!(during.sent > 0);
    assert!(
        during.final_ok_ratio >= 0.999,
        "[{test}] {:.2}% of the pushes sent from the failover on answered 200: {:?}",
        100.0 * during.final_ok_ratio,
        during.by_final_outcome
    );
    let after = gw.farm.counters();
    eprintln!(
        "[{test}] farm since the failover: {}",
        after.changes_since(&before)
    );
    assert_connections_kept(&after, &before, test);
    assert_eq!(after.session_overlaps, 0, "[{test}] session overlaps");
    assert_eq!(
        after.keys_delivered_twice, 0,
        "[{test}] keys delivered twice"
    );
    assert_eq!(
        (after.stale_hellos_refused, after.stale_pushes_refused),
        (before.stale_hellos_refused, before.stale_pushes_refused),
        "[{test}] a terminal refused an epoch as stale"
    );
    let now = gw.owners();
    let moved = moved(&owners, &now);
    assert!(moved.is_empty(), "[{test}] owners changed: {moved:?}");
    let renewed: Vec<_> = owners
        .iter()
        .filter(|(s, (_, epoch))| now.get(s).is_some_and(|(_, e)| e > epoch))
        .map(|(s, _)| *s)
        .collect();
    eprintln!(
        "[{test}] {} shards served with a higher epoch afterwards (re-claimed), none lower",
        renewed.len()
    );
    assert!(owners.iter().all(|(s, (_, e))| now[s].1 >= *e));
    if matches!(
        failover,
        Failover::LosingWrites | Failover::LosingRegistrations
    ) {
        // Acquisitions or renewals were lost: those leases were re-claimed above them.
        assert!(!renewed.is_empty(), "[{test}] no lease was re-claimed");
        let rollbacks: u64 = gw
            .handles()
            .iter()
            .map(|h| h.metrics.store_rollbacks.get())
            .sum();
        assert!(rollbacks > 0, "[{test}] no pod found the store gone back");
    }
    if failover == Failover::ClockBehind {
        join_on_a_clock_behind(&mut gw, test).await;
    }
    gw.assert_no_overlap(test);
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}

/// A pod joins while the master's clock is behind every epoch handed out: the shards it
/// takes get epochs above the ones their terminals saw, and no terminal refuses one.
async fn join_on_a_clock_behind(gw: &mut Gateway, test: &str) {
    let before = gw.owners();
    let counters = gw.farm.counters();
    gw.add_pod().await;
    let took = wait_for(
        "the joined pod took its share",
        Duration::from_secs(30),
        || gw.balanced(),
    )
    .await;
    let after = gw.owners();
    let moved = moved(&before, &after);
    eprintln!(
        "[{test}] a pod joined after the failover: {} shards moved to it in {:.3} s",
        moved.len(),
        secs(took)
    );
    assert!(!moved.is_empty());
    for shard in &moved {
        assert!(
            after[shard].1 > before[shard].1,
            "[{test}] shard {shard}: epoch {} after {}",
            after[shard].1,
            before[shard].1
        );
    }
    let now = gw.farm.counters();
    assert_eq!(
        (now.stale_hellos_refused, now.stale_pushes_refused),
        (counters.stale_hellos_refused, counters.stale_pushes_refused),
        "[{test}] a terminal refused an epoch as stale"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planned_failover_costs_no_delivery() {
    through(Failover::Planned, "ha-planned").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_master_costs_no_delivery() {
    through(Failover::Killed, "ha-killed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_that_loses_registrations_keeps_every_owner() {
    through(Failover::LosingRegistrations, "ha-lost-registrations").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_that_loses_lease_writes_keeps_every_owner() {
    through(Failover::LosingWrites, "ha-lost-writes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_promoted_replica_with_a_clock_behind_hands_out_no_lower_epoch() {
    through(Failover::ClockBehind, "ha-clock-behind").await;
}
