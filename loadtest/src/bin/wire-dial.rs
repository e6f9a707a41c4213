//! `wire-dial`: the cold start's wire protocol without posgate, a floor for the full
//! cold start.
//!
//! `posgate-load --full cold-start` judges 20 pods dialing 50,000 terminals against
//! `1.2 x T + 5 s`, with `T = terminals / H` and H calibrated by one client process with
//! 128 handshakes in flight (`load::calibrate`). This tool runs the same calibration,
//! then the cold start's shape with nothing of posgate in it: `--dialers` processes (one
//! per pod), each dialing every `dialers`-th terminal of a fresh farm of `--terminals`
//! at `--dial-rate` with `--in-flight` handshakes at most (the pods' defaults), and
//! holding every connection, as a pod does. With `--hello` each dial also does what a
//! pod's does on the wire after TLS: the HTTP/2 handshake (hyper's client) and
//! `POST /hello`, answered 200 by the terminal. It prints when the last dialer was done,
//! as a multiple of T, and checks with the farm's own counters that every terminal is
//! connected (and, with `--hello`, has its hello accepted) before it believes the figure.
//!
//! So the gap between H and the judged run splits in three: bare TLS handshakes dialed
//! by 20 processes (what the topology costs), HTTP/2 and the hello (what the protocol
//! costs), and the rest (posgate). See `docs/benchmarks.md`.
//!
//! Not for: a gate (it judges nothing) or posgate's own figures (`posgate-load`).
//!
//! ```text
//! cargo build --release -p posgate-loadtest --bins
//! target/release/wire-dial --dir /tmp/wire --hello
//! ```

use std::{
    error::Error,
    path::PathBuf,
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use posgate_loadtest::{
    load::{calibrate, procs, sims::SimFarm},
    pos_sim,
};
use rustls::pki_types::ServerName;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpStream,
    sync::{mpsc, Semaphore},
    task::JoinSet,
};
use tokio_rustls::TlsConnector;

type Fallible<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Bound of one dial, through the hello: a floor that needed a retry would not be one,
/// so a slower dial ends the run with an error (the pods' `--dial-timeout` is 5 s).
const DIAL_LIMIT: Duration = Duration::from_secs(30);

#[derive(Parser, Clone)]
struct Args {
    /// Where the farms (calibration and dialed) keep their files.
    #[arg(long)]
    dir: PathBuf,
    /// Dialing processes (the full profile's pods).
    #[arg(long, default_value_t = 20)]
    dialers: usize,
    /// Terminals of the dialed farm.
    #[arg(long, default_value_t = 50_000)]
    terminals: u64,
    /// Dials started per second by each dialer, evenly spaced (`--dial-rate`).
    #[arg(long, default_value_t = 200)]
    dial_rate: u32,
    /// Dials in flight per dialer (`--dial-concurrency`).
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// After TLS, the HTTP/2 handshake and `POST /hello` on each connection.
    #[arg(long)]
    hello: bool,
    /// The pos-sim binary (default: next to this binary).
    #[arg(long)]
    pos_sim: Option<PathBuf>,
    /// Internal: run as dialer number `k` of `dialers` against the farm in `dir`.
    #[arg(long, hide = true)]
    dialer: Option<usize>,
}

#[tokio::main]
async fn main() -> Fallible<()> {
    let args = Args::parse();
    match args.dialer {
        Some(k) => dialer(&args, k).await,
        None => run(&args).await,
    }
}

/// Calibrates H, starts the farm, runs the dialers, prints the figure.
async fn run(args: &Args) -> Fallible<()> {
    let pos_sim = match &args.pos_sim {
        Some(p) => p.clone(),
        None => procs::beside_this_binary("pos-sim")?,
    };
    let window = calibrate::Window::COLD_START;
    let h = calibrate::handshake_rate(&pos_sim, &args.dir.join("calibration"), window).await?;
    println!("H = {}", h.describe());
    let farm_dir = args.dir.join("farm");
    std::fs::create_dir_all(&farm_dir)?;
    let farm = SimFarm::start(&pos_sim, args.terminals, &farm_dir).await?;
    let me = std::env::current_exe()?;
    let start = Instant::now();
    let mut dialers = Vec::new();
    for k in 0..args.dialers {
        let mut cmd = tokio::process::Command::new(&me);
        cmd.arg("--dir")
            .arg(&farm_dir)
            .args(["--dialers", &args.dialers.to_string()])
            .args(["--dial-rate", &args.dial_rate.to_string()])
            .args(["--in-flight", &args.in_flight.to_string()])
            .args(["--dialer", &k.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if args.hello {
            cmd.arg("--hello");
        }
        dialers.push(cmd.spawn()?);
    }
    // Each dialer prints one line once all its connections are up, then holds them
    // until its stdin closes (below, when `dialers` drops), so the farm carries every
    // connection to the end as it does in the cold start.
    let (mut last, mut cpu) = (Duration::ZERO, 0.0);
    for (k, child) in dialers.iter_mut().enumerate() {
        let out = child.stdout.take().ok_or("a dialer without stdout")?;
        let line = BufReader::new(out)
            .lines()
            .next_line()
            .await?
            .ok_or_else(|| format!("dialer {k} ended without its figure"))?;
        last = last.max(start.elapsed());
        let cpu_s = line
            .strip_prefix("cpu ")
            .ok_or_else(|| format!("dialer {k}: {line}"))?;
        cpu += cpu_s.parse::<f64>()?;
    }
    // A TLS 1.3 client is done one flight before its server: the farm may count the
    // last few connections a moment after the dialers report them.
    let hellos_wanted = if args.hello { args.terminals } else { 0 };
    let settled = Instant::now() + Duration::from_secs(5);
    let (connected, hellos, failed) = loop {
        let farm_saw = farm.counters().await?;
        let count = |name: &str| farm_saw.get(name).copied().unwrap_or(0);
        let seen = (
            count("terminals_connected"),
            count("sessions_accepted"),
            count("handshakes_failed"),
        );
        if (seen.0, seen.1) == (args.terminals, hellos_wanted) || Instant::now() > settled {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "farm: {connected} terminals connected, {hellos} hellos accepted, {failed} handshakes failed"
    );
    if connected != args.terminals || hellos != hellos_wanted {
        return Err(format!(
            "the farm disagrees: {connected} of {} terminals connected, {hellos} hellos \
             accepted ({hellos_wanted} sent)",
            args.terminals
        )
        .into());
    }
    let t = args.terminals as f64 / h.per_s() as f64;
    let what = if args.hello {
        "TLS + HTTP/2 + hello"
    } else {
        "TLS only"
    };
    println!(
        "{what}: {} terminals by {} dialers in {:.1} s = {:.2} x T (T = {t:.1} s, the \
         cold-start bound 1.2 x T + 5 s = {:.1} s); dialers' CPU {cpu:.1} s, {:.3} ms per dial",
        args.terminals,
        args.dialers,
        last.as_secs_f64(),
        last.as_secs_f64() / t,
        1.2 * t + 5.0,
        cpu * 1_000.0 / args.terminals as f64,
    );
    drop(dialers);
    drop(farm);
    Ok(())
}

/// Dials every `dialers`-th terminal from the `k`-th, prints `cpu <seconds>` (its own
/// CPU time) once all are up, and holds them until stdin closes. The parent times the
/// run on its own clock, from spawning the dialers to the last line.
async fn dialer(args: &Args, k: usize) -> Fallible<()> {
    let csv = args.dir.join("terminals.csv");
    let terminals = calibrate::terminal_addrs(&csv)?;
    let connector = TlsConnector::from(calibrate::client_config(&args.dir.join("ca.pem"))?);
    let mine: Vec<usize> = (k..terminals.len()).step_by(args.dialers).collect();
    let in_flight = Arc::new(Semaphore::new(args.in_flight));
    // Evenly spaced and never catching up after a late start, as the pods' limiter with
    // a burst of 1.
    let mut pace = tokio::time::interval(Duration::from_secs(1) / args.dial_rate);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (held_tx, mut held) = mpsc::unbounded_channel();
    let mut dials = JoinSet::new();
    for &i in &mine {
        pace.tick().await;
        let permit = in_flight.clone().acquire_owned().await?;
        let (connector, terminals) = (connector.clone(), terminals.clone());
        let (held_tx, hello, pod) = (held_tx.clone(), args.hello, format!("pod-{k}"));
        dials.spawn(tokio::time::timeout(DIAL_LIMIT, async move {
            let terminal = &terminals[i];
            let tcp = TcpStream::connect(terminal.addr.as_str()).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(terminal.name.clone(), tcp).await?;
            if !hello {
                drop(permit);
                let _ = held_tx.send(Box::new(tls) as Box<dyn std::any::Any + Send>);
                return Fallible::Ok(());
            }
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await?;
            tokio::spawn(conn);
            let ServerName::DnsName(host) = &terminal.name else {
                return Err(format!("terminal {i}: not a DNS name").into());
            };
            let request = http::Request::post(format!("https://{}/hello", host.as_ref()))
                .header(pos_sim::H_EPOCH, 1)
                .header(pos_sim::H_POD, pod)
                .header(pos_sim::H_TERMINAL, terminal.id.as_str())
                .body(Empty::<bytes::Bytes>::new())?;
            let answer = send.send_request(request).await?;
            if !answer.status().is_success() {
                return Err(format!("terminal {i}: hello answered {}", answer.status()).into());
            }
            drop(permit);
            let _ = held_tx.send(Box::new(send) as Box<dyn std::any::Any + Send>);
            Ok(())
        }));
    }
    let mut connections = Vec::with_capacity(mine.len());
    while connections.len() < mine.len() {
        tokio::select! {
            Some(connection) = held.recv() => connections.push(connection),
            Some(done) = dials.join_next() => done?
                .map_err(|_| format!("a dial took longer than {DIAL_LIMIT:?}"))??,
        }
    }
    let cpu = procs::cpu_ticks_of("self").ok_or("/proc/self/stat not read")?;
    println!("cpu {:.2}", cpu as f64 / procs::CLOCK_TICKS);
    // Hold until the parent closes stdin (or exits).
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while stdin.next_line().await?.is_some() {}
    Ok(())
}
