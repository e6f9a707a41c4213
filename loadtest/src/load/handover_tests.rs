//! Handover gaps and stale-epoch verdicts on synthetic samples.

use super::*;
use crate::load::observe::PodObs;

/// A pod that answered `answered_ms` serving `shards` (shard, epoch in its own view).
fn pod(name: &str, answered_ms: u64, shards: &Served) -> PodObs {
    PodObs {
        pod: name.into(),
        answered_unix_ms: answered_ms,
        serving: shards.to_vec(),
        sessions: 0,
    }
}

/// Shards a pod serves, each with the epoch its own view gives.
type Served = [(u32, Option<u64>)];

/// A sample taken at `at` with the given answers (answered 5 ms later).
fn sample(at: u64, pods: &[(&str, &Served)]) -> Sample {
    Sample {
        at_unix_ms: at,
        pods: pods.iter().map(|(n, s)| pod(n, at + 5, s)).collect(),
        ..Sample::default()
    }
}

const S: u32 = 1;
const SERVES: &Served = &[(S, None)];
const IDLE: &Served = &[];

#[test]
fn gap_runs_from_first_sample_without_the_old_owner_to_first_with_the_new() {
    let samples = vec![
        sample(0, &[("a", SERVES), ("b", IDLE)]),
        sample(250, &[("a", SERVES), ("b", IDLE)]),
        sample(500, &[("a", IDLE), ("b", IDLE)]),
        sample(750, &[("a", IDLE), ("b", IDLE)]),
        sample(1000, &[("a", IDLE), ("b", SERVES)]),
        sample(1250, &[("a", IDLE), ("b", SERVES)]),
    ];
    let h = handovers(&samples, 4, 250);
    assert_eq!((h.handovers, h.shards, h.unfinished), (1, 1, 0));
    assert_eq!(
        h.list[0],
        Handover {
            shard: S,
            from: "a".into(),
            to: "b".into(),
            stopped_unix_ms: 500,
            serving_unix_ms: 1000,
            gap_ms: 500,
        }
    );
    assert_eq!((h.gap_ms.p50, h.gap_ms.max), (500, 500));
    assert_eq!(h.sample_spacing_ms.max, 250);
    assert_eq!(h.two_serving_samples, 0);
}

#[test]
fn a_silent_sample_is_no_handover_but_a_killed_owner_stops_at_its_first_silence() {
    let samples = vec![
        sample(0, &[("a", SERVES), ("b", IDLE)]),
        // a does not answer once, then serves again: same owner, nothing moved.
        sample(250, &[("b", IDLE)]),
        sample(500, &[("a", SERVES), ("b", IDLE)]),
        // a is killed: never answers again; b takes over later.
        sample(750, &[("b", IDLE)]),
        sample(1000, &[("b", IDLE)]),
        sample(1500, &[("b", SERVES)]),
    ];
    let h = handovers(&samples, 4, 250);
    assert_eq!(h.handovers, 1, "{:?}", h.list);
    assert_eq!((h.list[0].stopped_unix_ms, h.list[0].gap_ms), (750, 750));
    assert_eq!(h.sample_spacing_ms.max, 500);
}

#[test]
fn a_handover_inside_one_round_is_a_zero_gap_and_counted_as_two_serving() {
    let samples = vec![
        sample(0, &[("a", SERVES), ("b", IDLE)]),
        sample(250, &[("a", SERVES), ("b", SERVES)]),
        sample(500, &[("a", IDLE), ("b", SERVES)]),
    ];
    let h = handovers(&samples, 4, 250);
    assert_eq!(h.handovers, 1);
    assert_eq!(h.list[0].gap_ms, 0);
    assert_eq!(h.two_serving_samples, 1);
}

#[test]
fn moves_back_and_forth_count_each_and_an_open_ending_is_unfinished() {
    let two: &Served = &[(2, None)];
    let samples = vec![
        sample(0, &[("a", two), ("b", SERVES)]),
        sample(250, &[("a", IDLE), ("b", SERVES)]),
        sample(500, &[("a", IDLE), ("b", two)]),
        sample(750, &[("a", two), ("b", IDLE)]),
        sample(1000, &[("a", two), ("b", IDLE)]),
    ];
    let h = handovers(&samples, 4, 250);
    // Shard 2: a -> b (gap 250), then b -> a within one round (gap 0); shard 1: b
    // stopped serving it and nobody took it.
    assert_eq!((h.handovers, h.shards, h.unfinished), (2, 1, 1));
    let gaps: Vec<(&str, &str, u64)> = h
        .list
        .iter()
        .map(|x| (x.from.as_str(), x.to.as_str(), x.gap_ms))
        .collect();
    assert_eq!(gaps, [("a", "b", 250), ("b", "a", 0)]);
}

fn refusal(pod: &str, epoch: u64, at: u64) -> Refusal {
    Refusal {
        terminal: "pos-00000".into(),
        pod: pod.into(),
        kind: "hello".into(),
        epoch,
        highest: epoch + 1,
        at_unix_ms: at,
    }
}

/// Shard of `pos-00000` of 64 (docs/design.md's test vector).
const T: u32 = 62;

fn serving(epoch: Option<u64>) -> Vec<(u32, Option<u64>)> {
    vec![(T, epoch)]
}

#[test]
fn refusal_verdicts() {
    let r = refusal("p", 5, 1_000);
    let at = |t: u64, s: Vec<(u32, Option<u64>)>| Sample {
        at_unix_ms: t,
        pods: vec![pod("p", t + 5, &s)],
        ..Sample::default()
    };
    let v = |samples: &[Sample]| verdict(samples, &r, T, 1_000, 500);
    // Asked before the refusal: says nothing about afterwards, even if answered after.
    let early = at(990, vec![]);
    assert_eq!(v(std::slice::from_ref(&early)), Verdict::Undetermined);
    // Seen serving, then not, within the second.
    let within = [early, at(1_100, serving(Some(5))), at(1_350, vec![])];
    assert_eq!(v(&within), Verdict::DroppedWithin);
    // Serving a newer grant of its own is a drop of the refused one.
    assert_eq!(v(&[at(1_350, serving(Some(9)))]), Verdict::DroppedWithin);
    // Still serving at the last sample before the limit, gone at the first after it.
    let next = [at(1_900, serving(Some(5))), at(2_100, vec![])];
    assert_eq!(v(&next), Verdict::DroppedByNextSample);
    // Still serving (refused or unknown epoch) in a sample asked after the limit.
    assert_eq!(v(&[at(2_100, serving(Some(5)))]), Verdict::StillServing);
    assert_eq!(v(&[at(2_100, serving(None))]), Verdict::StillServing);
    // Gone, but first seen long after the limit: when it dropped is unknown.
    assert_eq!(v(&[at(4_000, vec![])]), Verdict::Undetermined);
    // Another pod's answers do not count.
    let other = Sample {
        at_unix_ms: 1_100,
        pods: vec![pod("q", 1_105, &[])],
        ..Sample::default()
    };
    assert_eq!(v(&[other]), Verdict::Undetermined);
}

#[test]
fn stale_check_counts_kinds_grants_and_verdicts() {
    let samples = vec![Sample {
        at_unix_ms: 1_200,
        pods: vec![pod("p", 1_205, &[]), pod("q", 1_205, &serving(Some(3)))],
        ..Sample::default()
    }];
    let mut push = refusal("p", 5, 1_000);
    push.kind = "push".into();
    let refusals = [refusal("p", 5, 1_000), push, refusal("q", 3, 1_000)];
    let c = stale_check(&samples, &refusals, 64, 1_000, 500, 0);
    assert_eq!((c.refusals, c.hellos, c.pushes, c.grants), (3, 2, 1, 2));
    assert_eq!(c.count(Verdict::DroppedWithin), 2);
    // q still serves the refused epoch, but no sample after the limit shows it.
    assert_eq!(c.count(Verdict::Undetermined), 1);
    assert_eq!(c.examples.len(), 1);
    assert_eq!(c.examples[0].refusal.pod, "q");
}
