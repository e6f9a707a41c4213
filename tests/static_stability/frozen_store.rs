//! Redis frozen (SIGSTOP) for 2.5x the lease TTL under open-loop pushes, then resumed
//! (its leases expired meanwhile) or killed and restarted empty: the pods hold their
//! shards and keep delivering on them (cluster-wide verdict), no terminal is
//! disconnected, and afterwards every shard is re-claimed by the pod that held it.

use std::time::{Duration, Instant};

use posgate::config::PosConfig;
use posgate_loadtest::load::pushgen::PushRecord;
use posgate_loadtest::load::unix_ms;
use posgate_pos_sim::FarmCounters;

use super::{assert_no_key_twice, fast, RATE, TERMINALS};
use crate::support::farm::{self, Farm};
use crate::support::gateway::{moved, open_loop, sent_between, summary, Gateway};
use crate::support::pod::{served, SHARDS};
use crate::support::wait::{secs, wait_for};

/// How long the store stays frozen: 2.5x the lease TTL.
fn freeze() -> Duration {
    fast().lease_ttl.mul_f64(2.5)
}

/// Fails the test if a terminal connection closed or a new one opened since `before`
/// (a terminal disconnected, or redialed); `when` says when it was seen.
fn assert_connections_kept(farm: &Farm, before: &FarmCounters, when: &str, test: &str) {
    let now = farm.counters();
    assert!(
        now.connections_closed == before.connections_closed
            && now.connections_opened == before.connections_opened,
        "[{test}] terminal connections changed {when}: {}",
        now.changes_since(before)
    );
}

/// [`assert_connections_kept`] every 100 ms for `span`.
async fn assert_no_disconnect_for(farm: &Farm, before: &FarmCounters, span: Duration, test: &str) {
    let started = Instant::now();
    while started.elapsed() < span {
        let when = format!("{:.3} s into the freeze", secs(started.elapsed()));
        assert_connections_kept(farm, before, &when, test);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The farm after a scenario: not one terminal disconnected or redialed since `before`,
/// every terminal connected once, no session overlap, no key accepted twice.
fn assert_terminals_kept(farm: &Farm, before: &FarmCounters, pushes: &[PushRecord], test: &str) {
    let after = farm.counters();
    eprintln!(
        "[{test}] farm since the start of the load: {}",
        after.changes_since(before)
    );
    let disconnected = after.connections_closed - before.connections_closed;
    eprintln!("[{test}] terminals disconnected: {disconnected}");
    assert_eq!(disconnected, 0, "terminal connections closed");
    assert_eq!(
        after.connections_opened, before.connections_opened,
        "redials"
    );
    assert_eq!(after.terminals_connected, TERMINALS);
    assert_eq!(after.session_overlaps, 0, "session overlaps");
    assert_no_key_twice(farm, pushes, test);
}

/// What becomes of the frozen Redis.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// SIGCONT: back with its data (the leases expired meanwhile).
    Resume,
    /// SIGKILL and an empty `redis-server` on the same port.
    RestartEmpty,
}

/// `pods` pods under open-loop pushes; Redis frozen for [`freeze`], then `then`; checks
/// the pushes, the terminals and the owners.
async fn frozen_store(pods: usize, then: Then, test: &str) {
    let test_started = Instant::now();
    let mut gw = Gateway::start(pods, farm::config(TERMINALS), test).await;
    let owners = gw.owners();
    let before = gw.farm.counters();
    let load = open_loop(gw.all_targets(), RATE, TERMINALS, test);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let frozen = unix_ms();
    gw.redis.freeze();
    assert_no_disconnect_for(&gw.farm, &before, freeze(), test).await;
    let serving: usize = gw.handles().iter().map(|h| served(h).len()).sum();
    eprintln!(
        "[{test}] {:.1} s into the freeze: {serving} of {SHARDS} shards still served",
        secs(freeze())
    );
    let thawed = unix_ms();
    match then {
        Then::Resume => gw.redis.thaw(),
        Then::RestartEmpty => gw.redis.restart_empty(),
    }
    // The leases expired meanwhile (or are gone with the data): each shard is
    // re-claimed with a higher epoch, said hello with on the same connections.
    let reclaimed = || {
        assert_connections_kept(&gw.farm, &before, "while the shards were re-claimed", test);
        let now = gw.owners();
        gw.current()
            && owners
                .iter()
                .all(|(s, (_, old))| now.get(s).is_some_and(|o| o.1 > *old))
    };
    let back = wait_for(
        "every shard re-claimed and every terminal current after the freeze",
        Duration::from_secs(20),
        reclaimed,
    )
    .await;
    eprintln!(
        "[{test}] Redis {}: every shard re-claimed with a higher epoch and every terminal \
         current {:.3} s later",
        if then == Then::Resume {
            "resumed"
        } else {
            "restarted empty"
        },
        secs(back)
    );
    // Pushes go on past the recovery (after an empty restart, past a directory poll of
    // the pods, which finds no terminal), then the load stops.
    let more = match then {
        Then::Resume => Duration::from_secs(2),
        Then::RestartEmpty => PosConfig::default().directory_poll + Duration::from_secs(1),
    };
    tokio::time::sleep(more).await;
    let ended = unix_ms();
    let pushes = load.stop().await;

    let during = summary(
        test,
        "sent during the freeze",
        &sent_between(&pushes, frozen, thawed),
    );
    let afterwards = summary(
        test,
        "sent after the freeze",
        &sent_between(&pushes, thawed, ended),
    );
    summary(test, "sent in all", &pushes);
    assert!(during.sent > 0 && afterwards.sent > 0);
    // The first attempt counts: a retry can wait the outage out, which is no proof the
    // pods delivered during it.
    assert!(
        during.ok_ratio >= 0.995,
        "{:.2}% of the pushes sent during the freeze answered 200 first time: {:?}",
        100.0 * during.ok_ratio,
        during.by_outcome
    );
    if then == Then::RestartEmpty {
        // Throughout: also while the pods re-claim in the new generation.
        assert!(
            afterwards.ok_ratio >= 0.995,
            "{:.2}% of the pushes sent after the restart answered 200 first time: {:?}",
            100.0 * afterwards.ok_ratio,
            afterwards.by_outcome
        );
    }
    assert_terminals_kept(&gw.farm, &before, &pushes, test);
    let moved = moved(&owners, &gw.owners());
    eprintln!("[{test}] shards with another owner afterwards: {moved:?}");
    assert!(moved.is_empty(), "owners changed: {moved:?}");
    gw.assert_no_overlap(test);
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pods_keep_delivering_while_redis_is_frozen() {
    frozen_store(3, Then::Resume, "freeze-3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_pod_keeps_delivering_while_redis_is_frozen() {
    frozen_store(1, Then::Resume, "freeze-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pods_keep_delivering_through_a_freeze_and_an_empty_restart() {
    frozen_store(3, Then::RestartEmpty, "freeze-wipe-3").await;
}
