//! `wire-dial`, the cold start's floor without posgate, against real `pos-sim` processes:
//! it reports its figure only when the farm's own counters agree that every terminal is
//! connected and, with `--hello`, was greeted.

use std::process::Command;

const WIRE_DIAL: &str = env!("CARGO_BIN_EXE_wire-dial");
const POS_SIM: &str = env!("CARGO_BIN_EXE_pos-sim");

fn wire_dial(dir: &std::path::Path, hello: bool) -> (bool, String) {
    let mut cmd = Command::new(WIRE_DIAL);
    cmd.arg("--dir")
        .arg(dir)
        .args(["--pos-sim", POS_SIM])
        .args([
            "--dialers",
            "3",
            "--terminals",
            "300",
            "--dial-rate",
            "1000",
        ]);
    if hello {
        cmd.arg("--hello");
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Both modes in one test: each run's farms take fixed loopback addresses (as
/// `posgate-load`'s do), so two runs cannot share the machine.
#[test]
fn every_terminal_is_dialed_and_held_and_greeted_only_with_hello() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = wire_dial(&dir.path().join("hello"), true);
    assert!(ok, "{out}");
    assert!(
        out.contains("farm: 300 terminals connected, 300 hellos accepted, 0 handshakes failed"),
        "{out}"
    );
    assert!(
        out.contains("TLS + HTTP/2 + hello: 300 terminals by 3 dialers in"),
        "{out}"
    );
    assert!(out.contains(" x T (T = "), "{out}");

    let (ok, out) = wire_dial(&dir.path().join("tls"), false);
    assert!(ok, "{out}");
    assert!(
        out.contains("farm: 300 terminals connected, 0 hellos accepted, 0 handshakes failed"),
        "{out}"
    );
    assert!(
        out.contains("TLS only: 300 terminals by 3 dialers"),
        "{out}"
    );
}
