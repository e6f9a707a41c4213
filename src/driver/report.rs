//! What the driver tells people: the [`PodStatus`] it publishes and the log lines for
//! changes of the pod's situation (registration, readiness, outage judgement, store
//! generation, applied assignment).
//!
//! Only changes are logged at INFO or above, never a steady state, so a healthy pod is
//! quiet and a log shows the story of an incident line by line.

use std::collections::BTreeSet;
use std::time::Instant;

use tracing::{info, warn};

use crate::core::reconciler::{MoveCounts, Outage, Reconciler, ShardState};
use crate::core::ring::Assignment;
use crate::core::{PodId, ShardId};
use crate::status::{PlacementStatus, PodStatus, ShardStatus, StoreStatus};

/// The status of the pod behind `rec` at `now`.
pub(super) fn pod_status(rec: &Reconciler, now: Instant) -> PodStatus {
    let shards = (0..rec.config().shards)
        .map(|shard| {
            let lease = rec.lease(shard);
            ShardStatus {
                shard,
                assigned: rec.assignment().owner(shard).cloned(),
                owner: lease.map(|l| l.owner.clone()),
                epoch: lease.map(|l| l.epoch),
                serving: rec.serving(shard, now).is_some(),
                suspended: matches!(rec.shard_state(shard), Some(ShardState::Suspended { .. })),
                next_owner: rec.waiting_for(shard).cloned(),
            }
        })
        .collect();
    PodStatus {
        pod: Some(rec.pod().clone()),
        registered: rec.registered(),
        ready: rec.ready(),
        store: store_status(rec),
        recovery_hold: rec.hold_until(now),
        members: rec.members().to_vec(),
        placement: rec
            .placement()
            .zip(rec.placement_since())
            .map(|(p, since)| PlacementStatus {
                version: p.version,
                since,
            }),
        shards,
    }
}

/// The store as `rec` sees it.
fn store_status(rec: &Reconciler) -> StoreStatus {
    match (rec.store_failing_since(), rec.outage()) {
        (Some(since), Some(outage)) => StoreStatus::Unreachable { since, outage },
        _ if rec.store_reachable() => StoreStatus::Reachable,
        _ => StoreStatus::Untried,
    }
}

/// A pod id for a log field, `none` for nobody.
pub(super) fn name(pod: Option<&PodId>) -> &str {
    pod.map_or("none", PodId::as_str)
}

/// The pod-level facts last logged, to log each change once.
pub(super) struct Situation {
    registered: bool,
    ready: bool,
    outage: Option<Outage>,
    generation: Option<String>,
    applied: Assignment,
    rollbacks: u64,
    moves: MoveCounts,
}

impl Situation {
    pub fn new(rec: &Reconciler) -> Self {
        Situation {
            registered: rec.registered(),
            ready: rec.ready(),
            outage: rec.outage(),
            generation: rec.generation().map(str::to_owned),
            applied: rec.assignment().clone(),
            rollbacks: rec.rollbacks(),
            moves: rec.moves(),
        }
    }

    /// The planned moves counted since the last call, by result (`elected`, `skipped`,
    /// `failed`).
    pub fn new_moves(&mut self, rec: &Reconciler) -> [(&'static str, u64); 3] {
        let (now, was) = (rec.moves(), std::mem::replace(&mut self.moves, rec.moves()));
        [
            ("elected", now.elected - was.elected),
            ("skipped", now.skipped - was.skipped),
            ("failed", now.failed - was.failed),
        ]
    }

    /// Logs what changed since the last call; returns how many times the store was found
    /// to have gone back in time meanwhile.
    pub fn update(&mut self, rec: &Reconciler) -> u64 {
        let rollbacks = rec.rollbacks() - self.rollbacks;
        if rollbacks > 0 {
            self.rollbacks = rec.rollbacks();
            warn!(
                "the store went back in time: it lost writes it had acknowledged (a failover \
                 to a replica that lacked them); re-claiming what it forgot, putting the \
                 placement back, no other ownership change for one member TTL"
            );
        }
        if rec.generation() != self.generation.as_deref() {
            let generation = rec.generation().unwrap_or_default();
            if self.generation.is_none() {
                info!(generation, "joined store generation");
            } else {
                warn!(
                    generation,
                    previous = self.generation.as_deref().unwrap_or_default(),
                    "store generation changed (the store lost its data): re-claiming held shards"
                );
            }
            self.generation = rec.generation().map(str::to_owned);
        }
        if rec.registered() != self.registered {
            self.registered = rec.registered();
            if self.registered {
                info!(members = rec.members().len(), "registered in the cluster");
            } else if rec.is_finished() {
                info!("deregistered");
            } else {
                warn!("registration missing from the store");
            }
        }
        // Once per change of verdict, not per probe that confirms it.
        let kind = |o: &Option<Outage>| o.as_ref().map(std::mem::discriminant);
        if kind(&rec.outage()) != kind(&self.outage) {
            self.outage = rec.outage();
            match self.outage {
                // The recovery line, with the outage's length, comes from the op bookkeeping.
                None => {}
                Some(Outage::Unknown) => {
                    warn!("store unreachable: asking peers whether they reach it")
                }
                Some(Outage::Isolated { .. }) => warn!(
                    "store unreachable from this pod only: shards are given up at their deadlines"
                ),
                Some(Outage::ClusterWide { .. }) => warn!(
                    "store unreachable for a majority of the cluster: shards are held past \
                     their deadlines and keep delivering; ownership cannot change until the \
                     store is back"
                ),
            }
        }
        if rec.assignment() != &self.applied {
            let me = rec.pod();
            let before: BTreeSet<ShardId> = self.applied.shards_of(me).collect();
            let after: BTreeSet<ShardId> = rec.assignment().shards_of(me).collect();
            info!(
                members = rec.assignment().pods().len(),
                assigned = after.len(),
                gained = after.difference(&before).count(),
                lost = before.difference(&after).count(),
                "rebalance applied"
            );
            self.applied = rec.assignment().clone();
        }
        // Readiness is never withdrawn (see `Reconciler::ready`).
        if rec.ready() && !self.ready {
            self.ready = true;
            info!(
                shards = self.applied.shards_of(rec.pod()).count(),
                "ready: every assigned shard is served"
            );
        }
        rollbacks
    }
}
