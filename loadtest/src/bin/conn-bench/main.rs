//! `conn-bench`: measures one `posgate serve` process holding terminal connections.
//!
//! Starts `redis-server` on a free loopback port (unless `--redis-url` is given), a POS
//! farm of `--terminals` simulated terminals in this process, and then real `posgate`
//! processes:
//!
//! 1. `posgate serve` with an empty directory; its RSS once ready is the baseline.
//! 2. `posgate terminals import terminals.csv`; the pod picks the terminals up and dials
//!    them at `--dial-rate` (default 1000/s): time until every terminal has a session,
//!    then the RSS again -> KiB per held connection; then the pod's and the farm's CPU
//!    while the connections sit idle for `--hold-secs` -> CPU per held connection (its
//!    HTTP/2 keep-alive PINGs, `cpu`).
//! 3. Churn: the farm drops every connection and the pod redials them all, `--churn`
//!    times (default 2) -> KiB per held connection after it, which shows what the
//!    allocator keeps from the connections that went.
//! 4. The pod is stopped and a second one started with a very high dial rate and many
//!    handshakes in flight: terminals per second from its first to its last session is
//!    the handshake rate one pod sustains (farm and pod share this machine's CPUs).
//!
//! Prints a markdown table, each memory figure beside its bound and split by the pod's
//! allocator statistics (`memory`); exits 1 when a figure exceeds its bound. Loopback
//! only; never dials anything but the farm.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use posgate_pos_sim::{FarmConfig, PosFarm};

use crate::memory::Snapshot;
use crate::process::{start_redis, stop, supports, wait_ready, wait_sessions, Dialed, Setup};

mod cpu;
mod memory;
mod process;

/// Measure memory per held connection, connect time and handshake rate of one pod.
#[derive(Debug, Parser)]
struct Args {
    /// The posgate binary.
    #[arg(long, default_value = "target/release/posgate")]
    posgate: PathBuf,
    /// Use this Redis instead of starting a redis-server (the cluster name is unique per
    /// run, so an existing one is not disturbed).
    #[arg(long)]
    redis_url: Option<String>,
    /// Number of simulated terminals (at most 15,000 in this process).
    #[arg(long, default_value_t = 10_000)]
    terminals: u64,
    /// Dial rate of the connect-time measurement.
    #[arg(long, default_value_t = 1_000)]
    dial_rate: u32,
    /// Dial rate and concurrency of the handshake-rate measurement.
    #[arg(long, default_value_t = 100_000)]
    fast_dial_rate: u32,
    #[arg(long, default_value_t = 1_024)]
    fast_dial_concurrency: u32,
    /// Directory for ca.pem, terminals.csv and the pods' logs [default: a new one in
    /// the temp directory].
    #[arg(long)]
    out: Option<PathBuf>,
    /// How many times every connection is dropped and redialed before the churn figure.
    #[arg(long, default_value_t = 2)]
    churn: u32,
    /// Bound on KiB per held connection (issue 19: 40).
    #[arg(long, default_value_t = 40.0)]
    max_kib: f64,
    /// Bound on KiB per held connection after the churn (issue 19: 44).
    #[arg(long, default_value_t = 44.0)]
    max_kib_churned: f64,
    /// Give up waiting for the connections after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// How long the held connections sit idle while their CPU is measured: a few of
    /// the pods' keep-alive intervals (10 s by default), so that every connection's
    /// PINGs fall in the window.
    #[arg(long, default_value_t = 30)]
    hold_secs: u64,
    /// A flag for both pods that conn-bench does not set itself (repeatable), e.g.
    /// `--pod-arg=--pos-keepalive=10s` to measure a setting against the default.
    #[arg(long, allow_hyphen_values = true)]
    pod_arg: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.terminals;
    let limit = Duration::from_secs(args.timeout_secs);
    let dir = match &args.out {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("conn-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    if !args.posgate.is_file() {
        bail!(
            "{} not found: cargo build --release first",
            args.posgate.display()
        );
    }
    let (_redis, redis_url) = match &args.redis_url {
        Some(url) => (None, url.clone()),
        None => {
            let (child, url) = start_redis(&dir)?;
            (Some(child), url)
        }
    };
    let mut config = FarmConfig::new(0..n);
    config.port = 0;
    let farm = PosFarm::start(config).await.context("start the POS farm")?;
    farm.write_files(&dir)?;
    let cluster = format!("conn-bench-{}", std::process::id());
    let setup = Setup {
        posgate: &args.posgate,
        redis_url: &redis_url,
        cluster: &cluster,
        dir: &dir,
        api_tokens_flag: supports(&args.posgate, "--api-tokens-file")?,
        extra: &args.pod_arg,
    };
    eprintln!("files and logs in {}", dir.display());

    // 1. Baseline: a ready pod with an empty directory.
    let (mut pod, port, serve_cmd) = setup.serve("bench-pod-1", args.dial_rate, 64)?;
    let ready = wait_ready(&mut pod, port, Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = pod.0.id();
    let log1 = dir.join("bench-pod-1.log");
    let snap0 = Snapshot::take(pid, &log1)?;
    let rss0 = snap0.rss_kib;
    eprintln!(
        "pod ready after {:.1} s with 0 terminals: RSS {rss0} KiB",
        ready.as_secs_f64()
    );

    // 2. Import; the pod dials everything at --dial-rate.
    let base = farm.counters();
    let imported = Instant::now();
    let import_cmd = setup.import()?;
    let import_took = imported.elapsed();
    let Dialed { first, last, .. } = wait_sessions(&farm, &base, n, &mut pod, limit).await?;
    let connect_span = last - first;
    eprintln!(
        "{n} sessions {:.2} s after the import started (first connection at {:.2} s)",
        last.as_secs_f64(),
        first.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let snap1 = Snapshot::take(pid, &log1)?;
    let rss1 = snap1.rss_kib;
    let held = farm.counters();
    if held.connections_open != n {
        eprintln!(
            "warning: {} connections open, expected {n}",
            held.connections_open
        );
    }
    eprintln!("RSS with {} connections: {rss1} KiB", held.connections_open);
    let pod_pid = pid.to_string();
    let (pod_cpu0, farm_cpu0) = (cpu::cpu_secs(&pod_pid)?, cpu::cpu_secs("self")?);
    let hold = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.hold_secs)).await;
    let held_cpu = cpu::rows(
        cpu::cpu_secs(&pod_pid)? - pod_cpu0,
        cpu::cpu_secs("self")? - farm_cpu0,
        farm.counters().connections_open,
        hold.elapsed().as_secs_f64(),
    );

    // 3. Churn: every connection dropped by the terminals and redialed by the pod.
    for round in 1..=args.churn {
        let base = farm.counters();
        let dropped = farm.drop_connections(1.0)?;
        let took = wait_sessions(&farm, &base, dropped as u64, &mut pod, limit)
            .await?
            .last;
        eprintln!(
            "churn {round}: {dropped} connections dropped and redialed in {:.2} s",
            took.as_secs_f64()
        );
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let snap2 = Snapshot::take(pid, &log1)?;
    let churned = farm.counters();
    eprintln!(
        "RSS with {} connections after the churn: {} KiB",
        churned.connections_open, snap2.rss_kib
    );
    stop(pod)?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 4. Handshake rate: a new pod with no real pacing.
    let base = farm.counters();
    let (mut pod, _port, fast_cmd) = setup.serve(
        "bench-pod-2",
        args.fast_dial_rate,
        args.fast_dial_concurrency,
    )?;
    let fast = wait_sessions(&farm, &base, n, &mut pod, limit).await?;
    let span2 = fast.last - fast.first;
    let rate = n as f64 / span2.as_secs_f64();
    let after = farm.counters();
    stop(pod)?;

    println!("| measurement | value |");
    println!("|---|---|");
    println!("| terminals | {n} |");
    println!("| RSS, ready, 0 terminals | {rss0} KiB |");
    println!(
        "| RSS, {} connections held | {rss1} KiB |",
        held.connections_open
    );
    let (held_rows, held_ok) =
        memory::rows("held", &snap0, &snap1, held.connections_open, args.max_kib);
    let (churn_rows, churn_ok) = memory::rows(
        &format!("after churn x{}", args.churn),
        &snap0,
        &snap2,
        churned.connections_open,
        args.max_kib_churned,
    );
    println!(
        "| RSS, {} connections held after churn x{} | {} KiB |",
        churned.connections_open, args.churn, snap2.rss_kib
    );
    for row in held_rows.iter().chain(&held_cpu).chain(&churn_rows) {
        println!("{row}");
    }
    println!(
        "| connect {n} at --dial-rate {}: first to last session | {:.2} s |",
        args.dial_rate,
        connect_span.as_secs_f64()
    );
    println!(
        "| connect {n} at --dial-rate {}: from import start (incl. directory poll) | {:.2} s |",
        args.dial_rate,
        last.as_secs_f64()
    );
    println!(
        "| handshakes/s, one pod (--dial-rate {}, --dial-concurrency {}) | {rate:.0} /s ({n} in {:.2} s) |",
        args.fast_dial_rate,
        args.fast_dial_concurrency,
        span2.as_secs_f64()
    );
    println!("{}", cpu::dial_row(fast.cpu.0, fast.cpu.1, n));
    println!(
        "| farm: raw overlaps / handshakes failed | {} / {} |",
        after.raw_overlaps, after.handshakes_failed
    );
    println!();
    println!(
        "import ({:.2} s): `{}`",
        import_took.as_secs_f64(),
        import_cmd.join(" ")
    );
    println!("pod 1: `{}`", serve_cmd.join(" "));
    println!("pod 2: `{}`", fast_cmd.join(" "));
    if !(held_ok && churn_ok) {
        bail!("memory per connection above its bound (see the table)");
    }
    Ok(())
}
