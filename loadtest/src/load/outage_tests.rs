//! Push windows, the takeover check and the outage gates on synthetic records.

use super::*;
use crate::load::pushgen::testing::{attempt, push};

fn ok(sent: u64) -> PushRecord {
    push(attempt("pod-0", sent, 200, "ok"), vec![])
}

/// First answered `status`, then every retry answered `then`, 300 ms apart.
fn retried(sent: u64, status: u16, then: &[u16]) -> PushRecord {
    let retries = then
        .iter()
        .enumerate()
        .map(|(k, &s)| attempt("pod-1", sent + 300 * (k as u64 + 1), s, "x"))
        .collect();
    push(attempt("pod-0", sent, status, "x"), retries)
}

fn cut(pods: &[&str], from: u64, to: u64) -> Cut {
    Cut {
        pods: pods.iter().map(|p| p.to_string()).collect(),
        from_unix_ms: from,
        to_unix_ms: to,
    }
}

#[test]
fn a_push_counts_in_the_window_of_its_first_attempt_with_its_final_outcome() {
    let pushes = [
        ok(9_999),
        ok(10_000),
        // 503 during the outage, delivered by a retry sent after it ended.
        retried(19_900, 503, &[200]),
        // Never delivered.
        retried(15_000, 504, &[504, 0]),
        // First sent before the window, failed again by a retry sent inside it.
        retried(9_900, 0, &[503]),
        // The window's end is exclusive.
        ok(20_000),
    ];
    let w = PushWindow::count(&pushes, "during", "r".into(), (10_000, 20_000), None);
    assert_eq!((w.sent, w.ok_first, w.ok_final), (3, 1, 2));
    assert!((w.first_ok_ratio - 1.0 / 3.0).abs() < 1e-9);
    assert!((w.final_ok_ratio - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!(w.passes(), None, "not gated");
}

#[test]
fn the_gate_is_on_the_share_after_retries_and_an_empty_window_fails() {
    let mut pushes: Vec<PushRecord> = (0..999).map(|k| ok(1_000 + k)).collect();
    // One push delivered only by its retry: still counts as answered 200.
    pushes.push(retried(2_000, 503, &[200]));
    let window =
        |p: &[PushRecord]| PushWindow::count(p, "during", "r".into(), (0, 10_000), Some(0.999));
    let w = window(&pushes);
    assert_eq!((w.ok_first, w.ok_final), (999, 1_000));
    assert_eq!(w.passes(), Some(true));
    // Two of 1,000 never delivered: 99.8% < 99.9%.
    pushes[0] = retried(1_000, 503, &[503, 503]);
    pushes[1] = retried(1_001, 0, &[0, 0]);
    assert_eq!(window(&pushes).passes(), Some(false));
    pushes[1] = ok(1_001);
    assert_eq!(window(&pushes).passes(), Some(true), "999 of 1,000");
    assert_eq!(
        window(&[]).passes(),
        Some(false),
        "nothing sent proves nothing"
    );
}

#[test]
fn each_outage_scenario_has_its_windows() {
    let profile = Profile::quick();
    let c = cut(&["pod-4"], 10_000, 22_000);
    let pushes = [ok(9_000), ok(12_000), ok(19_000), ok(21_000), ok(25_000)];
    for sc in [Scenario::RedisOutage, Scenario::SinglePodOutage] {
        let w = push_windows(sc, &c, &profile, &pushes, 30_000);
        let spans: Vec<(u64, u64, usize, Option<f64>)> = w
            .iter()
            .map(|w| (w.from_unix_ms, w.to_unix_ms, w.sent, w.gate_min))
            .collect();
        assert_eq!(
            spans,
            [(10_000, 22_000, 3, Some(0.999)), (22_000, 30_000, 1, None)]
        );
    }
    // Quick: lease TTL 3 s + member TTL 3 s + 2 s after the cut.
    let w = push_windows(Scenario::PartialPartition, &c, &profile, &pushes, 30_000);
    assert_eq!(w[0].name, "before the takeover");
    assert_eq!(
        (w[0].to_unix_ms, w[0].sent, w[0].gate_min),
        (18_000, 1, None)
    );
    assert_eq!(w[1].name, "after the takeover");
    assert_eq!((w[1].from_unix_ms, w[1].to_unix_ms), (18_000, 30_000));
    assert_eq!((w[1].sent, w[1].gate_min), (3, Some(0.99)));
    assert!(w[1].rule.contains("lease TTL 3 s + member TTL 3 s + 2 s"));
    assert!(push_windows(Scenario::PodPartition, &c, &profile, &pushes, 30_000).is_empty());
}

fn owners(slots: &[Option<(&str, u64)>]) -> Owners {
    slots
        .iter()
        .map(|s| s.map(|(p, e)| (p.to_string(), e)))
        .collect()
}

fn at(t: u64, o: Owners) -> Sample {
    Sample {
        at_unix_ms: t,
        owners: Some(o),
        ..Sample::default()
    }
}

#[test]
fn a_takeover_is_a_pod_not_cut_off_with_a_higher_epoch_while_the_cut_stands() {
    let before = owners(&[
        Some(("pod-3", 10)),
        Some(("pod-4", 11)),
        Some(("pod-0", 5)),
        Some(("pod-4", 12)),
        Some(("pod-3", 13)),
    ]);
    let c = cut(&["pod-3", "pod-4"], 1_000, 9_000);
    let samples = [
        // Before the cut: does not count.
        at(900, owners(&[None, None, None, None, Some(("pod-1", 99))])),
        at(
            5_000,
            owners(&[
                Some(("pod-1", 20)),
                // The other cut-off pod is no takeover.
                Some(("pod-3", 30)),
                Some(("pod-0", 5)),
                // A pod not cut off, but under an epoch not above the old one.
                Some(("pod-2", 12)),
                None,
            ]),
        ),
        // After the restore: does not count.
        at(
            9_500,
            owners(&[None, Some(("pod-0", 40)), None, None, Some(("pod-1", 41))]),
        ),
    ];
    let t = takeover(&before, &samples, &c);
    assert_eq!(
        t,
        Takeover {
            shards: 4,
            taken_over: 1,
            not_taken_over: vec![1, 3, 4],
        }
    );
}

fn failed_gates(r: &ScenarioReport) -> Vec<String> {
    r.checks
        .iter()
        .filter(|c| c.gate && !c.pass)
        .map(|c| c.name.clone())
        .collect()
}

#[test]
fn the_outage_gates_fail_on_a_disconnect_a_moved_shard_or_a_missed_push() {
    let pushes: Vec<PushRecord> = (0..1_000).map(|k| ok(11_000 + k)).collect();
    let healthy = || ScenarioReport {
        push_windows: push_windows(
            Scenario::RedisOutage,
            &cut(&["pod-0"], 10_000, 22_000),
            &Profile::quick(),
            &pushes,
            30_000,
        ),
        ..ScenarioReport::default()
    };
    let mut r = healthy();
    checks(&mut r, Scenario::RedisOutage);
    assert_eq!(r.checks.len(), 3, "{:?}", r.checks);
    assert!(failed_gates(&r).is_empty(), "{:?}", r.checks);

    let mut r = healthy();
    r.connections_closed = 1;
    checks(&mut r, Scenario::SinglePodOutage);
    assert_eq!(failed_gates(&r), ["no terminal disconnected"]);

    let mut r = healthy();
    r.shard_moves = 1;
    checks(&mut r, Scenario::RedisOutage);
    assert_eq!(
        failed_gates(&r),
        ["same owners afterwards (no shard moved)"]
    );

    let mut r = healthy();
    r.push_windows[0].final_ok_ratio = 0.998;
    checks(&mut r, Scenario::RedisOutage);
    assert_eq!(
        failed_gates(&r),
        [">= 99.9% pushes 200 during the outage (first attempt or a retry)"]
    );
}

#[test]
fn a_partial_partition_fails_without_a_complete_takeover() {
    let name = "the rest take the cut-off half's shards over with higher epochs";
    let mut r = ScenarioReport::default();
    checks(&mut r, Scenario::PartialPartition);
    assert_eq!(failed_gates(&r), [name], "no ownership seen: no takeover");
    let mut r = ScenarioReport {
        takeover: Some(Takeover {
            shards: 25,
            taken_over: 24,
            not_taken_over: vec![7],
        }),
        ..ScenarioReport::default()
    };
    checks(&mut r, Scenario::PartialPartition);
    assert_eq!(failed_gates(&r), [name]);
    r.checks.clear();
    r.takeover = Some(Takeover {
        shards: 25,
        taken_over: 25,
        not_taken_over: vec![],
    });
    checks(&mut r, Scenario::PartialPartition);
    assert!(failed_gates(&r).is_empty(), "{:?}", r.checks);
}
