//! The observability artefacts in `k8s/observability/` against the code:
//!
//! - every `posgate_*` metric named in the Grafana dashboard and in the alert rules is
//!   documented in `docs/metrics.md` (histogram series `_bucket`/`_sum`/`_count` count as
//!   their family);
//! - with `promtool` on PATH (Debian package `prometheus`; `scripts/test` installs it):
//!   `promtool test rules alerts_test.yaml`, `promtool check rules alerts.yaml`, and every
//!   dashboard query parses as PromQL (Grafana variables replaced by sample values);
//!   without it those checks print "skipped" and pass, except under `CI=true`, where
//!   they fail (`support::tools`);
//! - `prometheusrule.yaml` (the operator's wrapping of the rules) is exactly what
//!   `scripts/gen-prometheusrule` makes of `alerts.yaml` today;
//! - every alert links its runbook, a heading of `docs/operations.md`;
//! - the dashboard is JSON with the expected variables, and every panel has a title and a
//!   query;
//! - a live pod (`Pod::start_with_terminals` against a real `redis-server`, like
//!   `tests/push_api/`) serves every metric the dashboard and the rules use, and its
//!   scrape passes `promtool check metrics` (when promtool is installed) in the classic
//!   text format it gets without asking for OpenMetrics, and Prometheus' `Accept` gets
//!   OpenMetrics with the same samples.
//!
//! `dashboard` has the dashboard's checks, `live_scrape` the live pod's; the others and
//! the helpers all three share are here.

mod dashboard;
mod live_scrape;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{api, pod, RedisServer};

const DASHBOARD: &str = "k8s/observability/dashboard.json";
const ALERTS: &str = "k8s/observability/alerts.yaml";
const ALERTS_TEST: &str = "k8s/observability/alerts_test.yaml";
const PROMETHEUS_RULE: &str = "k8s/observability/prometheusrule.yaml";
const INSTALL: &str = "Debian package prometheus; scripts/test installs it";
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// `docs/metrics.md`'s table rows `| `posgate_x` | type | ...`: name -> type.
fn documented() -> BTreeMap<String, String> {
    let doc = read("docs/metrics.md");
    let metrics: BTreeMap<String, String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `posgate_"))
        .map(|rest| {
            let (name, after) = rest.split_once('`').expect("closing backtick");
            let kind = after
                .trim_start_matches([' ', '|'])
                .split('|')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            (format!("posgate_{name}"), kind)
        })
        .collect();
    assert!(
        metrics.len() >= 20,
        "docs/metrics.md: expected its metric tables, found {metrics:?}"
    );
    metrics
}

/// Every `posgate_<name>` token in `text` (queries, descriptions and comments alike).
fn posgate_tokens(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(i) = text[from..].find("posgate_") {
        let start = from + i;
        let word_start = start == 0 || {
            let b = bytes[start - 1];
            !(b.is_ascii_alphanumeric() || b == b'_' || b == b':')
        };
        let mut end = start + "posgate_".len();
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if word_start && end > start + "posgate_".len() {
            out.insert(text[start..end].to_string());
        }
        from = end;
    }
    out
}

/// The metric families `text` uses: a histogram's series name its family.
fn families_used(text: &str, documented: &BTreeMap<String, String>) -> BTreeSet<String> {
    posgate_tokens(text)
        .into_iter()
        .map(|name| {
            if documented.contains_key(&name) {
                return name;
            }
            for suffix in HISTOGRAM_SUFFIXES {
                if let Some(base) = name.strip_suffix(suffix) {
                    if documented
                        .get(base)
                        .is_some_and(|k| k.starts_with("histogram"))
                    {
                        return base.to_string();
                    }
                }
            }
            name
        })
        .collect()
}

/// (file, family) for every metric the dashboard and the rules use.
fn used_by_artefacts(documented: &BTreeMap<String, String>) -> Vec<(&'static str, String)> {
    let mut used = Vec::new();
    for file in [DASHBOARD, ALERTS] {
        let families = families_used(&read(file), documented);
        assert!(!families.is_empty(), "{file} names no posgate metric");
        used.extend(families.into_iter().map(|f| (file, f)));
    }
    used
}

#[test]
fn every_metric_used_by_dashboard_and_rules_is_documented() {
    let documented = documented();
    let used = used_by_artefacts(&documented);
    let undocumented: Vec<_> = used
        .iter()
        .filter(|(_, f)| !documented.contains_key(f))
        .collect();
    assert!(
        undocumented.is_empty(),
        "metrics used but not in docs/metrics.md: {undocumented:?}"
    );
    // The scale-event essentials are on the dashboard and in the rules.
    let dashboard = families_used(&read(DASHBOARD), &documented);
    for needed in [
        "posgate_shards_served",
        "posgate_terminals",
        "posgate_rebalances_total",
        "posgate_rebalance_duration_seconds",
        "posgate_shard_served",
        "posgate_shards_without_owner",
        "posgate_shard_stops_total",
        "posgate_dials_total",
        "posgate_dial_queue_depth",
        "posgate_dial_wait_seconds",
        "posgate_push_requests_total",
        "posgate_push_duration_seconds",
        "posgate_store_op_duration_seconds",
        "posgate_lease_ops_total",
        "posgate_store_errors_total",
        "posgate_store_reachable",
        "posgate_members",
        // Redis outages: what is held, whether pushes still flow, for how long.
        "posgate_shards_suspended",
        "posgate_pushes_on_suspended_shards_total",
        "posgate_store_verdict",
        "posgate_store_unreachable_seconds",
        // Pushes kept for later: how many, how old, how they end.
        "posgate_queue_pushes",
        "posgate_queue_bytes",
        "posgate_queue_oldest_connected_seconds",
        "posgate_queue_finals_total",
        "posgate_queue_copies_total",
    ] {
        assert!(
            dashboard.contains(needed),
            "dashboard does not show {needed}"
        );
    }
    let rules = families_used(&read(ALERTS), &documented);
    for needed in [
        "posgate_shard_served",
        "posgate_lease_ops_total",
        "posgate_store_errors_total",
        "posgate_terminals",
        "posgate_push_requests_total",
        "posgate_store_reachable",
        "posgate_store_verdict",
        "posgate_store_unreachable_seconds",
        "posgate_queue_oldest_connected_seconds",
        "posgate_queue_bytes",
        "posgate_queue_max_bytes",
    ] {
        assert!(rules.contains(needed), "alert rules do not use {needed}");
    }
    eprintln!(
        "[observability] {} metric families used by dashboard + rules, all documented",
        used.iter().map(|(_, f)| f).collect::<BTreeSet<_>>().len()
    );
}

/// `promtool args..` in the repository root, `None` when promtool is not installed
/// (see [`crate::support::tools::require`]); `unchecked` says what is then not checked.
fn promtool(args: &[&str], stdin: Option<&[u8]>, unchecked: &str) -> Option<Output> {
    let output = run_promtool(args, stdin);
    crate::support::tools::require(output, "promtool", unchecked, INSTALL)
}

fn run_promtool(args: &[&str], stdin: Option<&[u8]>) -> Option<Output> {
    let mut command = Command::new("promtool");
    command
        .args(args)
        .current_dir(root())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("write promtool stdin");
    }
    Some(child.wait_with_output().expect("promtool output"))
}

fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn alert_rules_pass_promtool() {
    let Some(version) = promtool(&["--version"], None, "alert rules not checked") else {
        return;
    };
    eprintln!(
        "[observability] {}",
        String::from_utf8_lossy(&version.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&version.stderr).lines())
            .next()
            .unwrap_or("promtool")
    );
    let check = run_promtool(&["check", "rules", ALERTS], None).expect("promtool");
    assert!(
        check.status.success(),
        "promtool check rules: {}",
        describe(&check)
    );
    let test = run_promtool(&["test", "rules", ALERTS_TEST], None).expect("promtool");
    assert!(
        test.status.success(),
        "promtool test rules: {}",
        describe(&test)
    );
    eprintln!("[observability] promtool check rules + test rules: ok");
}

#[test]
fn prometheus_rule_is_generated_from_the_alert_rules() {
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let status = Command::new("bash")
        .arg(root().join("scripts/gen-prometheusrule"))
        .arg(out.path())
        .status()
        .expect("run scripts/gen-prometheusrule");
    assert!(status.success(), "scripts/gen-prometheusrule failed");
    let generated = std::fs::read_to_string(out.path()).expect("read generated rule");
    assert!(
        generated.contains("kind: PrometheusRule") && generated.contains("\n  groups:\n"),
        "generator output lost its shape:\n{generated}"
    );
    assert!(
        generated == read(PROMETHEUS_RULE),
        "{PROMETHEUS_RULE} is out of date with {ALERTS}: run scripts/gen-prometheusrule"
    );
}

/// Every alert's runbook link `docs/operations.md#<anchor>` names a heading of that file,
/// and every alert has one: an operator paged at night follows it.
#[test]
fn every_alert_links_a_runbook_section_that_exists() {
    let anchors: BTreeSet<String> = read("docs/operations.md")
        .lines()
        .filter_map(|l| l.strip_prefix("### ").or_else(|| l.strip_prefix("## ")))
        .map(|h| {
            // GitHub's anchors: lower case, spaces to '-', punctuation dropped.
            h.to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let rules = read(ALERTS);
    let mut problems = Vec::new();
    let mut alerts = 0;
    for block in rules.split("- alert: ").skip(1) {
        alerts += 1;
        let name = block.lines().next().unwrap_or("").trim();
        let anchor = block
            .split("docs/operations.md#")
            .nth(1)
            .map(|rest| rest.split(['"', ' ', '\n']).next().unwrap_or(""));
        match anchor {
            None => problems.push(format!("{name}: no docs/operations.md# runbook link")),
            Some(a) if !anchors.contains(a) => {
                problems.push(format!("{name}: docs/operations.md#{a} is not a heading"))
            }
            Some(_) => {}
        }
    }
    assert!(alerts >= 10, "found only {alerts} alerts in {ALERTS}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
