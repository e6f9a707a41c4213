//! The alert timeline, the gate and the summary on synthetic `ALERTS` series.

use super::*;

fn series(name: &str, state: &str, shard: &str, at_s: &[u64]) -> Series {
    let metric = [
        ("__name__", "ALERTS"),
        ("alertname", name),
        ("alertstate", state),
        ("severity", "critical"),
        ("shard", shard),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    Series {
        metric,
        values: at_s.iter().map(|&t| (t as f64, "1".into())).collect(),
    }
}

#[test]
fn episodes_join_pending_and_firing_and_split_on_gaps() {
    let s = [
        series("A", "pending", "3", &[100, 101, 102]),
        series("A", "firing", "3", &[103, 104, 110]),
        series("A", "pending", "4", &[120]),
    ];
    let e = episodes(&s, 1000, 120_000);
    assert_eq!(e.len(), 3, "{e:?}");
    assert_eq!(
        (
            e[0].pending_unix_ms,
            e[0].fired_unix_ms,
            e[0].resolved_unix_ms
        ),
        (100_000, Some(103_000), Some(105_000))
    );
    assert_eq!(e[0].labels, "shard=3");
    // Firing again after a gap: a new episode, firing from its first step.
    assert_eq!(
        (
            e[1].pending_unix_ms,
            e[1].fired_unix_ms,
            e[1].resolved_unix_ms
        ),
        (110_000, Some(110_000), Some(111_000))
    );
    // Seen at the last step: still active; never firing.
    assert_eq!((e[2].fired_unix_ms, e[2].resolved_unix_ms), (None, None));
}

fn report(episodes: Vec<Episode>, expected: Expectation) -> ScenarioReport {
    ScenarioReport {
        event_unix_ms: 1_000,
        alerts: Some(AlertReport {
            expected,
            episodes,
            ..AlertReport::default()
        }),
        ..ScenarioReport::default()
    }
}

fn ep(alert: &str, fired: bool) -> Episode {
    Episode {
        alert: alert.into(),
        labels: String::new(),
        severity: "critical".into(),
        pending_unix_ms: 2_000,
        fired_unix_ms: fired.then_some(8_000),
        resolved_unix_ms: Some(9_000),
    }
}

#[test]
fn the_gate_wants_every_must_and_nothing_unlisted() {
    let must = Expectation {
        must: vec!["A"],
        may: vec![("B", "borderline")],
        ..Expectation::default()
    };
    let mut r = report(
        vec![ep("A", true), ep("B", true), ep("C", false)],
        must.clone(),
    );
    check(&mut r);
    assert!(r.passed(), "{:?}", r.checks);
    assert_eq!(
        r.checks[0].detail,
        "pending +1 s, firing +7 s, resolved +8 s"
    );
    // Pending only is not firing.
    let mut r = report(vec![ep("A", false)], must.clone());
    check(&mut r);
    assert!(!r.passed());
    assert_eq!(
        r.checks[0].detail,
        "pending +1 s, never firing, resolved +8 s"
    );
    let mut r = report(vec![], must);
    check(&mut r);
    assert_eq!(r.checks[0].detail, "never pending");
    assert!(!r.passed());
    // Nothing expected: anything firing fails.
    let mut r = report(vec![ep("C", true)], Expectation::default());
    check(&mut r);
    assert!(!r.passed());
    assert!(
        r.checks[0].detail.contains("not expected here: [\"C\"]"),
        "{:?}",
        r.checks
    );
    // Without Prometheus there is nothing to gate.
    let mut r = ScenarioReport::default();
    check(&mut r);
    assert!(r.checks.is_empty());
}

#[test]
fn the_summary_groups_episodes_per_alert_relative_to_the_event() {
    let mut a = ep("A", true);
    a.labels = "shard=3".into();
    let mut b = ep("A", false);
    b.labels = "shard=4".into();
    b.resolved_unix_ms = None;
    let mut r = report(vec![a, b, ep("B", false)], expect(Scenario::Kill));
    if let Some(x) = r.alerts.as_mut() {
        x.started_unix_ms = 0;
    }
    let mut md = String::new();
    lines(&mut md, &r);
    assert!(md.starts_with("- alerts (rules' for and range windows / 0; times relative to the event, which was 1.0 s into"), "{md}");
    assert!(
        md.contains("\n  - A (critical), 2 episode(s) [shard=3; shard=4]: pending +1 s, firing +7 s, still active\n"),
        "{md}"
    );
    assert!(
        md.contains(
            "\n  - B (critical), 1 episode(s): pending +1 s, never firing, all resolved +8 s\n"
        ),
        "{md}"
    );
    assert!(
        md.contains("\n  - cannot fire here: PosgateShardWithoutOwner: "),
        "{md}"
    );
    assert_eq!(
        timeline(&r),
        "alerts fired: A (pending +1 s, firing +7 s, resolved +8 s)"
    );
}

#[test]
fn every_expected_alert_is_a_rule_of_the_project() {
    let names: Vec<String> = super::super::rules::rules(super::super::rules::ALERTS_YAML)
        .into_iter()
        .map(|r| r.alert)
        .collect();
    for sc in Scenario::ALL.into_iter().chain(Scenario::EXPLICIT) {
        let e = expect(sc);
        let listed = e.must.iter().chain(e.may.iter().map(|m| &m.0));
        for n in listed.chain(e.cannot.iter().map(|m| &m.0)) {
            assert!(names.iter().any(|r| r == n), "{}: {n}", sc.name());
        }
    }
}
