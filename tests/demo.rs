//! `posgate demo` as a user runs it: the whole cluster in one process, once on the
//! embedded store (no `redis-server` on `PATH`) without the script, once with a private
//! `redis-server` and the script (a pod joins at 10 s, one is killed at 20 s, five
//! terminals are offline from 25 s for 2 s). The summary must report a fully connected
//! farm, no overlapping connections or sessions and no key delivered twice; the script's
//! pushes with a TTL to the offline terminals must be answered `202` and delivered once
//! they are back.

use std::process::Command;

fn demo(args: &[&str], path: &str) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_posgate"));
    cmd.arg("demo").args(args).env_clear().env("PATH", path);
    let out = cmd.output().expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), stdout)
}

/// The summary lines of `stdout` starting with each label end in its value.
fn assert_summary(stdout: &str, expected: &[(&str, &str)]) {
    for (label, value) in expected {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(label))
            .unwrap_or_else(|| panic!("no {label:?} line in:\n{stdout}"));
        assert_eq!(line.trim(), *value, "{label}");
    }
}

const CONNECTED: &str = "terminals connected at the end:";
const RAW_OVERLAPS: &str = "raw overlaps (two connections to one terminal):";
const TWICE: &str = "keys delivered twice:";

#[test]
fn demo_on_the_embedded_store() {
    // A PATH without redis-server (an unset PATH would fall back to /usr/bin).
    // Long enough for the broadcast at 5 s (and the join at 10 s), not the rest.
    let (ok, out) = demo(&["--duration", "12s", "--terminals", "200"], "/nonexistent");
    assert!(ok);
    assert!(out.contains("store: embedded in-memory store"), "{out}");
    // 200 terminals labeled store=0..74 in turn: 3 of them store=17.
    let line = "broadcast to store=17: 3 of 3 terminals took it, in ";
    assert!(out.contains(line), "no {line:?} line in:\n{out}");
    assert!(out.contains("status page: http://127.0.0.1:"), "{out}");
    assert_summary(
        &out,
        &[(CONNECTED, "200"), (RAW_OVERLAPS, "0"), (TWICE, "0")],
    );
}

#[test]
fn demo_script_with_a_private_redis() {
    let path = std::env::var("PATH").unwrap_or_default();
    let (ok, out) = demo(&["--duration", "34s", "--terminals", "300"], &path);
    assert!(ok);
    assert!(out.contains("store: private redis-server"), "{out}");
    assert!(
        out.contains("+ demo-pod-3 started"),
        "the 4th pod joins: {out}"
    );
    assert!(out.contains("x demo-pod-1 killed"), "{out}");
    for line in [
        "- 5 terminals offline (",
        "- 5 of 5 pushes with ?ttl_s=60 answered 202 queued",
        "+ the 5 terminals back online",
        "= 5 of 5 queued pushes delivered, ",
        "pushes with a TTL to offline terminals: 5 of 5 answered 202, 5 delivered once back",
        "* broadcast ",
        "broadcast to store=17: 4 of 4 terminals took it, in ",
    ] {
        assert!(out.contains(line), "no {line:?} line in:\n{out}");
    }
    assert!(!out.contains("the rest: "), "{out}");
    // The kill is an event the demo expects: its takeover is no burst of warnings.
    let warnings: Vec<&str> = out.lines().filter(|l| l.contains("WARN")).collect();
    assert!(warnings.is_empty(), "{}", warnings.join("\n"));
    let sessions = "session overlaps (two accepted sessions > 1 s):";
    assert_summary(
        &out,
        &[
            (CONNECTED, "300"),
            (RAW_OVERLAPS, "0"),
            (sessions, "0"),
            (TWICE, "0"),
        ],
    );
}
