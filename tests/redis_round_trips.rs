//! Steady-state Redis load of a pod with the default timings (poll 1 s, renew 5 s,
//! heartbeat 5 s): at most 2 round trips per second per pod, counted by the client, and
//! at 1,024 shards at most 2 KB per second each way and 20 commands per second (those
//! inside scripts included), counted by Redis (`INFO stats`).
//!
//! The pods run as `posgate serve` does, with the POS connection manager (an empty
//! directory), so its directory version check is counted too. The bound follows from
//! the design (one poll per second, one renew and one heartbeat per five seconds, one
//! directory version check per four, one pub/sub PING per five: 1.85/s), so it is a
//! behaviour check, not a speed check: a slower machine makes fewer calls, not more. The
//! measured rates and Redis's own `INFO commandstats` (where a script counts each inner
//! call) are printed for the issue notes:
//!
//! ```sh
//! cargo test --test it redis_round_trips -- --nocapture
//! ```

use std::time::Duration;

use posgate::config::PodConfig;
use posgate::core::{CoreConfig, PodId};
use posgate::pod::Pod;
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate::store::CoordStore;

use crate::support::wait::wait_for;
use crate::support::{pod, RedisServer};

const CLUSTER: &str = "rt";
const WINDOW: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_makes_at_most_two_round_trips_per_second_in_steady_state() {
    let load = steady_state(3, 64).await;
    for rate in &load.round_trips {
        assert!(*rate <= 2.0, "steady-state round trips per pod: {load:?}");
        assert!(*rate > 0.5, "the pods stopped talking to Redis: {load:?}");
    }
}

/// What a pod sends Redis and gets back, and the commands Redis runs for it, do not grow
/// with the shard count: the poll answers a digest while nothing changed, renewals name
/// their leases by shard, and a pod keeps all its leases by one pod lease (one write per
/// renewal, not one per lease: 205 leases per pod here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_sends_and_receives_under_2_kb_and_20_commands_per_second_at_1024_shards() {
    let load = steady_state(5, 1024).await;
    assert!(
        load.bytes_in <= 2048.0 && load.bytes_out <= 2048.0,
        "bytes per pod per second into and out of Redis: {load:?}"
    );
    assert!(
        load.commands <= 20.0,
        "commands per pod per second, those inside scripts included: {load:?}"
    );
    assert!(
        load.bytes_in > 100.0,
        "the pods stopped talking to Redis: {load:?}"
    );
}

/// Steady-state Redis load per pod per second.
#[derive(Debug)]
#[allow(dead_code)] // Read through `Debug` in the assertions' messages.
struct Load {
    /// Client round trips, per pod.
    round_trips: Vec<f64>,
    /// Bytes into and out of Redis (`INFO stats`), per pod.
    bytes_in: f64,
    bytes_out: f64,
    /// Commands Redis ran, those inside scripts included (`INFO stats`), per pod.
    commands: f64,
}

/// Runs `pods` pods of a cluster with `shards` shards until they are ready and settled,
/// then measures their Redis load over [`WINDOW`] and stops them.
async fn steady_state(pods: usize, shards: u32) -> Load {
    let redis = RedisServer::start();
    let options = RedisOptions::default();
    // An existing cluster: the store generation is older than one member TTL, so the
    // pods do not hold their first claims (see "Recovery" in docs/design.md).
    let setup = RedisStore::connect(&redis.url(), CLUSTER, options.clone())
        .await
        .unwrap();
    setup.snapshot(shards).await.unwrap();
    redis.command(&[
        "HSET",
        &format!("posgate:{{{CLUSTER}}}:gen"),
        "created_ms",
        "0",
    ]);

    let core = CoreConfig {
        shards,
        ..CoreConfig::default()
    };
    let mut running = Vec::new();
    for i in 0..pods {
        let store = RedisStore::connect(&redis.url(), CLUSTER, options.clone())
            .await
            .unwrap();
        let (listener, url) = pod::listen().await;
        let id = PodId::new(format!("rt-{i}")).unwrap();
        let config = PodConfig::new(id, url, core.clone(), None);
        let handle = Pod::start_with_terminals(config, store.clone(), listener).unwrap();
        running.push((store, handle));
    }
    wait_for(
        "the pods to own every shard",
        Duration::from_secs(60),
        || {
            let owned: usize = running
                .iter()
                .map(|(_, h)| {
                    h.status
                        .borrow()
                        .shards
                        .iter()
                        .filter(|s| s.serving)
                        .count()
                })
                .sum();
            running.iter().all(|(_, h)| h.status.borrow().ready) && owned == shards as usize
        },
    )
    .await;
    // Let the first renewals and heartbeats of every pod fall into their regular rhythm.
    tokio::time::sleep(core.renew_interval).await;

    redis.command(&["CONFIG", "RESETSTAT"]);
    let before: Vec<u64> = running.iter().map(|(s, _)| s.round_trips()).collect();
    tokio::time::sleep(WINDOW).await;
    let per_second = |n: f64| n / WINDOW.as_secs_f64();
    let round_trips = running
        .iter()
        .zip(&before)
        .map(|((s, _), b)| per_second((s.round_trips() - b) as f64))
        .collect();
    let stats = info(&redis.url(), "stats").await;
    let commandstats = info(&redis.url(), "commandstats").await;
    let per_pod = |n: u64| per_second(n as f64) / pods as f64;
    let load = Load {
        round_trips,
        bytes_in: per_pod(field(&stats, "total_net_input_bytes")),
        bytes_out: per_pod(field(&stats, "total_net_output_bytes")),
        commands: per_pod(field(&stats, "total_commands_processed")),
    };
    eprintln!("[round-trips] {pods} pods, {shards} shards, over {WINDOW:?}: {load:.1?}");
    eprintln!("[round-trips] redis INFO commandstats:\n{commandstats}");
    for (_, handle) in &mut running {
        handle.shutdown();
    }
    for (_, handle) in &mut running {
        handle.wait().await.unwrap();
    }
    // Redis's CPU for one poll of an unchanged view, for the capacity guide: the cost of
    // a pod's poll that the bytes above do not show.
    setup.snapshot(shards).await.unwrap();
    redis.command(&["CONFIG", "RESETSTAT"]);
    for _ in 0..100 {
        setup.snapshot(shards).await.unwrap();
    }
    let commandstats = info(&redis.url(), "commandstats").await;
    let cpu = |name: &str| {
        let line = commandstats.lines().find(|l| l.starts_with(name));
        line.and_then(|l| {
            l.split(",usec=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<f64>()
                .ok()
        })
    };
    let poll_us = cpu("cmdstat_evalsha:").expect("evalsha in commandstats") / 100.0;
    eprintln!(
        "[round-trips] {shards} shards: Redis CPU per poll of an unchanged view {poll_us:.0} us"
    );
    load
}

/// The number `name:<n>` in an `INFO` answer.
fn field(info: &str, name: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO:\n{info}"))
}

/// One section of Redis's `INFO` (`commandstats` counts a script's inner calls too).
async fn info(url: &str, section: &str) -> String {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .unwrap()
}
