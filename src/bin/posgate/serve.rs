//! `posgate serve`: validates the flags, sets up logging and runs one pod until SIGTERM
//! or Ctrl-C, reloading its secret and certificate files on SIGHUP and when they change.
//!
//! Not for: the flags themselves and their validation (`posgate::config`) or what a pod
//! does (`posgate::pod`); this is the process around it: signals, logging, exit codes.

use std::future::Future;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use posgate::config::{ConfigError, LogFormat, PodConfig, ServeArgs, StoreConfig};
use posgate::pod::{Pod, PodError};
use posgate::store::redis::RedisStore;
use posgate::store::StoreError;
use tracing_subscriber::EnvFilter;

use crate::{init_tracing, USAGE_ERROR};

/// Runs `posgate serve`: exit 0 after a graceful shutdown, 2 for settings that cannot work
/// (bad flags, refused by the store, unusable TLS files), else 1.
pub fn main(args: ServeArgs) -> ExitCode {
    // Validate everything before logging starts, so a bad flag is one plain line.
    // Kept to read the secret files again on SIGHUP or when they change; the poller
    // compares with their content from before anything read them.
    let reload_args = args.clone();
    // Terminal sessions and client connections are file descriptors; take what the
    // hard limit allows before the connection cap is derived from it (config).
    let raised = rlimit::increase_nofile_limit(u64::MAX);
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
    crate::alloc_stats::spawn();
    match raised {
        Ok(fd_limit) => tracing::info!(
            fd_limit,
            max_connections = config.connections.max_connections,
            "open-file limit; client connections are capped at max_connections, the rest \
             is for terminal sessions, peers and the store"
        ),
        Err(error) => tracing::warn!(%error, "cannot raise the open-file limit"),
    }
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
    settings: StoreConfig,
    listen: SocketAddr,
    reload: (ServeArgs, posgate::reload::Fingerprints),
) -> anyhow::Result<()> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        commit = env!("POSGATE_COMMIT"),
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
    let options = settings.redis_options();
    if options.wait.is_none() {
        tracing::warn!(
            "pushes with a TTL are acknowledged (202) once the Redis master has them \
             (--redis-wait-replicas 0): a failover to a replica that lacks them loses them, \
             and a Redis restart without persistence loses all of them; production runs \
             --redis-wait-replicas 1 with replicas and AOF (docs/operations.md, \
             \"Pushes kept for later\")"
        );
    }
    let shutdown = shutdown_signal()?;
    // Lazy: a pod may start before Redis does (a fresh cluster, a node restart); it then
    // serves health and retries in the background instead of crash-looping.
    let store = RedisStore::connect_lazy(&settings.redis_url, &settings.cluster, options)
        .context("cannot set up the Redis store")?;
    let listener =
        posgate::http::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
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
