//! The `posgate` binary: parses the command line, sets up logging and runs one pod
//! (`posgate serve`), the ring algorithm report (`posgate ring-report`), the
//! deterministic cluster simulation (`posgate simulate`) or edits the terminal directory
//! (`posgate terminals`).
//!
//! This is the only place that uses `anyhow` and decides exit codes: `0` success, `1` a
//! runtime failure (or an invariant violation in `simulate`), `2` an invalid command line
//! or configuration (one line on stderr,
//! `error: invalid --flag: reason`). Everything else lives in the library, except the
//! two tools only the binary runs: `demo` (a whole cluster in one process) and
//! `ring_report` (the assignment algorithm comparison).

mod demo;
mod ring_report;

use std::future::Future;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::demo::DemoArgs;
use crate::ring_report::RingReportArgs;
use anyhow::Context;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Parser, Subcommand};
use posgate::config::terminals_args::{TerminalsArgs, TerminalsCommand};
use posgate::config::{ConfigError, LogFormat, PodConfig, ServeArgs, StoreSettings};
use posgate::pod::{Pod, PodError};
use posgate::sim::{run_seed, SimConfig, SimStats};
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate::store::StoreError;
use tracing_subscriber::EnvFilter;

/// Exit code for an invalid command line or configuration (as clap uses).
const USAGE_ERROR: u8 = 2;
/// How often `posgate simulate` reports progress on stderr.
const SIM_PROGRESS_EVERY: Duration = Duration::from_secs(5);

#[derive(Parser)]
#[command(name = "posgate", version, about, long_about = None)]
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
    /// Edit the terminal directory in Redis: import a CSV file, remove, count.
    Terminals(TerminalsArgs),
    /// Run a whole cluster in this process: pods, simulated terminals, push traffic.
    Demo(DemoArgs),
}

/// Flags of `posgate simulate`.
#[derive(clap::Args)]
struct SimulateArgs {
    /// Run only this seed, e.g. to replay a failure
    #[arg(long, value_name = "N", conflicts_with_all = ["first", "seeds"])]
    seed: Option<u64>,
    /// With --seed: print every simulated event to stderr as it happens
    #[arg(long, requires = "seed")]
    trace: bool,
    /// First seed of the range
    #[arg(long, value_name = "N", default_value_t = 0)]
    first: u64,
    /// Number of seeds to run
    #[arg(long, value_name = "M", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
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
        Command::Serve(args) => serve(*args),
        Command::RingReport(args) => {
            let report = ring_report::run(&args);
            println!("{}", report.trim_end());
            ExitCode::SUCCESS
        }
        Command::Simulate(args) => simulate(&args),
        Command::Terminals(args) => terminals(args),
        Command::Demo(args) => demo(args),
    }
}

fn demo(args: DemoArgs) -> ExitCode {
    // Warnings only: the live table is the demo's output. RUST_LOG overrides.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    init_tracing(LogFormat::Text, filter);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match runtime.block_on(demo::run(args, interrupt)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    // Validate everything before logging starts, so a bad flag is one plain line.
    // Kept to read the secret files again on SIGHUP or when they change; the poller
    // compares with their content from before anything read them.
    let reload_args = args.clone();
    let watched = posgate::reload::Fingerprints::read(&args.reloadable_files());
    let resolved = log_settings(&args).and_then(|log| Ok((log, args.resolve()?)));
    let ((format, filter), (config, settings, listen)) = match resolved {
        Ok(resolved) => resolved,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    init_tracing(format, filter);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_pod(config, settings, listen, (reload_args, watched))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "posgate stopped");
            // Settings the store refused, or unusable TLS files, will not work on a retry
            // either.
            let bad_tls = matches!(
                err.downcast_ref::<PodError>(),
                Some(PodError::Tls(_) | PodError::Config(_))
            );
            match err.downcast_ref::<StoreError>() {
                Some(StoreError::Config(_)) => ExitCode::from(USAGE_ERROR),
                _ if bad_tls => ExitCode::from(USAGE_ERROR),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

async fn run_pod(
    config: PodConfig,
    settings: StoreSettings,
    listen: SocketAddr,
    reload: (ServeArgs, posgate::reload::Fingerprints),
) -> anyhow::Result<()> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        pod = %config.pod_id,
        cluster = %config.cluster,
        advertise_url = %config.advertise_url,
        %listen,
        shards = config.core.shards,
        store = ?settings,
        pos = ?config.pos,
        "starting"
    );
    if config.cluster_secret.is_none() {
        tracing::warn!(
            "RUNNING WITHOUT PEER AUTHENTICATION (--insecure): anyone who reaches {listen} can \
             call the internal endpoints; never do this outside local development"
        );
    }
    if config.api_tokens.is_none() {
        tracing::warn!(
            "RUNNING WITHOUT API AUTHENTICATION (--insecure): anyone who reaches {listen} can \
             push to terminals; never do this outside local development"
        );
    }
    let shutdown = shutdown_signal()?;
    let options = RedisOptions {
        response_timeout: settings.store_timeout,
        ca_file: settings.redis_ca_file,
        client_cert: settings.redis_client_cert,
        ..Default::default()
    };
    // Lazy: a pod may start before Redis does (a fresh cluster, a node restart); it then
    // serves health and retries in the background instead of crash-looping.
    let store = RedisStore::connect_lazy(&settings.redis_url, &settings.cluster, options)
        .context("cannot set up the Redis store")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let mut pod = Pod::start_with_terminals(config, store, listener).context("pod failed")?;
    let reloads = reload_loop(reload, pod.reloader.clone())?;
    tokio::select! {
        () = shutdown => pod.shutdown(),
        ended = pod.wait() => return ended.context("pod failed"),
        () = reloads => unreachable!("the reload loop never ends"),
    }
    pod.wait().await.context("pod failed")
}

/// Reloads the secret and certificate files (API tokens, cluster secret, POS, listener
/// and peer TLS) on every SIGHUP and when their content changes, without a restart, so
/// a rotation costs no rebalance. A bad file is logged and the old values stay.
fn reload_loop(
    (args, watched): (ServeArgs, posgate::reload::Fingerprints),
    reloader: posgate::pod::Reloader,
) -> anyhow::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    let hangups = {
        let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot install the SIGHUP handler")?;
        futures::stream::unfold(signal, |mut signal| async move {
            signal.recv().await.map(|()| ((), signal))
        })
    };
    #[cfg(not(unix))]
    let hangups = futures::stream::pending::<()>();
    Ok(posgate::reload::run(
        args,
        reloader,
        watched,
        Box::pin(hangups),
    ))
}

/// Resolves on SIGTERM (Kubernetes stopping the pod) or Ctrl-C. The handlers are
/// installed now, so a signal arriving during start-up is not lost.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    let ctrl_c = tokio::signal::ctrl_c();
    Ok(async move {
        #[cfg(unix)]
        let signal = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = ctrl_c => "SIGINT",
        };
        #[cfg(not(unix))]
        let signal = {
            let _ = ctrl_c.await;
            "Ctrl-C"
        };
        tracing::info!(signal, "shutting down");
    })
}

/// Runs the seeds `args` select, stopping at the first invariant violation.
fn simulate(args: &SimulateArgs) -> ExitCode {
    let (first, count) = match args.seed {
        Some(seed) => (seed, 1),
        None => (args.first, args.seeds),
    };
    let Some(end) = first.checked_add(count) else {
        eprintln!("error: invalid --seeds: --first plus --seeds must fit in 64 bits");
        return ExitCode::from(USAGE_ERROR);
    };
    if args.trace {
        // The simulation's checker reads this when each run starts. Set before any
        // thread exists, so nothing reads the environment concurrently.
        std::env::set_var("POSGATE_SIM_TRACE", "1");
    }
    let cfg = SimConfig::default();
    let started = Instant::now();
    let mut reported = started;
    let mut total = SimStats::default();
    for seed in first..end {
        match run_seed(seed, &cfg) {
            Ok(stats) => total.add(&stats),
            Err(violation) => {
                // The violation ends with a newline and names the replay command.
                eprint!("error: invariant violated in {violation}");
                let line = sim_line(seed - first, &total, started.elapsed());
                eprintln!("before it: {line}");
                return ExitCode::FAILURE;
            }
        }
        if reported.elapsed() >= SIM_PROGRESS_EVERY {
            let line = sim_line(seed + 1 - first, &total, started.elapsed());
            eprintln!("progress: {line} (at seed {seed}, last {})", end - 1);
            reported = Instant::now();
        }
    }
    println!(
        "simulated seeds {first}..{end}: {}",
        sim_line(count, &total, started.elapsed())
    );
    ExitCode::SUCCESS
}

/// `<n> seeds in <t>s, <r> seeds/s, <e> events, <r> events/s, <f> faults, <a> acquisitions,
/// <h> handovers, <o> fenced overlaps, <s> served in outages`.
fn sim_line(seeds: u64, total: &SimStats, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    format!(
        "{seeds} seeds in {secs:.1}s, {:.1} seeds/s, {} events, {:.0} events/s, {} faults, \
         {} acquisitions, {} handovers, {} fenced overlaps, {} served in outages",
        rate(seeds),
        total.events,
        rate(total.events),
        total.faults,
        total.acquisitions,
        total.handovers,
        total.fenced_overlaps,
        total.served_in_outage,
    )
}

/// `--log-format` (default: JSON unless stderr is a terminal) and the filter from
/// `--log-level`, else `RUST_LOG`, else `info`.
fn log_settings(args: &ServeArgs) -> Result<(LogFormat, EnvFilter), ConfigError> {
    let format = args
        .log_format
        .unwrap_or(if std::io::stderr().is_terminal() {
            LogFormat::Text
        } else {
            LogFormat::Json
        });
    let rust_log = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
    let filter = match (&args.log_level, rust_log) {
        (Some(level), _) => EnvFilter::try_new(level).map_err(|e| ConfigError::Invalid {
            flag: "log-level",
            reason: e.to_string(),
        })?,
        (None, Some(env)) => EnvFilter::try_new(env).map_err(|e| ConfigError::InvalidEnv {
            var: "RUST_LOG",
            reason: e.to_string(),
        })?,
        (None, None) => EnvFilter::new("info"),
    };
    Ok((format, filter))
}

fn init_tracing(format: LogFormat, filter: EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
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

/// `posgate terminals ...`: edits the terminal directory. An import file is read and
/// checked whole before Redis is contacted; a bad line is reported as `FILE:LINE: reason`
/// and nothing is imported (exit 1). Settings the store refuses (cluster metadata
/// mismatch, bad TLS files) exit 2, like a bad flag.
fn terminals(args: TerminalsArgs) -> ExitCode {
    let settings = match args.resolve() {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let import = match &args.command {
        TerminalsCommand::Import { file, .. } => match read_import(file) {
            Ok(terminals) => terminals,
            Err(code) => return code,
        },
        _ => Vec::new(),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_terminals(&args, settings, import)) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            match err.downcast_ref::<StoreError>() {
                Some(StoreError::Config(_) | StoreError::MetaMismatch { .. }) => {
                    ExitCode::from(USAGE_ERROR)
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// Every terminal of the import file, or exit 1 after printing each bad line.
fn read_import(
    file: &std::path::Path,
) -> Result<Vec<posgate::store::directory::Terminal>, ExitCode> {
    let name = file.display();
    let text = std::fs::read_to_string(file).map_err(|err| {
        eprintln!("error: cannot read {name}: {err}");
        ExitCode::FAILURE
    })?;
    posgate::store::directory::csv::parse(&text).map_err(|errors| {
        for e in &errors {
            eprintln!("{name}:{}: {}", e.line, e.reason);
        }
        eprintln!(
            "error: {name}: {} invalid line(s); nothing was imported",
            errors.len()
        );
        ExitCode::FAILURE
    })
}

/// Connects (eagerly: fails at once if Redis is down), checks the cluster metadata and
/// runs the action; returns the line to print.
async fn run_terminals(
    args: &TerminalsArgs,
    settings: StoreSettings,
    import: Vec<posgate::store::directory::Terminal>,
) -> anyhow::Result<String> {
    use posgate::store::directory::DirectoryAdmin;
    use posgate::store::{ClusterMeta, CoordStore};

    let options = RedisOptions {
        response_timeout: settings.store_timeout,
        ca_file: settings.redis_ca_file,
        client_cert: settings.redis_client_cert,
        ..Default::default()
    };
    let store = RedisStore::connect(&settings.redis_url, &settings.cluster, options).await?;
    let shards = args.shards;
    store.pin_meta(&ClusterMeta::current(shards)).await?;
    Ok(match &args.command {
        TerminalsCommand::Import { replace, .. } => {
            let done = if *replace {
                store.replace_all(shards, &import).await
            } else {
                store.upsert(shards, &import).await
            }
            .context("import failed part-way (chunks already written stay; rerun the import)")?;
            let into: std::collections::BTreeSet<_> = import
                .iter()
                .map(|t| posgate::core::shard::shard_of(&t.id, shards))
                .collect();
            format!(
                "imported {} terminals ({} added, {} updated, {} removed) into {} shards",
                import.len(),
                done.added,
                done.updated,
                done.removed,
                into.len()
            )
        }
        TerminalsCommand::Remove { ids } => {
            let done = store.remove(shards, ids).await?;
            format!(
                "removed {} terminals ({} not found) from {} shards",
                done.removed,
                done.unchanged,
                done.changed_shards.len()
            )
        }
        TerminalsCommand::Count => store.count(shards).await?.to_string(),
    })
}
