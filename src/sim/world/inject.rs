//! Applying one fault to the simulated cluster: a join, a graceful leave, a crash, a
//! pause, a partition (of one pod or half of them), a store outage or a store wipe, and
//! the combinations static stability must survive (an outage ending in a wipe, an outage
//! that begins while a pod is frozen); and adding a pod (at the start and on a join).

use std::time::Duration;

use rand::Rng;

use super::{Ev, SimPod, World};
use crate::core::PodId;
use crate::push::idempotency::IdempotencyCache;
use crate::sim::checks::Violation;
use crate::sim::faults::Fault;

impl World<'_> {
    pub(super) fn fault(&mut self, fault: Fault) -> Result<(), Violation> {
        self.stats.faults += 1;
        let staying: Vec<usize> = self
            .alive()
            .into_iter()
            .filter(|&p| !self.pods[p].leaving)
            .collect();
        let can_lose = staying.len() > 1;
        let alive: Vec<usize> = staying
            .into_iter()
            .filter(|&p| self.pods[p].paused_until.is_none())
            .collect();
        let victim = if alive.is_empty() {
            None
        } else {
            Some(alive[self.rng.random_range(0..alive.len())])
        };
        self.check
            .log(self.now, format_args!("fault {fault:?} victim {victim:?}"));
        match (fault, victim) {
            (Fault::Join, _) if self.alive().len() < self.cfg.max_pods => self.add_pod(self.now),
            (Fault::Leave, Some(v)) if can_lose => {
                self.pods[v].leaving = true;
                let now = self.local(v);
                if let Some(rec) = self.pods[v].rec.as_mut() {
                    rec.begin_shutdown(now);
                }
                self.perform(v)?;
                self.schedule_wake(v);
            }
            (Fault::Crash, Some(v)) if can_lose => {
                self.pods[v].alive = false;
                self.sessions_crash(v);
            }
            (Fault::Pause(d), Some(v)) => {
                self.pods[v].paused_until = Some(self.now + d);
                self.schedule(self.now + d, Ev::Resume(v));
            }
            (Fault::Partition(d), Some(v)) => {
                self.pods[v].partitioned = true;
                self.schedule(self.now + d, Ev::Heal(v));
            }
            (Fault::StoreOutage(d), _) => {
                self.store_up = false;
                self.schedule(self.now + d, Ev::StoreUp);
            }
            (Fault::StoreWipe, _) => self.wipe_store(),
            (Fault::StoreFailover(failover), _) => self.begin_failover(failover),
            (Fault::HalfPartition(d), _) => {
                let mut pods = alive.clone();
                for i in (1..pods.len()).rev() {
                    pods.swap(i, self.rng.random_range(0..=i));
                }
                for &p in pods.iter().take(pods.len() / 2) {
                    self.pods[p].partitioned = true;
                    self.schedule(self.now + d, Ev::Heal(p));
                }
            }
            (Fault::StoreOutageThenWipe(d), _) => {
                self.store_up = false;
                self.schedule(self.now + d, Ev::StoreUpWiped);
            }
            (Fault::PauseThenOutage { pause, outage }, Some(v)) => {
                self.pods[v].paused_until = Some(self.now + pause);
                self.schedule(self.now + pause, Ev::Resume(v));
                let begins = self.now + pause / 2;
                // Like every fault, over by the end of the fault window.
                let outage = outage.min(self.cfg.fault_end.saturating_sub(begins));
                self.schedule(begins, Ev::Fault(Fault::StoreOutage(outage)));
            }
            _ => {}
        }
        Ok(())
    }

    /// A new pod, started at `at`, with its clock rate drawn within the skew.
    pub(super) fn add_pod(&mut self, at: Duration) {
        let idx = self.pods.len();
        let skew = self.cfg.clock_skew;
        let rate = 1.0
            + if skew > 0.0 {
                self.rng.random_range(-skew..skew)
            } else {
                0.0
            };
        self.pods.push(SimPod {
            id: PodId::new(format!("pod-{idx}")).expect("valid id"),
            rec: None,
            rate,
            alive: true,
            leaving: false,
            paused_until: None,
            partitioned: false,
            deferred: Vec::new(),
            wake_at: None,
            cache: IdempotencyCache::new(Duration::from_secs(600), 100_000),
            wall_offset_ms: self.rng.random_range(-250..=250),
            drains: Default::default(),
            copies: Default::default(),
        });
        self.schedule(at, Ev::Start(idx));
    }
}
