//! Checks the Kubernetes manifests (`k8s/`) and the `Dockerfile` against the code:
//!
//! - every `POSGATE_*` variable named in a manifest is a real `posgate serve` flag
//!   variable (from the binary's `serve --help`, `[env: POSGATE_X=]`) or one of the
//!   documented secret variables, and secret variables are never set as plain values;
//! - the shutdown timeline fits: preStop sleep + the longer of (`--shutdown-budget` + the
//!   kept-answers linger) and `--drain-budget` + HTTP drain <=
//!   `terminationGracePeriodSeconds`;
//! - the Redis ACL examples grant exactly the commands posgate sends (client side plus
//!   the commands the Lua scripts call) on the cluster's own keys;
//! - the Dockerfile's user is the one the Deployment runs as;
//! - every kustomization renders with `kubectl kustomize` (skipped, with a message, when
//!   no kubectl is installed, and failed under `CI=true`; `scripts/install-kubectl`
//!   installs one), and the rendered output passes the variable checks too; a kustomize
//!   component (k8s/observability) must be included by an overlay whose rendering
//!   carries all its resources; `k8s/init` (the `posgate init` Job) must reach the
//!   base Deployment's Redis and cluster.
//!
//! - every rendering (each kustomization, the Helm chart with its defaults and with every
//!   option on) validates against the Kubernetes schemas of the oldest supported release
//!   (`kubernetes-validate`, strict: unknown fields fail);
//! - the chart's defaults render the objects of the kustomize base and its init Job;
//! - the Deployment and the init Job take the store settings from one ConfigMap.
//!
//! YAML is scanned as text, line by line, where the checks only need names and a few
//! scalar values; comparisons of whole objects read the YAML with Python's PyYAML (which
//! `kubernetes-validate` brings along).
//!
//! `redis_acl` has the ACL check, `rendered` the ones of `kubectl kustomize`, `chart` the
//! ones of `helm template`; the other checks and the helpers they share are here.

mod chart;
mod redis_acl;
mod rendered;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use posgate::push::handover::HANDOVER_LINGER;

/// Secrets are read from these variables (or from the `*_FILE` flags); they are not flags
/// themselves, so `serve --help` does not list them as `[env: ...]`.
const SECRET_VARS: &[&str] = &[
    "POSGATE_CLUSTER_SECRET",
    "POSGATE_API_TOKENS",
    "POSGATE_REDIS_PASSWORD",
];

/// How long the HTTP listener drains after the driver's graceful shutdown
/// (`HTTP_DRAIN` in `src/pod.rs`, not public).
const HTTP_DRAIN_SECS: u64 = 5;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Files under `dir` (recursively) whose name ends with one of `exts`, sorted.
fn files_under(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot list {}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| exts.contains(&e))
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn yaml_files() -> Vec<PathBuf> {
    let files = files_under(&root().join("k8s"), &["yaml", "yml"]);
    assert!(!files.is_empty(), "no YAML files under k8s/");
    files
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every `POSGATE_<NAME>` token in `text` (comments included), with its 1-based line.
fn posgate_vars(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(i) = rest.find("POSGATE_") {
            let after = &rest[i + "POSGATE_".len()..];
            let len = after
                .bytes()
                .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
                .count();
            // `POSGATE_<FLAG>` in prose names no variable.
            if len > 0 {
                out.push((format!("POSGATE_{}", &after[..len]), n + 1));
            }
            rest = &after[len..];
        }
    }
    out
}

/// The binary's `serve --help`.
fn serve_help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_posgate"))
        .args(["serve", "--help"])
        .output()
        .expect("run posgate serve --help");
    assert!(out.status.success(), "posgate serve --help failed: {out:?}");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The variables clap lists as `[env: NAME=value]` or `[env: NAME]` (hidden values).
fn flag_env_vars(help: &str) -> BTreeSet<String> {
    let mut vars = BTreeSet::new();
    let mut rest = help;
    while let Some(i) = rest.find("[env: ") {
        let after = &rest[i + "[env: ".len()..];
        let end = after.find(['=', ']']).expect("[env: ...] is closed");
        vars.insert(after[..end].trim().to_string());
        rest = &after[end..];
    }
    vars
}

fn allowed_vars() -> BTreeSet<String> {
    let mut vars = flag_env_vars(&serve_help());
    // If clap's help format changed, the parse above finds nothing: fail loudly rather
    // than accept nothing.
    for expected in [
        "POSGATE_REDIS_URL",
        "POSGATE_POD_ID",
        "POSGATE_ADVERTISE_URL",
    ] {
        assert!(
            vars.contains(expected),
            "`posgate serve --help` does not list {expected} as [env: ...]; found {vars:?}"
        );
    }
    vars.extend(SECRET_VARS.iter().map(|s| s.to_string()));
    vars
}

/// Unknown `POSGATE_*` names in `text`, and secret variables given as plain values.
fn var_problems(source: &str, text: &str, allowed: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for (var, line) in posgate_vars(text) {
        if !allowed.contains(&var) {
            problems.push(format!(
                "{source}:{line}: {var} is not a `posgate serve` flag variable nor one of {SECRET_VARS:?}"
            ));
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.trim().trim_start_matches("- ").strip_prefix("name:") else {
            continue;
        };
        let name = name.trim().trim_matches('"');
        if SECRET_VARS.contains(&name) {
            let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
            if !next.starts_with("valueFrom:") {
                problems.push(format!(
                    "{source}:{}: {name} must come from a Secret (valueFrom), not a plain value",
                    i + 1
                ));
            }
        }
    }
    problems
}

#[test]
fn every_posgate_variable_in_the_manifests_is_a_real_flag() {
    let allowed = allowed_vars();
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for file in yaml_files() {
        let text = read(&file);
        seen.extend(posgate_vars(&text).into_iter().map(|(v, _)| v));
        problems.extend(var_problems(&rel(&file), &text, &allowed));
    }
    println!("POSGATE_* variables used under k8s/: {seen:?}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The Deployment must at least set these (downward API identity and address).
    for needed in [
        "POSGATE_POD_ID",
        "POSGATE_ADVERTISE_URL",
        "POSGATE_REDIS_URL",
        "POSGATE_CLUSTER_SECRET_FILE",
        "POSGATE_API_TOKENS_FILE",
    ] {
        assert!(seen.contains(needed), "no manifest sets {needed}");
    }
}

/// `Ns` / `Nms` / `Nm` as whole seconds (rounded up), for the flag defaults we read.
fn parse_secs(s: &str) -> u64 {
    let s = s.trim().trim_matches('"');
    if let Some(ms) = s.strip_suffix("ms") {
        return ms.parse::<u64>().expect("milliseconds").div_ceil(1000);
    }
    if let Some(secs) = s.strip_suffix('s') {
        return secs.parse().expect("seconds");
    }
    if let Some(min) = s.strip_suffix('m') {
        return min.parse::<u64>().expect("minutes") * 60;
    }
    panic!("unsupported duration {s:?} (use s, ms or m)");
}

/// The number after `key:` on the first line (at or after `from`) that has it.
pub(crate) fn scalar_after(lines: &[&str], from: usize, key: &str) -> Option<(usize, String)> {
    lines.iter().enumerate().skip(from).find_map(|(i, l)| {
        l.trim()
            .strip_prefix(key)
            .and_then(|v| v.strip_prefix(':'))
            .map(|v| (i, v.trim().to_string()))
    })
}

/// The default of `--shutdown-budget` as `serve --help` prints it.
fn default_of(help: &str, flag: &str) -> u64 {
    let at = help.find(flag).unwrap_or_else(|| panic!("{flag} in help"));
    let tail = &help[at..];
    let start = tail
        .find("[default: ")
        .unwrap_or_else(|| panic!("default of {flag}"))
        + 10;
    let end = start + tail[start..].find(']').expect("closed default");
    parse_secs(&tail[start..end])
}

/// preStop sleep + the longer of (shutdown budget + kept-answers linger) and the drain
/// budget (a pod lingers until its shards handed over drain, `src/pod.rs`) + HTTP drain
/// must fit in the grace period of the posgate Deployment in `text` (one YAML document
/// or a file). `defaults`: the shutdown and drain budgets' flag defaults.
fn check_shutdown_timing(source: &str, text: &str, defaults: (u64, u64)) {
    let lines: Vec<&str> = text.lines().collect();
    let (_, grace) = scalar_after(&lines, 0, "terminationGracePeriodSeconds")
        .unwrap_or_else(|| panic!("{source}: no terminationGracePeriodSeconds"));
    let grace: u64 = grace.parse().expect("grace period seconds");
    let pre_stop = lines
        .iter()
        .position(|l| l.trim() == "preStop:")
        .unwrap_or_else(|| panic!("{source}: no preStop hook"));
    let (_, sleep) = scalar_after(&lines, pre_stop, "seconds")
        .unwrap_or_else(|| panic!("{source}: preStop has no sleep seconds"));
    let sleep: u64 = sleep.parse().expect("preStop sleep seconds");
    let set = |name: &str, default: u64| {
        lines
            .iter()
            .position(|l| l.trim().trim_start_matches("- ") == format!("name: {name}"))
            .and_then(|i| scalar_after(&lines, i + 1, "value"))
            .map_or(default, |(_, v)| parse_secs(&v))
    };
    let budget = set("POSGATE_SHUTDOWN_BUDGET", defaults.0);
    let drain = set("POSGATE_DRAIN_BUDGET", defaults.1);
    let linger = HANDOVER_LINGER.as_secs_f64().ceil() as u64;
    let needed = sleep + (budget + linger).max(drain) + HTTP_DRAIN_SECS;
    println!(
        "{source}: preStop {sleep}s + max(shutdown budget {budget}s + kept-answers linger \
         {linger}s, drain budget {drain}s) + HTTP drain {HTTP_DRAIN_SECS}s = {needed}s <= \
         terminationGracePeriodSeconds {grace}s"
    );
    assert!(
        needed <= grace,
        "{source}: terminationGracePeriodSeconds {grace} is shorter than preStop {sleep}s + \
         max(shutdown budget {budget}s + kept-answers linger {linger}s, drain budget \
         {drain}s) + HTTP drain {HTTP_DRAIN_SECS}s: pods would be killed before releasing \
         their leases or before the new owners took their terminals over"
    );
}

#[test]
fn grace_period_covers_the_graceful_shutdown() {
    let help = serve_help();
    let defaults = (
        default_of(&help, "--shutdown-budget"),
        default_of(&help, "--drain-budget"),
    );
    let path = root().join("k8s/base/deployment.yaml");
    check_shutdown_timing(&rel(&path), &read(&path), defaults);
}

#[test]
fn dockerfile_user_matches_the_deployment() {
    let docker = read(&root().join("Dockerfile"));
    let user = docker
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .next_back()
        .expect("Dockerfile sets USER");
    let uid = user.split(':').next().expect("uid").trim();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "USER must be a numeric non-root uid, got {user}"
    );
    let deployment = read(&root().join("k8s/base/deployment.yaml"));
    assert!(
        deployment.contains(&format!("runAsUser: {uid}")),
        "k8s/base/deployment.yaml must run as the image's user {uid}"
    );
    for needed in [
        "EXPOSE 8080",
        "ENTRYPOINT [\"posgate\"]",
        "CMD [\"serve\"]",
        "--locked",
    ] {
        assert!(docker.contains(needed), "Dockerfile lacks {needed}");
    }
}

/// The oldest Kubernetes release the manifests support (the preStop `sleep` action is
/// 1.30's); the chart's `kubeVersion` says the same.
const KUBE_MIN: &str = "1.30.0";

/// A tool's binary (`$ENV_VAR` or `default`) if `args` runs it successfully.
fn tool(env_var: &str, default: &str, args: &[&str]) -> Option<String> {
    let bin = std::env::var(env_var).unwrap_or_else(|_| default.to_string());
    let out = Command::new(&bin).args(args).output().ok()?;
    out.status.success().then(|| {
        println!(
            "using {bin}: {}",
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .replace('\n', ", ")
        );
        bin
    })
}

/// `command` run with `input` on its standard input: its standard output, or what it
/// printed on failure.
fn pipe(command: &mut Command, input: &str) -> Result<String, String> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .map_err(|e| format!("writing to {command:?}: {e}"))?;
    let out = child.wait_with_output().expect("wait");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `kubectl` (or `$KUBECTL`), required under CI; `unchecked` says what a skip leaves out.
fn kubectl(unchecked: &str) -> Option<String> {
    crate::support::tools::require(
        tool("KUBECTL", "kubectl", &["version", "--client"]),
        "kubectl",
        unchecked,
        "scripts/install-kubectl installs it; set KUBECTL to use another binary",
    )
}

/// `kubectl kustomize DIR`: the rendering, or what kubectl said.
fn kustomize(kubectl: &str, dir: &Path) -> Result<String, String> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl kustomize");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8(out.stdout).expect("rendered YAML is UTF-8"))
}

/// `kubernetes-validate`, required like kubectl (`scripts/test` installs it).
fn kubernetes_validate() -> Option<String> {
    crate::support::tools::require(
        tool("KUBERNETES_VALIDATE", "kubernetes-validate", &["--version"]),
        "kubernetes-validate",
        "rendered manifests not validated against the Kubernetes schemas",
        "pip install kubernetes-validate",
    )
}

/// Problems `kubernetes-validate` finds in `rendered` against [`KUBE_MIN`], strict
/// (unknown fields fail). Custom resources (the Prometheus Operator's) have no schema
/// there and only warn.
fn schema_problems(validator: &str, source: &str, rendered: &str) -> Vec<String> {
    let mut file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    file.write_all(rendered.as_bytes())
        .expect("write rendering");
    let out = Command::new(validator)
        .args(["-k", KUBE_MIN, "--strict", "--quiet", "--no-warn"])
        .arg(file.path())
        .output()
        .expect("run kubernetes-validate");
    if out.status.success() {
        return Vec::new();
    }
    vec![format!(
        "{source} does not validate against Kubernetes {KUBE_MIN}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )]
}

/// The documents of a rendering as JSON (read by PyYAML, as `kubernetes-validate` does).
fn yaml_objects(rendered: &str) -> Vec<serde_json::Value> {
    let json = pipe(
        Command::new("python3").args([
            "-c",
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
        ]),
        rendered,
    )
    .unwrap_or_else(|e| panic!("python3 with PyYAML (pip install kubernetes-validate brings it): {e}"));
    serde_json::from_str(&json).expect("PyYAML's JSON")
}
