//! The end-of-run check: once faults stop and the settle time passes, the stored
//! placement is a balanced table over exactly the live pods, every shard is served
//! by exactly its pod, and each of its terminals has exactly one session, with that pod.

use std::time::Duration;

use super::World;
use crate::core::PodId;
use crate::sim::checks::Violation;
use crate::sim::SimConfig;

/// How long a run goes on after the faults end: long enough for every shard to settle
/// on its assigned pod.
pub(super) fn settle(cfg: &SimConfig) -> Duration {
    cfg.core.lease_ttl.max(cfg.core.member_ttl) + Duration::from_secs(3)
}

impl World<'_> {
    /// When the run ends and convergence is judged: [`settle`] after the faults, plus
    /// how far the store's clock is behind true time (a failover to a replica whose
    /// clock lags keeps every TTL alive that much longer: liveness is the store's).
    pub(super) fn end(&self) -> Duration {
        let lag = Duration::from_millis(self.store_clock_ms.min(0).unsigned_abs());
        self.cfg.fault_end + settle(self.cfg) + lag
    }

    /// After faults stop and the settle time passes: the stored placement is a balanced
    /// table over exactly the live pods, and each shard is served by exactly its pod.
    pub(super) fn converged(&mut self) -> Result<(), Violation> {
        let alive = self.alive();
        let mut ids: Vec<PodId> = alive.iter().map(|&p| self.pods[p].id.clone()).collect();
        ids.sort();
        let shards = self.cfg.core.shards;
        let assignment = match self.store.placement() {
            Some(p) if p.assignment.pods() == ids.as_slice() => p.assignment.clone(),
            other => {
                let pods = other.map(|p| p.assignment.pods().to_vec());
                return Err(self.check.violation(
                    self.now,
                    format!("not converged: placement for {pods:?}, live pods {ids:?}"),
                ));
            }
        };
        let n = ids.len().max(1);
        let (lo, hi) = (shards as usize / n, (shards as usize).div_ceil(n));
        if let Some(p) = ids
            .iter()
            .find(|p| !(lo..=hi).contains(&assignment.load_of(p)))
        {
            let load = assignment.load_of(p);
            return Err(self.check.violation(
                self.now,
                format!("unbalanced placement: {p} holds {load}, not {lo}..={hi}"),
            ));
        }
        for shard in 0..self.cfg.core.shards {
            let servers: Vec<PodId> = alive
                .iter()
                .filter(|&&p| {
                    let now = self.local(p);
                    self.pods[p]
                        .rec
                        .as_ref()
                        .is_some_and(|r| r.serving(shard, now).is_some())
                })
                .map(|&p| self.pods[p].id.clone())
                .collect();
            let want = assignment.owner(shard).cloned();
            if servers.len() != 1 || Some(&servers[0]) != want.as_ref() {
                return Err(self.check.violation(
                    self.now,
                    format!(
                        "not converged: shard {shard} assigned to {want:?}, served by {servers:?}"
                    ),
                ));
            }
            let owner = self.pods.iter().position(|p| p.id == servers[0]);
            let owner = owner.expect("a live pod");
            let now = self.local(owner);
            let rec = self.pods[owner].rec.as_ref();
            let epoch = rec.and_then(|r| r.serving(shard, now)).expect("served");
            self.sessions_converged(shard, owner, epoch)?;
        }
        Ok(())
    }
}
