//! `pos-sim`: runs a farm of simulated POS terminals (see `docs/pos-protocol.md`) until
//! SIGTERM or Ctrl-C, then writes `counters.json` and exits 0.
//!
//! It writes `ca.pem` and `terminals.csv` into `--out` at start, serves counters and fault
//! knobs on `--admin`, and does nothing else: it never dials out.
#![forbid(unsafe_code)]

use std::{net::Ipv4Addr, net::SocketAddr, ops::Range, path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};
use clap::Parser;
use posgate_pos_sim::{DedupWindow, FarmConfig, Naming, PosFarm};
use tracing::info;
use tracing_subscriber::EnvFilter;

/// Simulated POS terminals for posgate load and fault tests.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Terminal numbers to serve, `START..END` (end exclusive), at most 15,000.
    #[arg(long, value_parser = parse_range)]
    range: Range<u64>,
    /// Directory for `ca.pem`, `terminals.csv` and, on exit, `counters.json`.
    #[arg(long)]
    out: PathBuf,
    /// Address of the plain-HTTP admin endpoint (`GET /counters`, `POST /faults`, ...).
    #[arg(long, default_value = "127.0.0.1:9900")]
    admin: SocketAddr,
    /// Number of TLS listeners, on consecutive addresses from `--first-ip`.
    #[arg(long, default_value_t = 16)]
    listeners: usize,
    /// Port of every TLS listener.
    #[arg(long, default_value_t = 8443)]
    port: u16,
    /// Address of the first listener (must be in 127.0.0.0/8).
    #[arg(long, default_value = "127.0.1.1")]
    first_ip: Ipv4Addr,
    /// Terminal id prefix.
    #[arg(long, default_value = "pos-")]
    prefix: String,
    /// DNS suffix of the terminals' server names.
    #[arg(long, default_value = "pos.test")]
    domain: String,
    /// Path pushes are posted to.
    #[arg(long, default_value = "/push")]
    push_path: String,
    /// Milliseconds a superseded session's connection may linger after GOAWAY.
    #[arg(long, default_value_t = 2000)]
    supersede_grace_ms: u64,
    /// Seconds a terminal answers a repeated idempotency key as a duplicate; at least
    /// the pods' `--idempotency-ttl` (`docs/pos-protocol.md` §5).
    #[arg(long, default_value_t = 600)]
    dedup_window_secs: u64,
    /// Most idempotency keys one terminal remembers (bounds memory; keys forgotten
    /// early are counted in `keys_forgotten_early`).
    #[arg(long, default_value_t = 1_000)]
    dedup_capacity: usize,
}

fn parse_range(s: &str) -> Result<Range<u64>, String> {
    let (start, end) = s
        .split_once("..")
        .ok_or_else(|| format!("expected START..END, got {s:?}"))?;
    let parse = |v: &str| v.trim().parse::<u64>().map_err(|e| format!("{v:?}: {e}"));
    Ok(parse(start)?..parse(end)?)
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    // Terminals must stay on loopback: this machine may not send traffic anywhere else.
    if !args.first_ip.is_loopback() {
        bail!("--first-ip {} is not in 127.0.0.0/8", args.first_ip);
    }
    if !args.admin.ip().is_loopback() {
        bail!("--admin {} is not a loopback address", args.admin);
    }
    let mut config = FarmConfig::new(args.range.clone());
    config.naming = Naming {
        prefix: args.prefix,
        domain: args.domain,
    };
    config.first_ip = args.first_ip;
    config.listeners = args.listeners;
    config.port = args.port;
    config.push_path = args.push_path;
    config.supersede_grace = Duration::from_millis(args.supersede_grace_ms);
    config.dedup = DedupWindow {
        window: Duration::from_secs(args.dedup_window_secs),
        capacity: args.dedup_capacity,
    };

    let farm = PosFarm::start(config).await.context("starting the farm")?;
    farm.write_files(&args.out)?;
    let admin = farm.serve_admin(args.admin).await?;
    info!(
        range = ?args.range,
        out = %args.out.display(),
        admin = %admin.local_addr(),
        "pos-sim ready"
    );

    wait_for_stop().await?;
    let counters = farm.counters();
    let path = args.out.join("counters.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&counters)?)
        .with_context(|| format!("writing {}", path.display()))?;
    info!(path = %path.display(), ?counters, "stopped; counters written");
    Ok(())
}

async fn wait_for_stop() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM"),
        result = tokio::signal::ctrl_c() => { result.context("waiting for Ctrl-C")?; info!("Ctrl-C") }
    }
    Ok(())
}
