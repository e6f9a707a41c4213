//! `wire-dial`: the cold start's wire protocol without posgate, a floor for the full
//! cold start.
//!
//! `posgate-load --full cold-start` judges 20 pods dialing 50,000 terminals against
//! `1.2 x T + 5 s`, with `T = terminals / H` and H calibrated by one client process with
//! 128 handshakes in flight (`load::calibrate`). This tool runs the same calibration,
//! then the cold start's shape with nothing of posgate in it (`load::floor`):
//! `--dialers` processes of this binary (one per pod; the hidden `--dialer k` mode
//! below), each dialing every `dialers`-th terminal of a fresh farm of `--terminals` at
//! `--dial-rate` with `--in-flight` handshakes at most (the pods' defaults), and holding
//! every connection, as a pod does. With `--hello` each dial also does what a pod's does
//! on the wire after TLS: the HTTP/2 handshake (hyper's client) and `POST /hello`,
//! answered 200 by the terminal. It prints when the last dialer was done, as a multiple
//! of T, once the farm's own counters agree that every terminal is connected (and, with
//! `--hello`, has its hello accepted). `posgate-load` runs the same floor (with the
//! hello) before the pods of every cold start and reports the cold start against it.
//!
//! So the gap between H and the judged run splits in three: bare TLS handshakes dialed
//! by 20 processes (what the topology costs), HTTP/2 and the hello (what the protocol
//! costs), and the rest (posgate). See `docs/performance.md`, "Cold start".
//!
//! Not for: a gate (it judges nothing) or posgate's own figures (`posgate-load`).
//!
//! ```text
//! cargo build --release -p posgate-loadtest --bins
//! target/release/wire-dial --dir /tmp/wire --hello
//! ```

use std::{error::Error, path::PathBuf, sync::Arc, time::Duration};

use clap::Parser;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use posgate_loadtest::load::{analysis, calibrate, floor, procs};
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
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let ran = match args.dialer {
        Some(k) => dialer(&args, k).await,
        None => run(&args).await,
    };
    match ran {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wire-dial: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Calibrates H, then measures the floor (`load::floor`: a fresh farm, this binary's
/// dialer mode in `--dialers` processes) and prints it against T.
async fn run(args: &Args) -> Fallible<()> {
    let pos_sim = match &args.pos_sim {
        Some(p) => p.clone(),
        None => procs::beside_this_binary("pos-sim")?,
    };
    let window = calibrate::Window::COLD_START;
    let h = calibrate::handshake_rate(&pos_sim, &args.dir.join("calibration"), window).await?;
    println!("H = {}", h.describe());
    let plan = floor::Plan {
        dialers: args.dialers,
        terminals: args.terminals,
        dial_rate: u64::from(args.dial_rate),
        in_flight: args.in_flight,
        hello: args.hello,
    };
    let me = std::env::current_exe()?;
    let floor = floor::run(&me, &pos_sim, &args.dir.join("farm"), &plan).await?;
    let hellos = if floor.hello { floor.terminals } else { 0 };
    println!(
        "farm: {} terminals connected, {hellos} hellos accepted, {} handshakes failed",
        floor.terminals, floor.handshakes_failed
    );
    let dialers = args.dialers as u64;
    let t = analysis::cold_start_t(args.terminals, dialers, plan.dial_rate, h.per_s());
    println!("{}", floor.describe(t, analysis::bound_s(t)));
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
                .header("posgate-epoch", 1)
                .header("posgate-pod", pod)
                .header("posgate-terminal", terminal.id.as_str())
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
