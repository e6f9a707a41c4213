//! What a scenario's pushes came to ([`PushSummary`]): outcomes per attempt and per push
//! (after the sender's retries), latency of the answered attempts, and the attempts left
//! unanswered, excused when their entry pod was the one killed or paused.
//!
//! The unanswered gate stays per attempt: a healthy pod that leaves a request without an
//! answer past its deadline + 1 s is a defect even when the sender's retry then succeeds.
//!
//! Not for: sending (`pushgen`) or keys delivered twice (`duplicates`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::pushgen::{Attempt, PushRecord};
use posgate_pos_sim::dist::{dist, Dist};

/// Pushes sent during a scenario and their outcomes. A push is one idempotency key; its
/// attempts are the first send and the sender's retries (`pushgen`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PushSummary {
    pub sent: usize,
    /// Every attempt, retries included.
    pub attempts: usize,
    /// Pushes sent more than once.
    pub retried: usize,
    /// Per attempt: `ok` (200) or the error code / `transport` / `unanswered`, with its
    /// status.
    pub by_outcome: BTreeMap<String, usize>,
    /// Per push, its last attempt's outcome (what the sender ended with).
    pub by_final_outcome: BTreeMap<String, usize>,
    /// Latency of the answered attempts, ms.
    pub latency_ms: Dist,
    /// Attempts with no answer within deadline + 1 s, entry pod healthy: a gateway
    /// defect, whether or not a retry then succeeded.
    pub unanswered: usize,
    /// Attempts with no answer, but the pod they were sent to was killed or paused
    /// meanwhile.
    pub unanswered_entry_faulted: usize,
    /// Pushes whose every attempt went unanswered.
    pub gave_up_unanswered: usize,
    /// Share of pushes whose first attempt was answered 200.
    pub ok_ratio: f64,
    /// Share of pushes answered 200 in the end (after retries).
    pub final_ok_ratio: f64,
    /// The first 50 pushes with an unanswered attempt, for diagnosis.
    pub unanswered_examples: Vec<super::pushgen::PushRecord>,
}

/// Whether `attempt` went to a pod killed or paused (`hard_faults`: pod, from, to) while
/// it could have been answered: an unanswered attempt there is excused.
fn entry_faulted(attempt: &Attempt, hard_faults: &[(String, u64, u64)], timeout_ms: u64) -> bool {
    hard_faults.iter().any(|(pod, from, to)| {
        *pod == attempt.entry_pod
            && attempt.sent_unix_ms + timeout_ms + 1000 >= *from
            && attempt.sent_unix_ms <= *to
    })
}

pub(crate) fn outcome_key(a: &Attempt) -> String {
    if a.status == 0 {
        a.outcome.clone()
    } else {
        format!("{} {}", a.status, a.outcome)
    }
}

/// The summary of a scenario's pushes; `hard_faults` as in [`super::scenarios::Action`],
/// `timeout_ms` the pushes' deadline.
pub fn summarize(
    pushes: &[PushRecord],
    hard_faults: &[(String, u64, u64)],
    timeout_ms: u64,
) -> PushSummary {
    let mut s = PushSummary {
        sent: pushes.len(),
        ..PushSummary::default()
    };
    let mut latencies = Vec::new();
    for p in pushes {
        let mut unanswered_here = false;
        for a in p.attempts() {
            s.attempts += 1;
            *s.by_outcome.entry(outcome_key(a)).or_default() += 1;
            if a.unanswered {
                unanswered_here = true;
                if entry_faulted(a, hard_faults, timeout_ms) {
                    s.unanswered_entry_faulted += 1;
                } else {
                    s.unanswered += 1;
                }
            } else if a.status != 0 {
                latencies.push(a.latency_ms);
            }
        }
        *s.by_final_outcome.entry(outcome_key(p.last())).or_default() += 1;
        s.retried += usize::from(!p.retries.is_empty());
        s.gave_up_unanswered += usize::from(p.attempts().all(|a| a.unanswered));
        if unanswered_here && s.unanswered_examples.len() < 50 {
            s.unanswered_examples.push(p.clone());
        }
    }
    let share = |n: usize| {
        if pushes.is_empty() {
            1.0
        } else {
            n as f64 / pushes.len() as f64
        }
    };
    s.ok_ratio = share(pushes.iter().filter(|p| p.first.status == 200).count());
    s.final_ok_ratio = share(pushes.iter().filter(|p| p.last().status == 200).count());
    s.latency_ms = dist(latencies);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::pushgen::testing::{attempt, push};

    #[test]
    fn first_and_final_outcomes_and_unanswered_attempts() {
        let faults = [("pod-0".to_string(), 10_000, 12_000)];
        let pushes = [
            push(attempt("pod-1", 1_000, 200, "ok"), vec![]),
            // 504, then delivered through another pod.
            push(
                attempt("pod-1", 2_000, 504, "pos_timeout"),
                vec![attempt("pod-2", 2_300, 200, "ok")],
            ),
            // Sent to the pod being killed: excused; the retry answered.
            push(
                attempt("pod-0", 9_500, 0, "transport"),
                vec![attempt("pod-3", 9_800, 200, "ok")],
            ),
            // A healthy pod that never answered is a defect even though the retry worked.
            push(
                attempt("pod-1", 20_000, 0, "unanswered"),
                vec![attempt("pod-2", 26_300, 200, "ok")],
            ),
            // Every attempt unanswered.
            push(
                attempt("pod-1", 30_000, 0, "unanswered"),
                vec![
                    attempt("pod-2", 36_300, 0, "unanswered"),
                    attempt("pod-3", 42_600, 0, "transport"),
                ],
            ),
        ];
        let s = summarize(&pushes, &faults, 5_000);
        assert_eq!((s.sent, s.attempts, s.retried), (5, 10, 4));
        assert_eq!((s.unanswered, s.unanswered_entry_faulted), (4, 1));
        assert_eq!(s.gave_up_unanswered, 1);
        assert_eq!(s.ok_ratio, 0.2);
        assert_eq!(s.final_ok_ratio, 0.8);
        assert_eq!(s.by_outcome["200 ok"], 4);
        assert_eq!(s.by_outcome["504 pos_timeout"], 1);
        assert_eq!(s.by_final_outcome["200 ok"], 4);
        assert_eq!(s.by_final_outcome["transport"], 1);
        assert_eq!(s.latency_ms.count, 5, "answered attempts only");
        assert_eq!(s.unanswered_examples.len(), 3);
    }
}
