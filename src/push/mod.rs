//! The push service: any pod accepts a push, the shard's owner delivers it.
//!
//! [`PushService::push`] (in `route`) finds the owner from this pod's latest status and
//! delivers here ([`PushService::deliver_here`], in `owner`) or forwards one hop to the
//! owner (`forward`), retrying only what provably reached no terminal, until the
//! caller's deadline. A push with a TTL (`later`) is stored first and delivered by the
//! owner's drain (`queue`), in order per terminal, after its hello. A batch (`batch`)
//! goes to each owner in one request. Answers (`answer`) are JSON with the documented codes; the owner's
//! idempotency cache (`idempotency`) turns retries into replays, and its answers for a
//! shard move with the shard (`handover`); `auth` maps bearer tokens to tenants.
//!
//! Not for: HTTP parsing and validation (`crate::http::push`), or sessions themselves
//! (`crate::pos`).

pub mod answer;
pub mod batch;
pub mod broadcast;
mod forward;
pub mod handover;
pub mod idempotency;
pub mod later;
mod owner;
pub mod queue;
mod route;
pub mod slots;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::watch;

use self::idempotency::IdempotencyCache;
use crate::core::lease::StaleEpoch;
use crate::core::{PodId, ShardId};
use crate::credentials::Tenant;
use crate::metrics::Metrics;
use crate::peer::PeerClient;
use crate::pos::manager::{ConnectionManager, DrainingSession, Lookup, TerminalLink};
use crate::serving::ServingTable;
use crate::status::PodStatus;
use crate::store::directory::Directory;
use crate::telemetry::Telemetry;
pub use crate::trace_context::Trace;

pub use self::forward::Forwarded;
pub use self::owner::Owned;
pub use self::route::TerminalView;

/// Default caller deadline (`?timeout_ms=`), and the largest one accepted.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5_000);
pub const MAX_TIMEOUT: Duration = Duration::from_millis(30_000);

/// Limits and settings of the push API (`posgate serve` flags).
#[derive(Clone, Debug)]
pub struct PushConfig {
    /// `--max-push-bytes`: largest push body.
    pub max_push_bytes: usize,
    /// `--max-batch-bytes`: largest batch request body (`POST /v1/pushes`).
    pub max_batch_bytes: usize,
    /// `--max-inflight`: pushes this pod handles at once (received or forwarded to it).
    pub max_inflight: usize,
    /// `--max-inflight-per-tenant`: of those, at most this many of one tenant.
    pub max_inflight_per_tenant: usize,
    /// `--max-waiting-per-terminal`: pushes waiting for one terminal's session.
    pub max_waiting_per_terminal: usize,
    /// `--pos-push-path`: where terminals take pushes.
    pub push_path: String,
    /// `--idempotency-ttl` and `--idempotency-capacity`.
    pub idempotency_ttl: Duration,
    pub idempotency_capacity: usize,
    /// `--body-read-timeout`: how long a request body (a push, a peer request) may take
    /// to arrive whole; `408` after.
    pub body_read_timeout: Duration,
    /// The `--queue-*` flags: pushes with a TTL.
    pub queue: queue::QueueConfig,
    /// The `--broadcast-*` flags.
    pub broadcast: broadcast::BroadcastConfig,
}

impl Default for PushConfig {
    fn default() -> Self {
        PushConfig {
            max_push_bytes: 64 * 1024,
            max_batch_bytes: 4 << 20,
            max_inflight: 10_000,
            max_inflight_per_tenant: 5_000,
            max_waiting_per_terminal: 64,
            push_path: crate::pos::wire::DEFAULT_PUSH_PATH.to_string(),
            idempotency_ttl: Duration::from_secs(600),
            idempotency_capacity: 100_000,
            body_read_timeout: Duration::from_secs(10),
            queue: queue::QueueConfig::default(),
            broadcast: broadcast::BroadcastConfig::default(),
        }
    }
}

/// One validated push.
#[derive(Clone, Debug)]
pub struct PushRequest {
    pub tenant: Tenant,
    pub terminal: String,
    pub key: String,
    pub content_type: Option<HeaderValue>,
    pub body: Bytes,
    /// When this pod received it (for `latency_ms`).
    pub received: Instant,
    /// A TTL: the push waits for its terminal (`later`).
    pub later: Option<later::Later>,
    pub trace: Trace,
}

/// Where pushes find terminal sessions: the connection manager, or nothing.
pub trait Sessions: Send + Sync + 'static {
    fn lookup(&self, shard: ShardId, terminal: &str) -> Lookup;
    /// Every terminal link of `shard`; `None` while it is not served here or its
    /// terminals are not read yet.
    fn links(&self, shard: ShardId) -> Option<Vec<TerminalLink>>;
    /// A terminal refused an epoch on a push as stale (see
    /// `Reconciler::handle_stale_epoch`).
    fn report_stale(&self, refused: StaleEpoch);
    /// `terminal`'s session in `shard` while the shard drains here and its new owner
    /// has not asked for the terminal: where a push it relays goes.
    fn draining(&self, shard: ShardId, terminal: &str) -> Option<DrainingSession>;
}

impl<D: Directory> Sessions for ConnectionManager<D> {
    fn lookup(&self, shard: ShardId, terminal: &str) -> Lookup {
        ConnectionManager::lookup(self, shard, terminal)
    }

    fn links(&self, shard: ShardId) -> Option<Vec<TerminalLink>> {
        ConnectionManager::links(self, shard)
    }

    fn report_stale(&self, refused: StaleEpoch) {
        ConnectionManager::report_stale(self, refused)
    }

    fn draining(&self, shard: ShardId, terminal: &str) -> Option<DrainingSession> {
        self.draining_session(shard, terminal)
    }
}

/// A pod without a connection layer (coordination-only tests): no terminal exists.
#[derive(Debug, Default)]
pub struct NoTerminals;

impl Sessions for NoTerminals {
    fn lookup(&self, _shard: ShardId, _terminal: &str) -> Lookup {
        Lookup::Unknown
    }

    fn links(&self, _shard: ShardId) -> Option<Vec<TerminalLink>> {
        None
    }

    fn report_stale(&self, _refused: StaleEpoch) {}

    fn draining(&self, _shard: ShardId, _terminal: &str) -> Option<DrainingSession> {
        None
    }
}

/// See the module docs. Cheap to share behind an `Arc`.
pub struct PushService {
    pod: PodId,
    shards: u32,
    serving: ServingTable,
    status: watch::Receiver<PodStatus>,
    sessions: Arc<dyn Sessions>,
    cache: IdempotencyCache,
    /// Shards whose kept answers are being taken over (see `handover`).
    fetching: watch::Receiver<handover::Fetching>,
    forward: forward::ForwardClient,
    settings: PushConfig,
    inflight: slots::Slots,
    /// The drains of pushes with a TTL, when the pod has a queue store.
    drains: Option<Arc<queue::Drains>>,
    /// Broadcasts, kept in the same store.
    broadcasts: Option<Arc<broadcast::Broadcasts>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for PushService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushService")
            .field("pod", &self.pod)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl PushService {
    /// The push service of the pod `peers` signs as (it forwards with them), over
    /// `serving`'s shards.
    pub fn new(
        serving: ServingTable,
        status: watch::Receiver<PodStatus>,
        sessions: Arc<dyn Sessions>,
        peers: PeerClient,
        settings: PushConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        PushService {
            pod: peers.me().clone(),
            shards: serving.shards(),
            forward: forward::ForwardClient::new(peers),
            serving,
            status,
            sessions,
            cache: IdempotencyCache::new(settings.idempotency_ttl, settings.idempotency_capacity),
            fetching: watch::channel(handover::Fetching::new()).1,
            inflight: slots::Slots::new(settings.max_inflight, settings.max_inflight_per_tenant),
            drains: None,
            broadcasts: None,
            settings,
            metrics,
        }
    }

    /// Records the spans of pushes (`crate::telemetry`).
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.forward.telemetry = telemetry;
        self
    }

    /// Where the spans of pushes go (off unless [`PushService::with_telemetry`]).
    pub fn telemetry(&self) -> &Telemetry {
        &self.forward.telemetry
    }

    /// Keeps pushes with a TTL in `store` and drains them on the shards this pod
    /// serves, as `events` (the other end of its [`queue::QueueHook`]) says.
    pub fn with_queue(
        mut self,
        store: Arc<dyn crate::store::queue::QueueStore>,
        broadcasts: Arc<dyn crate::store::broadcast::BroadcastStore>,
        events: queue::QueueEvents,
    ) -> Self {
        let drains = Arc::new(queue::Drains::new(
            self.pod.clone(),
            store,
            self.serving.clone(),
            self.sessions.clone(),
            self.settings.queue.clone(),
            self.settings.idempotency_ttl,
            self.settings.push_path.clone(),
            self.metrics.clone(),
        ));
        self.metrics
            .queue_max_bytes
            .set(self.settings.queue.limits.cluster_bytes as i64);
        let broadcasts = Arc::new(broadcast::Broadcasts::new(
            self.pod.clone(),
            broadcasts,
            self.serving.clone(),
            self.sessions.clone(),
            self.status.clone(),
            self.settings.broadcast.clone(),
            *drains.rules(),
            &self.settings.queue,
            self.settings.push_path.clone(),
            self.metrics.clone(),
        ));
        tokio::spawn(drains.clone().run(events));
        tokio::spawn(broadcasts.clone().run());
        self.drains = Some(drains);
        self.broadcasts = Some(broadcasts);
        self
    }

    /// Broadcasts, if this pod keeps pushes for later (the same store).
    pub fn broadcasts(&self) -> Option<&Arc<broadcast::Broadcasts>> {
        self.broadcasts.as_ref()
    }

    /// The drains of pushes with a TTL, if this pod keeps them.
    pub fn drains(&self) -> Option<&Arc<queue::Drains>> {
        self.drains.as_ref()
    }

    /// How many shards the cluster has.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    pub fn settings(&self) -> &PushConfig {
        &self.settings
    }

    /// A slot of `--max-inflight` for a push of `tenant` (`slots`), or which bound the
    /// push is past.
    pub fn admit(&self, tenant: &Tenant) -> Result<slots::Slot, slots::Full> {
        self.inflight.admit(&tenant.0)
    }
}
