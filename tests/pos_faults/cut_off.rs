//! One pod, then every pod, cut off from Redis (each pod behind its own proxy).

use std::time::{Duration, Instant};

use posgate::core::shard::shard_of;
use posgate::core::{CoreConfig, ShardId};
use posgate::pod::PodHandle;
use posgate::pos::backoff::BackoffPolicy;

use crate::support::farm::{self, connect_limit, Farm};
use crate::support::pod::{self, served, SHARDS};
use crate::support::wait::{secs, wait_for};
use crate::support::{RedisProxy, RedisServer};

use super::{start_pod, DIAL_RATE};

/// Two pods, each behind its own proxy to one Redis, over a farm of `n` terminals.
struct ProxiedPods {
    /// Kept for the test's length: Redis stops when this drops.
    _redis: RedisServer,
    t: Farm,
    proxies: [RedisProxy; 2],
    pods: Vec<PodHandle>,
    /// When the test began, for the closing figure.
    started: Instant,
}

/// How many terminals [`ProxiedPods`] serve.
const PROXIED: u64 = 400;

impl ProxiedPods {
    /// Starts them and waits until every terminal holds a current session (and prints
    /// how long that took).
    async fn start(test: &str) -> ProxiedPods {
        let started = Instant::now();
        let n = PROXIED;
        let redis = RedisServer::start();
        let t = Farm::with_directory(&redis, farm::config(n)).await;
        let proxies = [
            RedisProxy::start(redis.addr()).await.unwrap(),
            RedisProxy::start(redis.addr()).await.unwrap(),
        ];
        let mut pods = Vec::new();
        for (i, proxy) in proxies.iter().enumerate() {
            let backoff = BackoffPolicy::default();
            pods.push(start_pod(i, &proxy.url(), &t, backoff, DIAL_RATE).await);
        }
        let pair = ProxiedPods {
            _redis: redis,
            t,
            proxies,
            pods,
            started,
        };
        let took = wait_for(
            "every terminal current with 2 pods",
            connect_limit(),
            || both_current(&pair.t, &pair.pods),
        )
        .await;
        eprintln!(
            "[{test}] {n} terminals current after {:.3} s; shards {} + {}",
            secs(took),
            served(&pair.pods[0]).len(),
            served(&pair.pods[1]).len()
        );
        pair
    }
}

/// The two `pods` together serve every shard, and every terminal is current with them.
fn both_current(t: &Farm, pods: &[PodHandle]) -> bool {
    served(&pods[0]).len() + served(&pods[1]).len() == SHARDS as usize
        && t.all_sessions_current(&[&pods[0], &pods[1]])
}

// ----- 1. one pod cut off from Redis -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_cut_off_from_redis_closes_its_terminals_before_another_pod_dials_them() {
    let test = "cut-one";
    let c = ProxiedPods::start(test).await;
    let before = c.t.counters();
    assert_eq!(before.raw_overlaps, 0);

    let (victim, survivor) = (0, 1);
    let theirs = served(&c.pods[victim]);
    let their_terminals =
        c.t.ids
            .iter()
            .filter(|id| theirs.contains(&shard_of(id, SHARDS)))
            .count();
    let cut = Instant::now();
    c.proxies[victim].cut();
    let stopped = wait_for(
        "the cut-off pod to stop serving",
        Duration::from_secs(10),
        || served(&c.pods[victim]).is_empty(),
    )
    .await;
    let survivor_took = wait_for(
        "every terminal current at the surviving pod",
        Duration::from_secs(20),
        || {
            served(&c.pods[survivor]).len() == SHARDS as usize
                && c.t.all_sessions_current(&[&c.pods[survivor]])
        },
    )
    .await;
    let after = c.t.counters();
    eprintln!(
        "[{test}] cut-off pod stopped serving its {} shards ({their_terminals} terminals) {:.3} s \
         after the cut; all {PROXIED} terminals current at the survivor {:.3} s after the cut",
        theirs.len(),
        secs(stopped),
        secs(cut.elapsed()),
    );
    let _ = survivor_took;
    eprintln!("[{test}] during the cut: {}", after.changes_since(&before));
    eprintln!("[{test}] counters: {after:?}");
    assert_eq!(
        after.raw_overlaps, 0,
        "a terminal was dialed by the survivor while the cut-off pod still held it"
    );
    assert_eq!(after.session_overlaps, 0, "session overlaps");
    assert_eq!(after.terminals_connected, PROXIED);
    assert_eq!(
        after.connections_open, PROXIED,
        "one connection per terminal"
    );
    assert!(
        after.connections_opened - before.connections_opened >= their_terminals as u64,
        "the survivor dialed the cut-off pod's terminals"
    );

    // Healed: the pod rejoins, shards move back gracefully (close before release).
    let healed = Instant::now();
    c.proxies[victim].restore();
    let took = wait_for(
        "both pods serving and every terminal current after the heal",
        Duration::from_secs(25),
        || !served(&c.pods[victim]).is_empty() && both_current(&c.t, &c.pods),
    )
    .await;
    let end = c.t.counters();
    eprintln!(
        "[{test}] after the heal: both pods serve ({} + {} shards), every terminal current in \
         {:.3} s; {}",
        served(&c.pods[0]).len(),
        served(&c.pods[1]).len(),
        secs(took),
        end.changes_since(&after)
    );
    let _ = healed;
    assert_eq!(end.raw_overlaps, 0, "raw overlaps while moving back");
    assert_eq!(
        end.session_overlaps, 0,
        "session overlaps while moving back"
    );
    pod::stop(c.pods).await;
    eprintln!("[{test}] test took {:.3} s", secs(c.started.elapsed()));
}

// ----- 2. every pod cut off from Redis -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_pods_cut_off_for_twice_the_ttl_disconnect_no_terminal() {
    let test = "cut-all";
    let c = ProxiedPods::start(test).await;
    let owners: Vec<Vec<ShardId>> = c.pods.iter().map(served).collect();
    let before = c.t.counters();

    let cut = Instant::now();
    for proxy in &c.proxies {
        proxy.cut();
    }
    let outage = CoreConfig::fast().lease_ttl * 2;
    // Sample the farm through the outage: not one connection may close.
    while cut.elapsed() < outage {
        let now = c.t.counters();
        assert_eq!(
            now.connections_closed,
            before.connections_closed,
            "a terminal connection closed {:.3} s into the outage: {}",
            secs(cut.elapsed()),
            now.changes_since(&before)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let during = c.t.counters();
    // Static stability: both pods agree the outage is cluster-wide, so past the lease
    // deadline every shard is still served, by the same owner, on the same sessions.
    let held: Vec<Vec<ShardId>> = c.pods.iter().map(served).collect();
    eprintln!(
        "[{test}] after {:.1} s without Redis: {} shards held and delivering; {}",
        secs(outage),
        held.iter().map(Vec::len).sum::<usize>(),
        during.changes_since(&before)
    );
    assert_eq!(held, owners, "every shard still served by its owner");
    assert_eq!(during.connections_opened, before.connections_opened);
    assert_eq!(during.connections_closed, before.connections_closed);
    assert_eq!(during.terminals_connected, PROXIED);

    let restored = Instant::now();
    for proxy in &c.proxies {
        proxy.restore();
    }
    let took = wait_for(
        "every terminal current again after the outage",
        Duration::from_secs(20),
        || both_current(&c.t, &c.pods),
    )
    .await;
    let back = c.t.counters();
    eprintln!(
        "[{test}] shards served again and every terminal current (new epochs) {:.3} s after \
         Redis came back; {}",
        secs(took),
        back.changes_since(&before)
    );
    // Past the generation hold and a debounce: nothing moves afterwards either.
    let fast = CoreConfig::fast();
    tokio::time::sleep(fast.member_ttl + fast.debounce).await;
    let end = c.t.counters();
    eprintln!(
        "[{test}] {:.1} s after restore: {}",
        secs(restored.elapsed()),
        end.changes_since(&before)
    );
    assert!(c.t.all_sessions_current(&[&c.pods[0], &c.pods[1]]));
    assert_eq!(
        end.connections_closed, before.connections_closed,
        "terminal connections closed because Redis blinked"
    );
    assert_eq!(
        end.connections_opened, before.connections_opened,
        "terminals redialed because Redis blinked"
    );
    assert!(
        end.sessions_accepted >= before.sessions_accepted + PROXIED,
        "the re-claimed shards said hello with their new epochs"
    );
    assert_eq!(end.sessions_superseded, before.sessions_superseded);
    assert_eq!(end.raw_overlaps, 0);
    assert_eq!(end.session_overlaps, 0);
    for (i, shards) in owners.iter().enumerate() {
        assert_eq!(
            &served(&c.pods[i]),
            shards,
            "pod {i} serves other shards now"
        );
    }
    pod::stop(c.pods).await;
    eprintln!("[{test}] test took {:.3} s", secs(c.started.elapsed()));
}
