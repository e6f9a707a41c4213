//! What the simulated terminals make of the pods: after every event of a pod, at most
//! one of the pods that may deliver on a shard holds its terminals' current session (the
//! rest fenced by epoch), and what a terminal answers a refused epoch with.

use std::time::Instant;

use super::World;
use crate::core::lease::StaleEpoch;
use crate::core::reconciler::ShardState;
use crate::core::{Epoch, PodId, ShardId};
use crate::sim::checks::Violation;

impl World<'_> {
    /// A terminal's stale-epoch answer to `epoch` on `shard`: it names the newest epoch
    /// the shard's terminals said hello with, as a real `409` does.
    pub(super) fn stale_epoch(&self, shard: ShardId, epoch: Epoch) -> StaleEpoch {
        StaleEpoch {
            shard,
            epoch,
            highest: self.check.newest_hello(shard).map(|(_, e)| e),
        }
    }

    pub(super) fn check_exclusive(&mut self, pod: usize) -> Result<(), Violation> {
        let now_of: Vec<Instant> = (0..self.pods.len()).map(|i| self.local(i)).collect();
        let Some(rec) = self.pods[pod].rec.as_ref() else {
            return Ok(());
        };
        for shard in 0..self.cfg.core.shards {
            if rec.serving(shard, now_of[pod]).is_none() {
                continue;
            }
            if matches!(rec.shard_state(shard), Some(ShardState::Suspended { .. })) {
                self.stats.served_in_outage += 1;
            }
            // A frozen pod delivers nothing; on waking its first input runs first.
            let servers: Vec<(PodId, Epoch)> = self
                .pods
                .iter()
                .enumerate()
                .filter(|(_, p)| p.alive && p.paused_until.is_none())
                .filter_map(|(i, p)| {
                    let epoch = p.rec.as_ref()?.serving(shard, now_of[i])?;
                    Some((p.id.clone(), epoch))
                })
                .collect();
            self.check.exclusive(self.now, shard, &servers)?;
        }
        Ok(())
    }
}
