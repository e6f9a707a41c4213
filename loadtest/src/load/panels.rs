//! The dashboard check: every target query of `k8s/observability/dashboard.json`
//! (compiled into the harness), its Grafana variables substituted as Grafana would for
//! this Prometheus, evaluated over the scenario (`query_range`, step 1 s) against the
//! run's Prometheus; a query that returns no data, or that Prometheus refuses, fails the
//! gate, unless [`EMPTY_OK`] names it with the condition it needs that a scenario may
//! lack.
//!
//! Not for: what the panels look like (tests/observability/ parses every query and
//! checks the metric names).

use std::fmt::Write as _;

use serde::Serialize;

use super::{cluster::Cluster, prometheus::INTERVAL, report::ScenarioReport};

/// `k8s/observability/dashboard.json`, as built into this harness.
pub const DASHBOARD_JSON: &str = include_str!("../../../k8s/observability/dashboard.json");

/// Queries that may legitimately return nothing, with the condition they need.
pub const EMPTY_OK: [(&str, &str); 2] = [
    (
        "sum by (shard) (posgate_shard_served) > 1",
        "lists the shards two pods serve: empty unless that happens (the panel's other query \
         counts them, 0 included)",
    ),
    (
        "sum by (result) (rate(posgate_push_requests_total{result!~\"ok|queued|push_ended|\
         invalid_request|unauthorized|unknown_terminal|idempotency_conflict|payload_too_large\",\
         pod=~\".*\"}[4s])) / scalar(sum(rate(posgate_push_requests_total{result!~\"queued|\
         push_ended|invalid_request|unauthorized|unknown_terminal|idempotency_conflict|\
         payload_too_large\",pod=~\".*\"}[4s])))",
        "one line per failure result: a result has no series before its first failure, so \
         empty while no push fails (the panel's ratio query shows 0 then)",
    ),
];

/// One query of one panel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Target {
    pub panel: String,
    /// As evaluated (variables substituted).
    pub expr: String,
}

/// The dashboard part of a scenario's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PanelCheck {
    pub queries: usize,
    /// Queries without data (or refused, with Prometheus's error), not in [`EMPTY_OK`].
    pub empty: Vec<(Target, Option<String>)>,
    /// Queries in [`EMPTY_OK`] that returned nothing this time.
    pub empty_ok: Vec<Target>,
}

/// Every target of `dashboard` (panels inside rows included), variables substituted:
/// `$pod` is All (`.*`), `$__rate_interval` 4 s (Grafana's: four scrape intervals of 1 s),
/// `$dial_rate_limit` the pods' `--dial-rate`.
pub fn targets(dashboard: &str, dial_rate: u64) -> Result<Vec<Target>, String> {
    let d: serde_json::Value = serde_json::from_str(dashboard).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> = d["panels"].as_array().into_iter().flatten().collect();
    while let Some(p) = stack.pop() {
        stack.extend(p["panels"].as_array().into_iter().flatten());
        let title = p["title"].as_str().unwrap_or("(untitled)");
        for t in p["targets"].as_array().into_iter().flatten() {
            let Some(expr) = t["expr"].as_str() else {
                continue;
            };
            let rate = format!("{}s", 4 * INTERVAL.as_secs());
            let expr = expr
                .replace("$__rate_interval", &rate)
                .replace("$pod", ".*")
                .replace("$dial_rate_limit", &dial_rate.to_string());
            if expr.contains('$') {
                return Err(format!("panel {title:?}: unknown variable in {expr}"));
            }
            out.push(Target {
                panel: title.to_owned(),
                expr,
            });
        }
    }
    out.reverse();
    Ok(out)
}

/// Evaluates every target over `[from_ms, to_ms]`; `None` without Prometheus.
pub async fn check(c: &Cluster, from_ms: u64, to_ms: u64) -> Option<PanelCheck> {
    let p = c.prometheus.as_ref()?;
    let mut out = PanelCheck::default();
    let list = match targets(DASHBOARD_JSON, c.profile.dial_rate) {
        Ok(l) => l,
        Err(e) => {
            let t = Target {
                panel: "dashboard.json".into(),
                expr: String::new(),
            };
            out.empty.push((t, Some(e)));
            return Some(out);
        }
    };
    out.queries = list.len();
    for t in list {
        let answer = p
            .query_range(&c.client, &t.expr, from_ms, to_ms, INTERVAL)
            .await;
        let error = match answer {
            Ok(series) if series.iter().any(|s| !s.values.is_empty()) => continue,
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        };
        if error.is_none() && EMPTY_OK.iter().any(|(q, _)| t.expr == *q) {
            out.empty_ok.push(t);
        } else {
            out.empty.push((t, error));
        }
    }
    Some(out)
}

/// The gate line of the dashboard check in `r` (none without Prometheus).
pub fn gate(r: &mut ScenarioReport) {
    let Some(p) = r.panels.clone() else {
        return;
    };
    let mut detail = format!(
        "{} of {} queries returned data over the scenario",
        p.queries - p.empty.len() - p.empty_ok.len(),
        p.queries
    );
    for (t, e) in &p.empty {
        let _ = write!(detail, "; NO DATA: panel {:?}: {}", t.panel, t.expr);
        if let Some(e) = e {
            let _ = write!(detail, " ({e})");
        }
    }
    for t in &p.empty_ok {
        let why = EMPTY_OK
            .iter()
            .find(|(q, _)| t.expr == *q)
            .map_or("", |x| x.1);
        let _ = write!(detail, "; empty as allowed: panel {:?}: {why}", t.panel);
    }
    r.check(
        "every dashboard query returns data",
        true,
        p.empty.is_empty(),
        detail,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dashboard_query_is_found_with_its_variables_substituted() {
        let list = targets(DASHBOARD_JSON, 200).unwrap();
        assert!(list.len() > 40, "{}", list.len());
        assert!(list.iter().all(|t| !t.expr.contains('$')));
        let dial = list
            .iter()
            .find(|t| t.expr.starts_with("count(posgate_members"))
            .unwrap();
        assert_eq!(dial.expr, "count(posgate_members{pod=~\".*\"}) * 200");
        assert!(list.iter().any(|t| t.expr.contains("[4s])")));
        // The allowed-empty queries are the dashboard's, not stale copies.
        for (q, _) in EMPTY_OK {
            assert!(list.iter().any(|t| t.expr == q), "{q}");
        }
    }

    #[test]
    fn an_unknown_variable_is_an_error_naming_the_panel() {
        let d = r#"{"panels":[{"title":"Row","panels":[{"title":"X","targets":[{"expr":"up{a=\"$b\"}"}]}]}]}"#;
        let e = targets(d, 200).unwrap_err();
        assert!(e.starts_with("panel \"X\": unknown variable"), "{e}");
    }
}
