//! Every shell command shown in the README and the docs is exercised, or at least checked
//! against the real thing, or marked `# needs a Kubernetes cluster`:
//!
//! - `posgate …` (also as `cargo run --release -- …` or `target/release/posgate …`) and
//!   the load-test binaries (`posgate-load`, `conn-bench`, `pos-sim`): the exact
//!   arguments, with synopsis placeholders (`[…]`, `FILE`, `ID...`, `DIR`, `N`) filled in,
//!   must parse with the real binary — run with `--help` appended, so clap rejects an
//!   unknown flag or a bad value but nothing starts;
//! - `cargo …`: every package (`-p`) is a workspace member and every `--example` exists;
//! - `target/release/examples/NAME …`: examples/NAME.rs exists and reads every `--flag`
//!   given (the examples parse their arguments by hand, so this looks for the flag's
//!   literal in the source);
//! - `scripts/…`: the script exists and CI or a test runs it;
//! - `promtool …`: the files exist and `tests/observability/` runs promtool on them;
//! - `curl …`: method and path are in `docs/openapi.yaml` and the headers the API needs
//!   are present;
//! - `kubectl kustomize DIR`: DIR is a kustomization (tests/k8s_manifests/ renders it);
//!   any other `kubectl` or `docker` command must carry `# needs a Kubernetes cluster`,
//!   and a `-k DIR` in it must name a kustomization;
//! - `helm install|upgrade|template RELEASE CHART …`: renders with `helm template` and
//!   the same values (install and upgrade marked as needing a cluster).
//!
//! Anything else fails the test, so a new kind of command gets a rule here first.
//! Commands are the lines of fenced `sh`/`bash`/`shell`/`console` blocks; `\`
//! continuations are joined. The load-test binaries are looked up next to this test's
//! executable: `cargo test --workspace` (what `scripts/test` runs) builds them.

use std::path::{Path, PathBuf};
use std::process::Command;

const CLUSTER_MARK: &str = "# needs a Kubernetes cluster";
const LOADTEST_BINS: [&str; 4] = ["posgate-load", "conn-bench", "pos-sim", "wire-dial"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// Markdown files whose commands are checked: README, docs/, and READMEs under k8s/ and
/// loadtest/.
fn doc_files() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    let mut stack = vec![
        root().join("docs"),
        root().join("k8s"),
        root().join("loadtest"),
    ];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                if !path.ends_with("target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(root()).expect("under root");
                files.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    files
}

/// One command: where it is, the command text, and its trailing comment (if any).
#[derive(Debug)]
struct DocCommand {
    at: String,
    words: Vec<String>,
    comment: String,
}

/// Splits on whitespace, keeping single- and double-quoted parts together (quotes
/// removed). Good enough for the docs' commands; no escapes inside quotes.
fn shell_words(line: &str) -> (Vec<String>, String) {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c == '#' && !in_word => {
                return (
                    words,
                    chars[i..].iter().collect::<String>().trim().to_string(),
                );
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                cur.push(c);
                in_word = true;
            }
        }
        i += 1;
    }
    if in_word {
        words.push(cur);
    }
    (words, String::new())
}

fn commands_in(file: &str) -> Vec<DocCommand> {
    let text = read(file);
    let mut out = Vec::new();
    let mut in_shell: Option<bool> = None;
    let mut pending = String::new();
    let mut pending_at = 0;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            in_shell = match in_shell {
                None => Some(matches!(lang.trim(), "sh" | "bash" | "shell" | "console")),
                Some(_) => None,
            };
            continue;
        }
        if in_shell != Some(true) {
            continue;
        }
        let line = line.trim().trim_start_matches("$ ");
        if pending.is_empty() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            pending_at = i + 1;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let (words, comment) = shell_words(&std::mem::take(&mut pending));
        out.push(DocCommand {
            at: format!("{file}:{pending_at}"),
            words,
            comment,
        });
    }
    out
}

/// Fills synopsis placeholders so the arguments can be parsed: drops optional `[...]`
/// groups, and replaces `FILE`, `DIR`, `ID...`, `N` with sample values.
fn concrete_args(words: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    for w in words {
        if w.starts_with('[') {
            depth += 1;
        }
        let closes = w.ends_with(']');
        if depth == 0 {
            out.push(match w.as_str() {
                "FILE" => "terminals.csv".to_string(),
                "DIR" => "/tmp/posgate-doc-results".to_string(),
                "ID..." | "ID" => "pos-00001".to_string(),
                "N" => "3".to_string(),
                other => other.to_string(),
            });
        }
        if closes && depth > 0 {
            depth -= 1;
        }
    }
    out
}

/// Where the workspace's binaries are: the directory of this test's executable's parent
/// (`target/<profile>/deps/..`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// Runs `binary args... --help` and returns an error message unless it exits 0.
fn parses(binary: &Path, args: &[String]) -> Result<(), String> {
    let out = Command::new(binary)
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{} {}` does not parse: {}",
            binary.file_name().unwrap_or_default().to_string_lossy(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn posgate_args(words: &[String]) -> Result<(), String> {
    parses(
        Path::new(env!("CARGO_BIN_EXE_posgate")),
        &concrete_args(words),
    )
}

fn loadtest_args(bin: &str, words: &[String]) -> Result<(), String> {
    let path = bin_dir().join(bin);
    if !path.exists() {
        return Err(format!(
            "{} not built: run `cargo test --workspace` (it builds the load-test binaries)",
            path.display()
        ));
    }
    parses(&path, &concrete_args(words))
}

fn cargo_command(words: &[String]) -> Result<(), String> {
    let members = [
        "posgate",
        "posgate-terminal",
        "posgate-pos-sim",
        "posgate-loadtest",
    ];
    let mut it = words.iter().skip(1);
    while let Some(w) = it.next() {
        match w.as_str() {
            "-p" | "--package" => {
                let p = it.next().ok_or("-p without a package")?;
                if !members.contains(&p.as_str()) {
                    return Err(format!("-p {p}: not a workspace member"));
                }
            }
            "--example" => {
                let e = it.next().ok_or("--example without a name")?;
                if !root().join("examples").join(format!("{e}.rs")).exists() {
                    return Err(format!("--example {e}: no examples/{e}.rs"));
                }
            }
            // `cargo run ... -- ARGS`: the arguments go to posgate.
            "--" => return posgate_args(&it.cloned().collect::<Vec<_>>()),
            _ => {}
        }
    }
    Ok(())
}

/// An example's run: the example exists and its source reads each `--flag` (`--flag=V`
/// too) the command gives it.
fn example_command(words: &[String]) -> Result<(), String> {
    let name = Path::new(&words[0])
        .file_name()
        .unwrap_or_default()
        .to_string_lossy();
    let file = format!("examples/{name}.rs");
    if !root().join(&file).exists() {
        return Err(format!("no {file}"));
    }
    let source = read(&file);
    for flag in words[1..].iter().filter(|w| w.starts_with("--")) {
        let literal = match flag.split_once('=') {
            Some((f, _)) => format!("\"{f}=\""),
            None => format!("\"{flag}\""),
        };
        if !source.contains(&literal) {
            return Err(format!("{flag}: {file} does not read it"));
        }
    }
    Ok(())
}

/// A script must exist and be run by CI (`scripts/test`, `.ci/run`) or by a test.
fn script_command(words: &[String]) -> Result<(), String> {
    let script = if words[0] == "bash" {
        words.get(1).ok_or("bash without a script")?
    } else {
        &words[0]
    };
    if !root().join(script).exists() {
        return Err(format!("{script} does not exist"));
    }
    let name = Path::new(script)
        .file_name()
        .unwrap_or_default()
        .to_string_lossy();
    let mut runners = vec![read(".ci/run"), read("scripts/test")];
    // Every test source, those of the modules kept as directories too.
    let mut dirs = vec![root().join("tests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a directory under tests/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                runners.push(std::fs::read_to_string(path).expect("test source"));
            }
        }
    }
    if runners
        .iter()
        .any(|r| r.contains(&format!("scripts/{name}")))
    {
        Ok(())
    } else {
        Err(format!("{script}: neither CI nor a test runs it"))
    }
}

fn promtool_command(words: &[String]) -> Result<(), String> {
    for f in words.iter().filter(|w| w.ends_with(".yaml")) {
        if !root().join(f).exists() {
            return Err(format!("{f} does not exist"));
        }
        let name = Path::new(f)
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        if !read("tests/observability/mod.rs").contains(name.as_ref()) {
            return Err(format!("tests/observability/ does not run promtool on {f}"));
        }
    }
    Ok(())
}

/// `curl`: the method (POST with `-d`, else GET) and path must be in the OpenAPI
/// document, with a bearer token; pushes need an idempotency key.
fn curl_command(words: &[String]) -> Result<(), String> {
    let url = words
        .iter()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .ok_or("curl without a URL")?;
    let path = url
        .splitn(4, '/')
        .nth(3)
        .map(|p| format!("/{p}"))
        .ok_or("URL without a path")?;
    let path = path.split('?').next().unwrap_or_default();
    let post = words
        .iter()
        .any(|w| w == "-d" || w == "--data" || w == "-X");
    let openapi = read("docs/openapi.yaml");
    let documented = openapi.lines().filter_map(|l| {
        let l = l.trim_end();
        (l.starts_with("  /") && l.ends_with(':')).then(|| l.trim().trim_end_matches(':'))
    });
    let matches_template = |template: &str| {
        let (a, b): (Vec<&str>, Vec<&str>) =
            (template.split('/').collect(), path.split('/').collect());
        a.len() == b.len() && a.iter().zip(&b).all(|(t, p)| t.starts_with('{') || t == p)
    };
    let Some(template) = documented.into_iter().find(|t| matches_template(t)) else {
        return Err(format!("{path}: not a path in docs/openapi.yaml"));
    };
    let has = |h: &str| words.iter().any(|w| w.to_ascii_lowercase().starts_with(h));
    if !template.starts_with("/v1/") {
        return Ok(());
    }
    if !has("authorization: bearer ") {
        return Err(format!("{path}: no Authorization: Bearer header"));
    }
    if post && template.ends_with("/push") && !has("idempotency-key: ") {
        return Err(format!("{path}: a push without an Idempotency-Key"));
    }
    Ok(())
}

fn kustomization(dir: &str) -> Result<(), String> {
    if root().join(dir).join("kustomization.yaml").exists() {
        Ok(())
    } else {
        Err(format!("{dir}: no kustomization.yaml"))
    }
}

fn kubectl_command(c: &DocCommand) -> Result<(), String> {
    if c.words.get(1).map(String::as_str) == Some("kustomize") {
        return kustomization(
            c.words
                .get(2)
                .ok_or("kubectl kustomize without a directory")?,
        );
    }
    // What `apply -k DIR` applies is rendered and validated by tests/k8s_manifests/.
    if let Some(at) = c.words.iter().position(|w| w == "-k") {
        kustomization(c.words.get(at + 1).ok_or("-k without a directory")?)?;
    }
    if c.comment.contains(CLUSTER_MARK) {
        Ok(())
    } else {
        Err(format!("mark it `{CLUSTER_MARK}`"))
    }
}

/// `helm install|upgrade|template RELEASE CHART [flags]`: marked when it needs a cluster,
/// and rendered with the same values by `helm template` (tests/k8s_manifests/ validates
/// the chart's renderings), so a wrong value name or a missing required value fails
/// here.
fn helm_command(c: &DocCommand) -> Result<(), String> {
    let verb = c.words.get(1).map(String::as_str).unwrap_or("");
    if !["install", "upgrade", "template"].contains(&verb) {
        return Err(format!("no rule for `helm {verb}`"));
    }
    if verb != "template" && !c.comment.contains(CLUSTER_MARK) {
        return Err(format!("mark it `{CLUSTER_MARK}`"));
    }
    let (Some(release), Some(chart)) = (c.words.get(2), c.words.get(3)) else {
        return Err("helm without a release and a chart".into());
    };
    if !root().join(chart).join("Chart.yaml").exists() {
        return Err(format!("{chart}: no Chart.yaml"));
    }
    let helm = std::env::var("HELM").unwrap_or_else(|_| "helm".into());
    let found = Command::new(&helm)
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if crate::support::tools::require(
        found.then_some(()),
        "helm",
        "documented helm commands not rendered",
        "scripts/install-kubectl installs it",
    )
    .is_none()
    {
        return Ok(());
    }
    // Flags that only mean something against a cluster.
    let args: Vec<&String> = c.words[4..]
        .iter()
        .filter(|w| !["--reuse-values", "--wait", "--atomic"].contains(&w.as_str()))
        .collect();
    let out = Command::new(&helm)
        .current_dir(root())
        .args(["template", release, chart])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {helm}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "helm template fails: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn check(c: &DocCommand) -> Result<(), String> {
    let Some(first) = c.words.first() else {
        return Err("empty command".into());
    };
    if first == "bash" || first.starts_with("scripts/") {
        return script_command(&c.words);
    }
    if first.contains("/examples/") {
        return example_command(&c.words);
    }
    let program = Path::new(first)
        .file_name()
        .unwrap_or_default()
        .to_string_lossy();
    match program.as_ref() {
        "posgate" => posgate_args(&c.words[1..]),
        bin if LOADTEST_BINS.contains(&bin) => loadtest_args(bin, &c.words[1..]),
        "cargo" => cargo_command(&c.words),
        "promtool" => promtool_command(&c.words),
        "curl" => curl_command(&c.words),
        "kubectl" | "docker" => kubectl_command(c),
        "helm" => helm_command(c),
        _ => Err("no rule for this command in tests/doc_commands.rs".into()),
    }
}

#[test]
fn every_documented_command_is_checked_or_marked() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        for c in commands_in(&file) {
            checked += 1;
            if let Err(e) = check(&c) {
                problems.push(format!("{}: `{}`: {e}", c.at, c.words.join(" ")));
            }
        }
    }
    println!("{checked} documented commands checked");
    assert!(
        checked > 10,
        "found only {checked} commands: is the extraction broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checks_reject_what_they_should() {
    let cmd = |line: &str, comment: &str| {
        let (words, _) = shell_words(line);
        DocCommand {
            at: "test".into(),
            words,
            comment: comment.into(),
        }
    };
    let rejected = [
        "posgate serve --no-such-flag",
        "posgate serve --lease-ttl banana",
        "cargo run --release --example no_such_example",
        "cargo build -p not-a-member",
        "bash scripts/no-such-script",
        "curl -H 'Authorization: Bearer x' http://h/v1/nope",
        "curl -H 'Idempotency-Key: k' -d '{}' http://h/v1/terminals/t/push",
        "kubectl apply -k k8s/overlays/dev",
        "helm install posgate charts/posgate",
        "rm -rf /",
    ];
    for line in rejected {
        assert!(
            check(&cmd(line, "")).is_err(),
            "`{line}` should be rejected"
        );
    }
    let accepted = [
        ("posgate serve --lease-ttl 15s", ""),
        ("posgate terminals import FILE [--replace]", ""),
        ("cargo run --release -- demo", ""),
        ("kubectl apply -k k8s/overlays/dev", CLUSTER_MARK),
        ("helm install posgate charts/posgate --set store.cluster=x", CLUSTER_MARK),
        (
            "curl -H 'Authorization: Bearer x' -H 'Idempotency-Key: k' -d '{}' http://h/v1/terminals/t/push",
            "",
        ),
    ];
    for (line, comment) in accepted {
        assert_eq!(check(&cmd(line, comment)), Ok(()), "`{line}` should pass");
    }
}
