//! The `posgate` binary's command line: bad flags and missing secrets are refused before
//! anything starts, with exit code 2 and one line on stderr naming the culprit; and
//! `posgate simulate` runs seeds and reports its rates.

use crate::support::binary::posgate;

/// Asserts a refusal with exit code 2 and a single stderr line starting with `prefix`;
/// returns the line.
fn refused(args: &[&str], env: &[(&str, &str)], prefix: &str) -> String {
    let out = posgate(args, env);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: expected one line, got {stderr:?}"
    );
    assert!(
        lines[0].starts_with(prefix),
        "{args:?}: {stderr:?} should start with {prefix:?}"
    );
    lines[0].to_string()
}

const INSECURE: &[(&str, &str)] = &[("POSGATE_INSECURE", "true")];

#[test]
fn invalid_timings_and_sizes_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["serve", "--lease-ttl", "2s"],
            "error: invalid --lease-ttl: ",
        ),
        (&["serve", "--shards", "0"], "error: invalid --shards: "),
        (&["serve", "--shards", "many"], "error: invalid --shards: "),
        (
            &["serve", "--lease-ttl", "nonsense"],
            "error: invalid --lease-ttl: ",
        ),
        (
            &["serve", "--store-timeout", "12s"],
            "error: invalid --store-timeout: ",
        ),
        (
            &["serve", "--heartbeat-interval", "10s"],
            "error: invalid --heartbeat-interval: ",
        ),
        (
            &["serve", "--cluster", "no spaces"],
            "error: invalid --cluster: ",
        ),
        (
            &["serve", "--advertise-url", "10.0.0.1:8080"],
            "error: invalid --advertise-url: ",
        ),
        (
            &["serve", "--log-format", "xml"],
            "error: invalid --log-format: ",
        ),
        (
            &["serve", "--redis-url", "http://x"],
            "error: invalid --redis-url: ",
        ),
    ];
    for (args, prefix) in cases {
        refused(args, INSECURE, prefix);
    }
}

#[test]
fn tls_certificate_and_key_come_together() {
    refused(
        &["serve", "--tls-cert", "/tls/tls.crt"],
        INSECURE,
        "error: invalid --tls-cert: needs --tls-key",
    );
    refused(
        &["serve", "--tls-key", "/tls/tls.key"],
        INSECURE,
        "error: invalid --tls-key: needs --tls-cert",
    );
    refused(
        &["serve"],
        &[
            ("POSGATE_INSECURE", "1"),
            ("POSGATE_TLS_KEY", "/tls/tls.key"),
        ],
        "error: invalid --tls-key: needs --tls-cert",
    );
    refused(
        &["serve", "--tls-cert", "c", "--tls-key", "k"],
        &[
            ("POSGATE_INSECURE", "1"),
            ("POSGATE_ADVERTISE_URL", "http://10.0.0.1:8080"),
        ],
        "error: invalid --advertise-url: must start with https://",
    );
    refused(
        &["serve", "--reload-poll-interval", "often"],
        INSECURE,
        "error: invalid --reload-poll-interval: ",
    );
}

/// Files that exist as flags but cannot be used stop the start with exit code 2, the
/// log naming the file.
#[test]
fn an_unreadable_tls_certificate_stops_the_start_naming_the_file() {
    let pki = crate::support::tls::TestPki::generate();
    let out = posgate(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--advertise-url",
            "https://127.0.0.1:1",
            "--tls-cert",
            "/nonexistent/tls.crt",
            "--tls-key",
            pki.path("server-key").to_str().unwrap(),
            "--pos-ca",
            pki.path("ca").to_str().unwrap(),
        ],
        INSECURE,
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent/tls.crt"), "{stderr}");
}

#[test]
fn environment_variables_are_checked_like_flags() {
    refused(
        &["serve"],
        &[("POSGATE_SHARDS", "0"), ("POSGATE_INSECURE", "1")],
        "error: invalid --shards: ",
    );
    refused(
        &["serve"],
        &[("POSGATE_LEASE_TTL", "soon"), ("POSGATE_INSECURE", "1")],
        "error: invalid --lease-ttl: ",
    );
    refused(
        &["serve"],
        &[("POSGATE_INSECURE", "maybe")],
        "error: invalid --insecure: ",
    );
}

#[test]
fn serve_without_a_secret_refuses_unless_insecure() {
    let line = refused(&["serve"], &[], "error: no cluster secret");
    assert!(
        line.contains("POSGATE_CLUSTER_SECRET") && line.contains("--insecure"),
        "{line}"
    );
    refused(
        &["serve", "--cluster-secret-file", "/nonexistent/secret"],
        &[],
        "error: invalid --cluster-secret-file: ",
    );
}

#[test]
fn serve_without_api_tokens_refuses_unless_insecure() {
    let secret = ("POSGATE_CLUSTER_SECRET", "a-long-enough-cluster-secret");
    let line = refused(&["serve"], &[secret], "error: no API tokens");
    assert!(
        line.contains("POSGATE_API_TOKENS") && line.contains("--insecure"),
        "{line}"
    );
    // A bad token list names the entry, never the token.
    let line = refused(
        &["serve"],
        &[secret, ("POSGATE_API_TOKENS", "acme:short-token")],
        "error: invalid POSGATE_API_TOKENS: entry 1: token must be",
    );
    assert!(!line.contains("short-token"), "{line}");
    refused(
        &["serve"],
        &[secret, ("POSGATE_API_TOKENS", "no-colon-here-0123456789")],
        "error: invalid POSGATE_API_TOKENS: entry 1: expected tenant:token",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, "# tenants\nacme:a-good-token-0123456789\nacme\n").unwrap();
    refused(
        &["serve", "--api-tokens-file", file.to_str().unwrap()],
        &[secret],
        "error: invalid --api-tokens-file: line 3: expected tenant:token",
    );
    refused(
        &["serve", "--max-push-bytes", "0"],
        &[secret, ("POSGATE_INSECURE", "1")],
        "error: invalid --max-push-bytes: ",
    );
    refused(
        &["serve", "--pos-push-path", "push"],
        &[secret, ("POSGATE_INSECURE", "1")],
        "error: invalid --pos-push-path: ",
    );
}

#[test]
fn a_bad_secret_is_refused_without_being_printed() {
    let line = refused(
        &["serve"],
        &[("POSGATE_CLUSTER_SECRET", "tooshort")],
        "error: invalid POSGATE_CLUSTER_SECRET: ",
    );
    assert!(!line.contains("tooshort"), "{line}");
    let env = [
        ("POSGATE_CLUSTER_SECRET", "a-long-enough-cluster-secret"),
        ("POSGATE_API_TOKENS", "acme:a-good-token-0123456789"),
        ("POSGATE_REDIS_PASSWORD", "hunter2"),
    ];
    let line = refused(
        &["serve", "--redis-url", "redis://u:pw@h:6379"],
        &env,
        "error: invalid POSGATE_REDIS_PASSWORD: ",
    );
    assert!(
        !line.contains("hunter2") && !line.contains(":pw@"),
        "{line}"
    );
}

#[test]
fn unknown_flags_and_commands_are_one_line_errors() {
    refused(&["serve", "--no-such-flag"], &[], "error: ");
    refused(&["frobnicate"], &[], "error: ");
    refused(
        &["serve", "--cluster-secret", "given-as-a-flag"],
        &[],
        "error: ",
    );
}

#[test]
fn version_and_help() {
    let out = posgate(&["--version"], &[]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    // The release and the commit it was built from (the checkout's, when there is one).
    assert_eq!(
        stdout.trim(),
        format!(
            "posgate {} ({})",
            env!("CARGO_PKG_VERSION"),
            env!("POSGATE_COMMIT")
        )
    );
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    if let Some(head) = head.ok().filter(|h| h.status.success()) {
        let head = String::from_utf8(head.stdout).unwrap();
        assert_eq!(env!("POSGATE_COMMIT"), head.trim());
    }

    let out = posgate(&["serve", "--help"], &[]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for expected in [
        "--lease-ttl",
        "POSGATE_LEASE_TTL",
        "--cluster-secret-file",
        "--insecure",
    ] {
        assert!(help.contains(expected), "help lacks {expected}:\n{help}");
    }
}

#[test]
fn simulate_runs_seeds_and_reports_rates() {
    let out = posgate(&["simulate", "--first", "0", "--seeds", "3"], &[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains("3 seeds") && summary.contains("seeds/s") && summary.contains("events/s"),
        "{stdout}"
    );
    // The cluster's size: in the summary, and bounded.
    let args = [
        "--pods",
        "12",
        "--shards",
        "128",
        "--terminals-per-shard",
        "2",
    ];
    let out = posgate(&[&["simulate", "--seeds", "1"][..], &args].concat(), &[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("(12 pods, 128 shards, 2 terminals each)"),
        "{stdout}"
    );
    refused(
        &["simulate", "--shards", "0"],
        &[],
        "error: invalid --shards: ",
    );
    refused(&["simulate", "--pods", "0"], &[], "error: invalid --pods: ");
    // --trace only makes sense for one replayed seed.
    refused(&["simulate", "--trace"], &[], "error: missing --seed");
    refused(&["simulate", "--seed", "1", "--seeds", "5"], &[], "error: ");
}

/// The reference's flag table (docs/reference.md) documents exactly the flags `posgate serve` has.
#[test]
fn reference_flag_table_matches_serve_help() {
    let out = posgate(&["serve", "--help"], &[]);
    let help = String::from_utf8(out.stdout).unwrap();
    let flags_in = |text: &str, line_start: &str| -> std::collections::BTreeSet<String> {
        text.lines()
            .filter(|l| l.trim_start().starts_with(line_start))
            .flat_map(|l| {
                let head = if line_start == "|" {
                    // Only the first column of a table row names flags.
                    l.split('|').nth(1).unwrap_or_default().to_string()
                } else {
                    l.split_whitespace().next().unwrap_or_default().to_string()
                };
                head.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .filter(|w| {
                        w.strip_prefix("--")
                            .is_some_and(|f| f.starts_with(|c: char| c.is_ascii_lowercase()))
                    })
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut documented = flags_in(include_str!("../docs/reference.md"), "|");
    let mut actual = flags_in(&help, "--");
    actual.remove("--help");
    documented.remove("--help");
    assert_eq!(
        documented, actual,
        "docs/reference.md flag table vs `posgate serve --help`"
    );
}
