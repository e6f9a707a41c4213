//! The OpenAPI document against a live pod with terminals, by a schema fuzzer
//! (schemathesis, from PyPI): requests generated from `docs/openapi.yaml`, valid and
//! not, and every answer checked: its status documented for the operation, its content
//! type and body as documented, and no server error but the documented 503 and 504
//! (`tests/support/schemathesis_hooks.py`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use posgate_loadtest::load::pods::TOKEN;

use crate::support::farm;
use crate::support::gateway::Gateway;
use crate::support::tools;
use crate::support::wait::wait_for;

/// Generated examples per operation; a fixed seed keeps a failure reproducible.
const EXAMPLES: &str = "100";
const SEED: &str = "20261202";

fn schemathesis() -> Option<&'static str> {
    let ok = Command::new("schemathesis")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some("schemathesis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_answers_as_its_openapi_document_says() {
    let Some(tool) = tools::require(
        schemathesis(),
        "schemathesis",
        "the API is not fuzzed against docs/openapi.yaml",
        "pip install schemathesis",
    ) else {
        return;
    };
    let gateway = Gateway::start(2, farm::config(50), "schema-fuzz").await;
    wait_for("every terminal served", Duration::from_secs(30), || {
        gateway.current()
    })
    .await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let url = gateway.pods[0].url.clone();
    let run = tokio::task::spawn_blocking(move || {
        Command::new(tool)
            .current_dir(std::env::temp_dir())
            .env("SCHEMATHESIS_HOOKS", "schemathesis_hooks")
            .env("PYTHONPATH", root.join("tests/support"))
            .env("NO_COLOR", "1")
            .args(["run", root.join("docs/openapi.yaml").to_str().unwrap()])
            .args(["--url", &url])
            .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
            .args(["--max-examples", EXAMPLES, "--seed", SEED])
            .args(["--request-timeout", "10"])
            .args([
                "--checks",
                "status_code_conformance,content_type_conformance,\
                 response_schema_conformance,only_documented_server_errors",
            ])
            .output()
            .expect("run schemathesis")
    })
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    let summary: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("generated") || l.contains("passed") || l.contains("failures"))
        .collect();
    eprintln!("[schema-fuzz] {}", summary.join(" | "));
    assert!(
        run.status.success(),
        "schemathesis found answers the OpenAPI document does not allow:\n{out}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}
