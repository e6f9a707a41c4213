//! One pod as a library value: HTTP listener plus ownership driver over a store.
//!
//! [`Pod::run_with_terminals`] is what `posgate serve` calls: the pod with its POS
//! connection manager as the serving hook. [`Pod::start_with_terminals`] runs the same pod
//! on a task and hands back what tests and the demo observe (status, serving table) with a
//! shutdown trigger; [`Pod::start`] and [`Pod::run`] take any other hook (tests). Nothing here is process-global, so one process can run many pods,
//! and everything a pod spawns dies with it: dropping the `run` future, or the
//! [`PodHandle`], stops the pod at once (a crash, as far as the cluster can tell: its
//! leases and registration expire by TTL).
//!
//! Start-up order: the HTTP listener first (liveness must answer while the store is
//! still unreachable), then the cluster metadata is pinned (retrying until the store
//! answers; a mismatch is fatal), then the driver runs. Shutdown runs the other way:
//! the driver's graceful shutdown (stop serving, release, deregister), then HTTP.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

mod handle;

pub use self::handle::PodHandle;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinError;
use tracing::{info, warn, Instrument};

use crate::config::{PodConfig, MAX_DRAIN_BUDGET};
use crate::core::config::InvalidTimings;
use crate::credentials::Credentials;
use crate::driver::Driver;
use crate::http::tls::ServerCert;
use crate::http::{self, HttpState, ReadyLatch};
use crate::metrics::{sampler, Metrics};
use crate::peer::{PeerClient, PeerReceiver, PeerTls};
use crate::pos::dialer::{Dialer, DialerConfig};
use crate::pos::handover::{Handovers, NoHandovers, WalkConfig, RELEASE_TIMEOUT};
use crate::pos::manager::{ConnectionManager, ManagerConfig};
use crate::pos::tls;
use crate::push::handover::{self, HandoverHook, Takeovers, HANDOVER_LINGER};
use crate::push::queue::{self, QueueEvents, QueueHook};
use crate::push::{NoTerminals, PushService, Sessions};
pub use crate::reload::Reloader;
use crate::serving::ServingHook;
use crate::serving::{NoSessions, SessionStats};
use crate::status::PodStatus;
use crate::store::broadcast::BroadcastStore;
use crate::store::directory::{edits, DirectoryAdmin, DirectoryEdits};
use crate::store::queue::QueueStore;
use crate::store::{ClusterMeta, CoordStore, StoreError};
use crate::telemetry::Telemetry;
use crate::tls::TlsConfigError;

/// First and longest wait between attempts to reach the store at start-up.
const PIN_RETRY_MIN: Duration = Duration::from_millis(200);
const PIN_RETRY_MAX: Duration = Duration::from_secs(5);
/// How long connecting to a peer may take when forwarding a push.
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long in-flight HTTP requests get to finish once the driver is done.
const HTTP_DRAIN: Duration = Duration::from_secs(5);

/// Why a pod stopped other than by a requested shutdown.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("invalid configuration: {0}")]
    Config(#[from] InvalidTimings),
    /// TLS files cannot be used: POS (`--pos-ca`, `--pos-client-cert`/`--pos-client-key`),
    /// the listener's (`--tls-cert`/`--tls-key`) or `--peer-ca-file`; the message names
    /// the file.
    #[error(transparent)]
    Tls(#[from] TlsConfigError),
    /// The store is pinned to other cluster settings; this pod refuses to join.
    #[error("refusing to start: {0}")]
    Meta(StoreError),
    #[error("HTTP server failed: {0}")]
    Http(#[source] io::Error),
    #[error("pod task failed: {0}")]
    Task(#[from] JoinError),
}

/// Runs pods. See the module docs.
pub struct Pod;

impl Pod {
    /// Runs one pod until `shutdown` resolves and its graceful shutdown is done, or until
    /// it fails. Dropping the returned future stops the pod without a graceful shutdown.
    pub async fn run<S: CoordStore>(
        config: PodConfig,
        store: S,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), PodError> {
        let mut pod = Pod::start(config, store, listener, ())?;
        tokio::select! {
            () = shutdown => pod.shutdown(),
            ended = pod.wait() => return ended,
        }
        pod.wait().await
    }

    /// Runs one pod with its POS connection manager (what `posgate serve` does) until
    /// `shutdown` resolves and its graceful shutdown is done, or until it fails. Dropping
    /// the returned future stops the pod without a graceful shutdown.
    pub async fn run_with_terminals<
        S: CoordStore + DirectoryAdmin + QueueStore + BroadcastStore,
    >(
        config: PodConfig,
        store: S,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), PodError> {
        let mut pod = Pod::start_with_terminals(config, store, listener)?;
        tokio::select! {
            () = shutdown => pod.shutdown(),
            ended = pod.wait() => return ended,
        }
        pod.wait().await
    }

    /// Starts one pod on a new task, telling `hook` about serving transitions. Must be
    /// called within a tokio runtime.
    pub fn start<S: CoordStore, H: ServingHook>(
        config: PodConfig,
        store: S,
        listener: TcpListener,
        hook: H,
    ) -> Result<PodHandle, PodError> {
        let store = Arc::new(store);
        let metrics = Arc::new(Metrics::new());
        let credentials = config.credentials();
        let (driver, takeovers, _) = driver(&config, &store, hook, None, &credentials, &metrics)?;
        let (server_cert, peer_tls) = tls_parts(&config)?;
        let parts = Parts {
            credentials,
            takeovers,
            queue: None,
            directory: None,
            sessions: Arc::new(NoTerminals),
            stats: Arc::new(NoSessions),
            handovers: Arc::new(NoHandovers),
            metrics,
            dialer: None,
            server_cert,
            peer_tls,
        };
        spawn_pod(&config, driver, store, listener, parts)
    }

    /// Starts one pod on a new task whose serving hook is a [`ConnectionManager`]
    /// dialing the terminals of the served shards, as `config.pos` says, with the
    /// terminal directory read from `store` (the same store value, so a `RedisStore`
    /// shares its connection). Terminals that refuse an epoch as stale are reported to
    /// the driver. Reads the TLS files now: a bad one fails here, naming the file.
    /// Like [`Pod::start`], the store need not be reachable yet. Must be called within a
    /// tokio runtime.
    pub fn start_with_terminals<S: CoordStore + DirectoryAdmin + QueueStore + BroadcastStore>(
        config: PodConfig,
        store: S,
        listener: TcpListener,
    ) -> Result<PodHandle, PodError> {
        let store = Arc::new(store);
        Pod::start_with_directory(config, store.clone(), store, listener)
    }

    /// [`Pod::start_with_terminals`] with the terminal directory kept apart from the
    /// coordination store (the demo's embedded mode). The store keeps pushes with a TTL
    /// too.
    pub fn start_with_directory<S: CoordStore + QueueStore + BroadcastStore, D: DirectoryAdmin>(
        config: PodConfig,
        store: Arc<S>,
        directory: Arc<D>,
        listener: TcpListener,
    ) -> Result<PodHandle, PodError> {
        config.core.validate()?;
        let pos = &config.pos;
        let tls = tls::client_config(&pos.tls)?;
        let dialer = Dialer::new(DialerConfig {
            tls,
            pod: config.pod_id.clone(),
            connect_timeout: pos.dial_timeout,
            handshake_timeout: pos.dial_timeout,
            keepalive: pos.keepalive,
        });
        let metrics = Arc::new(Metrics::new());
        let credentials = config.credentials();
        let (server_cert, peer_tls) = tls_parts(&config)?;
        // The driver's status (whom a drain is announced to), once the driver exists.
        let (members_tx, members_rx) = watch::channel(PodStatus::default());
        // Planned moves per terminal (`pos::handover`), unless `--drain-budget 0`.
        let walk = (!pos.drain_budget.is_zero()).then(|| {
            let peers = PeerClient::new(
                config.pod_id.clone(),
                credentials.clone(),
                PEER_CONNECT_TIMEOUT,
            )
            .using_tls(peer_tls.clone());
            WalkConfig::new(
                Arc::new(peers),
                members_rx.clone(),
                pos.dial_rate.get(),
                RELEASE_TIMEOUT,
            )
        });
        let manager_config = ManagerConfig {
            dial_rate: pos.dial_rate,
            max_handshakes: pos.dial_concurrency,
            hello_rate: pos.hello_rate,
            backoff: pos.backoff,
            close_budget: config.core.close_budget,
            directory_poll: pos.directory_poll,
            walk,
            drain_budget: pos.drain_budget,
            metrics: metrics.clone(),
            ..ManagerConfig::default()
        };
        let (stale_tx, stale_rx) = mpsc::unbounded_channel();
        let edits = edits(directory.clone(), config.core.shards);
        let manager = ConnectionManager::new(directory, dialer.clone(), manager_config, stale_tx);
        let sessions = Arc::new(manager.clone());
        let stats = Arc::new(manager.clone());
        let handovers = Arc::new(manager.clone());
        let queue_store: Stores = (store.clone(), store.clone());
        let (driver, takeovers, queue) = driver(
            &config,
            &store,
            manager,
            Some(queue_store),
            &credentials,
            &metrics,
        )?;
        let driver = driver.with_stale_epochs(stale_rx);
        tokio::spawn(forward_status(driver.status(), members_tx));
        let parts = Parts {
            credentials,
            takeovers,
            queue,
            directory: Some(edits),
            sessions,
            stats,
            handovers,
            metrics,
            dialer: Some(dialer),
            server_cert,
            peer_tls,
        };
        spawn_pod(&config, driver, store, listener, parts)
    }
}

/// Copies every status of the driver to `to` until either side is gone.
async fn forward_status(mut from: watch::Receiver<PodStatus>, to: watch::Sender<PodStatus>) {
    loop {
        let status = from.borrow_and_update().clone();
        if to.send(status).is_err() || from.changed().await.is_err() {
            return;
        }
    }
}

/// A pod's driver: it tells `hook` and the push layer's hooks (kept answers, queue
/// drains) about serving transitions.
type PodDriver<S, H> = Driver<S, (H, (HandoverHook, QueueHook))>;

/// The queue a pod keeps pushes with a TTL in, and its drains' end of the hook.
type Queue = (Stores, QueueEvents);

/// Where pushes with a TTL and broadcasts are kept (one store, seen through each trait).
type Stores = (Arc<dyn QueueStore>, Arc<dyn BroadcastStore>);

/// What [`driver`] makes: the driver, the handover hook's other end, and with a queue
/// store, the queue and its hook's other end.
type Driven<S, H> = (PodDriver<S, H>, Takeovers, Option<Queue>);

/// The pod's [`PodDriver`], signing with `credentials`, and the other ends of the push
/// layer's hooks.
fn driver<S: CoordStore, H: ServingHook>(
    config: &PodConfig,
    store: &Arc<S>,
    hook: H,
    queue: Option<Stores>,
    credentials: &Credentials,
    metrics: &Arc<Metrics>,
) -> Result<Driven<S, H>, PodError> {
    let (taken_over, takeovers) = handover::channel();
    let (queue_hook, events) = queue::hook(queue.is_some());
    let driver = Driver::new(
        config.driver(),
        credentials.clone(),
        store.clone(),
        (hook, (taken_over, queue_hook)),
        metrics.clone(),
    )?;
    Ok((driver, takeovers, queue.map(|q| (q, events))))
}

/// The listener's certificate (`None`: plain HTTP) and the peer client's TLS config, read
/// from the files `config` names.
fn tls_parts(config: &PodConfig) -> Result<(Option<ServerCert>, PeerTls), PodError> {
    let server_cert = match &config.tls {
        Some(files) => Some(ServerCert::new(files.load()?)),
        None => None,
    };
    Ok((server_cert, PeerTls::new(&config.peers)?))
}

/// What a pod has besides its driver and store: its credentials (replaced on reload),
/// the connection layer's view for pushes and its counts, the metrics, the dialer (to reload its TLS config), and the TLS of the listener and
/// of the peer client (both reloadable).
struct Parts {
    credentials: Credentials,
    /// The other end of the serving hook that moves kept push answers with their shards.
    takeovers: Takeovers,
    /// Where pushes with a TTL are kept, and the other end of the drains' hook.
    queue: Option<Queue>,
    /// The directory API's writes, with a terminal directory.
    directory: Option<Arc<dyn DirectoryEdits>>,
    sessions: Arc<dyn Sessions>,
    stats: Arc<dyn SessionStats>,
    handovers: Arc<dyn Handovers>,
    metrics: Arc<Metrics>,
    dialer: Option<Dialer>,
    server_cert: Option<ServerCert>,
    peer_tls: PeerTls,
}

/// Spawns the pod task around a built driver and returns its handle.
fn spawn_pod<S: CoordStore, H: ServingHook>(
    config: &PodConfig,
    driver: Driver<S, H>,
    store: Arc<S>,
    listener: TcpListener,
    parts: Parts,
) -> Result<PodHandle, PodError> {
    let Parts {
        credentials,
        takeovers,
        queue,
        directory,
        sessions,
        stats,
        handovers,
        metrics,
        dialer,
        server_cert,
        peer_tls,
    } = parts;
    let server_tls = server_cert
        .as_ref()
        .map(ServerCert::server_config)
        .transpose()?;
    let driver = driver.with_peer_tls(peer_tls.clone());
    let status = driver.status();
    let serving = driver.serving_table();
    // Pushes are forwarded on a client (and connection pool) of their own, apart from
    // the peer calls of the HTTP layer.
    let peer_client = || {
        PeerClient::new(
            config.pod_id.clone(),
            credentials.clone(),
            PEER_CONNECT_TIMEOUT,
        )
        .using_tls(peer_tls.clone())
    };
    let telemetry = match &config.otlp_endpoint {
        None => Telemetry::off(),
        Some(endpoint) => Telemetry::otlp(endpoint, config.pod_id.as_str()).unwrap_or_else(|e| {
            tracing::error!(error = %e, "not exporting spans");
            Telemetry::off()
        }),
    };
    let push = PushService::new(
        serving.clone(),
        status.clone(),
        sessions.clone(),
        peer_client(),
        config.push.clone(),
        metrics.clone(),
    )
    .with_takeovers(&takeovers)
    .with_telemetry(telemetry);
    let push = match queue {
        Some(((store, broadcasts), events)) => push.with_queue(store, broadcasts, events),
        None => push,
    };
    let push = Arc::new(push);
    // Ends when the driver (holding the hook) does.
    tokio::spawn(push.clone().run_takeovers(takeovers));
    let metrics_handle = metrics.clone();
    let failures = &http::PUSH_FAILURES;
    let sampler = sampler::run(metrics.clone(), status.clone(), stats.clone(), failures);
    let peers = peer_client();
    let http_state = HttpState {
        status: status.clone(),
        credentials: credentials.clone(),
        push,
        stats,
        handovers,
        metrics,
        peers,
        ready: ReadyLatch::default(),
        push_lines: Default::default(),
        peer: PeerReceiver::default(),
        directory,
    };
    let meta = ClusterMeta::current(config.core.shards);
    let (stop, stopped) = oneshot::channel();
    let span = tracing::info_span!("pod", pod = %config.pod_id);
    let task = tokio::spawn(
        run_pod(
            driver,
            store,
            meta,
            config.store_timeout,
            (listener, server_tls, config.connections),
            http_state,
            stopped,
            sampler,
        )
        .instrument(span),
    );
    let reloader = Reloader::new(
        credentials,
        dialer,
        server_cert,
        peer_tls,
        metrics_handle.clone(),
    );
    Ok(PodHandle {
        status,
        serving,
        metrics: metrics_handle,
        reloader,
        stop: Some(stop),
        task: Some(task),
    })
}

/// The pod task. Every part runs inside this one future (no further spawns, except the
/// connection manager's, which end when the driver owning it is dropped), so aborting the
/// task stops all of them.
// Each argument is a separate part of the pod that this one task owns.
#[allow(clippy::too_many_arguments)]
async fn run_pod<S: CoordStore, H: ServingHook>(
    driver: Driver<S, H>,
    store: Arc<S>,
    meta: ClusterMeta,
    store_timeout: Duration,
    (listener, tls, limits): (
        TcpListener,
        Option<Arc<rustls::ServerConfig>>,
        http::ConnectionLimits,
    ),
    http_state: HttpState,
    mut stopped: oneshot::Receiver<()>,
    sampler: impl Future<Output = ()>,
) -> Result<(), PodError> {
    let (stop_http, http_stopped) = oneshot::channel::<()>();
    let push = http_state.push.clone();
    let handovers = http_state.handovers.clone();
    let metrics = http_state.metrics.clone();
    let routes = http::Routes::new(http_state);
    let http_stopped = async move {
        let _ = http_stopped.await;
    };
    let http =
        async move { http::serve(listener, tls, routes, limits, metrics, http_stopped).await };
    let ownership = async move {
        tokio::select! {
            pinned = pin_meta(&*store, &meta, store_timeout) => pinned.map_err(PodError::Meta)?,
            // Asked to stop before the store was ever reached: nothing to give back.
            _ = &mut stopped => return Ok::<_, PodError>(()),
        }
        // A dropped handle aborts this task, so a closed channel needs no separate case.
        driver
            .run(async move {
                let _ = stopped.await;
            })
            .await;
        Ok(())
    };
    let mut http = std::pin::pin!(http);
    let mut ownership = std::pin::pin!(ownership);
    // The sampler ends only when the driver is gone; then nothing is left to sample.
    let sampler = async {
        sampler.await;
        std::future::pending::<()>().await
    };
    tokio::select! {
        () = sampler => unreachable!("the sampler future never completes"),
        owned = &mut ownership => {
            if owned.is_ok() {
                // The new owners of the shards just released ask for their kept push
                // answers (`push::handover`) and for each terminal of the shards that
                // drain (`pos::handover`): keep answering peers until they have, the
                // drains bounded by the drain budget (the manager closes the rest then).
                let kept = if push.kept_nothing() { Duration::ZERO } else { HANDOVER_LINGER };
                let linger = async {
                    tokio::join!(tokio::time::sleep(kept), handovers.drained());
                };
                // Only a safety net: each drain ends by its budget.
                let bounded = tokio::time::timeout(MAX_DRAIN_BUDGET + HTTP_DRAIN, linger);
                tokio::select! {
                    _ = bounded => {}
                    served = &mut http => {
                        return Err(PodError::Http(served.err().unwrap_or_else(|| {
                            io::Error::other("HTTP server stopped unexpectedly")
                        })));
                    }
                }
            }
            let _ = stop_http.send(());
            let served = tokio::time::timeout(HTTP_DRAIN, http).await.unwrap_or_else(|_| {
                warn!("HTTP requests still running after the drain period; dropping them");
                Ok(())
            });
            push.telemetry().flush().await;
            owned?;
            served.map_err(PodError::Http)
        }
        // The HTTP server only ends when asked to; if it ends anyway the pod is
        // unreachable for probes and peers, so it stops. Its leases expire by TTL.
        served = &mut http => Err(PodError::Http(served.err().unwrap_or_else(|| {
            io::Error::other("HTTP server stopped unexpectedly")
        }))),
    }
}

/// Pins the cluster metadata. While the store is unreachable it retries with capped
/// backoff, because a pod may start before Redis does; a mismatch is final.
async fn pin_meta<S: CoordStore>(
    store: &S,
    meta: &ClusterMeta,
    timeout: Duration,
) -> Result<(), StoreError> {
    let mut wait = PIN_RETRY_MIN;
    let mut attempt = 1u32;
    loop {
        let pinned = tokio::time::timeout(timeout, store.pin_meta(meta))
            .await
            .unwrap_or(Err(StoreError::Timeout(timeout)));
        match pinned {
            Ok(()) => {
                info!(attempts = attempt, "cluster metadata pinned");
                return Ok(());
            }
            Err(mismatch @ StoreError::MetaMismatch { .. }) => return Err(mismatch),
            Err(error) => {
                let retry_in_ms = wait.as_millis() as u64;
                warn!(attempt, %error, retry_in_ms, "cannot reach the store to pin cluster metadata");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(PIN_RETRY_MAX);
                attempt += 1;
            }
        }
    }
}
