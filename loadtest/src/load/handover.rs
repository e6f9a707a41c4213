//! Per-shard handover gaps and the stale-epoch check, computed from the sampler's per-pod
//! views ([`Sample::pods`]) and the simulators' refusal log.
//!
//! Both are only as precise as the sampling: every pod in service is asked for its
//! `/v1/cluster` every [`super::observe::SAMPLE_EVERY`], so an instant between two samples
//! is not seen. The numbers say which sample they come from, and the report states the
//! actual spacing of the samples next to them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use super::observe::Sample;
use posgate_pos_sim::{
    dist::{dist, Dist},
    Refusal,
};

/// One owner change of one shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Handover {
    pub shard: u32,
    pub from: String,
    pub to: String,
    /// The first sample after the last one that showed `from` serving (it answered "not
    /// serving", or did not answer: killed, stopped, taken out of service).
    pub stopped_unix_ms: u64,
    /// The first sample of the run in which `to` said it serves the shard.
    pub serving_unix_ms: u64,
    /// `serving - stopped`, 0 if `to` was seen serving first (a handover within one
    /// sampling round, or an overlap: see `two_serving_samples`).
    pub gap_ms: u64,
}

/// Handover gaps of one scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HandoverSummary {
    /// Owner changes seen (a shard that moved twice counts twice).
    pub handovers: usize,
    /// Shards with at least one owner change.
    pub shards: usize,
    /// Over the handovers.
    pub gap_ms: Dist,
    /// Shards whose last serving pod stopped and no other pod was seen serving by the end.
    pub unfinished: usize,
    /// (sample, shard) pairs in which two pods both said they served the shard.
    pub two_serving_samples: usize,
    /// The sampler's nominal period and the actual spacing between samples: a gap is
    /// accurate to about one spacing either way.
    pub sample_every_ms: u64,
    pub sample_spacing_ms: Dist,
    /// Every handover, for diagnosis.
    pub list: Vec<Handover>,
}

/// Spacing between consecutive samples, ms.
pub fn spacing(samples: &[Sample]) -> Dist {
    dist(
        samples
            .windows(2)
            .map(|w| w[1].at_unix_ms.saturating_sub(w[0].at_unix_ms))
            .collect(),
    )
}

/// Owner changes per shard, in sample order.
///
/// A shard's holder is the pod seen serving it; it keeps the shard while it is seen
/// serving, and a sample in which it was not seen serving (answered "no" or did not
/// answer) only matters once another pod is seen serving: then the holder changes, the
/// old one counts as stopped at the first sample after its last serving one, and the new
/// one as serving from the first sample of its current serving run. The true gap is
/// within about one sample spacing of the reported one either way.
pub fn handovers(samples: &[Sample], shards: u32, sample_every_ms: u64) -> HandoverSummary {
    let mut out = HandoverSummary {
        sample_every_ms,
        sample_spacing_ms: spacing(samples),
        ..HandoverSummary::default()
    };
    let mut moved = BTreeSet::new();
    for shard in 0..shards {
        // (holder, index of the last sample that showed it serving)
        let mut holder: Option<(String, usize)> = None;
        // pod -> first sample of its current serving run
        let mut since: HashMap<&str, usize> = HashMap::new();
        for (i, s) in samples.iter().enumerate() {
            let mut servers = Vec::new();
            for p in &s.pods {
                if p.serves(shard).is_some() {
                    since.entry(p.pod.as_str()).or_insert(i);
                    servers.push(p.pod.as_str());
                } else {
                    since.remove(p.pod.as_str());
                }
            }
            if servers.len() > 1 {
                out.two_serving_samples += 1;
            }
            match &mut holder {
                None => holder = servers.first().map(|p| (p.to_string(), i)),
                Some((a, last)) if servers.contains(&a.as_str()) => *last = i,
                Some((a, last)) => {
                    // The pod serving longest takes over when several do.
                    let Some(b) = servers.iter().min_by_key(|p| since[**p]) else {
                        continue;
                    };
                    let stopped = samples[*last + 1].at_unix_ms;
                    let serving = samples[since[*b]].at_unix_ms;
                    out.list.push(Handover {
                        shard,
                        from: a.clone(),
                        to: b.to_string(),
                        stopped_unix_ms: stopped,
                        serving_unix_ms: serving,
                        gap_ms: serving.saturating_sub(stopped),
                    });
                    moved.insert(shard);
                    holder = Some((b.to_string(), i));
                }
            }
        }
        if let Some((_, last)) = holder {
            if last + 1 < samples.len() {
                out.unfinished += 1;
            }
        }
    }
    out.handovers = out.list.len();
    out.shards = moved.len();
    out.gap_ms = dist(out.list.iter().map(|h| h.gap_ms).collect());
    out
}

/// What became of one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// A sample asked after the refusal and answered within the limit showed the pod no
    /// longer serving the shard under that epoch.
    DroppedWithin,
    /// No sample answered within the limit showed it, but the first one asked at or after
    /// the limit (and no later than the limit + slack) did: it dropped the shard between
    /// two samples around the limit.
    DroppedByNextSample,
    /// A sample asked at or after the limit still showed the pod serving the shard, and
    /// its own view did not name a newer epoch for it.
    StillServing,
    /// The pod did not answer in time (killed, stopped, out of service), or the scenario
    /// ended first.
    Undetermined,
}

/// One refusal and its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct RefusalVerdict {
    pub shard: u32,
    #[serde(flatten)]
    pub refusal: Refusal,
    pub verdict: Verdict,
}

/// Stale-epoch refusals of one scenario and whether the refused pod dropped the shard.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StaleCheck {
    pub refusals: usize,
    pub hellos: usize,
    pub pushes: usize,
    /// Distinct (pod, shard, epoch) refused.
    pub grants: usize,
    pub limit_ms: u64,
    pub verdicts: BTreeMap<String, usize>,
    /// Refusals the simulators had to drop from their logs (the check misses those).
    pub log_dropped: u64,
    /// Every refusal that did not end in a drop seen within the limit (first 50).
    pub examples: Vec<RefusalVerdict>,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::DroppedWithin => "dropped_within",
            Verdict::DroppedByNextSample => "dropped_by_next_sample",
            Verdict::StillServing => "still_serving",
            Verdict::Undetermined => "undetermined",
        }
    }
}

impl StaleCheck {
    pub fn count(&self, v: Verdict) -> usize {
        self.verdicts.get(v.as_str()).copied().unwrap_or(0)
    }
}

/// The verdict on one refusal of `shard` (see [`Verdict`]); `slack_ms` bounds how late
/// the first sample after the limit may be to still count as "the next sample".
pub fn verdict(
    samples: &[Sample],
    r: &Refusal,
    shard: u32,
    limit_ms: u64,
    slack_ms: u64,
) -> Verdict {
    let deadline = r.at_unix_ms + limit_ms;
    // Only rounds asked after the refusal show the pod's state after it.
    for s in samples.iter().filter(|s| s.at_unix_ms > r.at_unix_ms) {
        let Some(obs) = s.pods.iter().find(|p| p.pod == r.pod) else {
            continue;
        };
        // Serving under a newer epoch (per its own view) is a new grant: the refused one
        // was dropped.
        let dropped = match obs.serves(shard) {
            None => true,
            Some(Some(epoch)) => epoch > r.epoch,
            Some(None) => false,
        };
        if obs.answered_unix_ms <= deadline {
            if dropped {
                return Verdict::DroppedWithin;
            }
            continue;
        }
        // Answered after the deadline: the state shown held somewhere in [asked,
        // answered], which may straddle the deadline.
        if !dropped && s.at_unix_ms >= deadline {
            return Verdict::StillServing;
        }
        if dropped {
            return if obs.answered_unix_ms <= deadline + slack_ms {
                Verdict::DroppedByNextSample
            } else {
                Verdict::Undetermined
            };
        }
    }
    Verdict::Undetermined
}

/// Checks every refusal in `refusals` (already cut to the scenario's window).
pub fn stale_check(
    samples: &[Sample],
    refusals: &[Refusal],
    shards: u32,
    limit_ms: u64,
    slack_ms: u64,
    log_dropped: u64,
) -> StaleCheck {
    let mut out = StaleCheck {
        refusals: refusals.len(),
        limit_ms,
        log_dropped,
        ..StaleCheck::default()
    };
    let mut grants = BTreeSet::new();
    for r in refusals {
        let shard = super::shard_of(&r.terminal, shards);
        grants.insert((r.pod.clone(), shard, r.epoch));
        match r.kind.as_str() {
            "hello" => out.hellos += 1,
            _ => out.pushes += 1,
        }
        let v = verdict(samples, r, shard, limit_ms, slack_ms);
        *out.verdicts.entry(v.as_str().to_owned()).or_default() += 1;
        if v != Verdict::DroppedWithin && out.examples.len() < 50 {
            out.examples.push(RefusalVerdict {
                shard,
                refusal: r.clone(),
                verdict: v,
            });
        }
    }
    out.grants = grants.len();
    out
}

#[cfg(test)]
#[path = "handover_tests.rs"]
mod tests;
