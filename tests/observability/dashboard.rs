//! The dashboard: JSON with the expected variables, a title and a query per panel, and
//! every query valid PromQL (promtool).

use super::*;

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
