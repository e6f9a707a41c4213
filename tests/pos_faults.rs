//! Fault scenarios of the POS connections, end to end: whole pods against a real
//! `redis-server` and a `PosFarm` of simulated terminals (TLS + HTTP/2 on loopback), with
//! short timings (`CoreConfig::fast()`: lease TTL 3 s, renew 1 s, close budget 300 ms).
//!
//! - one pod cut off from Redis (a `RedisProxy` per pod) closes its terminals'
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use posgate::core::shard::shard_of;
use posgate::core::{CoreConfig, ShardId};
use posgate::pod::PodHandle;
use posgate::pos::backoff::BackoffPolicy;
use posgate::pos::manager::ManagerConfig;
use posgate::store::directory::{DirectoryAdmin, Terminal};
use posgate::store::redis::RedisStore;
use posgate_loadtest::pos_sim::FaultConfig;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::support::binary::{self, BinPod};
use crate::support::farm::{self, connect_limit, import, Farm};
use crate::support::pod::{self, served, SHARDS};
use crate::support::wait::{secs, wait_for, wait_for_async};
use crate::support::{RedisProxy, RedisServer};

// ----- in-process pods --------------------------------------------------------------------

/// Pod `fault-pod-{i}` over the Redis at `redis_url`, trusting `farm`'s CA, dialing at
/// most `dial_rate` terminals per second with `backoff` for refusals.
async fn start_pod(
    i: usize,
    redis_url: &str,
    farm: &Farm,
    backoff: BackoffPolicy,
    dial_rate: u32,
) -> PodHandle {
    let (listener, url) = pod::listen().await;
    let mut config = pod::config(&format!("fault-pod-{i}"), &url);
    config.pos = pod::pos(&farm.ca_file, dial_rate);
    config.pos.backoff = backoff;
    pod::start_with_terminals(config, redis_url, listener)
}

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

/// The dial rate of the in-process pods (`--dial-rate`).
const DIAL_RATE: u32 = 1_000;

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

// ----- 3. dropped connections and refusing terminals --------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_connections_are_redialed_once_and_refusals_back_off() {
    const N: u64 = 300;
    let test = "redial";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let t = Farm::with_directory(&redis, farm::config(N)).await;
    // Backoff ceilings 500 ms, 1 s, 2 s, then 4 s: short enough to recover quickly.
    let backoff = BackoffPolicy {
        base: Duration::from_millis(500),
        cap: Duration::from_secs(4),
    };
    let pods = vec![start_pod(0, &redis.url(), &t, backoff, DIAL_RATE).await];
    let took = wait_for("every terminal current", connect_limit(), || {
        t.all_sessions_current(&[&pods[0]])
    })
    .await;
    eprintln!("[{test}] {N} terminals current after {:.3} s", secs(took));

    // (a) 20% of the connections dropped by the terminals: each redialed exactly once.
    let before = t.counters();
    let dropped_at = Instant::now();
    let dropped = t.drop_connections(0.2).unwrap() as u64;
    assert!(
        (N / 10..=N * 3 / 10).contains(&dropped),
        "dropped {dropped} of {N}"
    );
    let took = wait_for(
        "every dropped terminal back with a current session",
        Duration::from_secs(15),
        || {
            let c = t.counters();
            c.connections_opened - before.connections_opened >= dropped
                && t.all_sessions_current(&[&pods[0]])
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = t.counters();
    eprintln!(
        "[{test}] dropped {dropped} connections; all back {:.3} s later; {}",
        secs(took),
        after.changes_since(&before)
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
    let before = t.counters();
    let all = t.drop_connections(1.0).unwrap() as u64;
    assert_eq!(all, N);
    let took = wait_for(
        "every terminal back after dropping all connections",
        Duration::from_secs(15),
        || {
            t.counters().connections_opened - before.connections_opened >= N
                && t.all_sessions_current(&[&pods[0]])
        },
    )
    .await;
    let after = t.counters();
    let rate = N as f64 / secs(took);
    eprintln!(
        "[{test}] dropped all {N}: every terminal current again {:.3} s later ({rate:.0} \
         redials/s at --dial-rate 1000); {}",
        secs(took),
        after.changes_since(&before)
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
    let before = t.counters();
    let refused_from = Instant::now();
    let cut = t
        .set_faults(FaultConfig {
            offline_terminals: offline.clone(),
            ..FaultConfig::default()
        })
        .unwrap();
    assert_eq!(cut, OFFLINE);
    const WINDOW: Duration = Duration::from_secs(8);
    tokio::time::sleep(WINDOW / 2).await;
    let half = t.counters();
    tokio::time::sleep(WINDOW / 2).await;
    let full = t.counters();
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
        full.changes_since(&before)
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
    t.set_faults(FaultConfig::default()).unwrap();
    let healed = Instant::now();
    wait_for(
        "every terminal current after the offline ones came back",
        backoff.cap + Duration::from_secs(6),
        || t.all_sessions_current(&[&pods[0]]),
    )
    .await;
    let end = t.counters();
    eprintln!(
        "[{test}] back online: every terminal current again {:.3} s later; {}",
        secs(healed.elapsed()),
        end.changes_since(&full)
    );
    assert_eq!(
        end.connections_opened - full.connections_opened,
        OFFLINE as u64
    );
    assert_eq!(end.raw_overlaps, 0);
    assert_eq!(end.terminals_connected, N);
    pod::stop(pods).await;
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
    let t = Farm::with_directory(&redis, farm::config(N)).await;
    let backoff = BackoffPolicy::default();
    let pods = vec![start_pod(0, &redis.url(), &t, backoff, RATE).await];
    let first_connect = Instant::now();
    let mut first_session = None;
    wait_for("every terminal current", connect_limit(), || {
        if first_session.is_none() && t.counters().sessions_accepted > 0 {
            first_session = Some(first_connect.elapsed());
        }
        t.all_sessions_current(&[&pods[0]])
    })
    .await;
    let connect_span = first_connect.elapsed() - first_session.unwrap_or_default();
    let before = t.counters();
    let all = t.drop_connections(1.0).unwrap() as u64;
    assert_eq!(all, N);
    let took = wait_for("every terminal back", Duration::from_secs(20), || {
        t.counters().connections_opened - before.connections_opened >= N
            && t.all_sessions_current(&[&pods[0]])
    })
    .await;
    let rate = N as f64 / secs(took);
    // The terminals' open times, first connect and redial (at least 2 x N, in ms).
    let mut opened: Vec<u64> = t
        .ids
        .iter()
        .flat_map(|id| t.terminal_report(id).unwrap().recent_connections)
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
    let after = t.counters();
    assert_eq!(
        after.raw_overlaps, before.raw_overlaps,
        "one connection per terminal"
    );
    pod::stop(pods).await;
}

/// Redis restarted empty loses the terminal directory with everything else: the pod
/// keeps its terminals connected (it re-claims its shards with higher epochs and says
/// hello again on the same connections) instead of closing them all, writes the
/// directory of its shards back, and a re-import changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_directory_disconnects_no_terminal() {
    const N: u64 = 200;
    let test = "wipe";
    let redis = RedisServer::start();
    let t = Farm::with_directory(&redis, farm::config(N)).await;
    let pods = vec![start_pod(0, &redis.url(), &t, BackoffPolicy::default(), DIAL_RATE).await];
    wait_for("every terminal current", connect_limit(), || {
        t.all_sessions_current(&[&pods[0]])
    })
    .await;
    let before = t.counters();
    redis.command(&["FLUSHALL"]);
    // Longer than the directory poll (4 s) and the re-claim after the wipe.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let wiped = t.counters();
    eprintln!(
        "[{test}] 6 s after FLUSHALL: {}",
        wiped.changes_since(&before)
    );
    assert_eq!(
        wiped.connections_closed, before.connections_closed,
        "terminals were disconnected"
    );
    assert_eq!(wiped.connections_opened, before.connections_opened);
    wait_for(
        "sessions current again after the re-claim",
        Duration::from_secs(20),
        || t.all_sessions_current(&[&pods[0]]),
    )
    .await;
    let store = RedisStore::connect(&redis.url(), pod::CLUSTER, pod::store_options())
        .await
        .unwrap();
    wait_for_async(
        "the directory written back",
        Duration::from_secs(10),
        || async { store.count(SHARDS).await.unwrap() == N },
    )
    .await;
    import(&redis, &t.entries()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = t.counters();
    eprintln!(
        "[{test}] after the re-import: {}",
        after.changes_since(&before)
    );
    assert_eq!(after.connections_closed, before.connections_closed);
    assert_eq!(after.raw_overlaps, 0);
    assert_eq!(after.session_overlaps, 0);
    pod::stop(pods).await;
}

// ----- `posgate serve` processes ------------------------------------------------------------

/// Shards served by each pod (`None` for a pod that did not answer).
async fn serving_of(pods: &[&BinPod]) -> Vec<Option<Vec<(ShardId, u64)>>> {
    let mut out = Vec::new();
    for pod in pods {
        out.push(pod.serving().await);
    }
    out
}

/// Waits until the two binary pods `a` and `b` both serve shards, together all of them,
/// and every terminal of `t` is settled; how long it took.
async fn both_serving_and_settled(
    a: &BinPod,
    b: &BinPod,
    t: &Farm,
    what: &str,
    limit: Duration,
) -> Duration {
    wait_for_async(what, limit, || async {
        let views = serving_of(&[a, b]).await;
        let counts: Vec<usize> = views.iter().flatten().map(Vec::len).collect();
        counts.len() == 2
            && counts.iter().all(|&c| c > 0)
            && counts.iter().sum::<usize>() == SHARDS as usize
            && t.all_settled()
    })
    .await
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
    let t = Farm::with_directory(&redis, farm::config(N)).await;
    let server = wrong_name_server().await;
    // The pod trusts both CAs: the wrong terminal's chain is valid, only its name is not.
    let bundle = t.dir.path().join("bundle.pem");
    std::fs::write(&bundle, format!("{}{}", t.ca_pem(), server.ca_pem)).unwrap();
    let wrong = Terminal::new(WRONG, &server.addr.to_string(), Some("wrong.example")).unwrap();
    import(&redis, &[wrong]).await;

    let mut pod = binary::terminal_pod("wrong-name-pod", &redis.url(), &bundle, t.dir.path(), &[]);
    let took = wait_for(
        "every good terminal with a session",
        connect_limit(),
        || t.all_settled(),
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
    let counters = t.counters();
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
    let metrics = match pod.get("/metrics", binary::API_TOKEN).await {
        Some((200, text)) => text,
        _ => String::new(),
    };
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
    let mut config = farm::config(N);
    // A frozen pod cannot answer GOAWAY: the terminal closes a superseded session itself
    // after its grace period. Keep that grace below the 1 s session-overlap threshold, as
    // the protocol asks of terminals ("closes its older sessions").
    config.supersede_grace = Duration::from_millis(500);
    let t = Farm::with_directory(&redis, config).await;
    let mut a = binary::terminal_pod("stop-pod-a", &redis.url(), &t.ca_file, t.dir.path(), &[]);
    let mut b = binary::terminal_pod("stop-pod-b", &redis.url(), &t.ca_file, t.dir.path(), &[]);

    let startup = Instant::now();
    while startup.elapsed() < connect_limit() + Duration::from_secs(5)
        && !(a.serving().await.is_some() && b.serving().await.is_some())
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if a.serving().await.is_none() || b.serving().await.is_none() {
        a.assert_running();
        b.assert_running();
        panic!("no /v1/cluster answer; logs:\n{}\n{}", a.log(), b.log());
    }
    let took = both_serving_and_settled(
        &a,
        &b,
        &t,
        "both pods serving and every terminal settled",
        connect_limit() + Duration::from_secs(5),
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
    let before = t.counters();
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
        || async { b.serving().await.map(|s| s.len()) == Some(SHARDS as usize) && t.all_settled() },
    )
    .await;
    let pause = Duration::from_secs(3 + 4);
    if frozen.elapsed() < pause {
        tokio::time::sleep(pause - frozen.elapsed()).await;
    }
    let during = t.counters();
    eprintln!(
        "[{test}] pod a frozen: pod b serves all shards, every terminal settled {:.3} s after \
         SIGSTOP; {}",
        secs(took_over),
        during.changes_since(&before)
    );
    for (id, old) in &a_terminals {
        let report = t.terminal_report(id).unwrap();
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
        .map(|(id, _)| {
            let (port, id) = (a.port, id.clone());
            tokio::spawn(async move { binary::push(port, &id, &format!("resume-{id}")).await })
        })
        .collect();
    let took = both_serving_and_settled(
        &a,
        &b,
        &t,
        "both pods serving again and every terminal settled",
        Duration::from_secs(30),
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
        let report = t.terminal_report(id).unwrap();
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
    let end = t.counters();
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
        end.changes_since(&before)
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
    assert!(t.all_settled());
    assert_eq!(end.connections_open, N);
    a.signal("-TERM");
    b.signal("-TERM");
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}
