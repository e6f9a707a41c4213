//! The driver's IO: store calls and peer probes as owned futures, and the bookkeeping
//! that turns their failures into the core's `OpFailed` without flooding the log.
//!
//! Every future owns what it needs (an `Arc` of [`OpContext`], cloned arguments), so any
//! number can run at once in the driver's `FuturesUnordered` and be dropped at any time.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{join_all, BoxFuture};
use futures::FutureExt;
use tracing::{debug, info, warn};

use crate::core::lease::{AcquireOutcome, Checked, RenewOutcome};
use crate::core::membership::{Member, Snapshot};
use crate::core::placement::Placement;
use crate::core::reconciler::{OpFailed, OpResult, PeerReport};
use crate::core::{CoreConfig, ShardId};
use crate::metrics::Metrics;
use crate::peer::{PeerClient, PeerTarget};
use crate::store::{ClusterMeta, CoordStore, StoreError};

/// A failed store call is logged at most this often (the first one always).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A finished operation, to be fed to the matching `Reconciler::handle_*`.
pub(super) enum Done {
    Snapshot(Result<Snapshot, StoreError>),
    Heartbeat(Result<Checked<()>, StoreError>),
    Acquire(
        Vec<ShardId>,
        Result<Checked<Vec<AcquireOutcome>>, StoreError>,
    ),
    Renew(Vec<ShardId>, Result<Checked<Vec<RenewOutcome>>, StoreError>),
    Release(Vec<ShardId>, Result<Vec<bool>, StoreError>),
    Deregister(Result<(), StoreError>),
    Place(Placement, Result<bool, StoreError>),
    Peers(PeerReport),
    /// The connection layer closed the shard's connections.
    Stopped(ShardId),
}

pub(super) type Op = BoxFuture<'static, Done>;

/// What every store call needs, shared by all in-flight calls.
pub(super) struct OpContext<S> {
    pub store: Arc<S>,
    pub member: Member,
    pub meta: ClusterMeta,
    pub core: CoreConfig,
    /// Our own bound on every store call, on top of the store's: a call that hangs would
    /// otherwise keep its timer in flight and stall renewals.
    pub store_timeout: Duration,
    pub metrics: Arc<Metrics>,
}

impl<S: CoordStore> OpContext<S> {
    pub fn poll(self: &Arc<Self>) -> Op {
        let cx = self.clone();
        async move {
            Done::Snapshot(
                cx.bounded("snapshot", cx.store.snapshot(cx.core.shards))
                    .await,
            )
        }
        .boxed()
    }

    pub fn heartbeat(self: &Arc<Self>, generation: String) -> Op {
        let cx = self.clone();
        async move {
            let call = cx
                .store
                .heartbeat(&generation, &cx.member, &cx.meta, cx.core.member_ttl);
            Done::Heartbeat(cx.bounded("heartbeat", call).await)
        }
        .boxed()
    }

    pub fn acquire(self: &Arc<Self>, generation: String, shards: Vec<ShardId>) -> Op {
        let cx = self.clone();
        async move {
            let call = cx
                .store
                .acquire(&generation, &cx.member.pod, &shards, cx.core.lease_ttl);
            let result = cx.bounded("acquire", call).await;
            Done::Acquire(shards, result)
        }
        .boxed()
    }

    pub fn renew(self: &Arc<Self>, generation: String, shards: Vec<ShardId>) -> Op {
        let cx = self.clone();
        async move {
            let call = cx
                .store
                .renew(&generation, &cx.member.pod, &shards, cx.core.lease_ttl);
            let result = cx.bounded("renew", call).await;
            Done::Renew(shards, result)
        }
        .boxed()
    }

    pub fn release(self: &Arc<Self>, shards: Vec<ShardId>) -> Op {
        let cx = self.clone();
        async move {
            let result = cx
                .bounded("release", cx.store.release(&cx.member.pod, &shards))
                .await;
            Done::Release(shards, result)
        }
        .boxed()
    }

    pub fn place(self: &Arc<Self>, expected: Option<u64>, placement: Placement) -> Op {
        let cx = self.clone();
        async move {
            let result = cx
                .bounded("place", cx.store.place(expected, &placement))
                .await;
            Done::Place(placement, result)
        }
        .boxed()
    }

    pub fn deregister(self: &Arc<Self>) -> Op {
        let cx = self.clone();
        async move {
            Done::Deregister(
                cx.bounded("deregister", cx.store.deregister(&cx.member.pod))
                    .await,
            )
        }
        .boxed()
    }

    /// Runs one store call under our timeout, timing it as `op` in the metrics.
    async fn bounded<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = tokio::time::timeout(self.store_timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.store_timeout)));
        self.metrics
            .store_call(op, started.elapsed(), result.is_ok());
        result
    }
}

/// Asks every peer at once whether it reaches the store. The client bounds each request
/// with its own timeout; an error or a timeout counts as "did not answer".
pub(super) fn probe_peers(client: PeerClient, peers: Vec<Member>) -> Op {
    async move {
        let targets: Vec<PeerTarget> = peers.iter().map(PeerTarget::from).collect();
        let answers = join_all(targets.iter().map(|t| client.store_reachable(t))).await;
        let mut report = PeerReport::default();
        for (peer, answer) in peers.iter().zip(answers) {
            match answer {
                Ok(answer) => {
                    report.answered += 1;
                    report.reaching += usize::from(answer.store_reachable);
                    debug!(peer = %peer.pod, reaches_store = answer.store_reachable, "peer answered");
                }
                Err(e) => debug!(peer = %peer.pod, error = %e, "peer did not answer"),
            }
        }
        Done::Peers(report)
    }
    .boxed()
}

/// Counts store failures and decides which ones are worth a log line: the first of an
/// outage, then one per [`WARN_EVERY`], then one when the store answers again.
#[derive(Debug, Default)]
pub(super) struct StoreHealth {
    failures: u64,
    since: Option<Instant>,
    last_warn: Option<Instant>,
}

impl StoreHealth {
    pub fn check<T>(
        &mut self,
        now: Instant,
        op: &'static str,
        result: Result<T, StoreError>,
    ) -> OpResult<T> {
        match result {
            Ok(value) => {
                if let Some(since) = self.since.take() {
                    let down_ms = now.saturating_duration_since(since).as_millis() as u64;
                    info!(
                        failures = self.failures,
                        down_ms, "store calls succeed again"
                    );
                    self.failures = 0;
                    self.last_warn = None;
                }
                Ok(value)
            }
            Err(error) => {
                self.failures += 1;
                self.since.get_or_insert(now);
                if self.last_warn.is_none_or(|t| now >= t + WARN_EVERY) {
                    self.last_warn = Some(now);
                    warn!(op, failures = self.failures, %error, "store call failed");
                } else {
                    debug!(op, failures = self.failures, %error, "store call failed");
                }
                Err(OpFailed)
            }
        }
    }
}

impl Metrics {
    /// Counts the per-shard outcomes of a finished lease call.
    pub(super) fn lease_outcomes(&self, done: &Done) {
        let count = |op, outcome| self.lease_outcome(op, outcome, 1);
        match done {
            Done::Acquire(_, Ok(Checked::Ok(outcomes))) => {
                for o in outcomes {
                    count(
                        "acquire",
                        match o {
                            AcquireOutcome::Acquired { .. } => "acquired",
                            AcquireOutcome::AlreadyMine { .. } => "already_mine",
                            AcquireOutcome::HeldBy { .. } => "held_by_other",
                        },
                    );
                }
            }
            Done::Renew(_, Ok(Checked::Ok(outcomes))) => {
                for o in outcomes {
                    count(
                        "renew",
                        match o {
                            RenewOutcome::Renewed => "renewed",
                            RenewOutcome::Missing => "missing",
                            RenewOutcome::HeldBy { .. } => "held_by_other",
                        },
                    );
                }
            }
            Done::Release(_, Ok(released)) => {
                for &r in released {
                    count("release", if r { "released" } else { "not_held" });
                }
            }
            Done::Acquire(shards, Ok(Checked::GenerationChanged(_)))
            | Done::Renew(shards, Ok(Checked::GenerationChanged(_))) => {
                let op = if matches!(done, Done::Acquire(..)) {
                    "acquire"
                } else {
                    "renew"
                };
                self.lease_outcome(op, "generation_changed", shards.len() as u64);
            }
            Done::Acquire(shards, Err(_)) => {
                self.lease_outcome("acquire", "error", shards.len() as u64)
            }
            Done::Renew(shards, Err(_)) => {
                self.lease_outcome("renew", "error", shards.len() as u64)
            }
            Done::Release(shards, Err(_)) => {
                self.lease_outcome("release", "error", shards.len() as u64)
            }
            _ => {}
        }
    }
}
