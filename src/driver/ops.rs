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

use crate::core::lease::{
    AcquireOutcome, Checked, Claim, LeaseCall, Release, ReleaseNote, Released, RenewOutcome,
};
use crate::core::membership::{Member, Snapshot};
use crate::core::placement::Placement;
use crate::core::reconciler::{OpFailed, OpResult, PeerReport};
use crate::core::{CoreConfig, ShardId};
use crate::metrics::Metrics;
use crate::peer::{PeerClient, PeerTarget};
use crate::store::{ClusterMeta, CoordStore, StoreError};

/// A failed store call is logged at most this often (the first one always).
pub(super) const WARN_EVERY: Duration = Duration::from_secs(10);

/// A finished operation, to be fed to the matching `Reconciler::handle_*`.
pub(super) enum Done {
    Snapshot(Result<Snapshot, StoreError>),
    Heartbeat(Result<Checked<u64>, StoreError>),
    Acquire(
        Vec<ShardId>,
        Result<Checked<Vec<AcquireOutcome>>, StoreError>,
    ),
    Renew(Vec<ShardId>, Result<Checked<Vec<RenewOutcome>>, StoreError>),
    Release(Vec<Release>, Result<Vec<Released>, StoreError>),
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
    /// Left with every release when this pod drains (see [`ReleaseNote`]).
    pub release_note: Option<ReleaseNote>,
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

    pub fn acquire(self: &Arc<Self>, generation: String, claims: Vec<Claim>) -> Op {
        let cx = self.clone();
        async move {
            let lease = cx.lease_call(&generation);
            let call = cx.store.acquire(&lease, &claims);
            let result = cx.bounded("acquire", call).await;
            Done::Acquire(claims.iter().map(|c| c.shard).collect(), result)
        }
        .boxed()
    }

    pub fn renew(self: &Arc<Self>, generation: String, shards: Vec<ShardId>) -> Op {
        let cx = self.clone();
        async move {
            let lease = cx.lease_call(&generation);
            let call = cx.store.renew(&lease, &shards);
            let result = cx.bounded("renew", call).await;
            Done::Renew(shards, result)
        }
        .boxed()
    }

    fn lease_call<'a>(&'a self, generation: &'a str) -> LeaseCall<'a> {
        LeaseCall {
            generation,
            pod: &self.member.pod,
            ttl: self.core.lease_ttl,
        }
    }

    pub fn release(self: &Arc<Self>, releases: Vec<Release>) -> Op {
        let cx = self.clone();
        async move {
            let result = cx
                .bounded(
                    "release",
                    cx.store.release(
                        &cx.member.pod,
                        &releases,
                        cx.release_note.as_ref(),
                        cx.core.lease_ttl,
                    ),
                )
                .await;
            Done::Release(releases, result)
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

/// What a failed store call says about the store. A change of it is logged at once,
/// whatever was logged last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Symptom {
    /// No answer in time, or no connection.
    Unreachable,
    /// Redis answers, with the error code of a condition that passes (`READONLY`, `OOM`,
    /// `LOADING`, ...): the call failed like an unreachable store's.
    Refusing(String),
    /// Writes applied, but fewer replicas acknowledged them than `--redis-wait-replicas`
    /// asks: they do not count.
    Unreplicated,
    /// Anything else: an unexpected reply, a metadata mismatch.
    Failing,
}

impl Symptom {
    fn of(error: &StoreError) -> Symptom {
        match error {
            StoreError::Timeout(_) | StoreError::Unavailable(_) => Symptom::Unreachable,
            StoreError::Refused { code, .. } => Symptom::Refusing(code.clone()),
            StoreError::NotReplicated { .. } => Symptom::Unreplicated,
            StoreError::Config(_) | StoreError::MetaMismatch { .. } | StoreError::Protocol(_) => {
                Symptom::Failing
            }
        }
    }
}

/// A log line [`StoreHealth`] asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// The first failure, or a failure with another symptom than the last line said.
    Changed(Symptom),
    /// The same symptom, [`WARN_EVERY`] after the last line.
    StillFailing,
    /// A call succeeded after `failures` failures since `since`, the last with `symptom`.
    Recovered {
        failures: u64,
        since: Instant,
        symptom: Symptom,
    },
}

/// Counts store failures and decides which ones are worth a log line: the first of an
/// outage and every change of its symptom (a network cut that becomes a `READONLY`
/// replica), one reminder per [`WARN_EVERY`] otherwise, and one line when the store
/// answers again.
#[derive(Debug, Default)]
pub(super) struct StoreHealth {
    /// Failures in a row, the first one's time and the symptom last logged.
    failing: Option<(u64, Instant, Symptom)>,
    last_warn: Option<Instant>,
}

impl StoreHealth {
    pub fn check<T>(
        &mut self,
        now: Instant,
        op: &'static str,
        result: Result<T, StoreError>,
    ) -> OpResult<T> {
        let line = self.note(now, result.as_ref().err());
        match result {
            Ok(value) => {
                if let Some(Line::Recovered {
                    failures,
                    since,
                    symptom,
                }) = line
                {
                    let down_ms = now.saturating_duration_since(since).as_millis() as u64;
                    match symptom {
                        Symptom::Refusing(code) => info!(
                            code = %code,
                            failures,
                            down_ms,
                            "redis serves again: store calls succeed"
                        ),
                        Symptom::Unreachable | Symptom::Unreplicated | Symptom::Failing => {
                            info!(failures, down_ms, "store calls succeed again")
                        }
                    }
                }
                Ok(value)
            }
            Err(error) => {
                let failures = self.failing.as_ref().map_or(0, |f| f.0);
                match line {
                    Some(Line::Changed(Symptom::Refusing(code))) => warn!(
                        op, code = %code, %error,
                        "redis answers {code}: treating the store as unreachable until it serves again"
                    ),
                    Some(Line::Changed(Symptom::Unreplicated)) => warn!(
                        op, %error,
                        "redis writes are not reaching enough replicas: treating the store as \
                         unreachable for them until they do"
                    ),
                    Some(Line::Changed(_) | Line::StillFailing) => {
                        warn!(op, failures, %error, "store call failed")
                    }
                    _ => debug!(op, failures, %error, "store call failed"),
                }
                Err(OpFailed)
            }
        }
    }

    /// Records a call's outcome (`error`, or success) at `now`: the line to log, if any.
    pub fn note(&mut self, now: Instant, error: Option<&StoreError>) -> Option<Line> {
        let Some(error) = error else {
            self.last_warn = None;
            return self
                .failing
                .take()
                .map(|(failures, since, symptom)| Line::Recovered {
                    failures,
                    since,
                    symptom,
                });
        };
        let symptom = Symptom::of(error);
        let (failures, _, logged) = self.failing.get_or_insert((0, now, Symptom::Failing));
        *failures += 1;
        let line = if *failures == 1 || *logged != symptom {
            *logged = symptom.clone();
            Line::Changed(symptom)
        } else if self.last_warn.is_none_or(|t| now >= t + WARN_EVERY) {
            Line::StillFailing
        } else {
            return None;
        };
        self.last_warn = Some(now);
        Some(line)
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
                            RenewOutcome::Missing { .. } => "missing",
                            RenewOutcome::HeldBy { .. } => "held_by_other",
                        },
                    );
                }
            }
            Done::Release(releases, Ok(outcomes)) => {
                for (r, outcome) in releases.iter().zip(outcomes) {
                    count(
                        "release",
                        match outcome {
                            Released::NotHeld => "not_held",
                            Released::Deleted => "released",
                            Released::HandedOver { .. } => "handed_over",
                        },
                    );
                    if let (Released::HandedOver { epoch }, Some(to)) = (outcome, &r.to) {
                        info!(shard = r.shard, to = %to, epoch, "lease handed over");
                    }
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
