//! The `posgate` binary in an integration test: one command run to completion
//! ([`posgate`]), or a `posgate serve` process ([`BinPod`]) with the fast timings of the
//! in-process pods ([`fast_flags`]) that a test signals, reads the log of and asks over
//! plain HTTP/1.1 ([`request`]); [`terminal_pod`] is one with its POS connections and
//! push API, asked which shards it serves ([`BinPod::serving`]) and pushed through
//! ([`push`]).
//!
//! Not for: in-process pods ([`super::pod`]).

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use posgate::core::{CoreConfig, ShardId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::pod::{CLUSTER, STORE_TIMEOUT};
use super::redis_server::free_port;

/// The operator token of a [`terminal_pod`] (the cluster view).
pub use posgate_loadtest::load::pods::OPERATOR_TOKEN;
/// The bearer token of a [`terminal_pod`]'s push API: the load harness's (tenant
/// `load`), so its push generator can push through the process too.
pub use posgate_loadtest::load::pods::TOKEN as API_TOKEN;
/// The directory token of a [`terminal_pod`] (the directory API, every terminal).
pub const DIRECTORY_TOKEN: &str = "terminal-pod-test-directory-token";
/// Tenant [`BROADCAST_TENANT`] of every terminal, and of the terminals `pos-0000*` only.
pub const BROADCAST_TOKEN: &str = "terminal-pod-test-broadcast-token";
pub const SCOPED_BROADCAST_TOKEN: &str = "terminal-pod-test-scoped-broadcast-token";
pub const BROADCAST_TENANT: &str = "bcast";

/// A coordination-only `posgate serve` pod `id` of cluster [`CLUSTER`] on `redis_url`,
/// with the fast timings and `extra` flags (no terminals, plain HTTP).
pub fn cluster_pod(redis_url: &str, id: &str, extra: &[&str]) -> BinPod {
    let port = free_port();
    let advertise = format!("http://127.0.0.1:{port}");
    let mut args: Vec<OsString> = [
        "--redis-url",
        redis_url,
        "--cluster",
        CLUSTER,
        "--pod-id",
        id,
        "--insecure",
        "--advertise-url",
        &advertise,
    ]
    .iter()
    .chain(extra)
    .map(OsString::from)
    .collect();
    args.extend(fast_flags().into_iter().map(OsString::from));
    BinPod::serve(port, args)
}

/// Runs the binary with `args` and only the environment in `env` (so a developer's
/// `POSGATE_*` variables cannot change the outcome).
pub fn posgate(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_posgate"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

/// `posgate serve` flags for the timings of `CoreConfig::fast()` and [`STORE_TIMEOUT`],
/// so a process runs exactly like the in-process test pods.
pub fn fast_flags() -> Vec<String> {
    fast_flags_except(&[])
}

/// [`fast_flags`] without those of the flags named in `args` (which set their own).
pub fn fast_flags_except(args: &[&str]) -> Vec<String> {
    let c = CoreConfig::fast();
    [
        ("--lease-ttl", c.lease_ttl),
        ("--renew-interval", c.renew_interval),
        ("--lease-margin", c.lease_margin),
        ("--member-ttl", c.member_ttl),
        ("--heartbeat-interval", c.heartbeat_interval),
        ("--poll-interval", c.poll_interval),
        ("--rebalance-debounce", c.debounce),
        ("--close-budget", c.close_budget),
        ("--shutdown-budget", c.shutdown_budget),
        ("--store-timeout", STORE_TIMEOUT),
    ]
    .into_iter()
    .filter(|(flag, _)| !args.contains(flag))
    .flat_map(|(flag, value)| {
        [
            flag.to_string(),
            humantime::format_duration(value).to_string(),
        ]
    })
    .collect()
}

/// A `posgate serve` child process listening on 127.0.0.1:`port`, its environment
/// cleared and its log (stderr) in a temporary file; killed on drop.
pub struct BinPod {
    child: Child,
    pub port: u16,
    log: tempfile::NamedTempFile,
}

impl BinPod {
    /// `posgate serve --listen 127.0.0.1:<port> <args>`.
    pub fn serve<S: AsRef<OsStr>>(port: u16, args: impl IntoIterator<Item = S>) -> BinPod {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_posgate"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("log file for the child"))
            .spawn()
            .expect("spawn posgate serve");
        BinPod { child, port, log }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (`-STOP`, `-HUP`, ...) with `kill`.
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// Everything the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).expect("read the log")
    }

    /// The log lines containing every one of `needles`.
    pub fn log_lines_with(&self, needles: &[&str]) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_owned)
            .collect()
    }

    /// The exit status, once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Panics with the log if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("posgate serve exited ({status}): {}", self.log());
        }
    }

    /// `GET /v1/cluster`: the shards this pod serves, with their epochs (`None` if it
    /// did not answer).
    pub async fn serving(&self) -> Option<Vec<(ShardId, u64)>> {
        let (200, body) = self.get("/v1/cluster", OPERATOR_TOKEN).await? else {
            return None;
        };
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

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `GET path` with a bearer `token` (none if empty): status and body, if an answer
    /// came within 2 s.
    pub async fn get(&self, path: &str, token: &str) -> Option<(u16, String)> {
        let auth = if token.is_empty() {
            String::new()
        } else {
            format!("Authorization: Bearer {token}\r\n")
        };
        let head = format!("GET {path} HTTP/1.1\r\n{auth}");
        request(self.port, &head, "", Duration::from_secs(2)).await
    }
}

/// Writes `contents` to `path` by renaming a file written beside it, so a pod started
/// a moment earlier that reads `path` never sees it empty (a plain write truncates it
/// first: such a pod exited with "no tokens").
fn replace_file(path: &Path, writer: &str, contents: &str) {
    let draft = path.with_extension(writer);
    std::fs::write(&draft, contents).unwrap();
    std::fs::rename(&draft, path).unwrap();
}

/// `posgate serve` as pod `id` of the Redis at `redis_url` with the fast timings, its
/// push API open to [`API_TOKEN`], its cluster view to [`OPERATOR_TOKEN`], its
/// directory API to [`DIRECTORY_TOKEN`] and tenant [`BROADCAST_TENANT`]'s two tokens, trusting the POS CA in `ca_file`, dialing at most
/// 1,000 terminals per second, logging JSON at info, with the `extra` flags (which may
/// replace a fast timing); its secret and token files go to `dir`.
pub fn terminal_pod(
    id: &str,
    redis_url: &str,
    ca_file: &Path,
    dir: &Path,
    extra: &[&str],
) -> BinPod {
    let secret_file = dir.join("cluster-secret");
    replace_file(&secret_file, id, "terminal-pod-test-cluster-secret");
    let tokens_file = dir.join("api-tokens");
    let tenant = posgate_loadtest::load::pods::TENANT;
    let tokens = format!(
        "{tenant}:{API_TOKEN}\noperator:{OPERATOR_TOKEN}\ndirectory:{DIRECTORY_TOKEN}\n\
         {BROADCAST_TENANT}:{BROADCAST_TOKEN}\n{BROADCAST_TENANT}:{SCOPED_BROADCAST_TOKEN}:pos-0000*\n"
    );
    replace_file(&tokens_file, id, &tokens);
    let port = free_port();
    let advertise = format!("http://127.0.0.1:{port}");
    let mut args: Vec<OsString> = ["--redis-url", redis_url, "--cluster", CLUSTER]
        .into_iter()
        .chain(["--pod-id", id, "--advertise-url", &advertise])
        .chain([
            "--dial-rate",
            "1000",
            "--log-format",
            "json",
            "--log-level",
            "info",
        ])
        .map(OsString::from)
        .collect();
    args.extend(fast_flags_except(extra).into_iter().map(OsString::from));
    args.extend(["--cluster-secret-file".into(), secret_file.into()]);
    args.extend(["--api-tokens-file".into(), tokens_file.into()]);
    args.extend(["--pos-ca".into(), ca_file.into()]);
    args.extend(extra.iter().map(OsString::from));
    BinPod::serve(port, args)
}

/// `POST /v1/terminals/{terminal}/push?timeout_ms=8000` with `key` through the
/// [`terminal_pod`] on `port`; the status, if an answer came within 12 s.
pub async fn push(port: u16, terminal: &str, key: &str) -> Option<u16> {
    let head = format!(
        "POST /v1/terminals/{terminal}/push?timeout_ms=8000 HTTP/1.1\r\n\
         Authorization: Bearer {API_TOKEN}\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\n"
    );
    let answer = request(port, &head, "{\"amount\":1}", Duration::from_secs(12)).await;
    answer.map(|(status, _)| status)
}

/// Sends `sig` (`-STOP`, `-CONT`, ...) to the child process `pid` with `kill`.
pub fn signal(pid: u32, sig: &str) {
    let pid = pid.to_string();
    let status = Command::new("kill")
        .args([sig, &pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}

impl Drop for BinPod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port` on a fresh connection: `head` is the request
/// line and any headers (each line ending in CRLF); `Host`, `Content-Length` (with a
/// `body`) and `Connection: close` are added. The status and the body, if the whole
/// answer came within `within`.
pub async fn request(port: u16, head: &str, body: &str, within: Duration) -> Option<(u16, String)> {
    let answer = exchange(port, head, body, within).await?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_string()))
}

/// As [`request`], the whole answer: status line, headers and body.
pub async fn exchange(port: u16, head: &str, body: &str, within: Duration) -> Option<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let length = if body.is_empty() {
            String::new()
        } else {
            format!("Content-Length: {}\r\n", body.len())
        };
        let request = format!("{head}Host: 127.0.0.1\r\n{length}Connection: close\r\n\r\n{body}");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        Some(String::from_utf8_lossy(&answer).into_owned())
    };
    tokio::time::timeout(within, exchange).await.ok().flatten()
}
