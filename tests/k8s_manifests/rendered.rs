//! Every kustomization renders with `kubectl kustomize`, and what it renders validates
//! and passes the variable and shutdown checks; a component is included whole by an
//! overlay; the Deployment and the `k8s/init` Job take the store from one ConfigMap.

use super::*;

/// In each rendered document, every `$(VAR)` reference must name a variable defined on an
/// earlier line (Kubernetes expands only variables defined before the reference).
pub(super) fn check_var_refs(source: &str, doc: &str) -> Vec<String> {
    let mut defined = BTreeSet::new();
    let mut problems = Vec::new();
    for (n, line) in doc.lines().enumerate() {
        let t = line.trim().trim_start_matches("- ");
        if let Some(name) = t.strip_prefix("name:") {
            defined.insert(name.trim().trim_matches('"').to_string());
        }
        let mut rest = line;
        while let Some(i) = rest.find("$(") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let var = &after[..end];
            if !defined.contains(var) {
                problems.push(format!(
                    "{source}: line {} uses $({var}) before it is defined",
                    n + 1
                ));
            }
            rest = &after[end..];
        }
    }
    problems
}

pub(super) fn docs(rendered: &str) -> Vec<&str> {
    rendered
        .split("\n---\n")
        .filter(|d| !d.trim().is_empty())
        .collect()
}

pub(super) fn doc_kind_name(doc: &str) -> (String, String) {
    let lines: Vec<&str> = doc.lines().collect();
    let kind = lines
        .iter()
        .find_map(|l| l.strip_prefix("kind: "))
        .unwrap_or("")
        .to_string();
    let meta = lines.iter().position(|l| *l == "metadata:").unwrap_or(0);
    let name = lines
        .iter()
        .skip(meta + 1)
        .take_while(|l| l.starts_with(' '))
        .find_map(|l| l.strip_prefix("  name: "))
        .unwrap_or("")
        .to_string();
    (kind, name)
}

fn kustomization_text(dir: &Path) -> String {
    read(&dir.join("kustomization.yaml"))
}

fn is_component(dir: &Path) -> bool {
    kustomization_text(dir)
        .lines()
        .any(|l| l.trim() == "kind: Component")
}

/// Resources (`Kind/name`) a component adds, from its own rendering.
fn rendered_kinds(kubectl: &str, dir: &Path) -> Result<Vec<String>, String> {
    Ok(docs(&kustomize(kubectl, dir)?)
        .iter()
        .map(|d| {
            let (kind, name) = doc_kind_name(d);
            format!("{kind}/{name}")
        })
        .collect())
}

/// A component must be listed under `components:` of at least one overlay, and that
/// overlay's rendering must contain every resource the component defines.
fn component_problems(kubectl: &str, dirs: &[PathBuf], component: &Path) -> Vec<String> {
    let name = component.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let wanted = match rendered_kinds(kubectl, component) {
        Ok(kinds) => kinds,
        Err(e) => return vec![format!("component {}: {e}", rel(component))],
    };
    let users: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| !is_component(d))
        .filter(|d| {
            let text = kustomization_text(d);
            let Some((_, after)) = text.split_once("\ncomponents:") else {
                return false;
            };
            after
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with(' ') || l.starts_with('-') || l.is_empty())
                .any(|l| {
                    l.trim()
                        .trim_start_matches("- ")
                        .ends_with(&format!("/{name}"))
                })
        })
        .collect();
    if users.is_empty() {
        return vec![format!(
            "component {} is not included by any overlay",
            rel(component)
        )];
    }
    let mut problems = Vec::new();
    for user in users {
        match rendered_kinds(kubectl, user) {
            Ok(kinds) => {
                for w in &wanted {
                    if !kinds.contains(w) {
                        problems.push(format!(
                            "kubectl kustomize {}: component {} resource {w} missing",
                            rel(user),
                            rel(component)
                        ));
                    }
                }
            }
            Err(e) => problems.push(format!("kubectl kustomize {}: {e}", rel(user))),
        }
    }
    problems
}

/// The store settings (Redis URL, cluster, member TTL): the keys of the base's ConfigMap
/// `posgate-store`, which the gateway and the init Job must both take whole (envFrom)
/// and neither may set on its own, so they cannot reach different stores.
fn store_problems(source: &str, rendered: &str, is_init: bool) -> Vec<String> {
    let base = read(&root().join("k8s/base/store.yaml"));
    let store_vars: Vec<&str> = base
        .lines()
        .filter_map(|l| l.strip_prefix("  ")?.split_once(':'))
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("POSGATE_"))
        .collect();
    assert!(store_vars.contains(&"POSGATE_REDIS_URL"), "{store_vars:?}");
    let objects = yaml_objects(rendered);
    let mut problems = Vec::new();
    let wanted = if is_init { "Job" } else { "Deployment" };
    let mut workloads = 0;
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or("");
        let name = object["metadata"]["name"].as_str().unwrap_or("");
        if kind == "ConfigMap" && name == "posgate-store" {
            for var in ["POSGATE_REDIS_URL", "POSGATE_CLUSTER"] {
                if object["data"][var].as_str().is_none_or(str::is_empty) {
                    problems.push(format!("{source}: ConfigMap/posgate-store has no {var}"));
                }
            }
        }
        if (kind, name) != (wanted, if is_init { "posgate-init" } else { "posgate" }) {
            continue;
        }
        workloads += 1;
        for container in object["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let from_store = container["envFrom"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["configMapRef"]["name"] == "posgate-store");
            if !from_store {
                problems.push(format!(
                    "{source}: {kind}/{name} does not take its store settings from ConfigMap/posgate-store (envFrom)"
                ));
            }
            for env in container["env"].as_array().into_iter().flatten() {
                let var = env["name"].as_str().unwrap_or("");
                if store_vars.contains(&var) {
                    problems.push(format!(
                        "{source}: {kind}/{name} sets {var} itself; it belongs in ConfigMap/posgate-store"
                    ));
                }
            }
        }
    }
    if workloads == 0 {
        problems.push(format!("{source}: no {wanted} of posgate"));
    }
    if !is_init
        && !objects
            .iter()
            .any(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "posgate-store")
    {
        problems.push(format!("{source}: no ConfigMap/posgate-store"));
    }
    problems
}

#[test]
fn every_kustomization_renders() {
    let dirs: Vec<PathBuf> = files_under(&root().join("k8s"), &["yaml", "yml"])
        .into_iter()
        .filter(|f| {
            f.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kustomization."))
        })
        .map(|f| f.parent().expect("parent").to_path_buf())
        .collect();
    assert!(
        dirs.iter().any(|d| d.ends_with("k8s/base")),
        "k8s/base has no kustomization"
    );
    let unchecked = format!("{} kustomizations not rendered", dirs.len());
    let Some(kubectl) = kubectl(&unchecked) else {
        return;
    };
    let validator = kubernetes_validate();
    let allowed = allowed_vars();
    let help = serve_help();
    let budget = (
        default_of(&help, "--shutdown-budget"),
        default_of(&help, "--drain-budget"),
    );
    let mut problems = Vec::new();
    for dir in &dirs {
        let source = format!("kubectl kustomize {}", rel(dir));
        let rendered = match kustomize(&kubectl, dir) {
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
        let docs = docs(&rendered);
        let mut secrets = BTreeSet::new();
        let mut kinds = Vec::new();
        for doc in &docs {
            let (kind, name) = doc_kind_name(doc);
            problems.extend(check_var_refs(&format!("{source} {kind}/{name}"), doc));
            if kind == "Deployment" && name == "posgate" {
                check_shutdown_timing(&format!("{source} Deployment/posgate"), doc, budget);
            }
            if kind == "Secret" {
                secrets.insert(name.clone());
            }
            kinds.push(format!("{kind}/{name}"));
        }
        if is_component(dir) {
            // A component is only meaningful inside an overlay; check one includes it
            // and that the overlay's rendering then carries the component's resources.
            problems.extend(component_problems(&kubectl, &dirs, dir));
        } else {
            problems.extend(store_problems(
                &source,
                &rendered,
                dir.ends_with("k8s/init"),
            ));
        }
        // The dev overlay is self-contained: every Secret it mounts (but an optional one)
        // is generated.
        if dir.ends_with("k8s/overlays/dev") {
            for object in yaml_objects(&rendered) {
                for volume in object["spec"]["template"]["spec"]["volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let secret = &volume["secret"];
                    let Some(name) = secret["secretName"].as_str() else {
                        continue;
                    };
                    if secret["optional"] != true && !secrets.contains(name) {
                        problems.push(format!(
                            "{source}: Secret {name} is mounted but not generated"
                        ));
                    }
                }
            }
        }
        println!(
            "{source}: ok, {} resources: {}",
            kinds.len(),
            kinds.join(", ")
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
