//! The handshake calibration behind the cold-start bound (`load::calibrate`), against a
//! real `pos-sim` process: it counts verified TLS handshakes, and a client that cannot
//! verify the farm's certificate gets an error, not a low figure.

use std::{path::Path, time::Duration};

use posgate_loadtest::load::{
    calibrate::{self, Window},
    sims::SimFarm,
};

const POS_SIM: &str = env!("CARGO_BIN_EXE_pos-sim");

/// Short: the test checks the counting, not the machine.
const WINDOW: Window = Window {
    in_flight: 8,
    warm_up: Duration::from_millis(100),
    span: Duration::from_millis(700),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_verified_handshakes_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let rate = calibrate::handshake_rate(Path::new(POS_SIM), dir.path(), WINDOW)
        .await
        .unwrap();
    assert!(rate.handshakes > 0, "{rate:?}");
    assert_eq!(rate.failed, 0, "{rate:?}");
    assert_eq!(rate.per_s(), (rate.handshakes as f64 / 0.7).round() as u64);
    assert!(
        rate.describe().contains("8 in flight"),
        "{}",
        rate.describe()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_cannot_verify_the_farm_gets_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let farm = SimFarm::start_at(Path::new(POS_SIM), 10, &dir.path().join("farm"), 251)
        .await
        .unwrap();
    // Another farm's CA: every handshake fails its certificate check.
    let other = SimFarm::start_at(Path::new(POS_SIM), 1, &dir.path().join("other"), 252)
        .await
        .unwrap();
    let config = calibrate::client_config(&other.ca).unwrap();
    let terminals = calibrate::terminal_addrs(&farm.csv).unwrap();
    let err = calibrate::measure(config, terminals, WINDOW)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no TLS handshake completed"),
        "{err}"
    );
}
