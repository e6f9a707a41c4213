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
//! - the dashboard is JSON with the expected variables, and every panel has a title and a
//!   query;
//! - a live pod (`Pod::start_with_terminals` against a real `redis-server`, like
//!   `tests/push_api.rs`) serves every metric the dashboard and the rules use, and its
//!   scrape passes `promtool check metrics` (when promtool is installed) in the classic
//!   text format it gets without asking for OpenMetrics, and Prometheus' `Accept` gets
//!   OpenMetrics with the same samples.

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

/// Every panel of the dashboard, rows' nested panels included.
fn all_panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("dashboard.panels is an array")
        .iter()
        .collect();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel.get("panels").and_then(Value::as_array) {
            stack.extend(nested);
        }
        out.push(panel);
    }
    out
}

/// Every query of the dashboard: panel targets and annotation queries.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut exprs: Vec<String> = all_panels(dashboard)
        .into_iter()
        .filter_map(|p| p.get("targets").and_then(Value::as_array))
        .flatten()
        .filter_map(|t| t.get("expr").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    if let Some(list) = dashboard["annotations"]["list"].as_array() {
        exprs.extend(
            list.iter()
                .filter_map(|a| a.get("expr").and_then(Value::as_str))
                .map(str::to_string),
        );
    }
    exprs
}

#[test]
fn dashboard_is_valid_json_with_a_query_per_panel() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("dashboard.json parses");
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36));

    let vars = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no `{name}` dashboard variable"))
    };
    let ds = var("datasource");
    assert_eq!(
        (ds["type"].as_str(), ds["query"].as_str()),
        (Some("datasource"), Some("prometheus"))
    );
    let pod = var("pod");
    assert_eq!(pod["type"], "query");
    assert_eq!(pod["definition"], "label_values(posgate_members, pod)");

    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in all_panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("");
        assert!(!title.is_empty(), "a panel without a title: {panel}");
        assert!(
            panel["id"].as_u64().is_some_and(|id| ids.insert(id)),
            "panel {title:?}: missing or duplicate id"
        );
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let exprs: Vec<&str> = targets
            .iter()
            .filter_map(|t| t["expr"].as_str())
            .filter(|e| !e.trim().is_empty())
            .collect();
        assert!(
            !exprs.is_empty(),
            "panel {title:?} has no target with an expr"
        );
        for target in targets {
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "panel {title:?}: a target not on the ${{datasource}} variable"
            );
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {title:?}"
        );
        queries += exprs.len();
    }
    eprintln!(
        "[observability] dashboard: {} panels, {queries} queries",
        ids.len()
    );

    // Every query parses as PromQL: as recording rules, Grafana's variables replaced.
    let exprs = dashboard_queries(&dashboard);
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "1m")
            .replace("$__interval", "1m")
            .replace("$pod", ".*")
            .replace("$dial_rate_limit", "200");
        assert!(!expr.contains('$'), "unknown variable in {expr}");
        let quoted = serde_json::to_string(&expr).expect("JSON string is a YAML string");
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {quoted}\n"
        ));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, rules).expect("write rules");
    let path = file.to_str().expect("UTF-8 path");
    let unchecked = "dashboard queries not parsed";
    let Some(out) = promtool(&["check", "rules", path], None, unchecked) else {
        return;
    };
    assert!(
        out.status.success(),
        "dashboard queries: {}",
        describe(&out)
    );
    eprintln!(
        "[observability] {} dashboard queries parse (promtool)",
        exprs.len()
    );
}

/// Metric families in a classic-format scrape, by their `# TYPE` lines (counters named
/// with `_total`, like their series and docs/metrics.md).
fn scraped_families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').expect("`# TYPE name kind`").0.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_scrape_has_every_metric_the_dashboard_and_rules_use() {
    let redis = RedisServer::start();
    let (listener, base) = pod::listen().await;
    let config = pod::config("obs-pod-0", &base);
    let mut pod = pod::start_with_terminals(config, &redis.url(), listener);

    let http = api::client();
    let scrape = || api::metrics(&http, &base);
    // Wait until the pod is a member and serves every shard (the sampler runs every
    // 500 ms), so the per-shard and state series are there too.
    let started = Instant::now();
    let text = loop {
        let text = scrape().await;
        if text.contains("posgate_members 1\n") && text.contains("posgate_shards_served 64\n") {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "pod did not serve all shards within 30 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "[observability] pod serves 64 shards after {:.2} s; scrape: {} bytes",
        started.elapsed().as_secs_f64(),
        text.len()
    );

    let documented = documented();
    let scraped = scraped_families(&text);
    let missing: Vec<_> = used_by_artefacts(&documented)
        .into_iter()
        .filter(|(_, f)| !scraped.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "used by dashboard/rules but not in a live /metrics scrape: {missing:?}\n{text}"
    );
    // The series the rules aggregate over exist with the labels the rules expect.
    for series in [
        "posgate_shard_served{shard=\"0\"} 1",
        "posgate_shard_served{shard=\"63\"} 1",
        "posgate_terminals{state=\"connected\"}",
        "posgate_lease_ops_total{op=\"renew\",outcome=\"held_by_other\"}",
        "posgate_lease_ops_total{op=\"renew\",outcome=\"missing\"}",
        "posgate_store_errors_total{op=\"renew\"}",
        "posgate_store_reachable 1",
        "posgate_store_verdict{verdict=\"reachable\"} 1",
        "posgate_store_verdict{verdict=\"cluster_wide\"} 0",
        "posgate_store_unreachable_seconds 0",
        "posgate_shards_suspended{delivery=\"delivering\"} 0",
        "posgate_shards_suspended{delivery=\"parked\"} 0",
        "posgate_pushes_on_suspended_shards_total 0",
        "posgate_push_requests_total{path=\"local\",result=\"ok\"}",
    ] {
        assert!(
            text.contains(series),
            "{series} missing from /metrics:\n{text}"
        );
    }
    assert!(
        text.lines().any(
            |l| l.starts_with("posgate_store_op_duration_seconds_bucket{")
                && l.contains("op=\"renew\"")
                && l.contains("le=")
        ),
        "no renew latency buckets in /metrics:\n{text}"
    );

    check_metrics_with_promtool(&text);
    check_content_negotiation(&http, &base).await;

    pod.shutdown();
    tokio::time::timeout(Duration::from_secs(10), pod.wait())
        .await
        .expect("pod stops within 10 s")
        .expect("pod stops cleanly");
}

/// `promtool check metrics` on a scrape in the classic text format (what `/metrics`
/// answers a client that does not ask for OpenMetrics): clean, no exception.
fn check_metrics_with_promtool(classic: &str) {
    let unchecked = "the scrape not checked";
    let Some(out) = promtool(&["check", "metrics"], Some(classic.as_bytes()), unchecked) else {
        return;
    };
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics (classic text format): {}",
        describe(&out)
    );
    eprintln!("[observability] promtool check metrics on the classic scrape: clean");
}

/// What Prometheus 2.x sends as `Accept` on a scrape.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// The same pod scraped as Prometheus does and as curl does: OpenMetrics (counter
/// families without `_total`, `# EOF` last) and the classic format (counters named like
/// their samples, no `# EOF`), with the same sample lines.
async fn check_content_negotiation(http: &api::Http, base: &str) {
    let (om_type, om) = api::metrics_as(http, base, Some(PROMETHEUS_ACCEPT)).await;
    let (classic_type, classic) = api::metrics_as(http, base, Some("text/plain")).await;
    assert!(
        om_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{om_type}"
    );
    assert!(
        classic_type.starts_with("text/plain; version=0.0.4"),
        "{classic_type}"
    );
    assert!(om.ends_with("# EOF\n") && !classic.contains("# EOF"));
    assert!(om.contains("# TYPE posgate_dials counter\n"), "{om}");
    assert!(
        classic.contains("# TYPE posgate_dials_total counter\n"),
        "{classic}"
    );
    // Samples equal, apart from the gauges that moved between the two scrapes.
    let samples = |text: &str| -> BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once(' ').map(|(series, _)| series.to_string()))
            .collect()
    };
    assert_eq!(samples(&om), samples(&classic));
    eprintln!(
        "[observability] /metrics: OpenMetrics for Prometheus' Accept, classic for text/plain"
    );
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
