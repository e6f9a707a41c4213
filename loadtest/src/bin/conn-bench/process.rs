//! The processes `conn-bench` runs and waits for: `redis-server`, `posgate serve` pods
//! (killed when dropped), their readiness, and the farm's sessions they open.
//!
//! Not for: what is measured of them (`main`, `memory`, `cpu`).

use std::net::TcpListener as StdListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use posgate_pos_sim::{FarmCounters, PosFarm};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cpu;

pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub fn start_redis(dir: &Path) -> Result<(Reaped, String)> {
    let port = free_port()?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn redis-server (apt-get install redis-server)")?;
    let child = Reaped(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("redis-server did not listen on {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((child, format!("redis://127.0.0.1:{port}/")))
}

async fn http_status(port: u16, path: &str) -> Option<u16> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf);
        text.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

pub struct Setup<'a> {
    pub posgate: &'a Path,
    pub redis_url: &'a str,
    pub cluster: &'a str,
    pub dir: &'a Path,
    pub api_tokens_flag: bool,
    pub extra: &'a [String],
}

impl Setup<'_> {
    pub fn serve(
        &self,
        name: &str,
        dial_rate: u32,
        concurrency: u32,
    ) -> Result<(Reaped, u16, Vec<String>)> {
        let port = free_port()?;
        // Written beside and renamed into place: a pod started a moment earlier may be
        // reading these, and a plain write truncates them first.
        let secret = self.dir.join("cluster-secret");
        let draft = self.dir.join(format!("cluster-secret.{name}"));
        std::fs::write(&draft, "conn-bench-cluster-secret-0123456789")?;
        std::fs::rename(&draft, &secret)?;
        let tokens = self.dir.join("api-tokens");
        let draft = self.dir.join(format!("api-tokens.{name}"));
        std::fs::write(&draft, "bench:conn-bench-api-token-0123456789abcdef\n")?;
        std::fs::rename(&draft, &tokens)?;
        let args: Vec<String> = [
            "serve",
            "--redis-url",
            self.redis_url,
            "--cluster",
            self.cluster,
            "--pod-id",
            name,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--advertise-url",
            &format!("http://127.0.0.1:{port}"),
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
            "1s",
            "--store-timeout",
            "500ms",
            "--cluster-secret-file",
            secret.to_str().context("UTF-8 path")?,
            "--pos-ca",
            self.dir.join("ca.pem").to_str().context("UTF-8 path")?,
            "--dial-rate",
            &dial_rate.to_string(),
            "--dial-concurrency",
            &concurrency.to_string(),
            "--directory-poll",
            "1s",
            "--log-format",
            "json",
            "--log-level",
            // The allocator's statistics, for `memory`.
            "warn,posgate::alloc=debug",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut args = args;
        // Builds with the push API refuse to start without tokens (or --insecure).
        if self.api_tokens_flag {
            args.push("--api-tokens-file".into());
            args.push(tokens.to_str().context("UTF-8 path")?.into());
        }
        args.extend(self.extra.iter().cloned());
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = Command::new(self.posgate)
            .args(&args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", self.posgate.display()))?;
        let mut shown = vec![self.posgate.display().to_string()];
        shown.extend(args);
        Ok((Reaped(child), port, shown))
    }

    pub fn import(&self) -> Result<Vec<String>> {
        let csv = self.dir.join("terminals.csv");
        let args: Vec<String> = vec![
            "terminals".into(),
            "import".into(),
            csv.to_str().context("UTF-8 path")?.into(),
            "--redis-url".into(),
            self.redis_url.into(),
            "--cluster".into(),
            self.cluster.into(),
        ];
        let out = Command::new(self.posgate)
            .args(&args)
            .env_clear()
            .output()?;
        if !out.status.success() {
            bail!(
                "import failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        eprintln!("import: {}", String::from_utf8_lossy(&out.stdout).trim());
        let mut shown = vec![self.posgate.display().to_string()];
        shown.extend(args);
        Ok(shown)
    }
}

pub async fn wait_ready(pod: &mut Reaped, port: u16, limit: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        if let Some(status) = pod.0.try_wait()? {
            bail!("posgate exited: {status}");
        }
        if http_status(port, "/readyz").await == Some(200) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            bail!("pod not ready after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `n` more sessions than in `base` were accepted; returns (time of the first
/// new connection, time of the last needed session), both measured from the call.
/// When the sessions of one step came, from the step's start, and the CPU the pod and
/// the farm (this process) spent between the first connection and the last session.
pub struct Dialed {
    pub first: Duration,
    pub last: Duration,
    /// Pod and farm CPU seconds over first..last.
    pub cpu: (f64, f64),
}

pub async fn wait_sessions(
    farm: &PosFarm,
    base: &FarmCounters,
    n: u64,
    pod: &mut Reaped,
    limit: Duration,
) -> Result<Dialed> {
    let pid = pod.0.id().to_string();
    let cpu_now = || -> Result<(f64, f64)> { Ok((cpu::cpu_secs(&pid)?, cpu::cpu_secs("self")?)) };
    let started = Instant::now();
    let mut first = None;
    loop {
        let c = farm.counters();
        if first.is_none() && c.connections_opened > base.connections_opened {
            first = Some((started.elapsed(), cpu_now()?));
        }
        if c.sessions_accepted >= base.sessions_accepted + n {
            let (first, cpu0) = first.unwrap_or_default();
            let cpu1 = cpu_now()?;
            return Ok(Dialed {
                first,
                last: started.elapsed(),
                cpu: (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1),
            });
        }
        if let Some(status) = pod.0.try_wait()? {
            bail!("posgate exited: {status}");
        }
        if started.elapsed() > limit {
            bail!(
                "only {} of {n} sessions after {limit:?}: {c:?}",
                c.sessions_accepted - base.sessions_accepted
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn stop(mut pod: Reaped) -> Result<()> {
    let pid = pod.0.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while pod.0.try_wait()?.is_none() {
        if Instant::now() > deadline {
            eprintln!("posgate {pid} did not stop in 20 s; killing it");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(pod);
    Ok(())
}

/// Whether `posgate serve --help` mentions `flag`.
pub fn supports(posgate: &Path, flag: &str) -> Result<bool> {
    let out = Command::new(posgate)
        .args(["serve", "--help"])
        .env_clear()
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).contains(flag))
}
