//! The `posgate` binary: parses the command line, sets up logging and runs one pod
//! (`posgate serve`), the ring algorithm report (`posgate ring-report`), the
//! deterministic cluster simulation (`posgate simulate`), readies a new cluster's store
//! (`posgate init`) or edits the terminal directory (`posgate terminals`).
//!
//! This is the only place that uses `anyhow` and decides exit codes: `0` success, `1` a
//! runtime failure (or an invariant violation in `simulate`), `2` an invalid command line
//! or configuration (one line on stderr,
//! `error: invalid --flag: reason`). Everything else lives in the library, except the
//! two tools only the binary runs: `demo` (a whole cluster in one process) and
//! `ring_report` (the assignment algorithm comparison).
//!
//! Layout: this file holds the command line, the clap error line and the logging setup;
//! each subcommand's runner is a module of its own (`serve.rs`, `simulate.rs`,
//! `init.rs`, `terminals.rs`, `demo/`, `ring_report.rs`).

mod alloc_stats;
mod conformance;
mod demo;
mod init;
mod ring_report;
mod serve;
mod simulate;
mod status;
mod terminals;

use std::io::IsTerminal;
use std::process::ExitCode;

use crate::demo::DemoArgs;
use crate::ring_report::RingReportArgs;
use crate::simulate::SimulateArgs;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Parser, Subcommand};
use posgate::config::conformance_args::ConformanceArgs;
use posgate::config::init_args::InitArgs;
use posgate::config::status_args::StatusArgs;
use posgate::config::terminals_args::TerminalsArgs;
use posgate::config::{LogFormat, ServeArgs};
use posgate::store::StoreError;
use tracing_subscriber::EnvFilter;

/// jemalloc rather than the system allocator: after a slowloris (`tests/slowloris.rs`)
/// glibc's kept the freed connection buffers resident (RSS 25 -> 73 -> 70 MB 30 s after
/// the last connection closed), as did mimalloc (40 -> 77 -> 73 MB); jemalloc's
/// background thread returns them within its 10 s decay (27 -> 89 -> 35 MB).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its start (`_RJEM_MALLOC_CONF` in the environment
/// overrides them). Freed pages are returned to the OS at once instead of over a 10 s
/// decay: otherwise the buffers of connections that went (and of every handshake) are
/// reused by the next connections already resident, where a fresh page stays out of RSS
/// until written. `conn-bench`, 10,000 terminals: 52.5 KiB per held connection and 60.5
/// after dropping and redialing them all twice, 41.0 and 41.1 with this (a 1 s decay:
/// 52.3 and 54.2). What this keeps out of RSS is buffer space not yet written (the
/// live heap stays 59.7 KiB per connection): a connection that carried a large push has
/// written its buffers. These were measured when the setting was chosen; today's figure
/// per held connection is in docs/performance.md ("Connections").
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8; 34] = b"dirty_decay_ms:0,muzzy_decay_ms:0\0";

/// Exit code for an invalid command line or configuration (as clap uses).
const USAGE_ERROR: u8 = 2;

/// `posgate --version`: the release and the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("POSGATE_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "posgate", version = VERSION, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one gateway pod: join the cluster in Redis, own shards, serve HTTP.
    Serve(Box<ServeArgs>),
    /// Compare ring algorithms (balance and movement on membership changes).
    RingReport(RingReportArgs),
    /// Run the deterministic cluster simulation over many seeds, or replay one.
    Simulate(SimulateArgs),
    /// Make a new cluster's store ready before its first pod, so pods claim at once.
    Init(InitArgs),
    /// Edit the terminal directory in Redis: import a CSV file, export, remove, count.
    Terminals(TerminalsArgs),
    /// Show the cluster as one pod sees it (needs an operator token).
    Status(StatusArgs),
    /// Check a terminal implementation against the POS protocol (docs/pos-protocol.md).
    Conformance(ConformanceArgs),
    /// Run a whole cluster in this process: pods, simulated terminals, push traffic.
    Demo(DemoArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                err.exit();
            }
            eprintln!("error: {}", clap_error_line(&err));
            return ExitCode::from(USAGE_ERROR);
        }
    };
    match cli.command {
        Command::Serve(args) => serve::main(*args),
        Command::RingReport(args) => {
            let report = ring_report::run(&args);
            println!("{}", report.trim_end());
            ExitCode::SUCCESS
        }
        Command::Simulate(args) => simulate::main(&args),
        Command::Init(args) => init::main(args),
        Command::Terminals(args) => terminals::main(args),
        Command::Status(args) => status::main(args),
        Command::Conformance(args) => conformance::main(args),
        Command::Demo(args) => demo::main(args),
    }
}

/// Logging to stderr, as JSON lines or text.
fn init_tracing(format: LogFormat, filter: EnvFilter) {
    // Colours only for a person at a terminal: escape codes in a log file or a
    // collector's input are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// `result`'s value, or exit 2 after printing its error as one `error: ...` line: for
/// settings a subcommand resolves from its flags (`?` in a runner returning
/// `Result<_, ExitCode>`).
fn or_usage<T, E: std::fmt::Display>(result: Result<T, E>) -> Result<T, ExitCode> {
    result.map_err(|err| {
        eprintln!("error: {err}");
        ExitCode::from(USAGE_ERROR)
    })
}

/// A multi-threaded tokio runtime, or exit 1 after saying why on stderr (for commands
/// that have not set up logging).
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Runtime::new().map_err(|err| {
        eprintln!("error: cannot start the async runtime: {err}");
        ExitCode::FAILURE
    })
}

/// The exit code of an operator command that failed with `err`: 2 for settings the
/// store refused (cluster metadata mismatch, bad TLS files), like a bad flag; 1 else.
fn exit_code_for(err: &anyhow::Error) -> ExitCode {
    match err.downcast_ref::<StoreError>() {
        Some(StoreError::Config(_) | StoreError::MetaMismatch { .. }) => {
            ExitCode::from(USAGE_ERROR)
        }
        _ => ExitCode::FAILURE,
    }
}

/// One line (without the `error: ` prefix) for a command-line error, naming the flag for
/// bad values (`invalid --lease-ttl: ...`); clap's own rendering spans several lines.
fn clap_error_line(err: &clap::Error) -> String {
    let context = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    if matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        if let Some(arg) = context(ContextKind::InvalidArg) {
            // "--lease-ttl <LEASE_TTL>" -> "--lease-ttl"
            let flag = arg.split_whitespace().next().unwrap_or(arg);
            let value = context(ContextKind::InvalidValue).unwrap_or_default();
            let reason = match (
                std::error::Error::source(err),
                err.get(ContextKind::ValidValue),
            ) {
                (Some(source), _) => source.to_string(),
                (None, Some(ContextValue::Strings(valid))) => {
                    format!("expected one of {}", valid.join(", "))
                }
                (None, _) => "not accepted".to_string(),
            };
            return format!("invalid {flag}: {reason} (got {value:?})");
        }
    }
    if err.kind() == ErrorKind::MissingRequiredArgument {
        // clap lists the missing arguments on the lines after the first.
        if let Some(ContextValue::Strings(missing)) = err.get(ContextKind::InvalidArg) {
            return format!("missing {}", missing.join(", "));
        }
    }
    let rendered = err.render().to_string();
    let first = rendered.lines().next().unwrap_or("invalid command line");
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}
