//! The integration tests: one test binary (`cargo test --test it`) with one module per
//! file of `tests/` (`cargo test --test it push_api::` runs one file's tests), all
//! sharing [`support`]. One binary links posgate and its dependencies once, where a
//! binary per file linked them, and compiled the support code, once per file.
//!
//! A file of `tests/` is compiled only when it is declared here (`autotests = false` in
//! `Cargo.toml`); [`every_test_file_is_a_module`] fails for one that is not.

mod support;

mod broadcast;
mod broadcast_store;
mod cli;
mod cli_init;
mod cli_status;
mod cli_terminals;
mod cluster_redis;
mod conformance;
mod dark_time;
mod demo;
mod directory;
mod directory_api;
mod directory_restore;
mod doc_commands;
mod http_api;
mod http_connections;
mod https;
mod k8s_manifests;
mod lease_handover;
mod move_budget;
mod observability;
mod openapi_sync;
mod outage_observability;
mod outage_pods;
mod peer_flood;
mod pos_connections;
mod pos_faults;
mod push_api;
mod queue_store;
mod queued_faults;
mod redis_failover;
mod redis_refusals;
mod redis_round_trips;
mod redis_store;
mod redis_tls;
mod reload;
mod ring_properties;
mod schema_fuzz;
mod simulation;
mod slowloris;
mod static_stability;
mod status_page;
mod store_differential;
mod tracing;

/// Every `tests/*.rs` file and `tests/*/` directory (but this file and `support`) is
/// declared above, so none is silently left out of the run.
#[test]
fn every_test_file_is_a_module() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let root = std::fs::read_to_string(tests.join("it.rs")).expect("tests/it.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&tests).expect("tests/") {
        let path = entry.expect("an entry of tests/").path();
        let name = if path.is_dir() {
            path.file_name()
        } else if path.extension().is_some_and(|e| e == "rs") {
            path.file_stem()
        } else {
            continue;
        };
        let name = name.unwrap_or_default().to_string_lossy().into_owned();
        if name != "it" && name != "support" && !root.contains(&format!("\nmod {name};\n")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "tests/ files that are not modules of tests/it.rs: {missing:?}"
    );
}
