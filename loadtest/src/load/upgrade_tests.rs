//! The rolling-upgrade checks on synthetic input: which flags the old binary's help
//! lists, peer counters from OpenMetrics text, pushes by release path.

use std::path::PathBuf;

use super::*;
use crate::load::pushgen::{testing::push, Attempt};

const HELP: &str = "\
Run one gateway pod: join the cluster in Redis, own shards, serve HTTP

Usage: posgate serve [OPTIONS]

Options:
      --redis-url <URL>
          Redis URL of the coordination store, with --redis-client-key for mutual TLS
      --lease-ttl <LEASE_TTL>
          Lease time-to-live in the store [default: 15s]
  -h, --help
          Print help
";

fn args(list: &[&str]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}

#[test]
fn a_flag_counts_as_listed_only_where_a_line_starts_with_it() {
    let passed = args(&[
        "serve",
        "--redis-url",
        "redis://x",
        "--lease-ttl=3s",
        "--help",
        "--redis-client-key",
        "k.pem",
        "--dial-rate",
        "200",
    ]);
    // `--redis-client-key` is only mentioned in a description.
    assert_eq!(
        missing_flags(HELP, &passed),
        ["--redis-client-key", "--dial-rate"]
    );
    assert!(missing_flags(HELP, &args(&["serve", "--lease-ttl", "3s"])).is_empty());
}

#[test]
fn every_flag_the_harness_passes_is_checked() {
    let plan = PodPlan {
        posgate: PathBuf::from("posgate"),
        previous: None,
        pos_ca: PathBuf::from("ca.pem"),
        flags: vec!["--lease-ttl".into(), "3s".into()],
        env: Vec::new(),
        log_dir: PathBuf::from("logs"),
    };
    let passed = plan.serve_args("pod-0", 1, "redis://127.0.0.1:1/");
    let full: String = missing_flags("", &passed)
        .iter()
        .map(|f| format!("      {f} <X>\n"))
        .collect();
    assert!(missing_flags(&full, &passed).is_empty());
    for flag in [
        "--pod-id",
        "--advertise-url",
        "--pos-ca",
        "--log-format",
        "--lease-ttl",
    ] {
        let without: String = full
            .lines()
            .filter(|l| !l.contains(flag))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(missing_flags(&without, &passed), [flag]);
    }
    assert!(matches!(
        plan.binary(Release::Previous),
        Err(LoadError::Plan(m)) if m.contains("--old-posgate")
    ));
}

#[test]
fn peer_counters_from_openmetrics_text() {
    let text = "\
# HELP posgate_peer_legacy_requests Peer requests accepted in protocol 1.
# TYPE posgate_peer_legacy_requests counter
posgate_peer_legacy_requests_total 17
# HELP posgate_peer_requests_refused Requests to the peer endpoints refused.
# TYPE posgate_peer_requests_refused counter
posgate_peer_requests_refused_total{reason=\"replay\"} 0
posgate_peer_requests_refused_total{reason=\"legacy_refused\"} 2
posgate_peer_requests_refused_seconds_total 9
posgate_pushes_total{result=\"ok\"} 100
# EOF
";
    let c = PeerCounters::parse(text);
    assert_eq!(c.legacy_accepted, 17);
    assert_eq!(c.refused, BTreeMap::from([("legacy_refused".into(), 2)]));
    let mut sum = c.clone();
    sum.add(&c);
    assert_eq!((sum.legacy_accepted, sum.refused_total()), (34, 4));
    assert_eq!(PeerCounters::parse(""), PeerCounters::default());
}

fn attempt(pod: &str, sent: u64, status: u16, by: Option<&str>) -> Attempt {
    Attempt {
        sent_unix_ms: sent,
        entry_pod: pod.into(),
        status,
        outcome: if status == 200 { "ok" } else { "pos_timeout" }.into(),
        latency_ms: 2,
        unanswered: status == 0,
        delivered_by: by.map(str::to_owned),
    }
}

#[test]
fn mixed_pushes_by_path_between_the_releases() {
    let releases = BTreeMap::from([
        ("pod-0".to_string(), Release::Previous),
        ("pod-1".to_string(), Release::Previous),
        ("pod-5".to_string(), Release::Current),
        ("pod-6".to_string(), Release::Current),
    ]);
    let pushes = [
        // Before the window: not counted.
        push(attempt("pod-0", 900, 200, Some("pod-5")), vec![]),
        push(attempt("pod-0", 1_000, 200, Some("pod-5")), vec![]),
        push(attempt("pod-5", 1_100, 200, Some("pod-1")), vec![]),
        push(attempt("pod-1", 1_200, 200, Some("pod-1")), vec![]),
        push(attempt("pod-0", 1_300, 200, Some("pod-1")), vec![]),
        // 504 through an old pod, then delivered new -> new.
        push(
            attempt("pod-1", 1_400, 504, None),
            vec![attempt("pod-6", 1_700, 200, Some("pod-5"))],
        ),
        // A `pod` the trace does not know is counted but not as across.
        push(attempt("pod-6", 1_800, 200, Some("pod-9")), vec![]),
        // After the window.
        push(attempt("pod-5", 2_001, 200, Some("pod-0")), vec![]),
    ];
    let m = mixed_pushes(&pushes, &releases, 1_000, 2_000);
    assert_eq!((m.pushes, m.first_ok, m.final_ok), (6, 5, 6));
    let paths: Vec<(&str, usize)> = m
        .delivered_by_path
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        paths,
        [
            ("new -> ?", 1),
            ("new -> new", 1),
            ("new -> old", 1),
            ("old -> new", 1),
            ("old -> old", 1),
            ("old local", 1),
        ]
    );
    assert_eq!(m.across_releases, 2);
    assert_eq!(m.outcomes_by_entry["old: 504 pos_timeout"], 1);
    assert_eq!(m.outcomes_by_entry["old: 200 ok"], 3);
    assert_eq!(m.outcomes_by_entry["new: 200 ok"], 3);
}

fn step(legacy: u64, refused: &[(&str, u64)]) -> Step {
    Step {
        new_pod: "pod-5".into(),
        old_pod: "pod-0".into(),
        new_started_unix_ms: 1_000,
        new_ready_unix_ms: 1_500,
        old_signalled_unix_ms: 2_000,
        old_left: 0,
        peer: PeerCounters {
            legacy_accepted: legacy,
            refused: refused.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
        },
        unscraped: Vec::new(),
    }
}

/// The checks' (gate, pass) for an upgrade whose last step ends the mixed phase with
/// `mixed_end`, with `end` refusals at the end and `across` pushes forwarded between
/// the releases.
fn checked(mixed_end: Step, end: &[(&str, u64)], across: usize) -> Vec<(bool, bool)> {
    let mut r = ScenarioReport {
        upgrade: Some(UpgradeReport {
            end: PeerCounters {
                legacy_accepted: mixed_end.peer.legacy_accepted,
                refused: end.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
            },
            mixed_end: mixed_end.peer.clone(),
            steps: vec![step(0, &[]), mixed_end],
            mixed: MixedPushes {
                across_releases: across,
                ..MixedPushes::default()
            },
            ..UpgradeReport::default()
        }),
        ..ScenarioReport::default()
    };
    checks(&mut r);
    r.checks.iter().map(|c| (c.gate, c.pass)).collect()
}

#[test]
fn the_gate_needs_pushes_forwarded_between_the_releases() {
    // Gate: pushes forwarded across the releases, whether or not the old release spoke
    // protocol 1 (legacy requests); target: refusals.
    assert_eq!(checked(step(3, &[]), &[], 5), [(true, true), (false, true)]);
    assert_eq!(checked(step(0, &[]), &[], 5), [(true, true), (false, true)]);
    assert_eq!(
        checked(step(3, &[]), &[], 0),
        [(true, false), (false, true)]
    );
    // legacy_refused after the last old pod left is expected; during it is not.
    let after = [("legacy_refused", 2)];
    assert_eq!(
        checked(step(3, &[]), &after, 5),
        [(true, true), (false, true)]
    );
    let during = step(3, &[("legacy_refused", 1)]);
    assert_eq!(checked(during, &after, 5), [(true, true), (false, false)]);
    let other = [("bad_signature", 1)];
    assert_eq!(
        checked(step(3, &[]), &other, 5),
        [(true, true), (false, false)]
    );
    // No upgrade part: no checks.
    let mut r = ScenarioReport::default();
    checks(&mut r);
    assert!(r.checks.is_empty());
}
