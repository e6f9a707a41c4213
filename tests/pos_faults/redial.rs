//! Dropped connections redialed once and at the dial rate, refusing terminals backed
//! off, and a wiped directory that disconnects no terminal.

use std::time::{Duration, Instant};

use posgate::pos::backoff::BackoffPolicy;
use posgate::pos::manager::ManagerConfig;
use posgate::store::directory::DirectoryAdmin;
use posgate::store::redis::RedisStore;
use posgate_pos_sim::FaultConfig;

use crate::support::farm::{self, connect_limit, import, Farm};
use crate::support::pod::{self, SHARDS};
use crate::support::wait::{secs, wait_for, wait_for_async};
use crate::support::RedisServer;

use super::{start_pod, DIAL_RATE};

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
