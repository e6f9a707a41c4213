//! A pod's store call arriving at the simulated store: applied to the in-memory state
//! (unless the pod is cut off or the store is down), checked, and answered after a
//! random latency, or lost after it was applied.

use super::*;
use crate::core::lease::{LeaseCall, ReleaseNote, Released};

impl World<'_> {
    /// A call reaches the store: apply it and send the reply (which may get lost).
    pub(super) fn arrive(&mut self, pod: usize, call: Call) -> Result<(), Violation> {
        if self.pods[pod].partitioned || !self.store_up {
            let at = self.now + STORE_TIMEOUT;
            self.schedule(at, Ev::Reply(pod, failed(call)));
            return Ok(());
        }
        let ms = (STORE_EPOCH_MS + self.now.as_millis() as u64)
            .saturating_add_signed(self.store_clock_ms);
        let core = &self.cfg.core;
        let id = self.pods[pod].id.clone();
        let store = &mut self.store;
        let reply = match call {
            Call::Heartbeat(g) => {
                let member = sim_member(&id, ms);
                let meta = ClusterMeta::current(core.shards);
                let r = store
                    .heartbeat(ms, &g, &member, &meta, core.member_ttl)
                    .map_err(|_| OpFailed);
                if !matches!(r, Ok(Checked::Ok(_))) {
                    self.check
                        .log(self.now, format_args!("store: {id} heartbeat {r:?}"));
                }
                Reply::Heartbeat(r)
            }
            Call::Poll => Reply::Snapshot(Ok(store.snapshot(ms, core.shards))),
            Call::Acquire(g, claims) => {
                let call = LeaseCall {
                    generation: &g,
                    pod: &id,
                    ttl: core.lease_ttl,
                };
                let r = store.acquire(ms, &call, &claims).map_err(|_| OpFailed);
                let shards: Vec<ShardId> = claims.iter().map(|c| c.shard).collect();
                if let Ok(Checked::Ok(outcomes)) = &r {
                    for (&s, o) in shards.iter().zip(outcomes) {
                        if let AcquireOutcome::Acquired { epoch, .. } = o {
                            self.stats.acquisitions += 1;
                            self.check.log(
                                self.now,
                                format_args!("store: {id} acquired {s} epoch {epoch}"),
                            );
                            self.check.granted(self.now, s, *epoch)?;
                        }
                    }
                }
                Reply::Acquire(shards, r)
            }
            Call::Renew(g, shards) => {
                let call = LeaseCall {
                    generation: &g,
                    pod: &id,
                    ttl: core.lease_ttl,
                };
                let r = store.renew(ms, &call, &shards).map_err(|_| OpFailed);
                Reply::Renew(shards, r)
            }
            Call::Release(releases) => {
                // Like the driver: a pod that drains leaves a note with every release.
                let note = ReleaseNote {
                    member: sim_member(&id, ms),
                    ttl: core.lease_ttl,
                };
                let r = store.release(ms, &id, &releases, Some(&note), core.lease_ttl);
                for (rel, outcome) in releases.iter().zip(&r) {
                    if let Released::HandedOver { epoch } = outcome {
                        self.stats.leases_handed_over += 1;
                        let to = rel.to.as_ref().map_or("?", |p| p.as_str());
                        self.check.log(
                            self.now,
                            format_args!("store: {id} handed {} to {to} epoch {epoch}", rel.shard),
                        );
                        self.check.granted(self.now, rel.shard, *epoch)?;
                    }
                }
                let shards = releases.iter().map(|r| r.shard).collect();
                Reply::Release(shards, Ok(r))
            }
            Call::Deregister => {
                store.deregister(ms, &id);
                Reply::Deregister(Ok(()))
            }
            Call::Place(expected, placement) => {
                let stored = store.place(expected, &placement);
                self.check.log(
                    self.now,
                    format_args!(
                        "store: {id} place v{} over {expected:?}: {stored}",
                        placement.version
                    ),
                );
                Reply::Place(placement, Ok(stored))
            }
        };
        self.replica.replicate(self.now, &self.store);
        let n = self.store.notifications();
        if n != self.notifications {
            self.notifications = n;
            for p in self.alive() {
                if !self.pods[p].partitioned {
                    let at = self.now + self.latency();
                    self.schedule(at, Ev::Notify(p));
                }
            }
        }
        // Lost replies are faults too: none after `fault_end`, so convergence is judged
        // on a quiet network. (Drawn either way, to keep every seed's random sequence.)
        let lost = self.rng.random_bool(self.cfg.reply_loss);
        if lost && self.now < self.cfg.fault_end {
            let at = self.now + STORE_TIMEOUT;
            self.schedule(at, Ev::Reply(pod, failed_reply(reply)));
        } else {
            let at = self.now + self.latency();
            self.schedule(at, Ev::Reply(pod, reply));
        }
        Ok(())
    }
}

pub(super) fn failed(call: Call) -> Reply {
    match call {
        Call::Heartbeat(_) => Reply::Heartbeat(Err(OpFailed)),
        Call::Poll => Reply::Snapshot(Err(OpFailed)),
        Call::Acquire(_, c) => Reply::Acquire(c.iter().map(|c| c.shard).collect(), Err(OpFailed)),
        Call::Renew(_, s) => Reply::Renew(s, Err(OpFailed)),
        Call::Release(r) => Reply::Release(r.iter().map(|r| r.shard).collect(), Err(OpFailed)),
        Call::Deregister => Reply::Deregister(Err(OpFailed)),
        Call::Place(_, p) => Reply::Place(p, Err(OpFailed)),
    }
}

fn failed_reply(reply: Reply) -> Reply {
    match reply {
        Reply::Heartbeat(_) => Reply::Heartbeat(Err(OpFailed)),
        Reply::Snapshot(_) => Reply::Snapshot(Err(OpFailed)),
        Reply::Acquire(s, _) => Reply::Acquire(s, Err(OpFailed)),
        Reply::Renew(s, _) => Reply::Renew(s, Err(OpFailed)),
        Reply::Release(s, _) => Reply::Release(s, Err(OpFailed)),
        Reply::Deregister(_) => Reply::Deregister(Err(OpFailed)),
        Reply::Place(p, _) => Reply::Place(p, Err(OpFailed)),
    }
}

/// A simulated pod's member record: the current protocols, draining on planned moves.
fn sim_member(id: &PodId, ms: u64) -> Member {
    Member {
        pod: id.clone(),
        url: format!("http://sim/{id}"),
        version: "sim".into(),
        ring_version: crate::core::ring::RING_VERSION.into(),
        started_ms: ms,
        peer_protocol: 2,
        handover: HANDOVER_LEASE,
        queue: 0,
        batch: 0,
        broadcast: 0,
        moves: crate::core::membership::MOVE_BUDGET,
        pod_lease: crate::core::membership::POD_LEASE,
    }
}
