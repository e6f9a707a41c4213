//! The driver: the one task that owns a pod's [`Reconciler`] and performs its actions.
//!
//! The reconciler decides and the driver does: it feeds the reconciler time
//! (`tokio::time::Instant`, so tests can pause the clock), store answers, change
//! notifications and the stale epochs the connection layer reports, runs the store
//! calls and peer probes it asks for concurrently (each bounded by the store timeout),
//! mirrors the serving state into the [`ServingTable`] and the [`ServingHook`],
//! publishes [`PodStatus`] and logs what changed.
//!
//! Not for: policy (who owns what and when to give up is `crate::core`), HTTP, or the
//! start-up checks of a pod (`crate::pod`).

mod ops;
mod report;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use self::ops::{Done, Op, OpContext, StoreHealth};
use self::report::{name, Situation};
use crate::clock::now;
use crate::core::config::{CoreConfig, InvalidTimings};
use crate::core::lease::{ReleaseNote, StaleEpoch};
use crate::core::membership::{Member, HANDOVER_DRAIN};
use crate::core::reconciler::{Action, Reconciler, ShardState, Stop};
use crate::core::ring::RING_VERSION;
use crate::core::{PodId, ShardId};
use crate::credentials::Credentials;
use crate::metrics::Metrics;
use crate::peer::{PeerClient, PEER_PROTOCOL};
use crate::serving::{ServingHook, ServingTable, Slot};
use crate::status::PodStatus;
use crate::store::{ClusterMeta, CoordStore};

/// Peers get this long at most to say whether they reach the store: the answer is only
/// useful before the next renewal.
const MAX_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the driver needs to know about its pod.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub pod: PodId,
    /// How peers reach this pod (written into its member record).
    pub advertise_url: String,
    pub core: CoreConfig,
    /// Bound of every store call.
    pub store_timeout: Duration,
}

/// One pod's reconciler and everything needed to carry out its actions.
pub struct Driver<S, H = ()> {
    rec: Reconciler,
    cx: Arc<OpContext<S>>,
    peers: PeerClient,
    hook: H,
    ops: FuturesUnordered<Op>,
    health: StoreHealth,
    /// What the table holds, as of the last step.
    slots: Vec<Slot>,
    table: ServingTable,
    status: watch::Sender<PodStatus>,
    situation: Situation,
    /// Shards and epochs a terminal refused as stale; `None` when not given or closed.
    stale_epochs: Option<mpsc::UnboundedReceiver<StaleEpoch>>,
}

impl<S: CoordStore, H: ServingHook> Driver<S, H> {
    /// A driver for the pod `config` describes, not yet running, signing its peer
    /// probes with the current secret of `credentials` and counting its store calls,
    /// lease outcomes and shard stops in `metrics`. Fails when `config.core` is not a
    /// valid configuration.
    pub fn new(
        config: DriverConfig,
        credentials: Credentials,
        store: Arc<S>,
        hook: H,
        metrics: Arc<Metrics>,
    ) -> Result<Self, InvalidTimings> {
        config.core.validate()?;
        let core = config.core;
        let rec = Reconciler::new(core.clone(), config.pod.clone(), now());
        let member = Member {
            pod: config.pod.clone(),
            url: config.advertise_url,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ring_version: RING_VERSION.to_string(),
            // Informational only; a clock before 1970 is reported as 0.
            started_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            peer_protocol: PEER_PROTOCOL,
            handover: hook.handover(),
            queue: hook.queue(),
            batch: crate::core::membership::BATCH_PEER_ROUTE,
            // The push layer walks broadcasts with the store it keeps pushes for later in.
            broadcast: if hook.queue() > 0 {
                crate::core::membership::BROADCAST_WALK
            } else {
                0
            },
            moves: crate::core::membership::MOVE_BUDGET,
            pod_lease: crate::core::membership::POD_LEASE,
        };
        // A pod that drains names itself in every release, for the next holder to ask
        // (`ReleaseNote`); one that closes whole shards leaves nothing to ask about.
        let release_note = (member.handover >= HANDOVER_DRAIN).then(|| ReleaseNote {
            member: member.clone(),
            ttl: hook.drain_budget(),
        });
        let probe_timeout = core.renew_interval.min(MAX_PROBE_TIMEOUT);
        let (status, _) = watch::channel(report::pod_status(&rec, now()));
        Ok(Driver {
            peers: PeerClient::new(config.pod, credentials, probe_timeout),
            cx: Arc::new(OpContext {
                store,
                member,
                release_note,
                meta: ClusterMeta::current(core.shards),
                store_timeout: config.store_timeout,
                core: core.clone(),
                metrics,
            }),
            hook,
            ops: FuturesUnordered::new(),
            health: StoreHealth::default(),
            slots: vec![Slot::Idle; core.shards as usize],
            table: ServingTable::new(core.shards),
            status,
            situation: Situation::new(&rec),
            stale_epochs: None,
            rec,
        })
    }

    /// Reaches `https://` peers with `tls` (the pod's reloadable peer CA).
    pub fn with_peer_tls(mut self, tls: crate::peer::PeerTls) -> Self {
        self.peers = self.peers.using_tls(tls);
        self
    }

    /// Feeds the driver the epochs terminals refused as stale (a hello with a higher
    /// epoch came first): the reconciler has the store bump such a shard's lease above
    /// the terminal's epoch, or stops serving it, if it still holds that epoch. The sending half goes to the connection layer, which is built before
    /// the driver because the driver owns it as its hook.
    pub fn with_stale_epochs(mut self, stale: mpsc::UnboundedReceiver<StaleEpoch>) -> Self {
        self.stale_epochs = Some(stale);
        self
    }

    /// The table of shards this pod serves, kept current while the driver runs.
    pub fn serving_table(&self) -> ServingTable {
        self.table.clone()
    }

    /// The pod's status, republished whenever it changes.
    pub fn status(&self) -> watch::Receiver<PodStatus> {
        self.status.subscribe()
    }

    /// Runs the pod's ownership until `shutdown` resolves and the graceful shutdown that
    /// follows (stop serving, release, deregister; bounded by the shutdown budget) is
    /// done. Store failures never end it: the reconciler rides them out.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = pin!(shutdown);
        let mut shutting_down = false;
        let mut changes = self.cx.store.changes();
        changes.borrow_and_update();
        let mut changes_open = true;
        self.rec.handle_timeout(now());
        loop {
            self.step();
            if self.rec.is_finished() {
                info!("shutdown complete");
                return;
            }
            let wake = self.rec.poll_timeout();
            tokio::select! {
                Some(done) = self.ops.next(), if !self.ops.is_empty() => self.complete(done),
                changed = changes.changed(), if changes_open => match changed {
                    Ok(()) => self.rec.handle_change_notification(now()),
                    // The store dropped its notifier; polling alone still converges.
                    Err(_) => changes_open = false,
                },
                () = sleep_until(wake) => self.rec.handle_timeout(now()),
                stale = next_stale(&mut self.stale_epochs) => match stale {
                    Some(refused) => {
                        debug!(shard = refused.shard, epoch = refused.epoch, highest = ?refused.highest, "a terminal refused our epoch as stale");
                        self.rec.handle_stale_epoch(now(), refused);
                    }
                    // Every sender is gone: nothing can be reported any more.
                    None => self.stale_epochs = None,
                },
                () = &mut shutdown, if !shutting_down => {
                    shutting_down = true;
                    info!("shutting down: stopping service, releasing shards, deregistering");
                    self.rec.begin_shutdown(now());
                }
            }
        }
    }

    /// After every input: mirror the shard states, carry out the actions, report.
    fn step(&mut self) {
        let now = now();
        let slots: Vec<Slot> = (0..self.rec.config().shards)
            .map(|s| slot_of(&self.rec, s))
            .collect();
        // The table changes before the hook hears of it, so a connection layer told to
        // start or stop already sees the new state.
        if slots != self.slots {
            self.table.set(&slots);
        }
        let mut suspended = Vec::new();
        while let Some(action) = self.rec.poll_action() {
            self.perform(action, &mut suspended);
        }
        if !suspended.is_empty() {
            warn!(
                shards = ?suspended,
                "held shards stop delivering: the store outage is no longer judged \
                 cluster-wide (connections kept until the verdict is known)"
            );
        }
        self.slots = slots;
        let rollbacks = self.situation.update(&self.rec);
        self.cx.metrics.store_rollbacks.inc_by(rollbacks);
        for (result, n) in self.situation.new_moves(&self.rec) {
            if n > 0 {
                self.cx
                    .metrics
                    .planned_moves
                    .get_or_create(&[("result", result)])
                    .inc_by(n);
            }
        }
        let status = report::pod_status(&self.rec, now);
        self.status.send_if_modified(|current| {
            let changed = *current != status;
            if changed {
                *current = status;
            }
            changed
        });
    }

    fn perform(&mut self, action: Action, suspended: &mut Vec<ShardId>) {
        debug!(?action, "action");
        let op = match action {
            Action::Poll => self.cx.poll(),
            Action::Heartbeat { generation } => self.cx.heartbeat(generation),
            Action::Acquire { generation, claims } => self.cx.acquire(generation, claims),
            Action::Renew { generation, shards } => self.cx.renew(generation, shards),
            Action::Release { releases } => self.cx.release(releases),
            Action::Deregister => self.cx.deregister(),
            Action::Place {
                expected,
                placement,
            } => self.cx.place(expected, placement),
            Action::ProbePeers { peers } => ops::probe_peers(self.peers.clone(), peers),
            Action::StartServing { shard, epoch } => {
                let me = self.rec.pod();
                // Where it comes from: the last other pod seen holding it (by now its
                // lease is usually released, so the current view shows no holder).
                let from = self.rec.last_holder(shard);
                match self.slots[shard as usize] {
                    Slot::Parked { epoch: held } if held == epoch => {
                        info!(shard, epoch, "shard serving resumed")
                    }
                    Slot::Idle => {
                        info!(
                            shard, epoch, from = %name(from.map(|m| &m.pod)), to = %me,
                            reason = %"acquired", "shard ownership changed"
                        );
                        if let Some(from) = from {
                            self.hook.taken_over(shard, epoch, from);
                        }
                    }
                    Slot::Serving { .. } | Slot::Held { .. } | Slot::Parked { .. } => info!(
                        shard, epoch, from = %me, to = %me, reason = %"reclaimed",
                        "shard ownership changed"
                    ),
                }
                self.hook.start(shard, epoch);
                return;
            }
            Action::SuspendServing { shard, epoch } => {
                suspended.push(shard);
                self.hook.suspend(shard, epoch);
                return;
            }
            Action::StopServing(stop) => {
                let Stop {
                    shard,
                    epoch,
                    reason,
                    ..
                } = stop;
                let me = self.rec.pod();
                // Who takes over, as far as we know: the lease holder when it is someone
                // else (stolen), otherwise the ring's choice (rebalance).
                let holder = self.rec.lease(shard).map(|l| &l.owner);
                let to = holder.filter(|&p| p != me).or(self
                    .rec
                    .assignment()
                    .owner(shard)
                    .filter(|&p| p != me));
                info!(
                    shard, epoch, from = %me, to = %name(to), reason = %reason.as_str(),
                    "shard ownership changed"
                );
                self.cx
                    .metrics
                    .shard_stops
                    .get_or_create(&[("reason", reason.as_str())])
                    .inc();
                let closed = self.hook.stop(stop);
                async move {
                    closed.await;
                    Done::Stopped(shard)
                }
                .boxed()
            }
        };
        self.ops.push(op);
    }

    fn complete(&mut self, done: Done) {
        let now = now();
        self.cx.metrics.lease_outcomes(&done);
        let (rec, health) = (&mut self.rec, &mut self.health);
        match done {
            Done::Snapshot(r) => rec.handle_snapshot(now, health.check(now, "snapshot", r)),
            Done::Heartbeat(r) => rec.handle_heartbeat(now, health.check(now, "heartbeat", r)),
            Done::Acquire(shards, r) => {
                rec.handle_acquire(now, &shards, health.check(now, "acquire", r))
            }
            Done::Renew(shards, r) => rec.handle_renew(now, &shards, health.check(now, "renew", r)),
            Done::Release(releases, r) => {
                let shards: Vec<ShardId> = releases.iter().map(|r| r.shard).collect();
                rec.handle_release(now, &shards, health.check(now, "release", r))
            }
            Done::Deregister(r) => rec.handle_deregister(now, health.check(now, "deregister", r)),
            Done::Place(placement, r) => {
                let r = health.check(now, "place", r);
                if r == Ok(true) {
                    let moved = placement.assignment.moved_from(rec.assignment());
                    info!(
                        version = placement.version,
                        pods = placement.assignment.pods().len(),
                        moved,
                        "placement written"
                    );
                }
                rec.handle_place(now, placement, r)
            }
            Done::Peers(report) => {
                debug!(
                    answered = report.answered,
                    reaching = report.reaching,
                    "peers probed"
                );
                self.cx
                    .metrics
                    .peers_reaching_store
                    .set(report.reaching as i64);
                rec.handle_peer_report(now, report);
            }
            Done::Stopped(shard) => rec.handle_serving_stopped(now, shard),
        }
    }
}

/// The next stale epoch reported, `None` once every sender is gone; never resolves
/// without a receiver.
async fn next_stale(stale: &mut Option<mpsc::UnboundedReceiver<StaleEpoch>>) -> Option<StaleEpoch> {
    match stale {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or forever when the reconciler has nothing scheduled.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// What the serving table records for `shard`: the epoch and the instant delivery must
/// stop by (a lease deadline, or for a shard held past it the lapse of the cluster-wide
/// verdict), a held shard not delivering, or nothing.
fn slot_of(rec: &Reconciler, shard: ShardId) -> Slot {
    match (rec.shard_state(shard), rec.serve_until(shard)) {
        (Some(ShardState::Suspended { .. }), Some((epoch, until))) => Slot::Held { epoch, until },
        (Some(ShardState::Suspended { epoch }), None) => Slot::Parked { epoch },
        (_, Some((epoch, deadline))) => Slot::Serving { epoch, deadline },
        (_, None) => Slot::Idle,
    }
}
