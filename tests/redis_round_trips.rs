//! Steady-state Redis load of a pod with the default timings (poll 1 s, renew 5 s,
//! heartbeat 5 s): at most 2 round trips per second per pod, counted by the client.
//!
//! The pods run as `posgate serve` does, with the POS connection manager (an empty
//! directory), so its directory version check is counted too. The bound follows from
//! the design (one poll per second, one renew and one heartbeat per five seconds, one
//! directory version check per four, one pub/sub PING per five: 1.85/s), so it is a
//! behaviour check, not a speed check: a slower machine makes fewer calls, not more. The
//! measured rates and Redis's own `INFO commandstats` (where a script counts each inner
//! call) are printed for the issue notes.

use std::time::Duration;

use posgate::config::PodConfig;
use posgate::core::{CoreConfig, PodId};
use posgate::pod::Pod;
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate::store::CoordStore;

use crate::support::wait::wait_for;
use crate::support::{pod, RedisServer};

const CLUSTER: &str = "rt";
const PODS: usize = 3;
const WINDOW: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_makes_at_most_two_round_trips_per_second_in_steady_state() {
    let redis = RedisServer::start();
    let options = RedisOptions::default();
    // An existing cluster: the store generation is older than one member TTL, so the
    // pods do not hold their first claims (see "Recovery" in docs/design.md).
    let setup = RedisStore::connect(&redis.url(), CLUSTER, options.clone())
        .await
        .unwrap();
    setup.snapshot(64).await.unwrap();
    redis.command(&[
        "HSET",
        &format!("posgate:{{{CLUSTER}}}:gen"),
        "created_ms",
        "0",
    ]);

    let core = CoreConfig::default();
    let mut pods = Vec::new();
    for i in 0..PODS {
        let store = RedisStore::connect(&redis.url(), CLUSTER, options.clone())
            .await
            .unwrap();
        let (listener, url) = pod::listen().await;
        let id = PodId::new(format!("rt-{i}")).unwrap();
        let config = PodConfig::new(id, url, core.clone(), None);
        let handle = Pod::start_with_terminals(config, store.clone(), listener).unwrap();
        pods.push((store, handle));
    }
    wait_for("the pods to be ready", Duration::from_secs(30), || {
        pods.iter().all(|(_, h)| h.status.borrow().ready)
    })
    .await;
    // Let the first renewals and heartbeats of every pod fall into their regular rhythm.
    tokio::time::sleep(core.renew_interval).await;

    redis.command(&["CONFIG", "RESETSTAT"]);
    let before: Vec<u64> = pods.iter().map(|(s, _)| s.round_trips()).collect();
    tokio::time::sleep(WINDOW).await;
    let rates: Vec<f64> = pods
        .iter()
        .zip(&before)
        .map(|((s, _), b)| (s.round_trips() - b) as f64 / WINDOW.as_secs_f64())
        .collect();
    let stats = info_commandstats(&redis.url()).await;
    eprintln!("[round-trips] client round trips/s per pod over {WINDOW:?}: {rates:.2?}");
    eprintln!("[round-trips] redis INFO commandstats for {PODS} pods over {WINDOW:?}:\n{stats}");
    for rate in &rates {
        assert!(*rate <= 2.0, "steady-state round trips per pod: {rates:?}");
        assert!(*rate > 0.5, "the pods stopped talking to Redis: {rates:?}");
    }
    for (_, handle) in &mut pods {
        handle.shutdown();
    }
    for (_, handle) in &mut pods {
        handle.wait().await.unwrap();
    }
}

/// Redis's own count of commands (a script's inner calls count there too).
async fn info_commandstats(url: &str) -> String {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .collect::<Vec<_>>()
        .join("\n")
}
