//! The Helm chart (`charts/posgate`): it lints; it renders with its defaults, with every
//! option on and with the optional parts off, and each rendering validates and passes
//! the variable, `$(VAR)` and shutdown checks; its defaults render the objects of the
//! kustomize base and its init Job; it refuses a Kubernetes older than [`KUBE_MIN`].

use super::rendered::{check_var_refs, doc_kind_name, docs};
use super::*;

use serde_json::Value;

const CHART: &str = "charts/posgate";

/// What an operator of a production cluster turns on (the prod overlay's choices).
const EVERY_OPTION: &[&str] = &[
    "--set",
    "tls.enabled=true,tls.peerName=posgate-peer.posgate.svc,monitoring.enabled=true",
    "--set",
    "store.extra.POSGATE_REDIS_PASSWORD_FILE=/etc/posgate/redis/password",
    "--set",
    "networkPolicy.redisCidrs={10.20.0.0/24}",
    "--set-string",
    "env.POSGATE_REDIS_WAIT_REPLICAS=1",
];

/// The optional parts off.
const OPTIONS_OFF: &[&str] = &[
    "--set",
    "posClientCert.enabled=false,init.enabled=false,networkPolicy.enabled=false",
];

fn helm() -> Option<String> {
    crate::support::tools::require(
        tool("HELM", "helm", &["version", "--short"]),
        "helm",
        "the Helm chart not rendered",
        "scripts/install-kubectl installs it; set HELM to use another binary",
    )
}

/// `helm template posgate charts/posgate ARGS`, release `posgate` (so object names are
/// the base's).
fn template(helm: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm)
        .args(["template", "posgate"])
        .arg(root().join(CHART))
        .args(args)
        .output()
        .expect("run helm template");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("rendered YAML is UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn chart_renders_and_validates() {
    let Some(helm) = helm() else { return };
    let validator = kubernetes_validate();
    let lint = Command::new(&helm)
        .args(["lint", "--strict"])
        .arg(root().join(CHART))
        .output()
        .expect("run helm lint");
    assert!(
        lint.status.success(),
        "helm lint --strict {CHART}:\n{}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    let allowed = allowed_vars();
    let help = serve_help();
    let budget = (
        default_of(&help, "--shutdown-budget"),
        default_of(&help, "--drain-budget"),
    );
    let mut problems = Vec::new();
    for (what, args) in [
        ("defaults", &[][..]),
        ("every option", EVERY_OPTION),
        ("options off", OPTIONS_OFF),
    ] {
        let source = format!("helm template {CHART} ({what})");
        let rendered = match template(&helm, args) {
            Ok(rendered) => rendered,
            Err(e) => {
                problems.push(format!("{source} failed:\n{e}"));
                continue;
            }
        };
        problems.extend(var_problems(&source, &rendered, &allowed));
        if let Some(validator) = &validator {
            problems.extend(schema_problems(validator, &source, &rendered));
        }
        let mut kinds = Vec::new();
        for doc in docs(&rendered) {
            let (kind, name) = doc_kind_name(doc);
            problems.extend(check_var_refs(&format!("{source} {kind}/{name}"), doc));
            if kind == "Deployment" {
                check_shutdown_timing(&format!("{source} {kind}/{name}"), doc, budget);
            }
            kinds.push(format!("{kind}/{name}"));
        }
        println!("{source}: {}", kinds.join(", "));
        if what == "every option" {
            // The alert rules arrive as alerts.yaml has them, their own `{{ $labels }}`
            // templates untouched by Helm's.
            let alerts = read(&root().join("k8s/observability/alerts.yaml"));
            for line in alerts.lines().filter(|l| l.contains("{{ $labels")).take(3) {
                if !rendered.contains(line.trim()) {
                    problems.push(format!("{source}: alert line {line:?} not rendered as is"));
                }
            }
            for kind in [
                "ServiceMonitor/posgate",
                "PrometheusRule/posgate",
                "Job/posgate-init",
            ] {
                if !kinds.iter().any(|k| k == kind) {
                    problems.push(format!("{source}: no {kind}"));
                }
            }
        }
    }
    // The chart says which Kubernetes it needs, and Helm enforces it.
    match template(&helm, &["--kube-version", "1.29.0"]) {
        Err(e) if e.contains("kubeVersion") => {}
        other => problems.push(format!(
            "helm template --kube-version 1.29.0 must refuse the chart (kubeVersion >= {KUBE_MIN}): {other:?}"
        )),
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Labels and annotations only Helm adds (release tracking, hooks).
const HELM_ONLY: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "annotations",
];

/// `object` without what only Helm adds, and every container image without its tag
/// (the chart pins its appVersion, the base says `posgate:latest`).
fn comparable(object: &Value) -> Value {
    match object {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !HELM_ONLY.contains(&k.as_str()))
                .map(|(k, v)| match (k.as_str(), v) {
                    ("image", Value::String(image)) => {
                        let repository = image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r);
                        (k.clone(), Value::String(repository.to_string()))
                    }
                    _ => (k.clone(), comparable(v)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(comparable).collect()),
        other => other.clone(),
    }
}

/// The init Job of `k8s/init` takes the store through `envFrom`; the chart's hook runs
/// before the ConfigMap exists and carries the same values as `env`. Spell the former
/// out as the latter, from `store` (the ConfigMap's data).
fn expand_store_env(job: &mut Value, store: &Value) {
    let container = &mut job["spec"]["template"]["spec"]["containers"][0];
    let Some(map) = container.as_object_mut() else {
        return;
    };
    if map.remove("envFrom").is_some() {
        let mut env: Vec<Value> = store
            .as_object()
            .expect("ConfigMap data")
            .iter()
            .map(|(k, v)| serde_json::json!({"name": k, "value": v}))
            .collect();
        env.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        map.insert("env".into(), Value::Array(env));
    }
}

fn by_kind_name(objects: Vec<Value>) -> BTreeMap<String, Value> {
    objects
        .into_iter()
        .map(|o| {
            let key = format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            );
            (key, comparable(&o))
        })
        .collect()
}

#[test]
fn chart_defaults_render_the_kustomize_base() {
    let Some(helm) = helm() else { return };
    let Some(kubectl) = kubectl("the chart not compared with the kustomize base") else {
        return;
    };
    let kustomize = |dir: &str| {
        let rendered = kustomize(&kubectl, &root().join(dir))
            .unwrap_or_else(|e| panic!("kubectl kustomize {dir}: {e}"));
        yaml_objects(&rendered)
    };
    let mut base = by_kind_name(kustomize("k8s/base"));
    base.extend(by_kind_name(kustomize("k8s/init")));
    let store = base["ConfigMap/posgate-store"]["data"].clone();
    expand_store_env(
        base.get_mut("Job/posgate-init")
            .expect("k8s/init has Job/posgate-init"),
        &store,
    );
    let chart = by_kind_name(yaml_objects(&template(&helm, &[]).expect("helm template")));
    assert_eq!(
        base.keys().collect::<Vec<_>>(),
        chart.keys().collect::<Vec<_>>(),
        "the chart's defaults render other objects than k8s/base and k8s/init"
    );
    let mut differ = Vec::new();
    for (key, object) in &base {
        if chart[key] != *object {
            differ.push(format!(
                "{key}:\n  kustomize: {}\n  chart:     {}",
                serde_json::to_string(object).expect("JSON"),
                serde_json::to_string(&chart[key]).expect("JSON")
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "the chart's defaults differ from the kustomize base (Helm's own labels, annotations and the image tag aside):\n{}",
        differ.join("\n")
    );
    println!(
        "chart defaults = kustomize base: {}",
        base.keys().cloned().collect::<Vec<_>>().join(", ")
    );
}
