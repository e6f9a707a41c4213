//! The gates of the scenarios that cut pods off from Redis for the profile's outage length
//! (redis-outage, single-pod-outage, partial-partition): the share of pushes answered
//! 200 within one span of the scenario ([`PushWindow`]), whether every terminal stayed
//! connected and every shard with its owner, and, for a cut-off minority, whether the
//! rest took each of its shards over under a higher epoch ([`Takeover`]).
//!
//! A push belongs to a window by its first attempt's send time, and counts with its final
//! outcome even when a retry was sent after the window closed: the sender's question is
//! "was the push I sent during the outage delivered?". The share at the first attempt is
//! reported next to it, so retries cannot hide what the gateway answered.
//!
//! Not for: the gates every scenario has (`measure`) or the whole scenario's pushes
//! (`push_summary`).

use std::time::Duration;

use serde::Serialize;

use super::{
    cluster::Profile,
    observe::{Owners, Sample},
    pushgen::PushRecord,
    report::ScenarioReport,
    scenarios::{Cut, Scenario},
};

/// partial-partition: the takeover is counted as done this long after the cut-off pods'
/// last leases and member records can have run out (one lease TTL + one member TTL after
/// the cut): the rest then place, claim and dial the shards.
pub const TAKEOVER_MARGIN: Duration = Duration::from_secs(2);
/// redis-outage, single-pod-outage: least share of the pushes sent during the outage
/// answered 200 (after the sender's retries).
pub const DURING_OUTAGE_MIN: f64 = 0.999;
/// partial-partition: least share of the pushes sent after the takeover answered 200
/// (after the sender's retries).
pub const AFTER_TAKEOVER_MIN: f64 = 0.99;

/// The pushes whose first attempt was sent within one span of a scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PushWindow {
    /// What the span is, e.g. "during the outage".
    pub name: String,
    /// How its bounds were chosen, for the report.
    pub rule: String,
    pub from_unix_ms: u64,
    /// Exclusive.
    pub to_unix_ms: u64,
    pub sent: usize,
    /// Answered 200 at the first attempt.
    pub ok_first: usize,
    /// Answered 200 at the first attempt or a retry (same key, another entry pod).
    pub ok_final: usize,
    pub first_ok_ratio: f64,
    pub final_ok_ratio: f64,
    /// The least `final_ok_ratio` that passes, when the window is gated.
    pub gate_min: Option<f64>,
}

impl PushWindow {
    /// Counts the pushes of `pushes` first sent in `[from, to)`.
    pub fn count(
        pushes: &[PushRecord],
        name: &str,
        rule: String,
        (from, to): (u64, u64),
        gate_min: Option<f64>,
    ) -> Self {
        let inside: Vec<&PushRecord> = pushes
            .iter()
            .filter(|p| (from..to).contains(&p.first.sent_unix_ms))
            .collect();
        let ok_first = inside.iter().filter(|p| p.first.status == 200).count();
        let ok_final = inside.iter().filter(|p| p.last().status == 200).count();
        // An empty window has a share of 0: nothing sent proves nothing was delivered.
        let share = |n: usize| n as f64 / inside.len().max(1) as f64;
        PushWindow {
            name: name.into(),
            rule,
            from_unix_ms: from,
            to_unix_ms: to,
            sent: inside.len(),
            ok_first,
            ok_final,
            first_ok_ratio: share(ok_first),
            final_ok_ratio: share(ok_final),
            gate_min,
        }
    }

    /// The gate's verdict (an empty window's share is 0: it fails).
    pub fn passes(&self) -> Option<bool> {
        Some(self.final_ok_ratio >= self.gate_min?)
    }

    /// "N pushes, 200 at the first attempt A (x%), after retries B (y%)".
    pub fn figures(&self) -> String {
        format!(
            "{} pushes first sent {} ({}): 200 at the first attempt {} ({:.3}%), after retries {} ({:.3}%)",
            self.sent,
            self.name,
            self.rule,
            self.ok_first,
            self.first_ok_ratio * 100.0,
            self.ok_final,
            self.final_ok_ratio * 100.0
        )
    }
}

/// The push windows of `sc` (empty for the scenarios without one), given the pods it cut
/// off and when the run ended (unix ms).
pub fn push_windows(
    sc: Scenario,
    cut: &Cut,
    profile: &Profile,
    pushes: &[PushRecord],
    end_unix_ms: u64,
) -> Vec<PushWindow> {
    let (from, to) = (cut.from_unix_ms, cut.to_unix_ms);
    match sc {
        Scenario::RedisOutage | Scenario::SinglePodOutage | Scenario::RedisFailover => vec![
            PushWindow::count(
                pushes,
                "during the outage",
                match sc {
                    Scenario::RedisFailover => "from the kill of the master to every pod \
                        reaching the promoted one with no recovery hold"
                        .into(),
                    _ => "from the cut to the restore".into(),
                },
                (from, to),
                Some(DURING_OUTAGE_MIN),
            ),
            PushWindow::count(
                pushes,
                "after the outage",
                "from its end to the end of the run".into(),
                (to, end_unix_ms),
                None,
            ),
        ],
        Scenario::PartialPartition => {
            let after = profile.lease_ttl + profile.member_ttl + TAKEOVER_MARGIN;
            let takeover = from + after.as_millis() as u64;
            let rule = format!(
                "from the cut + lease TTL {} s + member TTL {} s + {} s margin",
                profile.lease_ttl.as_secs(),
                profile.member_ttl.as_secs(),
                TAKEOVER_MARGIN.as_secs()
            );
            vec![
                PushWindow::count(
                    pushes,
                    "before the takeover",
                    "from the cut to the takeover".into(),
                    (from, takeover),
                    None,
                ),
                PushWindow::count(
                    pushes,
                    "after the takeover",
                    format!("{rule} to the end of the run, the restore included"),
                    (takeover, end_unix_ms),
                    Some(AFTER_TAKEOVER_MIN),
                ),
            ]
        }
        _ => Vec::new(),
    }
}

/// partial-partition: the cut-off pods' shards and whether the rest took them over.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Takeover {
    /// Shards the cut-off pods held when the cut began.
    pub shards: usize,
    /// Of those, seen held by a pod not cut off under a higher epoch while the cut stood.
    pub taken_over: usize,
    /// The others.
    pub not_taken_over: Vec<u32>,
}

/// Which shards held by `cut`'s pods in `before` a pod outside `cut` was seen owning with
/// a higher epoch in a sample taken while the cut stood.
pub fn takeover(before: &Owners, samples: &[Sample], cut: &Cut) -> Takeover {
    let during: Vec<&Owners> = samples
        .iter()
        .filter(|s| (cut.from_unix_ms..=cut.to_unix_ms).contains(&s.at_unix_ms))
        .filter_map(|s| s.owners.as_ref())
        .collect();
    let mut t = Takeover::default();
    for (shard, slot) in before.iter().enumerate() {
        let Some((pod, epoch)) = slot.as_ref().filter(|(p, _)| cut.pods.contains(p)) else {
            continue;
        };
        t.shards += 1;
        let taken = during.iter().any(|o| {
            matches!(o.get(shard), Some(Some((p, e))) if p != pod && !cut.pods.contains(p) && e > epoch)
        });
        if taken {
            t.taken_over += 1;
        } else {
            t.not_taken_over.push(shard as u32);
        }
    }
    t
}

/// The outage gates of `sc` on `r` (its windows, takeover and counters already filled).
pub fn checks(r: &mut ScenarioReport, sc: Scenario) {
    for w in r.push_windows.clone() {
        let (Some(min), Some(pass)) = (w.gate_min, w.passes()) else {
            continue;
        };
        let name = format!(
            ">= {}% pushes 200 {} (first attempt or a retry)",
            min * 100.0,
            w.name
        );
        r.check(&name, true, pass, w.figures());
    }
    match sc {
        Scenario::RedisOutage | Scenario::SinglePodOutage | Scenario::RedisFailover => {
            let closed = r.connections_closed;
            let d = format!(
                "{closed} connections closed; fewest terminals connected {} of {}",
                r.min_terminals_connected, r.terminals
            );
            r.check("no terminal disconnected", true, closed == 0, d);
            let m = r.shard_moves;
            let d = format!("{m} owner changes on {} shards", r.shards_moved);
            r.check("same owners afterwards (no shard moved)", true, m == 0, d);
        }
        Scenario::PartialPartition => {
            let t = r.takeover.clone().unwrap_or_default();
            let d = format!(
                "{} of the {} shards of the cut-off pods taken over under a higher epoch while \
                 the cut stood (sampled every 250 ms); not taken over: {:?}",
                t.taken_over, t.shards, t.not_taken_over
            );
            let pass = t.shards > 0 && t.not_taken_over.is_empty();
            r.check(
                "the rest take the cut-off half's shards over with higher epochs",
                true,
                pass,
                d,
            );
        }
        _ => {}
    }
}

#[cfg(test)]
#[path = "outage_tests.rs"]
mod tests;
