//! Every kustomization renders with `kubectl kustomize`, and what it renders passes the
//! variable and shutdown checks; a component is included whole by an overlay; `k8s/init`
//! reaches the base Deployment's Redis and cluster.

use super::*;

/// `kubectl`, or `$KUBECTL`; `None` when it cannot be run.
fn kubectl() -> Option<String> {
    let bin = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
    let out = Command::new(&bin)
        .args(["version", "--client"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    println!(
        "using {bin}: {}",
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .replace('\n', ", ")
    );
    Some(bin)
}

/// In each rendered document, every `$(VAR)` reference must name a variable defined on an
/// earlier line (Kubernetes expands only variables defined before the reference).
fn check_var_refs(source: &str, doc: &str) -> Vec<String> {
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

fn docs(rendered: &str) -> Vec<&str> {
    rendered
        .split("\n---\n")
        .filter(|d| !d.trim().is_empty())
        .collect()
}

fn doc_kind_name(doc: &str) -> (String, String) {
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
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl kustomize");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let rendered = String::from_utf8(out.stdout).expect("rendered YAML is UTF-8");
    Ok(docs(&rendered)
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

/// The value of the environment variable `name` where `text` first sets it (`- name:`
/// then `value:` on the next line).
fn env_value(text: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim() == format!("- name: {name}"))?;
    let value = lines.get(at + 1)?.trim().strip_prefix("value: ")?;
    Some(value.trim_matches('"').to_string())
}

/// `k8s/init` renders the `posgate init` Job, reaching the Redis and cluster of the
/// base's Deployment (the values an overlay then changes in both).
fn init_job_problems(source: &str, kinds: &[String], rendered: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !kinds.iter().any(|k| k == "Job/posgate-init") {
        problems.push(format!("{source}: no Job/posgate-init"));
    }
    let base = read(&root().join("k8s/base/deployment.yaml"));
    for var in ["POSGATE_REDIS_URL", "POSGATE_CLUSTER"] {
        let (job, deployment) = (env_value(rendered, var), env_value(&base, var));
        if job.is_none() || job != deployment {
            problems.push(format!(
                "{source}: {var} is {job:?}, the base Deployment's {deployment:?}"
            ));
        }
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
    let install = "scripts/install-kubectl installs it; set KUBECTL to use another binary";
    let Some(kubectl) = crate::support::tools::require(kubectl(), "kubectl", &unchecked, install)
    else {
        return;
    };
    let allowed = allowed_vars();
    let help = serve_help();
    let budget = (
        default_of(&help, "--shutdown-budget"),
        default_of(&help, "--drain-budget"),
    );
    let mut problems = Vec::new();
    for dir in &dirs {
        let out = Command::new(&kubectl)
            .arg("kustomize")
            .arg(dir)
            .output()
            .expect("run kubectl kustomize");
        let source = format!("kubectl kustomize {}", rel(dir));
        if !out.status.success() {
            problems.push(format!(
                "{source} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let rendered = String::from_utf8(out.stdout).expect("rendered YAML is UTF-8");
        problems.extend(var_problems(&source, &rendered, &allowed));
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
        } else if dir.ends_with("k8s/init") {
            problems.extend(init_job_problems(&source, &kinds, &rendered));
        } else if !kinds.iter().any(|k| k == "Deployment/posgate") {
            problems.push(format!("{source}: no Deployment/posgate"));
        }
        // The dev overlay is self-contained: every Secret it mounts is generated.
        if dir.ends_with("k8s/overlays/dev") {
            for line in rendered.lines() {
                if let Some(name) = line.trim().strip_prefix("secretName: ") {
                    if !secrets.contains(name) {
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
