//! Test tools that are not part of posgate (kubectl, promtool, Chromium): a test that
//! runs one passes what it found through [`require`].
//!
//! Under `CI=true` a missing tool fails the test: CI must run every check, and
//! `scripts/test` installs the tools (a failed install already stops it there). Elsewhere
//! the test says "skipped" and why, and passes, so a developer without the tool can
//! still run the rest.
//!
//! Not for: finding the tool (each test knows its binary and flags) or installing it.

/// Whether this run is CI: `CI` is `true` (any case) or `1`, as CI services set it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// `found`, or, when the tool is missing (`None`): a panic under `CI=true`, otherwise a
/// "skipped" line naming `tool`, what is not checked, and how to install it.
pub fn require<T>(found: Option<T>, tool: &str, unchecked: &str, install: &str) -> Option<T> {
    if found.is_some() {
        return found;
    }
    if in_ci() {
        panic!("{tool} is required under CI=true but was not found: {unchecked} ({install})");
    }
    eprintln!("skipped: {tool} not installed, {unchecked} ({install})");
    None
}
