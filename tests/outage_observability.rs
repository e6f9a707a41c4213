//! What an operator sees of a Redis outage, end to end: one pod
//! (`Pod::start_with_terminals`) over a real `redis-server` and a farm of simulated
//! terminals, Redis frozen with SIGSTOP for 2.5x the lease TTL while pushes go on (one
//! every 50 ms, open loop), and the pod's `/metrics` before, during and after:
//!
//! - during: verdict `cluster_wide` (one pod is its own majority), every shard suspended
//!   and delivering, none parked, the seconds since Redis answered past the lease TTL,
//!   and `posgate_pushes_on_suspended_shards_total` counting exactly the pushes the
//!   shards delivered past their leases (at least every 200 sent once every lease
//!   deadline had passed, at most every 200 of the freeze; none before it);
//! - after SIGCONT: back to `reachable`, nothing suspended, 0 s, and the counter stays
//!   where it was while pushes go on.
//!
//! Timings are `CoreConfig::fast()` (lease TTL 3 s); figures are printed
//! (`--nocapture`).

use std::time::{Duration, Instant};

use http::StatusCode;
use posgate::core::CoreConfig;
use posgate::pod::PodHandle;

use crate::support::api::{self, Http, Push};
use crate::support::farm::{self, Farm};
use crate::support::pod::{self, Setup};
use crate::support::wait::{secs, wait_for, wait_for_async};
use crate::support::RedisServer;

const TOKEN: &str = "outage-token-0123456789";
const TERMINALS: u64 = 100;
/// Open-loop push pace.
const EVERY: Duration = Duration::from_millis(50);
const HELD: &str = "posgate_pushes_on_suspended_shards_total";
const DELIVERING: &str = "posgate_shards_suspended{delivery=\"delivering\"}";
const PARKED: &str = "posgate_shards_suspended{delivery=\"parked\"}";
const UNREACHABLE_SECONDS: &str = "posgate_store_unreachable_seconds";

fn verdict(v: &str) -> String {
    format!("posgate_store_verdict{{verdict=\"{v}\"}}")
}

/// One push sent: when, and whether it was answered 200.
struct Sent {
    at: Instant,
    ok: bool,
}

/// Pushes one push every [`EVERY`] for `how_long` (open loop: each in its own task, to a
/// new key, terminals in turn from `first`), and waits for every answer.
async fn push_for(
    http: &Http,
    base: &str,
    farm: &Farm,
    first: usize,
    how_long: Duration,
) -> Vec<Sent> {
    let mut tick = tokio::time::interval(EVERY);
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    let mut i = first;
    while started.elapsed() < how_long {
        tick.tick().await;
        let (http, base) = (http.clone(), base.to_string());
        let terminal = farm.ids[i % farm.ids.len()].clone();
        tasks.spawn(async move {
            let key = format!("outage-{i}");
            let p = Push {
                key: Some(&key),
                query: "?timeout_ms=2000",
                ..Push::new(TOKEN)
            };
            let at = Instant::now();
            let (status, _, _) = api::push(&http, &base, &terminal, p).await;
            Sent {
                at,
                ok: status == StatusCode::OK,
            }
        });
        i += 1;
    }
    let mut sent = Vec::new();
    while let Some(done) = tasks.join_next().await {
        sent.push(done.unwrap());
    }
    sent
}

async fn start(redis: &RedisServer, farm: &Farm) -> (PodHandle, String) {
    let tokens = format!("acme:{TOKEN}");
    pod::start_with_api(
        &Setup::default(),
        "outage-pod",
        &redis.url(),
        farm,
        2_000,
        &tokens,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_shows_held_shards_delivering_then_normal_again() {
    let lease_ttl = CoreConfig::fast().lease_ttl;
    let redis = RedisServer::start();
    let farm = Farm::with_directory(&redis, farm::config(TERMINALS)).await;
    let (mut pod, base) = start(&redis, &farm).await;
    wait_for(
        "every terminal to hold a current session",
        farm::connect_limit(),
        || farm.all_sessions_current(&[&pod]),
    )
    .await;
    let http = api::client();

    // Before: pushes flow on leases; nothing is counted as held.
    let before = push_for(&http, &base, &farm, 0, Duration::from_secs(1)).await;
    assert!(
        before.iter().all(|s| s.ok),
        "a push failed before the outage"
    );
    let scrape = api::metrics(&http, &base).await;
    assert_eq!(
        api::scraped(&scrape, HELD),
        0.0,
        "pushes on leases counted as held"
    );
    assert_eq!(
        api::scraped(&scrape, &verdict("reachable")),
        1.0,
        "{scrape}"
    );
    assert_eq!(api::scraped(&scrape, UNREACHABLE_SECONDS), 0.0);
    assert_eq!(api::scraped(&scrape, DELIVERING), 0.0);

    // During: Redis frozen for 2.5x the lease TTL, pushes going on.
    redis.freeze();
    let frozen = Instant::now();
    let outage = lease_ttl * 5 / 2;
    let pushes = push_for(&http, &base, &farm, before.len(), outage).await;
    let scrape = api::metrics(&http, &base).await;
    let ok = pushes.iter().filter(|s| s.ok).count();
    // Every lease deadline lies within one TTL of the freeze (the last renewal was sent
    // before it): a push answered 200 after that was delivered on a held shard.
    let surely_held = pushes
        .iter()
        .filter(|s| s.ok && s.at >= frozen + lease_ttl)
        .count();
    let held = api::scraped(&scrape, HELD);
    eprintln!(
        "[outage] Redis frozen {:.1} s: {ok} of {} pushes 200 ({surely_held} sent after every \
         lease deadline); {held} counted as delivered on held shards; verdict cluster_wide {}, \
         {} s since Redis answered, suspended {} delivering / {} parked",
        secs(outage),
        pushes.len(),
        api::scraped(&scrape, &verdict("cluster_wide")),
        api::scraped(&scrape, UNREACHABLE_SECONDS),
        api::scraped(&scrape, DELIVERING),
        api::scraped(&scrape, PARKED),
    );
    assert_eq!(
        api::scraped(&scrape, &verdict("cluster_wide")),
        1.0,
        "{scrape}"
    );
    assert_eq!(api::scraped(&scrape, &verdict("reachable")), 0.0);
    assert_eq!(api::scraped(&scrape, "posgate_store_reachable"), 0.0);
    assert_eq!(
        api::scraped(&scrape, DELIVERING),
        f64::from(pod::SHARDS),
        "{scrape}"
    );
    assert_eq!(api::scraped(&scrape, PARKED), 0.0);
    assert_eq!(
        api::scraped(&scrape, "posgate_shards_served"),
        f64::from(pod::SHARDS)
    );
    assert!(
        api::scraped(&scrape, UNREACHABLE_SECONDS) > secs(lease_ttl),
        "{scrape}"
    );
    assert!(
        surely_held > 0,
        "no push was answered 200 past the deadlines"
    );
    assert!(
        held >= surely_held as f64 && held <= ok as f64,
        "{held} pushes counted as held, expected {surely_held}..={ok}"
    );

    // After: Redis answers again, everything returns to normal, the counter stays.
    redis.thaw();
    let recovered = wait_for_async(
        "the metrics to show a reachable store and no suspended shard",
        Duration::from_secs(20),
        || async {
            let s = api::metrics(&http, &base).await;
            api::scraped(&s, &verdict("reachable")) == 1.0
                && api::scraped(&s, &verdict("cluster_wide")) == 0.0
                && api::scraped(&s, UNREACHABLE_SECONDS) == 0.0
                && api::scraped(&s, DELIVERING) == 0.0
                && api::scraped(&s, PARKED) == 0.0
                && api::scraped(&s, "posgate_shards_served") == f64::from(pod::SHARDS)
        },
    )
    .await;
    let after = push_for(&http, &base, &farm, 100_000, Duration::from_secs(1)).await;
    let scrape = api::metrics(&http, &base).await;
    eprintln!(
        "[outage] metrics normal {:.2} s after SIGCONT; {} of {} pushes 200 afterwards",
        secs(recovered),
        after.iter().filter(|s| s.ok).count(),
        after.len()
    );
    assert!(after.iter().all(|s| s.ok), "a push failed after the outage");
    assert_eq!(
        api::scraped(&scrape, HELD),
        held,
        "pushes on renewed leases counted as held"
    );

    pod.shutdown();
    tokio::time::timeout(Duration::from_secs(10), pod.wait())
        .await
        .expect("pod stops within 10 s")
        .expect("pod stops cleanly");
}
