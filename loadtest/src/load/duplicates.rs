//! Keys delivered twice, by cause: each repeat pos-sim logged (who delivered this copy
//! and the one before it, `GET /duplicates`) is judged against the pods the scenario
//! killed.
//!
//! Two causes are inherent today and reported apart, not gated, because the design
//! accepts them and only a terminal that dedupes by key closes them:
//! - the pod that delivered a copy was killed (SIGKILL) before the next copy, and the
//!   next copy came from another pod: the killed owner's idempotency cache died with it,
//!   so the sender's retry (its answer was lost with the pod) is delivered again by the
//!   shard's next owner;
//! - the sender had been answered `504` (delivery unknown) and retried: the owner's
//!   attempt reached the terminal but its answer did not come back in time (the owner was
//!   slow, paused or cut off), and the retry is delivered again — by the same pod, which
//!   frees a key after a `504`, or by the shard's next owner, whose cache never saw it.
//!
//! Every other repeat is a defect: the same pod delivering a key twice without a `504`
//! before (its cache did not replay), or another pod while the first one lived or was
//! stopped gracefully.
//!
//! Not for: counting duplicates (pos-sim's counters do) or deciding the gate (`measure`).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use posgate_pos_sim::Duplicate;

/// A copy pos-sim saw up to this long after the kill signal still came from the killed
/// pod: it sent it before it died, and the terminal read it a little later (loopback,
/// two busy cores). A pod cannot send anything once it is dead, so the slack cannot
/// excuse a delivery made after the kill.
pub const KILL_SLACK_MS: u64 = 1_000;

/// Why a key was accepted again. Inherent causes come first: a key's worst repeat (the
/// greatest) decides whether it counts as a defect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Inherent today: the pod that delivered the copy before was killed before this
    /// copy, which another pod delivered; the killed pod's idempotency cache died with it.
    OwnerKilledCacheLost,
    /// Inherent today: one pod delivered the key twice, and the sender had been answered
    /// `504` (delivery unknown) before retrying: the owner's attempt had reached the
    /// terminal but ended without its answer, and the owner frees the key after a `504`.
    SamePodAfterUnknown,
    /// Inherent today: another pod delivered it after the sender had been answered `504`
    /// (delivery unknown) and retried: the first owner's attempt reached the terminal
    /// without its answer coming back (e.g. it was paused), and the shard's next owner's
    /// cache never saw the key.
    OtherPodAfterUnknown,
    /// Defect: one pod delivered the key twice; its idempotency cache did not replay.
    SamePod,
    /// Defect: another pod delivered it while the first lived (or after it stopped
    /// gracefully), with no `504` before the retry.
    OtherPodFirstNotKilled,
}

impl Cause {
    /// Whether the design promises this cannot happen (so the gate fails on it).
    pub fn is_defect(self) -> bool {
        !matches!(
            self,
            Cause::OwnerKilledCacheLost | Cause::SamePodAfterUnknown | Cause::OtherPodAfterUnknown
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            Cause::OwnerKilledCacheLost => "owner killed, cache lost",
            Cause::SamePod => "same pod delivered twice",
            Cause::SamePodAfterUnknown => "same pod again after a 504 delivery unknown",
            Cause::OtherPodAfterUnknown => "another pod after a 504 delivery unknown",
            Cause::OtherPodFirstNotKilled => "another pod, the first not killed",
        }
    }
}

/// What the harness knows besides pos-sim's log.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// `(pod, unix ms of the SIGKILL)`.
    pub kills: Vec<(String, u64)>,
    /// Keys (as pos-sim records them, `tenant:key`) the sender retried after a `504`.
    pub retried_after_unknown: HashSet<String>,
}

/// The cause of one repeat.
pub fn cause(d: &Duplicate, e: &Evidence) -> Cause {
    let (before, now) = (&d.previous, &d.this);
    if before.pod == now.pod {
        return if e.retried_after_unknown.contains(&d.key) {
            Cause::SamePodAfterUnknown
        } else {
            Cause::SamePod
        };
    }
    let killed_between = e.kills.iter().any(|(pod, at)| {
        *pod == before.pod && before.at_unix_ms <= at + KILL_SLACK_MS && *at < now.at_unix_ms
    });
    if killed_between {
        Cause::OwnerKilledCacheLost
    } else if e.retried_after_unknown.contains(&d.key) {
        Cause::OtherPodAfterUnknown
    } else {
        Cause::OtherPodFirstNotKilled
    }
}

/// A repeat with its cause, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct Judged {
    pub cause: Cause,
    pub duplicate: Duplicate,
}

/// The keys delivered twice in one scenario, by cause.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DuplicateSummary {
    /// Keys accepted more than once (pos-sim's counter, each key once).
    pub keys: u64,
    /// Keys whose every repeat has an inherent cause: reported, not gated.
    pub keys_inherent: u64,
    /// Every other key, including any the log cannot explain: the gate is on these.
    pub keys_defect: u64,
    /// Keys the counters saw but pos-sim's log did not (dropped or outside the window):
    /// counted as defects, since nothing shows they are not.
    pub keys_unexplained: u64,
    /// Repeats (every copy after the first) in the log, by cause label.
    pub repeats_by_cause: BTreeMap<String, u64>,
    /// The first 20 repeats with their cause.
    pub examples: Vec<Judged>,
}

/// Judges `log` (this scenario's repeats) against `evidence`; `keys` is the counters'
/// number of keys delivered twice over the same window.
pub fn summarize(log: &[Duplicate], keys: u64, evidence: &Evidence) -> DuplicateSummary {
    let mut s = DuplicateSummary {
        keys,
        ..DuplicateSummary::default()
    };
    // Per key: whether its first repeat is in the log, and its worst cause.
    let mut per_key: HashMap<(&str, &str), (bool, Cause)> = HashMap::new();
    for d in log {
        let c = cause(d, evidence);
        *s.repeats_by_cause.entry(c.label().to_owned()).or_default() += 1;
        let slot = per_key
            .entry((d.terminal.as_str(), d.key.as_str()))
            .or_insert((false, c));
        slot.0 |= d.copy == 2;
        slot.1 = slot.1.max(c);
        if s.examples.len() < 20 {
            s.examples.push(Judged {
                cause: c,
                duplicate: d.clone(),
            });
        }
    }
    let explained = per_key.values().filter(|(second, _)| *second).count() as u64;
    s.keys_inherent = per_key
        .values()
        .filter(|(second, c)| *second && !c.is_defect())
        .count() as u64;
    s.keys_unexplained = keys.saturating_sub(explained);
    s.keys_defect = keys.saturating_sub(s.keys_inherent);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use posgate_pos_sim::Delivery;

    fn dup(key: &str, copy: u32, first: (&str, u64), second: (&str, u64)) -> Duplicate {
        let at = |(pod, at_unix_ms): (&str, u64)| Delivery {
            pod: pod.into(),
            epoch: 1,
            at_unix_ms,
        };
        Duplicate {
            terminal: "pos-00001".into(),
            key: format!("load:{key}"),
            copy,
            previous: at(first),
            this: at(second),
        }
    }

    fn kills() -> Evidence {
        Evidence {
            kills: vec![("pod-0".into(), 10_000)],
            ..Evidence::default()
        }
    }

    #[test]
    fn killed_owner_then_another_pod_is_the_inherent_case() {
        let d = dup("k", 2, ("pod-0", 9_990), ("pod-1", 13_500));
        assert_eq!(cause(&d, &kills()), Cause::OwnerKilledCacheLost);
        // A request the pod sent just before dying, read by the terminal just after.
        let late = dup("k", 2, ("pod-0", 10_400), ("pod-1", 13_500));
        assert_eq!(cause(&late, &kills()), Cause::OwnerKilledCacheLost);
    }

    #[test]
    fn the_same_pod_twice_is_a_defect_even_when_killed() {
        let d = dup("k", 2, ("pod-1", 1_000), ("pod-1", 2_000));
        assert_eq!(cause(&d, &kills()), Cause::SamePod);
        let d = dup("k", 2, ("pod-0", 9_000), ("pod-0", 9_500));
        assert_eq!(cause(&d, &kills()), Cause::SamePod);
    }

    #[test]
    fn the_same_pod_after_a_504_is_told_apart_and_inherent() {
        let mut e = kills();
        e.retried_after_unknown.insert("load:k".into());
        let d = dup("k", 2, ("pod-1", 1_000), ("pod-1", 1_250));
        assert_eq!(cause(&d, &e), Cause::SamePodAfterUnknown);
        assert!(!Cause::SamePodAfterUnknown.is_defect());
        assert!(Cause::SamePod.is_defect());
        // Another key of the same run, without a 504 before its retry.
        let d = dup("other", 2, ("pod-1", 1_000), ("pod-1", 1_250));
        assert_eq!(cause(&d, &e), Cause::SamePod);
    }

    #[test]
    fn another_pod_without_the_kill_in_between_is_a_defect() {
        // The first pod was never killed (a graceful stop is not in `kills`).
        let d = dup("k", 2, ("pod-2", 9_000), ("pod-1", 13_000));
        assert_eq!(cause(&d, &kills()), Cause::OtherPodFirstNotKilled);
        // The second copy came before the kill: both pods delivered while alive.
        let d = dup("k", 2, ("pod-0", 9_000), ("pod-1", 9_900));
        assert_eq!(cause(&d, &kills()), Cause::OtherPodFirstNotKilled);
        // The first copy long after the kill cannot be the killed pod's.
        let d = dup("k", 2, ("pod-0", 12_000), ("pod-1", 13_000));
        assert_eq!(cause(&d, &kills()), Cause::OtherPodFirstNotKilled);
        // No kill at all.
        let d = dup("k", 2, ("pod-0", 9_990), ("pod-1", 13_500));
        assert_eq!(
            cause(&d, &Evidence::default()),
            Cause::OtherPodFirstNotKilled
        );
    }

    #[test]
    fn another_pod_after_a_504_is_told_apart_and_inherent() {
        // The owner delivered, was paused before its answer came back (504 to the
        // sender), and the shard's next owner delivered the retry.
        let mut e = kills();
        e.retried_after_unknown.insert("load:k".into());
        let d = dup("k", 2, ("pod-2", 1_000), ("pod-1", 6_000));
        assert_eq!(cause(&d, &e), Cause::OtherPodAfterUnknown);
        assert!(!Cause::OtherPodAfterUnknown.is_defect());
        // Without the 504 before the retry it stays a defect.
        let d = dup("other", 2, ("pod-2", 1_000), ("pod-1", 6_000));
        assert_eq!(cause(&d, &e), Cause::OtherPodFirstNotKilled);
    }

    #[test]
    fn only_keys_whose_every_repeat_is_inherent_escape_the_gate() {
        let log = [
            dup("a", 2, ("pod-0", 9_990), ("pod-1", 13_000)),
            dup("b", 2, ("pod-0", 9_990), ("pod-1", 13_000)),
            // b's third copy by the same new owner: its cache should have replayed.
            dup("b", 3, ("pod-1", 13_000), ("pod-1", 14_000)),
            dup("c", 2, ("pod-2", 5_000), ("pod-2", 6_000)),
        ];
        let s = summarize(&log, 3, &kills());
        assert_eq!((s.keys, s.keys_inherent, s.keys_defect), (3, 1, 2));
        assert_eq!(s.keys_unexplained, 0);
        assert_eq!(s.repeats_by_cause["owner killed, cache lost"], 2);
        assert_eq!(s.repeats_by_cause["same pod delivered twice"], 2);
        // A key the counters saw but the log lost is a defect, not an excuse.
        let s = summarize(&log[..1], 2, &kills());
        assert_eq!(
            (s.keys_inherent, s.keys_defect, s.keys_unexplained),
            (1, 1, 1)
        );
    }
}
