//! Running the `posgate` binary from an integration test.

use std::process::{Command, Output};

/// Runs the binary with `args` and only the environment in `env` (so a developer's
/// `POSGATE_*` variables cannot change the outcome).
pub fn posgate(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_posgate"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}
