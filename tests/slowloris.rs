//! A slowloris against a whole `posgate serve` process with its terminals: 2,000
//! clients that keep a connection open each, sending a request head a line at a time
//! and never finishing it, and open a new one whenever the pod closes theirs. Measured
//! on the process (file descriptors, RSS) before, during and after.
//!
//! What must hold: the pod holds at most `--max-connections` of them (on `main` before
//! the listener had limits every one was held: fds 105 -> 2,105 and never returned),
//! `/healthz` is answered as the kubelet's readiness probe needs it and pushes are
//! answered throughout, no terminal session is lost, and once the clients stop opening
//! new connections the pod closes every one it still holds within
//! `--header-read-timeout`, its descriptors and memory returning.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use posgate::http::MAX_CLOSING;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::k8s_manifests::scalar_after;
use crate::support::binary;
use crate::support::farm::{self, connect_limit, Farm};
use crate::support::pod::SHARDS;
use crate::support::wait::wait_for_async;
use crate::support::RedisServer;

const CLIENTS: usize = 2_000;
const MAX_CONNECTIONS: usize = 1_000;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the clients keep opening connections: past two header read timeouts, so
/// connections are both made room for and timed out.
const ATTACK: Duration = Duration::from_secs(8);
const TERMINALS: u64 = 200;
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// How much more resident memory than before the attack counts as returned.
const MEMORY_SLACK_KIB: u64 = 8 * 1024;

/// The readiness probe of `k8s/base/deployment.yaml`, the stricter of the two: its
/// `timeoutSeconds` and `failureThreshold`, what the kubelet acts on. A probe may miss
/// its time now and then: a flood fills the listener's accept queue at moments, and a
/// SYN the kernel drops then is sent again after 1 s (and 3 s), as for any client.
/// `failureThreshold` misses in a row take the pod out of the Service, and that is what
/// the shedding must prevent.
fn readiness_probe() -> (Duration, usize) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/k8s/base/deployment.yaml");
    let text = std::fs::read_to_string(path).expect("k8s/base/deployment.yaml");
    let lines: Vec<&str> = text.lines().collect();
    let probe = lines
        .iter()
        .position(|l| l.trim() == "readinessProbe:")
        .expect("a readinessProbe in k8s/base/deployment.yaml");
    let number = |key| {
        let (_, value) = scalar_after(&lines, probe, key).expect(key);
        value.parse::<u64>().expect(key)
    };
    let failures = usize::try_from(number("failureThreshold")).unwrap();
    (secs(number("timeoutSeconds")), failures)
}

/// Open file descriptors and resident memory (KiB) of process `pid`.
fn usage(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the pod's /proc entry")
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    (fds, rss)
}

/// One slowloris client: a connection with half a head, a header line every 500 ms,
/// until the pod closes it; then, after a pause, another, until `stop` (2,000 of them
/// reconnecting at once without a pause measure the machine's accept rate, not the
/// pod's limits, and starve the test's own terminals). Returns how long the pod held
/// the last one, from the end of its TCP handshake (a SYN dropped by a full accept
/// queue is retried after 1, 3, 7 s...; that wait is the client's), which includes
/// its wait in the pod's accept queue.
async fn client(port: u16, stop: Arc<AtomicBool>) -> Duration {
    loop {
        let Ok(mut tcp) = TcpStream::connect(("127.0.0.1", port)).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let opened = Instant::now();
        let _ = tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").await;
        let mut buf = [0u8; 512];
        loop {
            tokio::select! {
                read = tcp.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                },
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    let _ = tcp.write_all(b"x-slow: 1\r\n").await;
                }
            }
        }
        if stop.load(Ordering::Relaxed) {
            return opened.elapsed();
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slowloris_is_shed_while_probes_pushes_and_terminal_sessions_keep_working() {
    let redis = RedisServer::start();
    let t = Farm::with_directory(&redis, farm::config(TERMINALS)).await;
    let limits = [
        ("--max-connections", MAX_CONNECTIONS.to_string()),
        ("--header-read-timeout", "3s".to_string()),
    ];
    let extra: Vec<&str> = limits.iter().flat_map(|(f, v)| [*f, v.as_str()]).collect();
    let mut pod = binary::terminal_pod(
        "slowloris-pod",
        &redis.url(),
        &t.ca_file,
        t.dir.path(),
        &extra,
    );
    wait_for_async(
        "the pod serving every shard and every terminal settled",
        connect_limit() + Duration::from_secs(5),
        || async {
            pod.serving().await.map(|s| s.len()) == Some(SHARDS as usize) && t.all_settled()
        },
    )
    .await;
    let pid = pod.pid();
    let before = usage(pid);
    let sessions_before = t.counters().connections_opened;

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(client(pod.port, stop.clone())))
        .collect();
    let (probe_timeout, probe_failure_threshold) = readiness_probe();
    let started = Instant::now();
    let (mut peak, mut probes, mut pushes) = (before, 0, 0);
    let (mut failed_probes, mut failed_in_a_row) = (0, 0);
    while started.elapsed() < ATTACK {
        let now = usage(pid);
        peak = (peak.0.max(now.0), peak.1.max(now.1));
        let probe = binary::request(pod.port, "GET /healthz HTTP/1.1\r\n", "", probe_timeout).await;
        probes += 1;
        if probe.map(|(s, _)| s) == Some(200) {
            failed_in_a_row = 0;
        } else {
            failed_probes += 1;
            failed_in_a_row += 1;
        }
        assert!(
            failed_in_a_row < probe_failure_threshold,
            "/healthz during the attack: {failed_in_a_row} probes in a row unanswered within \
             {probe_timeout:?} (the kubelet takes the pod out of the Service)"
        );
        let terminal = &t.ids[pushes % t.ids.len()];
        let pushed = binary::push(pod.port, terminal, &format!("slowloris-{pushes}")).await;
        assert_eq!(
            pushed,
            Some(200),
            "push {pushes} to {terminal} during the attack"
        );
        pushes += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = usage(pid);
    stop.store(true, Ordering::Relaxed);
    let stopped = Instant::now();
    let mut longest_held = Duration::ZERO;
    for c in clients {
        let held = tokio::time::timeout(HEADER_READ_TIMEOUT + secs(10), c)
            .await
            .expect("the pod closes every connection it holds")
            .unwrap();
        longest_held = longest_held.max(held);
    }
    let drained = stopped.elapsed();
    pod.assert_running();
    // The allocator gives freed pages back to the OS after a decay time (jemalloc's
    // default: 10 s), in a background thread.
    let returned = Instant::now();
    let mut after = usage(pid);
    while after.1 > before.1 + MEMORY_SLACK_KIB && returned.elapsed() < secs(30) {
        tokio::time::sleep(secs(1)).await;
        after = usage(pid);
    }
    let returned = returned.elapsed();
    let scrape = binary::request(pod.port, "GET /metrics HTTP/1.1\r\n", "", secs(2))
        .await
        .expect("/metrics")
        .1;
    let closed: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("posgate_http_connections_closed_total{"))
        .collect();
    eprintln!(
        "[slowloris] {CLIENTS} clients for {ATTACK:?}, --max-connections {MAX_CONNECTIONS}: \
         fds {} -> peak {} (at the end {}) -> {} after; RSS {} -> peak {} -> {} KiB after ({returned:.1?} after the last close); \
         {probes} probes ({failed_probes} unanswered) and {pushes} pushes answered during; the last connections held \
         at most {longest_held:.1?}, all closed {drained:.1?} after the clients stopped; {closed:?}",
        before.0, peak.0, during.0, after.0, before.1, peak.1, after.1
    );
    // Counted from the stop: the header read timeout of the connections held then, and
    // the wait in the pod's accept queue of those not yet accepted (seconds, when the
    // whole test suite shares two cores).
    assert!(
        drained <= HEADER_READ_TIMEOUT + secs(10),
        "the pod still held connections {drained:?} after the clients stopped"
    );
    // Those making room while they close, the probe's and the push's.
    assert!(
        peak.0 <= before.0 + MAX_CONNECTIONS + MAX_CLOSING + 10,
        "the pod held more client connections than --max-connections: fds {} -> {}",
        before.0,
        peak.0
    );
    assert!(
        after.0 <= before.0 + 10,
        "descriptors returned: {} before, {} after",
        before.0,
        after.0
    );
    assert!(
        after.1 <= before.1 + MEMORY_SLACK_KIB,
        "memory returned: {} KiB before, {} KiB after (peak {})",
        before.1,
        after.1,
        peak.1
    );
    assert_eq!(
        t.counters().connections_opened,
        sessions_before,
        "no terminal session was lost and redialed"
    );
    assert!(t.all_settled(), "every terminal still has its one session");
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
