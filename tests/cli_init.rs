//! `posgate init` run as a binary against a real `redis-server`, then a `posgate serve`
//! pod with simulated terminals: the pod of an initialized cluster claims every shard
//! and dials its terminals well inside its member TTL, where a pod of a fresh store
//! holds its claims for one member TTL (the recovery hold, `docs/design.md`). Also: init
//! a second time returns at once and counts the pod, a cluster pinned with other
//! settings is refused (exit 2), an unreachable Redis is exit 1.

use std::time::{Duration, Instant};

use crate::support::binary::{self, posgate};
use crate::support::farm::{self, Farm};
use crate::support::pod::CLUSTER;
use crate::support::RedisServer;

/// The pods' member TTL here: the hold a pod of a fresh store would wait out.
const MEMBER_TTL: &str = "10s";

/// How soon the pod of an initialized cluster serves every shard with its terminals
/// connected: well under [`MEMBER_TTL`], so a hold cannot pass.
const AT_ONCE: Duration = Duration::from_secs(6);

fn init(url: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["init", "--redis-url", url, "--cluster", CLUSTER];
    args.extend(["--member-ttl", MEMBER_TTL]);
    args.extend(extra);
    posgate(&args, &[])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_of_an_initialized_cluster_claims_and_dials_at_once() {
    let redis = RedisServer::start();
    let t = Farm::with_directory(&redis, farm::config(10)).await;
    let out = init(&redis.url(), &[]);
    assert!(out.status.success(), "init: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("cluster ready: store generation "),
        "{}",
        text(&out.stdout)
    );

    let started = Instant::now();
    let mut pod = binary::terminal_pod(
        "init-pod",
        &redis.url(),
        &t.ca_file,
        t.dir.path(),
        &["--member-ttl", MEMBER_TTL],
    );
    let deadline = started + AT_ONCE;
    loop {
        let served = pod.serving().await.map_or(0, |s| s.len());
        let settled = t.all_settled();
        if served == 64 && settled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {AT_ONCE:?}: {served} of 64 shards served, terminals settled: {settled}; \
             log:\n{}",
            pod.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pod.assert_running();
    eprintln!("served and dialed {:?} after the start", started.elapsed());

    // Again: the generation is old; it returns at once and sees the pod.
    let out = init(&redis.url(), &[]);
    assert!(out.status.success(), "second init: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("1 pod(s) registered"),
        "{}",
        text(&out.stdout)
    );
    // Another shard count than the cluster's: refused like a bad flag.
    let out = init(&redis.url(), &["--shards", "8"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cluster metadata mismatch"));
}

#[test]
fn an_unreachable_redis_is_exit_1() {
    let port = crate::support::redis_server::free_port();
    let out = init(&format!("redis://127.0.0.1:{port}"), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("store unreachable"),
        "{}",
        text(&out.stderr)
    );
}
