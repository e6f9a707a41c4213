//! `docs/openapi.yaml` stays in sync with the code: every public error code and status
//! the push API can answer is documented, the documented routes exist, and nothing
//! documented is missing from the code (internal codes stay out of the document); the
//! docs/reference.md's status table lists exactly the public codes, each with its real status.

use posgate::push::answer::{ErrorCode, ALL_ERROR_CODES};

const SPEC: &str = include_str!("../docs/openapi.yaml");

/// The codes a caller can see: all but the internal `shard_moved`.
fn public() -> impl Iterator<Item = ErrorCode> {
    ALL_ERROR_CODES
        .into_iter()
        .filter(|c| *c != ErrorCode::ShardMoved)
}

#[test]
fn every_public_error_code_and_status_is_documented() {
    let enum_line = SPEC
        .lines()
        .find(|l| l.trim_start().starts_with("enum: [invalid_request"))
        .expect("the Error schema lists its codes");
    let documented: Vec<&str> = enum_line
        .trim()
        .trim_start_matches("enum: [")
        .trim_end_matches(']')
        .split(", ")
        .collect();
    let coded: Vec<&str> = public().map(|c| c.as_str()).collect();
    assert_eq!(documented, coded, "Error.error enum vs ErrorCode");
    for code in public() {
        let status = format!("\"{}\":", code.status().as_u16());
        assert!(
            SPEC.contains(&status),
            "status {status} of {code:?} undocumented"
        );
    }
    // The internal 421 never reaches a caller, so it is not in the document.
    assert!(!SPEC.contains(ErrorCode::ShardMoved.as_str()));
    assert!(!SPEC.contains("\"421\""));
}

#[test]
fn documented_routes_are_the_public_routes() {
    let paths: Vec<&str> = SPEC
        .lines()
        .filter(|l| l.starts_with("  /"))
        .map(|l| l.trim().trim_end_matches(':'))
        .collect();
    use posgate::api::{
        BATCH_ROUTE, BROADCASTS_ROUTE, BROADCAST_ROUTE, CLUSTER_ROUTE, FEEDBACK_ROUTE,
        PUSHES_ROUTE, PUSH_ROUTE, PUSH_STATUS_ROUTE, TERMINALS_ROUTE, TERMINAL_ROUTE,
    };
    assert_eq!(
        paths,
        [
            PUSH_ROUTE,
            BATCH_ROUTE,
            PUSH_STATUS_ROUTE,
            PUSHES_ROUTE,
            TERMINAL_ROUTE,
            TERMINALS_ROUTE,
            CLUSTER_ROUTE,
            FEEDBACK_ROUTE,
            BROADCASTS_ROUTE,
            BROADCAST_ROUTE,
            "/healthz",
            "/readyz"
        ]
    );
    // The router mounts the API's constants, and the probes by their literal paths.
    let router = include_str!("../src/http/mod.rs");
    for mounted in [
        "api::PUSH_ROUTE",
        "api::PUSH_STATUS_ROUTE",
        "api::PUSHES_ROUTE",
        "api::TERMINAL_ROUTE",
        "api::TERMINALS_ROUTE",
        "api::CLUSTER_ROUTE",
        "api::FEEDBACK_ROUTE",
        "api::BROADCASTS_ROUTE",
        "api::BROADCAST_ROUTE",
        "\"/healthz\"",
        "\"/readyz\"",
    ] {
        assert!(
            router.contains(&format!(".route({mounted},")),
            "{mounted} is documented but not routed"
        );
    }
}

#[test]
fn the_reference_status_table_lists_every_public_code_with_its_status() {
    let reference = include_str!("../docs/reference.md");
    // Rows like "| 503 | `overloaded` | ...".
    let rows: Vec<(u16, &str)> = reference
        .lines()
        .filter_map(|l| {
            let mut cells = l.split('|').map(str::trim).skip(1);
            let status = cells.next()?.parse().ok()?;
            let code = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
            Some((status, code))
        })
        .collect();
    let expected: Vec<(u16, &str)> = public()
        .map(|c| (c.status().as_u16(), c.as_str()))
        .collect();
    assert_eq!(
        rows, expected,
        "docs/reference.md status table vs ErrorCode (order included)"
    );
}
