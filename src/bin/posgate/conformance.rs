//! `posgate conformance`: checks a terminal implementation against
//! `docs/pos-protocol.md` (the checks are `posgate::pos::conformance`'s) and prints a
//! table, or JSON for CI.
//!
//! Not for: the flags (`posgate::config::conformance_args`).

use std::process::ExitCode;

use posgate::config::conformance_args::ConformanceArgs;
use posgate::pos::conformance::{self, Check, Level, Outcome};

use crate::{or_usage, runtime};

/// Exit 0 when every MUST check passed (a failed SHOULD is printed, not fatal), 1 when
/// one failed or was skipped, 2 for bad flags or TLS files.
pub fn main(args: ConformanceArgs) -> ExitCode {
    run(args).unwrap_or_else(|code| code)
}

fn run(args: ConformanceArgs) -> Result<ExitCode, ExitCode> {
    let settings = or_usage(args.resolve())?;
    let tls = or_usage(posgate::pos::tls::client_config(&settings.tls))?;
    let runtime = runtime()?;
    let checks = runtime.block_on(conformance::run(
        tls,
        &settings.terminal,
        &settings.push_path,
    ));
    if settings.json {
        let json = serde_json::json!({
            "terminal": settings.terminal.id,
            "addr": settings.terminal.addr,
            "server_name": settings.terminal.server_name,
            "conforms": conforms(&checks),
            "checks": checks,
        });
        println!("{json:#}");
    } else {
        print!("{}", table(&settings.terminal.id, &checks));
    }
    Ok(if conforms(&checks) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Every MUST check passed.
fn conforms(checks: &[Check]) -> bool {
    checks
        .iter()
        .all(|c| c.level != Level::Must || c.outcome == Outcome::Pass)
}

fn table(terminal: &str, checks: &[Check]) -> String {
    let mut out = format!(
        "{:<28} {:<6} {:<5} {:<7} detail\n",
        "CHECK", "LEVEL", "RULE", "RESULT"
    );
    for c in checks {
        let level = match c.level {
            Level::Must => "MUST",
            Level::Should => "SHOULD",
        };
        let (result, detail) = match &c.outcome {
            Outcome::Pass => ("pass", ""),
            Outcome::Fail(why) => ("FAIL", why.as_str()),
            Outcome::Skipped(why) => ("skipped", why.as_str()),
        };
        out.push_str(&format!(
            "{:<28} {level:<6} {:<5} {result:<7} {detail}\n",
            c.id, c.rule
        ));
    }
    let verdict = if conforms(checks) {
        "conforms: every MUST check passed"
    } else {
        "does NOT conform: a MUST check failed or was skipped"
    };
    out.push_str(&format!("\n{terminal}: {verdict} (docs/pos-protocol.md)\n"));
    out
}
