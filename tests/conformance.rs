//! `posgate conformance` run as a binary against the POS simulator: the simulator
//! conforms (every check passes, exit 0); each protocol breakage it can be told to make
//! fails exactly the checks of the rule it breaks (exit 1, or 0 when they are SHOULD
//! checks only); a terminal whose certificate does not hold the name fails `tls-h2` and
//! skips the rest. Each run gets a terminal of its own, so no run sees another's epochs
//! or keys.

use std::collections::BTreeSet;

use posgate::pos::conformance::{Level, ALL, PROMPT};
use posgate_pos_sim::FaultConfig;
use serde_json::Value;

use crate::support::binary::posgate;
use crate::support::redis_server::free_port;
use crate::support::tls::TestPki;

/// The example terminal of `posgate-terminal`, compiled into this test.
#[path = "../terminal/examples/terminal.rs"]
mod example_terminal;
use crate::support::farm::{self, Farm};

/// `posgate conformance --json` against terminal `index` of `farm`: exit code, and the
/// ids of the checks by result.
async fn run(farm: &Farm, index: usize, server_name: Option<&str>) -> (i32, Vec<(String, String)>) {
    let t = &farm.entries()[index];
    let args = vec![
        "conformance".to_string(),
        "--json".into(),
        "--addr".into(),
        t.addr.clone(),
        "--terminal-id".into(),
        t.id.clone(),
        "--ca".into(),
        farm.ca_file.to_str().unwrap().into(),
        "--server-name".into(),
        server_name.unwrap_or(&t.server_name).into(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        posgate(&args, &[])
    })
    .await
    .unwrap();
    results(&out)
}

/// The exit code of a `posgate conformance --json` run, and the ids of its checks with
/// their results.
fn results(out: &std::process::Output) -> (i32, Vec<(String, String)>) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}{}", String::from_utf8_lossy(&out.stderr)));
    let checks = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["outcome"]["result"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (out.status.code().unwrap(), checks)
}

fn with(checks: &[(String, String)], result: &str) -> BTreeSet<String> {
    checks
        .iter()
        .filter(|(_, r)| r == result)
        .map(|(id, _)| id.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_conforms_and_each_breakage_fails_its_checks() {
    let broken: [(FaultConfig, &[&str]); 5] = [
        (
            FaultConfig {
                accept_stale_epochs: true,
                ..FaultConfig::default()
            },
            &["stale-hello-refused", "stale-push-refused"],
        ),
        (
            FaultConfig {
                forget_keys: true,
                ..FaultConfig::default()
            },
            &["duplicate-marked", "max-length-key-deduplicated"],
        ),
        (
            FaultConfig {
                accept_without_hello: true,
                ..FaultConfig::default()
            },
            &["push-without-hello-refused"],
        ),
        (
            FaultConfig {
                require_content_type: true,
                ..FaultConfig::default()
            },
            &["push-without-content-type"],
        ),
        (
            // Over the kit's bound (a fifth of a push's default deadline), not its own
            // 5 s limit: the answers come, late.
            FaultConfig {
                answer_delay_ms: 1_200,
                ..FaultConfig::default()
            },
            &["answered-in-time"],
        ),
    ];
    // One terminal per run: the conforming one, each breakage's, the wrong name's.
    let farm = Farm::start(farm::config(broken.len() as u64 + 2)).await;
    let (code, checks) = run(&farm, 0, None).await;
    eprintln!("[conformance] pos-sim: {checks:?}");
    assert_eq!(checks.len(), ALL.len());
    // The kit's answer bound is a fifth of a push's default deadline (protocol §5).
    assert_eq!(PROMPT * 5, posgate::push::DEFAULT_TIMEOUT);
    assert_eq!(with(&checks, "pass").len(), checks.len(), "{checks:?}");
    assert_eq!(code, 0);

    for (index, (faults, breaks)) in broken.into_iter().enumerate() {
        farm.set_faults(faults.clone()).unwrap();
        let (code, checks) = run(&farm, index + 1, None).await;
        let failed = with(&checks, "fail");
        let expected: BTreeSet<String> = breaks.iter().map(|s| s.to_string()).collect();
        assert_eq!(failed, expected, "{faults:?}: {checks:?}");
        assert_eq!(with(&checks, "pass").len(), checks.len() - breaks.len());
        // A failed SHOULD check is reported, not fatal.
        let must = ALL
            .iter()
            .any(|(id, level, _)| *level == Level::Must && breaks.contains(id));
        assert_eq!(code, i32::from(must), "{faults:?}");
    }
    farm.set_faults(FaultConfig::default()).unwrap();

    // A name the certificate does not hold: nothing else can be checked.
    let last = farm.entries().len() - 1;
    let (code, checks) = run(&farm, last, Some("not-this-terminal.example")).await;
    assert_eq!(
        with(&checks, "fail"),
        BTreeSet::from(["tls-h2".to_string()])
    );
    assert_eq!(
        with(&checks, "skipped").len(),
        checks.len() - 1,
        "{checks:?}"
    );
    assert_eq!(code, 1);
}

/// The example terminal of the `posgate-terminal` library (`terminal/examples/terminal.rs`,
/// its `run`, in this process) conforms, with mutual TLS on: `posgate conformance`, a
/// process, passes every check with the pods' client certificate, and a kit without one
/// gets no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_librarys_example_conforms() {
    let pki = TestPki::generate();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let path = |name| pki.path(name).to_str().unwrap().to_string();
    let args = vec![
        "pos-lib-1".to_string(),
        addr.clone(),
        path("server"),
        path("server-key"),
        path("ca"),
    ];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let terminal = tokio::spawn(async move { example_terminal::run(&args, stopped).await });
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        assert!(
            !terminal.is_finished(),
            "the example terminal ended: {:?}",
            terminal.await
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let kit = |client_cert: bool| {
        let mut args = vec![
            "conformance",
            "--json",
            "--addr",
            &addr,
            "--terminal-id",
            "pos-lib-1",
            "--server-name",
            "localhost",
        ]
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
        args.extend(["--ca".into(), path("ca")]);
        if client_cert {
            args.extend([
                "--client-cert".into(),
                path("client"),
                "--client-key".into(),
                path("client-key"),
            ]);
        }
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            posgate(&args, &[])
        })
    };
    let out = kit(true).await.unwrap();
    let (code, checks) = results(&out);
    eprintln!("[conformance] example terminal: {checks:?}");
    assert_eq!(checks.len(), ALL.len());
    assert_eq!(with(&checks, "pass").len(), checks.len(), "{checks:?}");
    assert_eq!(code, 0);

    // Without a client certificate the terminal ends the handshake: under TLS 1.3 the
    // kit learns it only at its first request, so `hello-accepted` is what fails.
    let (code, checks) = results(&kit(false).await.unwrap());
    let failed = with(&checks, "fail");
    assert!(
        failed == BTreeSet::from(["tls-h2".to_string()])
            || failed == BTreeSet::from(["hello-accepted".to_string()]),
        "{checks:?}"
    );
    assert!(
        with(&checks, "pass").iter().all(|id| id == "tls-h2"),
        "{checks:?}"
    );
    assert_eq!(code, 1);
    stop.send(()).unwrap();
    terminal.await.unwrap().unwrap();
}
