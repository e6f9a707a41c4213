//! `SIGHUP` reloads secrets in place: a real `posgate serve` process gets a new API
//! token and a new cluster secret from its files; the old token stops working, the new
//! one works, and no shard changes owner or epoch (no rebalance for a rotation). The
//! file poller (`--reload-poll-interval`) does the same without a signal.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::binary::{fast_flags, BinPod};
use crate::support::redis_server::free_port;
use crate::support::wait::wait_for_async;
use crate::support::RedisServer;

const OLD: &str = "old-token-0123456789abcdef";
const NEW: &str = "new-token-0123456789abcdef";

/// `GET path` with `token`: status and body; status 0 when nothing answers.
async fn get(pod: &BinPod, path: &str, token: &str) -> (u16, String) {
    pod.get(path, token).await.unwrap_or_default()
}

async fn status(pod: &BinPod, path: &str, token: &str) -> u16 {
    get(pod, path, token).await.0
}

/// The (shard, owner, epoch) triples of `/v1/cluster`.
async fn owners(pod: &BinPod, token: &str) -> Vec<(u64, String, u64)> {
    let (_, text) = get(pod, "/v1/cluster", token).await;
    // Chunked encoding may wrap the JSON; take the outermost object.
    let json = &text[text.find('{').unwrap()..=text.rfind('}').unwrap()];
    let view: serde_json::Value = serde_json::from_str(json).unwrap();
    view["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard"].as_u64().unwrap(),
                s["owner"].as_str().unwrap_or_default().to_string(),
                s["epoch"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

const LIMIT: Duration = Duration::from_secs(20);

/// Starts `posgate serve` on a free port with the fast timings, the token and secret
/// files, plus `extra` flags.
fn serve(redis: &RedisServer, tokens: &Path, secret: &Path, extra: &[&str]) -> BinPod {
    let port = free_port();
    let mut args: Vec<OsString> = ["--redis-url", &redis.url(), "--pod-id", "reload-pod"]
        .into_iter()
        .map(OsString::from)
        .collect();
    args.push("--advertise-url".into());
    args.push(format!("http://127.0.0.1:{port}").into());
    args.extend(fast_flags().into_iter().map(OsString::from));
    args.extend([
        "--api-tokens-file".into(),
        tokens.into(),
        "--cluster-secret-file".into(),
        secret.into(),
    ]);
    args.extend(extra.iter().map(OsString::from));
    BinPod::serve(port, args)
}

/// The token file (`operator` with the OLD token) and the first cluster secret, in `dir`.
fn first_files(dir: &Path) -> (PathBuf, PathBuf) {
    let tokens = dir.join("tokens");
    let secret = dir.join("secret");
    std::fs::write(&tokens, format!("operator:{OLD}\n")).unwrap();
    std::fs::write(&secret, "first-cluster-secret-0123").unwrap();
    (tokens, secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_tokens_and_secret_without_a_rebalance() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (tokens, secret) = first_files(dir.path());
    // The poller is off: only the signal may reload.
    let pod = serve(&redis, &tokens, &secret, &["--reload-poll-interval", "0"]);
    wait_for_async("ready", LIMIT, || async {
        status(&pod, "/readyz", "").await == 200
    })
    .await;
    assert_eq!(status(&pod, "/v1/cluster", OLD).await, 200);
    assert_eq!(status(&pod, "/v1/cluster", NEW).await, 401);
    // The view shows the leases from the next store poll on, which may follow readiness.
    wait_for_async("every shard shows its owner", LIMIT, || async {
        owners(&pod, OLD)
            .await
            .iter()
            .all(|(_, owner, _)| !owner.is_empty())
    })
    .await;
    let before = owners(&pod, OLD).await;

    std::fs::write(&tokens, format!("operator:{NEW}\n")).unwrap();
    std::fs::write(&secret, "second-cluster-secret-0123").unwrap();
    pod.signal("-HUP");
    wait_for_async("the new token works", LIMIT, || async {
        status(&pod, "/v1/cluster", NEW).await == 200
    })
    .await;
    assert_eq!(status(&pod, "/v1/cluster", OLD).await, 401);
    // A few renewals later, still the same owners and epochs: nothing moved.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        owners(&pod, NEW).await,
        before,
        "a reload must not rebalance"
    );

    // A broken file keeps the current secrets.
    std::fs::write(&tokens, "no colon here\n").unwrap();
    pod.signal("-HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status(&pod, "/v1/cluster", NEW).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_reloads_a_changed_token_file_without_a_signal() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (tokens, secret) = first_files(dir.path());
    let pod = serve(
        &redis,
        &tokens,
        &secret,
        &["--reload-poll-interval", "100ms"],
    );
    wait_for_async("up", LIMIT, || async {
        status(&pod, "/healthz", "").await == 200
    })
    .await;
    assert_eq!(status(&pod, "/v1/cluster", OLD).await, 200);

    // Replaced the way an editor or `kubectl cp` would: a new file renamed over the old.
    let staged = dir.path().join("tokens.new");
    std::fs::write(&staged, format!("operator:{NEW}\n")).unwrap();
    std::fs::rename(&staged, &tokens).unwrap();
    wait_for_async("the poller applies the new token", LIMIT, || async {
        status(&pod, "/v1/cluster", NEW).await == 200
    })
    .await;
    assert_eq!(status(&pod, "/v1/cluster", OLD).await, 401);
    let (_, metrics) = get(&pod, "/metrics", "").await;
    assert!(
        metrics.contains("posgate_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );

    // A broken file is counted as a failed reload, once, and the current token stays.
    std::fs::write(&staged, "no colon here\n").unwrap();
    std::fs::rename(&staged, &tokens).unwrap();
    wait_for_async("the failed reload is counted", LIMIT, || async {
        get(&pod, "/metrics", "")
            .await
            .1
            .contains("posgate_reloads_total{result=\"error\"} 1")
    })
    .await;
    assert_eq!(status(&pod, "/v1/cluster", NEW).await, 200);
}
