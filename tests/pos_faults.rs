//! Fault scenarios of the POS connections, end to end: whole pods against a real
//! `redis-server` and a `PosFarm` of simulated terminals (TLS + HTTP/2 on loopback), with
//! short timings (`CoreConfig::fast()`: lease TTL 3 s, renew 1 s, close budget 300 ms).
//!
//! - one pod cut off from Redis (a `TcpProxy` per pod) closes its terminals'
//!   connections before another pod dials them: zero raw and zero session overlaps;
//! - every pod cut off for 2x the lease TTL: not one terminal connection closed or opened,
//!   the shards are served again (new epochs, same connections) once Redis is back;
//! - a dropped connection is redialed exactly once (all of them at once: paced by
//!   `--dial-rate`); an offline terminal (refusing every connection) is redialed with
//!   backoff (attempts bounded, decaying), not in a loop;
//! - a terminal presenting a certificate for another name never gets a session, and the
//!   real `posgate serve` logs the warning once (there is no metric yet);
//! - a `posgate serve` process SIGSTOPped past its lease TTL and resumed causes zero
//!   session overlaps; no push sent through it on waking reaches a terminal under its
//!   old epochs; any stale hello is refused (409) and the cluster converges.
//!
//! Measured values and farm counters are printed (`--nocapture`). Each test takes about
//! 15-40 s.

pub mod support;

use std::io::Read;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use posgate::config::{PodConfig, PosSettings};
use posgate::core::shard::shard_of;
use posgate::core::{CoreConfig, PodId, ShardId};
use posgate::credentials::ClusterSecret;
use posgate::pod::{Pod, PodHandle};
use posgate::pos::backoff::BackoffPolicy;
use posgate::pos::manager::ManagerConfig;
use posgate::pos::tls::TlsFiles;
use posgate::store::directory::{DirectoryAdmin, Terminal};
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate_loadtest::pos_sim::{FarmConfig, FarmCounters, FaultConfig, PosFarm};
use support::redis_server::free_port;
use support::{RedisServer, TcpProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const SHARDS: u32 = 64;
const CLUSTER: &str = "pos-faults";
const STORE_TIMEOUT: Duration = Duration::from_millis(300);
const SECRET: &[u8] = b"pos-faults-test-cluster-secret";
/// Bearer token of the push API of the `posgate serve` pods (tenant `faults`).
const API_TOKEN: &str = "pos-faults-test-api-token-0123456789abcdef";

fn store_options() -> RedisOptions {
    RedisOptions {
        response_timeout: STORE_TIMEOUT,
        connect_timeout: STORE_TIMEOUT,
        ..Default::default()
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Polls `cond` every 50 ms until it holds; panics after `limit`. Returns the wait.
async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !cond() {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

// ----- the farm and the directory -------------------------------------------------------

/// A farm of `n` terminals whose directory entries are imported into `redis`.
struct Terminals {
    farm: PosFarm,
    ids: Vec<String>,
    dir: tempfile::TempDir,
    ca_file: PathBuf,
}

async fn farm_with_directory(redis: &RedisServer, config: FarmConfig) -> Terminals {
    let farm = PosFarm::start(config).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("pos-ca.pem");
    std::fs::write(&ca_file, farm.ca_pem()).unwrap();
    let terminals: Vec<Terminal> = farm
        .terminals()
        .iter()
        .map(|t| Terminal::new(&t.id, &t.addr.to_string(), Some(&t.server_name)).unwrap())
        .collect();
    import(redis, &terminals).await;
    let ids = terminals.iter().map(|t| t.id.clone()).collect();
    Terminals {
        farm,
        ids,
        dir,
        ca_file,
    }
}

fn farm_config(n: u64) -> FarmConfig {
    let mut config = FarmConfig::new(0..n);
    config.port = 0;
    config
}

async fn import(redis: &RedisServer, terminals: &[Terminal]) {
    let admin = RedisStore::connect(&redis.url(), CLUSTER, store_options())
        .await
        .unwrap();
    admin.upsert(SHARDS, terminals).await.unwrap();
}

/// Every terminal has exactly one open connection, holding a current (not superseded)
/// session at the highest epoch the terminal has seen. Says nothing about which pod.
fn all_settled(farm: &PosFarm, ids: &[String]) -> bool {
    ids.iter().all(|id| {
        farm.terminal_report(id).is_some_and(|r| {
            r.open_connections.len() == 1
                && !r.open_connections[0].superseded
                && r.open_connections[0].session_epoch.is_some()
                && r.open_connections[0].session_epoch == r.highest_epoch
        })
    })
}

/// True when every terminal has an open, not superseded session whose epoch is the one
/// its shard is served with by one of `pods` (and every shard is served).
fn all_sessions_current(farm: &PosFarm, ids: &[String], pods: &[&PodHandle]) -> bool {
    let now = Instant::now();
    let epoch_of = |shard: ShardId| pods.iter().find_map(|p| p.serving.serving(shard, now));
    ids.iter().all(|id| {
        let Some(epoch) = epoch_of(shard_of(id, SHARDS)) else {
            return false;
        };
        farm.terminal_report(id).is_some_and(|report| {
            report
                .open_connections
                .iter()
                .any(|c| c.session_epoch == Some(epoch) && !c.superseded)
        })
    })
}

fn served(pod: &PodHandle) -> Vec<ShardId> {
    let now = Instant::now();
    (0..SHARDS)
        .filter(|&s| pod.serving.serving(s, now).is_some())
        .collect()
}

// ----- in-process pods --------------------------------------------------------------------

async fn start_pod(i: usize, redis_url: &str, ca_file: &Path, backoff: BackoffPolicy) -> PodHandle {
    start_paced_pod(
        i,
        redis_url,
        ca_file,
        backoff,
        NonZeroU32::new(1_000).unwrap(),
    )
    .await
}

async fn start_paced_pod(
    i: usize,
    redis_url: &str,
    ca_file: &Path,
    backoff: BackoffPolicy,
    dial_rate: NonZeroU32,
) -> PodHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let id = PodId::new(format!("fault-pod-{i}")).unwrap();
    let secret = ClusterSecret::new(*b"pos-faults-test-cluster-secret").unwrap();
    let mut config = PodConfig::new(id, url, CoreConfig::fast(), Some(secret));
    config.cluster = CLUSTER.to_string();
    config.store_timeout = STORE_TIMEOUT;
    config.pos = PosSettings {
        tls: TlsFiles {
            ca_file: Some(ca_file.to_owned()),
            client: None,
        },
        dial_rate,
        backoff,
        ..PosSettings::default()
    };
    let store = RedisStore::connect_lazy(redis_url, CLUSTER, store_options()).unwrap();
    Pod::start_with_terminals(config, store, listener).unwrap()
}

async fn stop_pods(pods: Vec<PodHandle>) {
    let mut pods = pods;
    for pod in &mut pods {
        pod.shutdown();
    }
    for pod in &mut pods {
        let _ = tokio::time::timeout(Duration::from_secs(10), pod.wait()).await;
    }
}

fn startup_limit() -> Duration {
    // Fresh generation: claims are held one member TTL, then debounce, then dialing.
    let c = CoreConfig::fast();
    c.member_ttl + c.debounce + c.poll_interval + Duration::from_secs(15)
}

fn delta(after: &FarmCounters, before: &FarmCounters) -> String {
    format!(
        "opened +{}, closed +{}, dropped +{}, sessions +{}, superseded +{}, raw overlaps +{}, \
         session overlaps +{}, stale hellos +{}, offline refused +{}",
        after.connections_opened - before.connections_opened,
        after.connections_closed - before.connections_closed,
        after.connections_dropped - before.connections_dropped,
        after.sessions_accepted - before.sessions_accepted,
        after.sessions_superseded - before.sessions_superseded,
        after.raw_overlaps - before.raw_overlaps,
        after.session_overlaps - before.session_overlaps,
        after.stale_hellos_refused - before.stale_hellos_refused,
        after.offline_refused - before.offline_refused,
    )
}

// ----- 1. one pod cut off from Redis -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_cut_off_from_redis_closes_its_terminals_before_another_pod_dials_them() {
    const N: u64 = 400;
    let test = "cut-one";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let t = farm_with_directory(&redis, farm_config(N)).await;
    let proxies = [
        TcpProxy::start(redis.addr()).await,
        TcpProxy::start(redis.addr()).await,
    ];
    let mut pods = Vec::new();
    for (i, proxy) in proxies.iter().enumerate() {
        pods.push(
            start_pod(
                i,
                &proxy.redis_url(""),
                &t.ca_file,
                BackoffPolicy::default(),
            )
            .await,
        );
    }
    let took = wait_for(
        "every terminal current with 2 pods",
        startup_limit(),
        || {
            served(&pods[0]).len() + served(&pods[1]).len() == SHARDS as usize
                && all_sessions_current(&t.farm, &t.ids, &[&pods[0], &pods[1]])
        },
    )
    .await;
    let before = t.farm.counters();
    eprintln!(
        "[{test}] {N} terminals current after {:.3} s; shards {} + {}",
        secs(took),
        served(&pods[0]).len(),
        served(&pods[1]).len()
    );
    assert_eq!(before.raw_overlaps, 0);

    let (victim, survivor) = (0, 1);
    let theirs = served(&pods[victim]);
    let their_terminals = t
        .ids
        .iter()
        .filter(|id| theirs.contains(&shard_of(id, SHARDS)))
        .count();
    let cut = Instant::now();
    proxies[victim].cut();
    let stopped = wait_for(
        "the cut-off pod to stop serving",
        Duration::from_secs(10),
        || served(&pods[victim]).is_empty(),
    )
    .await;
    let survivor_took = wait_for(
        "every terminal current at the surviving pod",
        Duration::from_secs(20),
        || {
            served(&pods[survivor]).len() == SHARDS as usize
                && all_sessions_current(&t.farm, &t.ids, &[&pods[survivor]])
        },
    )
    .await;
    let after = t.farm.counters();
    eprintln!(
        "[{test}] cut-off pod stopped serving its {} shards ({their_terminals} terminals) {:.3} s \
         after the cut; all {N} terminals current at the survivor {:.3} s after the cut",
        theirs.len(),
        secs(stopped),
        secs(cut.elapsed()),
    );
    let _ = survivor_took;
    eprintln!("[{test}] during the cut: {}", delta(&after, &before));
    eprintln!("[{test}] counters: {after:?}");
    assert_eq!(
        after.raw_overlaps, 0,
        "a terminal was dialed by the survivor while the cut-off pod still held it"
    );
    assert_eq!(after.session_overlaps, 0, "session overlaps");
    assert_eq!(after.terminals_connected, N);
    assert_eq!(after.connections_open, N, "one connection per terminal");
    assert!(
        after.connections_opened - before.connections_opened >= their_terminals as u64,
        "the survivor dialed the cut-off pod's terminals"
    );

    // Healed: the pod rejoins, shards move back gracefully (close before release).
    let healed = Instant::now();
    proxies[victim].restore();
    let took = wait_for(
        "both pods serving and every terminal current after the heal",
        Duration::from_secs(25),
        || {
            !served(&pods[victim]).is_empty()
                && served(&pods[0]).len() + served(&pods[1]).len() == SHARDS as usize
                && all_sessions_current(&t.farm, &t.ids, &[&pods[0], &pods[1]])
        },
    )
    .await;
    let end = t.farm.counters();
    eprintln!(
        "[{test}] after the heal: both pods serve ({} + {} shards), every terminal current in \
         {:.3} s; {}",
        served(&pods[0]).len(),
        served(&pods[1]).len(),
        secs(took),
        delta(&end, &after)
    );
    let _ = healed;
    assert_eq!(end.raw_overlaps, 0, "raw overlaps while moving back");
    assert_eq!(
        end.session_overlaps, 0,
        "session overlaps while moving back"
    );
    stop_pods(pods).await;
    drop(t.dir);
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}

// ----- 2. every pod cut off from Redis -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_pods_cut_off_for_twice_the_ttl_disconnect_no_terminal() {
    const N: u64 = 400;
    let test = "cut-all";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let t = farm_with_directory(&redis, farm_config(N)).await;
    let proxies = [
        TcpProxy::start(redis.addr()).await,
        TcpProxy::start(redis.addr()).await,
    ];
    let mut pods = Vec::new();
    for (i, proxy) in proxies.iter().enumerate() {
        pods.push(
            start_pod(
                i,
                &proxy.redis_url(""),
                &t.ca_file,
                BackoffPolicy::default(),
            )
            .await,
        );
    }
    let took = wait_for(
        "every terminal current with 2 pods",
        startup_limit(),
        || {
            served(&pods[0]).len() + served(&pods[1]).len() == SHARDS as usize
                && all_sessions_current(&t.farm, &t.ids, &[&pods[0], &pods[1]])
        },
    )
    .await;
    let owners: Vec<Vec<ShardId>> = pods.iter().map(served).collect();
    eprintln!(
        "[{test}] {N} terminals current after {:.3} s; shards {} + {}",
        secs(took),
        owners[0].len(),
        owners[1].len()
    );
    let before = t.farm.counters();

    let cut = Instant::now();
    for proxy in &proxies {
        proxy.cut();
    }
    let outage = CoreConfig::fast().lease_ttl * 2;
    // Sample the farm through the outage: not one connection may close.
    while cut.elapsed() < outage {
        let now = t.farm.counters();
        assert_eq!(
            now.connections_closed,
            before.connections_closed,
            "a terminal connection closed {:.3} s into the outage: {}",
            secs(cut.elapsed()),
            delta(&now, &before)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let during = t.farm.counters();
    let suspended: usize = pods
        .iter()
        .map(|p| {
            (0..SHARDS)
                .filter(|&s| p.serving.suspended(s).is_some())
                .count()
        })
        .sum();
    let serving: usize = pods.iter().map(|p| served(p).len()).sum();
    eprintln!(
        "[{test}] after {:.1} s without Redis: {suspended} shards suspended, {serving} served; {}",
        secs(outage),
        delta(&during, &before)
    );
    assert_eq!(serving, 0, "shards still served without Redis past the TTL");
    assert_eq!(
        suspended, SHARDS as usize,
        "every shard suspended, none given up"
    );
    assert_eq!(during.connections_opened, before.connections_opened);
    assert_eq!(during.connections_closed, before.connections_closed);
    assert_eq!(during.terminals_connected, N);

    let restored = Instant::now();
    for proxy in &proxies {
        proxy.restore();
    }
    let took = wait_for(
        "every terminal current again after the outage",
        Duration::from_secs(20),
        || {
            served(&pods[0]).len() + served(&pods[1]).len() == SHARDS as usize
                && all_sessions_current(&t.farm, &t.ids, &[&pods[0], &pods[1]])
        },
    )
    .await;
    let back = t.farm.counters();
    eprintln!(
        "[{test}] shards served again and every terminal current (new epochs) {:.3} s after \
         Redis came back; {}",
        secs(took),
        delta(&back, &before)
    );
    // Past the generation hold and a debounce: nothing moves afterwards either.
    let c = CoreConfig::fast();
    tokio::time::sleep(c.member_ttl + c.debounce).await;
    let end = t.farm.counters();
    eprintln!(
        "[{test}] {:.1} s after restore: {}",
        secs(restored.elapsed()),
        delta(&end, &before)
    );
    assert!(all_sessions_current(&t.farm, &t.ids, &[&pods[0], &pods[1]]));
    assert_eq!(
        end.connections_closed, before.connections_closed,
        "terminal connections closed because Redis blinked"
    );
    assert_eq!(
        end.connections_opened, before.connections_opened,
        "terminals redialed because Redis blinked"
    );
    assert!(
        end.sessions_accepted >= before.sessions_accepted + N,
        "the re-claimed shards said hello with their new epochs"
    );
    assert_eq!(end.sessions_superseded, before.sessions_superseded);
    assert_eq!(end.raw_overlaps, 0);
    assert_eq!(end.session_overlaps, 0);
    for (i, shards) in owners.iter().enumerate() {
        assert_eq!(&served(&pods[i]), shards, "pod {i} serves other shards now");
    }
    stop_pods(pods).await;
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}

// ----- 3. dropped connections and refusing terminals --------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_connections_are_redialed_once_and_refusals_back_off() {
    const N: u64 = 300;
    let test = "redial";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let t = farm_with_directory(&redis, farm_config(N)).await;
    // Backoff ceilings 500 ms, 1 s, 2 s, then 4 s: short enough to recover quickly.
    let backoff = BackoffPolicy {
        base: Duration::from_millis(500),
        cap: Duration::from_secs(4),
    };
    let pods = vec![start_pod(0, &redis.url(), &t.ca_file, backoff).await];
    let took = wait_for("every terminal current", startup_limit(), || {
        all_sessions_current(&t.farm, &t.ids, &[&pods[0]])
    })
    .await;
    eprintln!("[{test}] {N} terminals current after {:.3} s", secs(took));

    // (a) 20% of the connections dropped by the terminals: each redialed exactly once.
    let before = t.farm.counters();
    let dropped_at = Instant::now();
    let dropped = t.farm.drop_connections(0.2).unwrap() as u64;
    assert!(
        (N / 10..=N * 3 / 10).contains(&dropped),
        "dropped {dropped} of {N}"
    );
    let took = wait_for(
        "every dropped terminal back with a current session",
        Duration::from_secs(15),
        || {
            let c = t.farm.counters();
            c.connections_opened - before.connections_opened >= dropped
                && all_sessions_current(&t.farm, &t.ids, &[&pods[0]])
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = t.farm.counters();
    eprintln!(
        "[{test}] dropped {dropped} connections; all back {:.3} s later; {}",
        secs(took),
        delta(&after, &before)
    );
    let _ = dropped_at;
    assert_eq!(
        after.connections_dropped - before.connections_dropped,
        dropped
    );
    assert_eq!(
        after.connections_opened - before.connections_opened,
        dropped,
        "each dropped terminal is redialed exactly once"
    );
    assert_eq!(after.sessions_accepted - before.sessions_accepted, dropped);
    assert_eq!(after.raw_overlaps, 0);
    assert_eq!(after.terminals_connected, N);

    // (b) Every connection dropped at once: all redialed at once (no backoff for a lost
    // connection), paced by --dial-rate 1000/s.
    let before = t.farm.counters();
    let all = t.farm.drop_connections(1.0).unwrap() as u64;
    assert_eq!(all, N);
    let took = wait_for(
        "every terminal back after dropping all connections",
        Duration::from_secs(15),
        || {
            t.farm.counters().connections_opened - before.connections_opened >= N
                && all_sessions_current(&t.farm, &t.ids, &[&pods[0]])
        },
    )
    .await;
    let after = t.farm.counters();
    let rate = N as f64 / secs(took);
    eprintln!(
        "[{test}] dropped all {N}: every terminal current again {:.3} s later ({rate:.0} \
         redials/s at --dial-rate 1000); {}",
        secs(took),
        delta(&after, &before)
    );
    assert_eq!(after.connections_opened - before.connections_opened, N);
    assert_eq!(after.raw_overlaps, 0);

    // (c) Some terminals go offline (they refuse every connection by its SNI): they are
    // redialed with backoff (ceilings 0.5, 1, 2, 4, 4 ... s), not in a loop, and the
    // others are not disturbed.
    const OFFLINE: usize = 20;
    let offline: Vec<String> = t
        .ids
        .iter()
        .step_by(N as usize / OFFLINE)
        .cloned()
        .collect();
    assert_eq!(offline.len(), OFFLINE);
    let before = t.farm.counters();
    let refused_from = Instant::now();
    let cut = t
        .farm
        .set_faults(FaultConfig {
            offline_terminals: offline.clone(),
            ..FaultConfig::default()
        })
        .unwrap();
    assert_eq!(cut, OFFLINE);
    const WINDOW: Duration = Duration::from_secs(8);
    tokio::time::sleep(WINDOW / 2).await;
    let half = t.farm.counters();
    tokio::time::sleep(WINDOW / 2).await;
    let full = t.farm.counters();
    let first = half.offline_refused - before.offline_refused;
    let second = full.offline_refused - half.offline_refused;
    let per_terminal = (first + second) as f64 / OFFLINE as f64;
    // Redialing at once after each refusal, paced only by --dial-rate, would be
    // thousands of attempts per terminal in the window.
    eprintln!(
        "[{test}] {OFFLINE} terminals offline for {:.1} s: {first} dial attempts in the first \
         half, {second} in the second: {per_terminal:.2} per terminal (expected ~6-7 with \
         this backoff); {}",
        secs(refused_from.elapsed()),
        delta(&full, &before)
    );
    assert!(
        per_terminal >= 3.0,
        "offline terminals are retried ({per_terminal:.2} attempts each)"
    );
    assert!(
        per_terminal <= 12.0,
        "{per_terminal:.2} dial attempts per offline terminal in {WINDOW:?}: no backoff?"
    );
    assert!(
        second < first,
        "attempts do not decay ({first} then {second}): no exponential backoff?"
    );
    assert_eq!(
        full.connections_opened, before.connections_opened,
        "the online terminals were not redialed"
    );
    assert_eq!(full.terminals_connected, N - OFFLINE as u64);

    // (d) Back online: everyone is current again within the backoff cap (+ pacing).
    t.farm.set_faults(FaultConfig::default()).unwrap();
    let healed = Instant::now();
    wait_for(
        "every terminal current after the offline ones came back",
        backoff.cap + Duration::from_secs(6),
        || all_sessions_current(&t.farm, &t.ids, &[&pods[0]]),
    )
    .await;
    let end = t.farm.counters();
    eprintln!(
        "[{test}] back online: every terminal current again {:.3} s later; {}",
        secs(healed.elapsed()),
        delta(&end, &full)
    );
    assert_eq!(
        end.connections_opened - full.connections_opened,
        OFFLINE as u64
    );
    assert_eq!(end.raw_overlaps, 0);
    assert_eq!(end.terminals_connected, N);
    stop_pods(pods).await;
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}

/// Most of the sorted `times` (ms) within any window of `window_ms`.
fn most_in_window(times: &[u64], window_ms: u64) -> usize {
    (0..times.len())
        .map(|i| times[i..].partition_point(|&t| t < times[i] + window_ms))
        .max()
        .unwrap_or(0)
}

/// Every connection of one pod dropped at once: the pod redials them all right away,
/// paced only by `--dial-rate` (200/s here, the default); every terminal is back with one
/// new connection, and in no 1 s window (first connect or redial) did the terminals see
/// more connections open than the pace allows. The redial rate itself is printed, not
/// asserted (a wall-clock figure; the benchmark `conn-bench` reports it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_connections_are_redialed_at_the_dial_rate() {
    const N: u64 = 400;
    const RATE: u32 = 200;
    let test = "redial-rate";
    let redis = RedisServer::start();
    let t = farm_with_directory(&redis, farm_config(N)).await;
    let rate_flag = NonZeroU32::new(RATE).unwrap();
    let backoff = BackoffPolicy::default();
    let pods = vec![start_paced_pod(0, &redis.url(), &t.ca_file, backoff, rate_flag).await];
    let first_connect = Instant::now();
    let mut first_session = None;
    wait_for("every terminal current", startup_limit(), || {
        if first_session.is_none() && t.farm.counters().sessions_accepted > 0 {
            first_session = Some(first_connect.elapsed());
        }
        all_sessions_current(&t.farm, &t.ids, &[&pods[0]])
    })
    .await;
    let connect_span = first_connect.elapsed() - first_session.unwrap_or_default();
    let before = t.farm.counters();
    let all = t.farm.drop_connections(1.0).unwrap() as u64;
    assert_eq!(all, N);
    let took = wait_for("every terminal back", Duration::from_secs(20), || {
        t.farm.counters().connections_opened - before.connections_opened >= N
            && all_sessions_current(&t.farm, &t.ids, &[&pods[0]])
    })
    .await;
    let rate = N as f64 / secs(took);
    // The terminals' open times, first connect and redial (at least 2 x N, in ms).
    let mut opened: Vec<u64> = t
        .ids
        .iter()
        .flat_map(|id| t.farm.terminal_report(id).unwrap().recent_connections)
        .filter(|e| e.event == "opened")
        .map(|e| e.at_unix_ms)
        .collect();
    opened.sort_unstable();
    assert!(opened.len() as u64 >= 2 * N, "{} opens", opened.len());
    // The limiter grants at most RATE x window + 1 (the burst) dials in a window; each
    // dial starts up to the jitter after its grant, and the terminal records the open
    // after the TLS handshake, so opens can bunch by the spread of handshake times:
    // allowed up to 250 ms (a descheduled pod or farm on a shared machine); and + 1 for
    // the ms resolution. Without the limiter this pod opens all N in about half a second.
    const WINDOW_MS: u64 = 1_000;
    const SPREAD_MS: u64 = 250;
    let jitter_ms = ManagerConfig::default().dial_jitter.as_millis() as u64;
    let bound = (RATE as u64 * (WINDOW_MS + jitter_ms + SPREAD_MS)).div_ceil(1_000) + 2;
    let most = most_in_window(&opened, WINDOW_MS);
    eprintln!(
        "[{test}] first connect: {N} sessions within {:.3} s of the first; after dropping \
         all: every terminal back in {:.3} s = {rate:.0} redials/s (--dial-rate {RATE}); \
         most opens in any {WINDOW_MS} ms: {most} (bound {bound})",
        secs(connect_span),
        secs(took)
    );
    assert!(
        most as u64 <= bound,
        "{most} connections opened within {WINDOW_MS} ms, more than {bound} at --dial-rate {RATE}"
    );
    let after = t.farm.counters();
    assert_eq!(
        after.raw_overlaps, before.raw_overlaps,
        "one connection per terminal"
    );
    stop_pods(pods).await;
}

/// Redis restarted empty loses the terminal directory with everything else: the pod
/// keeps its terminals connected (it re-claims its shards with higher epochs and says
/// hello again on the same connections) instead of closing them all, and a re-import
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_directory_disconnects_no_terminal() {
    const N: u64 = 200;
    let test = "wipe";
    let redis = RedisServer::start();
    let t = farm_with_directory(&redis, farm_config(N)).await;
    let pods = vec![start_pod(0, &redis.url(), &t.ca_file, BackoffPolicy::default()).await];
    wait_for("every terminal current", startup_limit(), || {
        all_sessions_current(&t.farm, &t.ids, &[&pods[0]])
    })
    .await;
    let before = t.farm.counters();
    redis.command(&["FLUSHALL"]);
    // Longer than the directory poll (4 s) and the re-claim after the wipe.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let wiped = t.farm.counters();
    eprintln!("[{test}] 6 s after FLUSHALL: {}", delta(&wiped, &before));
    assert_eq!(
        wiped.connections_closed, before.connections_closed,
        "terminals were disconnected"
    );
    assert_eq!(wiped.connections_opened, before.connections_opened);
    wait_for(
        "sessions current again after the re-claim",
        Duration::from_secs(20),
        || all_sessions_current(&t.farm, &t.ids, &[&pods[0]]),
    )
    .await;
    let terminals: Vec<Terminal> = t
        .farm
        .terminals()
        .iter()
        .map(|x| Terminal::new(&x.id, &x.addr.to_string(), Some(&x.server_name)).unwrap())
        .collect();
    import(&redis, &terminals).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = t.farm.counters();
    eprintln!("[{test}] after the re-import: {}", delta(&after, &before));
    assert_eq!(after.connections_closed, before.connections_closed);
    assert_eq!(after.raw_overlaps, 0);
    assert_eq!(after.session_overlaps, 0);
    stop_pods(pods).await;
}

// ----- `posgate serve` processes ------------------------------------------------------------

/// A `posgate serve` child with fast timings, its JSON log on stderr going to a file.
struct BinPod {
    id: String,
    child: Child,
    port: u16,
    log: PathBuf,
}

impl BinPod {
    fn start(id: &str, redis_url: &str, ca_file: &Path, dir: &Path) -> BinPod {
        let secret_file = dir.join("cluster-secret");
        std::fs::write(&secret_file, SECRET).unwrap();
        let tokens_file = dir.join("api-tokens");
        std::fs::write(&tokens_file, format!("faults:{API_TOKEN}\n")).unwrap();
        let port = free_port();
        let log = dir.join(format!("{id}.log"));
        let listen = format!("127.0.0.1:{port}");
        let advertise = format!("http://127.0.0.1:{port}");
        let args: Vec<String> = [
            "serve",
            "--redis-url",
            redis_url,
            "--cluster",
            CLUSTER,
            "--pod-id",
            id,
            "--listen",
            &listen,
            "--advertise-url",
            &advertise,
            "--lease-ttl",
            "3s",
            "--renew-interval",
            "1s",
            "--lease-margin",
            "500ms",
            "--member-ttl",
            "3s",
            "--heartbeat-interval",
            "1s",
            "--poll-interval",
            "500ms",
            "--rebalance-debounce",
            "300ms",
            "--close-budget",
            "300ms",
            "--shutdown-budget",
            "5s",
            "--store-timeout",
            "300ms",
            "--cluster-secret-file",
            secret_file.to_str().unwrap(),
            "--api-tokens-file",
            tokens_file.to_str().unwrap(),
            "--pos-ca",
            ca_file.to_str().unwrap(),
            "--dial-rate",
            "1000",
            "--log-format",
            "json",
            "--log-level",
            "info",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let child = Command::new(env!("CARGO_BIN_EXE_posgate"))
            .args(&args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn posgate serve");
        BinPod {
            id: id.to_string(),
            child,
            port,
            log,
        }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.pid()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {}", self.pid());
    }

    fn log(&self) -> String {
        let mut s = String::new();
        std::fs::File::open(&self.log)
            .and_then(|mut f| f.read_to_string(&mut s))
            .unwrap();
        s
    }

    fn log_lines_with(&self, needles: &[&str]) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_owned)
            .collect()
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}): {}", self.id, self.log());
        }
    }

    /// `GET /v1/cluster`: the shards this pod serves, with their epochs.
    async fn serving(&self) -> Option<Vec<(ShardId, u64)>> {
        let body = http_get(self.port, "/v1/cluster").await?;
        let view: serde_json::Value = serde_json::from_str(&body).ok()?;
        let shards = view.get("shards")?.as_array()?;
        Some(
            shards
                .iter()
                .filter(|s| s.get("serving").and_then(|v| v.as_bool()) == Some(true))
                .filter_map(|s| {
                    Some((
                        s.get("shard")?.as_u64()? as ShardId,
                        s.get("epoch")?.as_u64()?,
                    ))
                })
                .collect(),
        )
    }
}

impl Drop for BinPod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET on loopback; the body, if the answer came within 2 s.
async fn http_get(port: u16, path: &str) -> Option<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_TOKEN}\r\n\
             Connection: close\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8(buf).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

/// `POST /v1/terminals/{id}/push` (HTTP/1.1, bearer token); the status, if any came.
async fn push_via(port: u16, terminal: String, key: String) -> Option<u16> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let body = "{\"amount\":1}";
        let req = format!(
            "POST /v1/terminals/{terminal}/push?timeout_ms=8000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Authorization: Bearer {API_TOKEN}\r\nIdempotency-Key: {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf);
        text.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(12), fetch)
        .await
        .ok()
        .flatten()
}

async fn wait_for_async<F, Fut>(what: &str, limit: Duration, mut cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !cond().await {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

/// Shards served by each pod (`None` for a pod that did not answer).
async fn serving_of(pods: &[&BinPod]) -> Vec<Option<Vec<(ShardId, u64)>>> {
    let mut out = Vec::new();
    for pod in pods {
        out.push(pod.serving().await);
    }
    out
}

// ----- 4. a certificate for the wrong name -----------------------------------------------

/// A TLS server presenting a certificate for `localhost` only, issued by its own CA;
/// counts the TCP connections it accepts.
struct WrongNameServer {
    addr: std::net::SocketAddr,
    ca_pem: String,
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

async fn wrong_name_server() -> WrongNameServer {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone(), ca.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = accepted.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::Relaxed);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // The client is expected to abort the handshake (bad certificate).
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let mut sink = Vec::new();
                    let _ = tls.read_to_end(&mut sink).await;
                }
            });
        }
    });
    WrongNameServer {
        addr,
        ca_pem: ca.pem(),
        accepted,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_the_wrong_name_is_refused_with_one_clear_log_line() {
    const N: u64 = 100;
    const WRONG: &str = "wrong-name-0";
    let test = "wrong-name";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let t = farm_with_directory(&redis, farm_config(N)).await;
    let server = wrong_name_server().await;
    // The pod trusts both CAs: the wrong terminal's chain is valid, only its name is not.
    let bundle = t.dir.path().join("bundle.pem");
    std::fs::write(&bundle, format!("{}{}", t.farm.ca_pem(), server.ca_pem)).unwrap();
    let wrong = Terminal::new(WRONG, &server.addr.to_string(), Some("wrong.example")).unwrap();
    import(&redis, &[wrong]).await;

    let mut pod = BinPod::start("wrong-name-pod", &redis.url(), &bundle, t.dir.path());
    let took = wait_for(
        "every good terminal with a session",
        startup_limit(),
        || all_settled(&t.farm, &t.ids),
    )
    .await;
    pod.assert_running();
    eprintln!(
        "[{test}] all {N} good terminals have a session after {:.3} s",
        secs(took)
    );
    // Let the wrong terminal be retried a few times (backoff 1 s, 2 s, 4 s ...).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let attempts = server.accepted.load(Ordering::Relaxed);
    let warned = pod.log_lines_with(&[
        "terminal presented a certificate for another name; check its directory entry",
        WRONG,
    ]);
    let failed_again = pod.log_lines_with(&[WRONG, "terminal dial failed"]);
    let counters = t.farm.counters();
    eprintln!(
        "[{test}] the wrong-name terminal was dialed {attempts} times in ~{:.0} s; warn lines: \
         {}; other dial-failure lines naming it at info+: {}",
        secs(test_started.elapsed()),
        warned.len(),
        failed_again.len()
    );
    for line in &warned {
        eprintln!("[{test}] log: {line}");
    }
    eprintln!("[{test}] farm: {counters:?}");
    // The metric: wrong-name refusals count as `tls_error` dials.
    let metrics = http_get(pod.port, "/metrics").await.unwrap_or_default();
    let tls_errors: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("posgate_dials_total{result=\"tls_error\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    eprintln!("[{test}] posgate_dials_total{{result=\"tls_error\"}} = {tls_errors}");
    assert!(
        tls_errors >= attempts.min(2) as u64,
        "the refusals are counted as tls_error dials ({tls_errors})"
    );
    assert!(attempts >= 2, "the wrong terminal is retried ({attempts})");
    assert!(
        attempts <= 10,
        "the wrong terminal is retried with backoff, not in a loop ({attempts})"
    );
    assert_eq!(
        warned.len(),
        1,
        "exactly one warning for the streak, naming the terminal"
    );
    assert!(warned[0].contains("wrong.example"), "{}", warned[0]);
    assert!(
        warned[0].contains("\"level\":\"WARN\""),
        "logged as a warning: {}",
        warned[0]
    );
    assert_eq!(counters.sessions_accepted, N, "only the good terminals");
    assert_eq!(counters.handshakes_failed, 0);
    assert_eq!(counters.unknown_sni_refused, 0);
    server.task.abort();
    pod.signal("-TERM");
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}

// ----- 5. a pod SIGSTOPped past its TTL ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_stopped_past_its_ttl_and_resumed_causes_no_session_overlap() {
    const N: u64 = 300;
    let test = "sigstop";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let mut config = farm_config(N);
    // A frozen pod cannot answer GOAWAY: the terminal closes a superseded session itself
    // after its grace period. Keep that grace below the 1 s session-overlap threshold, as
    // the protocol asks of terminals ("closes its older sessions").
    config.supersede_grace = Duration::from_millis(500);
    let t = farm_with_directory(&redis, config).await;
    let mut a = BinPod::start("stop-pod-a", &redis.url(), &t.ca_file, t.dir.path());
    let mut b = BinPod::start("stop-pod-b", &redis.url(), &t.ca_file, t.dir.path());

    let startup = Instant::now();
    while startup.elapsed() < startup_limit() + Duration::from_secs(5)
        && !(a.serving().await.is_some() && b.serving().await.is_some())
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if a.serving().await.is_none() || b.serving().await.is_none() {
        a.assert_running();
        b.assert_running();
        panic!("no /v1/cluster answer; logs:\n{}\n{}", a.log(), b.log());
    }
    let took = wait_for_async(
        "both pods serving and every terminal settled",
        startup_limit() + Duration::from_secs(5),
        || async {
            let views = serving_of(&[&a, &b]).await;
            let counts: Vec<usize> = views.iter().flatten().map(Vec::len).collect();
            counts.len() == 2
                && counts.iter().all(|&c| c > 0)
                && counts.iter().sum::<usize>() == SHARDS as usize
                && all_settled(&t.farm, &t.ids)
        },
    )
    .await;
    a.assert_running();
    b.assert_running();
    let a_shards = a.serving().await.unwrap();
    let a_terminals: Vec<(String, u64)> = t
        .ids
        .iter()
        .filter_map(|id| {
            let shard = shard_of(id, SHARDS);
            a_shards
                .iter()
                .find(|(s, _)| *s == shard)
                .map(|&(_, epoch)| (id.clone(), epoch))
        })
        .collect();
    let before = t.farm.counters();
    eprintln!(
        "[{test}] settled after {:.3} s: pod a serves {} shards ({} terminals); {before:?}",
        secs(took),
        a_shards.len(),
        a_terminals.len()
    );
    assert_eq!(before.session_overlaps, 0);

    // Freeze pod a for the lease TTL + 4 s.
    let frozen = Instant::now();
    a.signal("-STOP");
    let took_over = wait_for_async(
        "pod b to serve every shard and every terminal to be settled",
        Duration::from_secs(20),
        || async {
            b.serving().await.map(|s| s.len()) == Some(SHARDS as usize)
                && all_settled(&t.farm, &t.ids)
        },
    )
    .await;
    let pause = Duration::from_secs(3 + 4);
    if frozen.elapsed() < pause {
        tokio::time::sleep(pause - frozen.elapsed()).await;
    }
    let during = t.farm.counters();
    eprintln!(
        "[{test}] pod a frozen: pod b serves all shards, every terminal settled {:.3} s after \
         SIGSTOP; {}",
        secs(took_over),
        delta(&during, &before)
    );
    for (id, old) in &a_terminals {
        let report = t.farm.terminal_report(id).unwrap();
        assert!(
            report.highest_epoch > Some(*old),
            "{id}: epoch not raised past pod a's {old}: {:?}",
            report.highest_epoch
        );
    }

    // Resume: pod a must not get a session back with its old epochs; it rejoins.
    let resumed = Instant::now();
    a.signal("-CONT");
    // Right after waking, push to every terminal pod a served before the freeze, through
    // pod a itself: none of it may reach a terminal under pod a's old epochs.
    let pushes: Vec<_> = a_terminals
        .iter()
        .map(|(id, _)| tokio::spawn(push_via(a.port, id.clone(), format!("resume-{id}"))))
        .collect();
    let took = wait_for_async(
        "both pods serving again and every terminal settled",
        Duration::from_secs(30),
        || async {
            let views = serving_of(&[&a, &b]).await;
            let counts: Vec<usize> = views.iter().flatten().map(Vec::len).collect();
            counts.len() == 2
                && counts.iter().all(|&c| c > 0)
                && counts.iter().sum::<usize>() == SHARDS as usize
                && all_settled(&t.farm, &t.ids)
        },
    )
    .await;
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for push in pushes {
        let status = push.await.unwrap();
        let label = status.map_or("no answer".to_string(), |s| s.to_string());
        *statuses.entry(label).or_default() += 1;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.assert_running();
    b.assert_running();
    let mut old_epoch_pushes = Vec::new();
    for (id, old) in &a_terminals {
        let report = t.farm.terminal_report(id).unwrap();
        for p in &report.recent_pushes {
            if p.epoch <= *old {
                old_epoch_pushes.push(format!(
                    "{id}: {} at epoch {} <= {old}",
                    p.idempotency_key, p.epoch
                ));
            }
        }
    }
    eprintln!(
        "[{test}] {} pushes through pod a right after SIGCONT answered {statuses:?}",
        a_terminals.len()
    );
    let end = t.farm.counters();
    let stale_lines_a = a.log_lines_with(&["terminal refused our epoch"]).len();
    let stale_lines_b = b.log_lines_with(&["terminal refused our epoch"]).len();
    eprintln!(
        "[{test}] resumed: converged {:.3} s after SIGCONT (frozen {:.3} s); stale hellos \
         refused {} (pod a logged {stale_lines_a}, pod b {stale_lines_b}), stale pushes \
         refused {}, max session overlap {} ms; {}",
        secs(took),
        secs(resumed - frozen),
        end.stale_hellos_refused,
        end.stale_pushes_refused,
        end.max_session_overlap_ms,
        delta(&end, &before)
    );
    eprintln!("[{test}] counters: {end:?}");
    assert_eq!(end.session_overlaps, 0, "session overlaps");
    assert_eq!(end.keys_delivered_twice, 0);
    assert!(
        old_epoch_pushes.is_empty(),
        "pushes accepted under pod a's pre-freeze epochs: {old_epoch_pushes:?}"
    );
    assert!(end.pushes_accepted <= a_terminals.len() as u64);
    assert_eq!(
        end.stale_hellos_refused,
        (stale_lines_a + stale_lines_b) as u64,
        "every stale hello the farm refused was seen as a 409 by a pod"
    );
    assert!(all_settled(&t.farm, &t.ids));
    assert_eq!(end.connections_open, N);
    a.signal("-TERM");
    b.signal("-TERM");
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}
