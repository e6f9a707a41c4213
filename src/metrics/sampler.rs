//! Sets the state gauges from the pod's status and the connection layer every
//! [`SAMPLE_EVERY`], times rebalances: from a change of the shards assigned to this
//! pod until each of them is served and every terminal of them was dialed once, and
//! feeds the status page's timeline (`super::timeline`) when a sample is due.
//!
//! Sampling keeps the gauges off the hot paths; the price is up to one period of delay,
//! which is well below a scrape interval.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Metrics;
use crate::core::ShardId;
use crate::serving::SessionStats;
use crate::status::PodStatus;

/// How often the gauges are refreshed.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// The sampler's memory between samples.
#[derive(Debug, Default)]
struct Sampler {
    /// The `result` values of a failed push, for the timeline.
    push_failures: &'static [&'static str],
    members: Option<Vec<String>>,
    assigned: Option<BTreeSet<ShardId>>,
    rebalance_started: Option<Instant>,
}

/// Samples until `status` closes (the driver is gone). `push_failures`: the `result`
/// values of `posgate_push_requests_total` that the timeline counts as failed pushes.
pub async fn run(
    metrics: Arc<Metrics>,
    mut status: watch::Receiver<PodStatus>,
    sessions: Arc<dyn SessionStats>,
    push_failures: &'static [&'static str],
) {
    let mut sampler = Sampler {
        push_failures,
        ..Sampler::default()
    };
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if status.has_changed().is_err() {
            return;
        }
        let snapshot = status.borrow_and_update().clone();
        sampler.sample(&metrics, &snapshot, &*sessions, crate::clock::now());
    }
}

impl Sampler {
    fn sample(
        &mut self,
        m: &Metrics,
        status: &PodStatus,
        sessions: &dyn SessionStats,
        now: Instant,
    ) {
        let Some(me) = &status.pod else {
            return;
        };
        let members: Vec<String> = status.members.iter().map(|mb| mb.pod.to_string()).collect();
        m.members.set(members.len() as i64);
        if self.members.as_ref().is_some_and(|prev| *prev != members) {
            m.membership_changes.inc();
        }
        self.members = Some(members);
        m.store_reachable.set(i64::from(status.store.reachable()));
        m.store_unreachable_seconds
            .set(status.store.unreachable_for(now).as_secs_f64());
        let verdict = status.store.verdict();
        for v in crate::status::VERDICTS {
            m.store_verdict
                .get_or_create(&[("verdict", v)])
                .set(i64::from(v == verdict));
        }

        let assigned: BTreeSet<ShardId> = status
            .shards
            .iter()
            .filter(|s| s.assigned.as_ref() == Some(me))
            .map(|s| s.shard)
            .collect();
        let served = status.shards.iter().filter(|s| s.serving).count();
        m.shards_assigned.set(assigned.len() as i64);
        m.shards_served.set(served as i64);
        // A suspended shard delivers exactly while it is served (the verdict stands).
        for (delivery, serving) in [("delivering", true), ("parked", false)] {
            let n = status
                .shards
                .iter()
                .filter(|s| s.suspended && s.serving == serving)
                .count();
            m.shards_suspended
                .get_or_create(&[("delivery", delivery)])
                .set(n as i64);
        }
        m.shards_without_owner
            .set(status.shards.iter().filter(|s| s.owner.is_none()).count() as i64);
        m.shards_waiting_for_slot.set(
            status
                .shards
                .iter()
                .filter(|s| s.next_owner.is_some())
                .count() as i64,
        );
        for s in &status.shards {
            m.shard_served
                .get_or_create(&[("shard", s.shard)])
                .set(i64::from(s.serving));
            m.shard_epoch
                .get_or_create(&[("shard", s.shard)])
                .set(s.epoch.map_or(0, |e| e as i64));
        }

        let counts = sessions.terminal_counts();
        for (state, n) in [
            ("disconnected", counts.disconnected),
            ("dialing", counts.dialing),
            ("connected", counts.connected),
            ("backoff", counts.backoff),
        ] {
            m.terminals.get_or_create(&[("state", state)]).set(n as i64);
        }
        m.dial_queue_depth.set(sessions.dial_queue_depth() as i64);
        m.sample_timeline(now, self.push_failures);

        if self.assigned.as_ref().is_some_and(|prev| *prev != assigned) {
            m.rebalances.inc();
            self.rebalance_started = Some(now);
        }
        let settled = assigned
            .iter()
            .all(|&s| status.shards.get(s as usize).is_some_and(|st| st.serving))
            && sessions.pending_first_dials() == Some(0);
        if let Some(started) = self.rebalance_started.filter(|_| settled) {
            m.rebalance_duration
                .observe(now.saturating_duration_since(started).as_secs_f64());
            self.rebalance_started = None;
        }
        self.assigned = Some(assigned);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::core::reconciler::Outage;
    use crate::core::PodId;
    use crate::metrics::Exposition;
    use crate::serving::{ShardCount, TerminalCounts};
    use crate::status::{ShardStatus, StoreStatus};

    /// Sessions whose undialed count the test sets.
    #[derive(Default)]
    struct Fake(AtomicUsize);

    impl SessionStats for Fake {
        fn pending_first_dials(&self) -> Option<usize> {
            Some(self.0.load(Ordering::Relaxed))
        }
        fn terminal_counts(&self) -> TerminalCounts {
            TerminalCounts {
                connected: 5,
                backoff: 1,
                ..TerminalCounts::default()
            }
        }
        fn dial_queue_depth(&self) -> usize {
            3
        }
        fn shard_counts(&self) -> Vec<ShardCount> {
            Vec::new()
        }
    }

    fn status(me: &PodId, assigned: &[ShardId], serving: &[ShardId]) -> PodStatus {
        PodStatus {
            pod: Some(me.clone()),
            store: StoreStatus::Reachable,
            shards: (0..4)
                .map(|s| ShardStatus {
                    shard: s,
                    assigned: assigned.contains(&s).then(|| me.clone()),
                    owner: serving.contains(&s).then(|| me.clone()),
                    epoch: serving.contains(&s).then_some(7),
                    serving: serving.contains(&s),
                    suspended: false,
                    next_owner: None,
                })
                .collect(),
            ..PodStatus::default()
        }
    }

    #[test]
    fn rebalance_lasts_until_served_and_dialed() {
        let (m, fake, me) = (Metrics::new(), Fake::default(), PodId::new("p").unwrap());
        let mut sampler = Sampler::default();
        let t0 = Instant::now();
        sampler.sample(&m, &status(&me, &[0], &[0]), &fake, t0);
        // Shard 1 is assigned too: a rebalance starts; served at +1 s, dialed at +3 s.
        fake.0.store(10, Ordering::Relaxed);
        sampler.sample(
            &m,
            &status(&me, &[0, 1], &[0]),
            &fake,
            t0 + Duration::from_secs(1),
        );
        sampler.sample(
            &m,
            &status(&me, &[0, 1], &[0, 1]),
            &fake,
            t0 + Duration::from_secs(2),
        );
        fake.0.store(0, Ordering::Relaxed);
        sampler.sample(
            &m,
            &status(&me, &[0, 1], &[0, 1]),
            &fake,
            t0 + Duration::from_secs(4),
        );
        let text = m.encode(Exposition::OpenMetrics);
        assert!(text.contains("posgate_rebalances_total 1"), "{text}");
        assert!(
            text.contains("posgate_rebalance_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("posgate_rebalance_duration_seconds_sum 3.0"),
            "{text}"
        );
        assert!(text.contains("posgate_shards_assigned 2"));
        assert!(text.contains("posgate_shards_without_owner 2"));
        assert!(text.contains("posgate_shard_served{shard=\"1\"} 1"));
        assert!(text.contains("posgate_terminals{state=\"connected\"} 5"));
        assert!(text.contains("posgate_dial_queue_depth 3"));
    }

    #[test]
    fn a_store_outage_shows_its_verdict_duration_and_suspended_shards() {
        let (m, fake, me) = (Metrics::new(), Fake::default(), PodId::new("p").unwrap());
        let mut sampler = Sampler::default();
        let t0 = Instant::now();
        sampler.sample(&m, &status(&me, &[0, 1, 2], &[0, 1, 2]), &fake, t0);
        let text = m.encode(Exposition::OpenMetrics);
        assert!(
            text.contains("posgate_store_verdict{verdict=\"reachable\"} 1"),
            "{text}"
        );
        assert!(text.contains("posgate_store_verdict{verdict=\"cluster_wide\"} 0"));
        assert!(
            text.contains("posgate_store_unreachable_seconds 0.0"),
            "{text}"
        );
        assert!(text.contains("posgate_shards_suspended{delivery=\"delivering\"} 0"));

        // 12.5 s into a cluster-wide outage: shards 0 and 1 are held and deliver, shard 2
        // is held but parked.
        let mut outage = status(&me, &[0, 1, 2], &[0, 1]);
        outage.store = StoreStatus::Unreachable {
            since: t0,
            outage: Outage::ClusterWide { confirmed: t0 },
        };
        for s in &mut outage.shards[..3] {
            s.suspended = true;
        }
        sampler.sample(&m, &outage, &fake, t0 + Duration::from_millis(12_500));
        let text = m.encode(Exposition::OpenMetrics);
        for line in [
            "posgate_store_reachable 0",
            "posgate_store_unreachable_seconds 12.5",
            "posgate_store_verdict{verdict=\"cluster_wide\"} 1",
            "posgate_store_verdict{verdict=\"reachable\"} 0",
            "posgate_store_verdict{verdict=\"isolated\"} 0",
            "posgate_store_verdict{verdict=\"unknown\"} 0",
            "posgate_shards_suspended{delivery=\"delivering\"} 2",
            "posgate_shards_suspended{delivery=\"parked\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
