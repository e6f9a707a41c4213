//! `SIGHUP` reloads secrets in place: a real `posgate serve` process gets a new API
//! token and a new cluster secret from its files; the old token stops working, the new
//! one works, and no shard changes owner or epoch (no rebalance for a rotation). The
//! file poller (`--reload-poll-interval`) does the same without a signal.

pub mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::RedisServer;

const OLD: &str = "old-token-0123456789abcdef";
const NEW: &str = "new-token-0123456789abcdef";

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plain HTTP/1.1 GET over std (the test needs no client library): status and body;
/// status 0 when nothing answers.
fn get(url: &str, token: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut stream) = std::net::TcpStream::connect(host) else {
        return (0, String::new());
    };
    let request = format!(
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    let mut answer = String::new();
    if stream.write_all(request.as_bytes()).is_err() || stream.read_to_string(&mut answer).is_err()
    {
        return (0, String::new());
    }
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    (status, body.unwrap_or_default())
}

fn curl_status(url: &str, token: &str) -> u16 {
    get(url, token).0
}

/// The (shard, owner, epoch) triples of `/v1/cluster`.
fn owners(base: &str, token: &str) -> Vec<(u64, String, u64)> {
    let (_, text) = get(&format!("{base}/v1/cluster"), token);
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

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `posgate serve` on a free port with the token and secret files, plus `extra`
/// flags; returns the process and its base URL.
fn serve(redis: &RedisServer, tokens: &Path, secret: &Path, extra: &[&str]) -> (Serve, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_posgate"))
        .args([
            "serve",
            "--redis-url",
            &redis.url(),
            "--pod-id",
            "reload-pod",
        ])
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--advertise-url",
            &base,
        ])
        .args([
            "--lease-ttl",
            "3s",
            "--renew-interval",
            "1s",
            "--member-ttl",
            "3s",
        ])
        .args(["--heartbeat-interval", "1s", "--close-budget", "300ms"])
        .args(["--store-timeout", "300ms"])
        .arg("--api-tokens-file")
        .arg(tokens)
        .arg("--cluster-secret-file")
        .arg(secret)
        .args(extra)
        .env_clear()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Serve(child), base)
}

/// The token file (`ops` with the OLD token) and the first cluster secret, in `dir`.
fn first_files(dir: &Path) -> (PathBuf, PathBuf) {
    let tokens = dir.join("tokens");
    let secret = dir.join("secret");
    std::fs::write(&tokens, format!("ops:{OLD}\n")).unwrap();
    std::fs::write(&secret, "first-cluster-secret-0123").unwrap();
    (tokens, secret)
}

#[test]
fn sighup_rotates_tokens_and_secret_without_a_rebalance() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (tokens, secret) = first_files(dir.path());
    // The poller is off: only the signal may reload.
    let (serve, base) = serve(&redis, &tokens, &secret, &["--reload-poll-interval", "0"]);
    wait_until("ready", || {
        curl_status(&format!("{base}/readyz"), "") == 200
    });
    assert_eq!(curl_status(&format!("{base}/v1/cluster"), OLD), 200);
    assert_eq!(curl_status(&format!("{base}/v1/cluster"), NEW), 401);
    // The view shows the leases from the next store poll on, which may follow readiness.
    wait_until("every shard shows its owner", || {
        owners(&base, OLD)
            .iter()
            .all(|(_, owner, _)| !owner.is_empty())
    });
    let before = owners(&base, OLD);

    std::fs::write(&tokens, format!("ops:{NEW}\n")).unwrap();
    std::fs::write(&secret, "second-cluster-secret-0123").unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &serve.0.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    wait_until("the new token works", || {
        curl_status(&format!("{base}/v1/cluster"), NEW) == 200
    });
    assert_eq!(curl_status(&format!("{base}/v1/cluster"), OLD), 401);
    // A few renewals later, still the same owners and epochs: nothing moved.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(owners(&base, NEW), before, "a reload must not rebalance");

    // A broken file keeps the current secrets.
    std::fs::write(&tokens, "no colon here\n").unwrap();
    Command::new("kill")
        .args(["-HUP", &serve.0.id().to_string()])
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(curl_status(&format!("{base}/v1/cluster"), NEW), 200);
}

#[test]
fn the_poller_reloads_a_changed_token_file_without_a_signal() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (tokens, secret) = first_files(dir.path());
    let (_serve, base) = serve(
        &redis,
        &tokens,
        &secret,
        &["--reload-poll-interval", "100ms"],
    );
    wait_until("up", || curl_status(&format!("{base}/healthz"), "") == 200);
    assert_eq!(curl_status(&format!("{base}/v1/cluster"), OLD), 200);

    // Replaced the way an editor or `kubectl cp` would: a new file renamed over the old.
    let staged = dir.path().join("tokens.new");
    std::fs::write(&staged, format!("ops:{NEW}\n")).unwrap();
    std::fs::rename(&staged, &tokens).unwrap();
    wait_until("the poller applies the new token", || {
        curl_status(&format!("{base}/v1/cluster"), NEW) == 200
    });
    assert_eq!(curl_status(&format!("{base}/v1/cluster"), OLD), 401);
    let (_, metrics) = get(&format!("{base}/metrics"), "");
    assert!(
        metrics.contains("posgate_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );

    // A broken file is counted as a failed reload, once, and the current token stays.
    std::fs::write(&staged, "no colon here\n").unwrap();
    std::fs::rename(&staged, &tokens).unwrap();
    wait_until("the failed reload is counted", || {
        get(&format!("{base}/metrics"), "")
            .1
            .contains("posgate_reloads_total{result=\"error\"} 1")
    });
    assert_eq!(curl_status(&format!("{base}/v1/cluster"), NEW), 200);
}
