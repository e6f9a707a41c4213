//! Names the commit the binary is built from, for `posgate --version` and the starting
//! log line: `POSGATE_COMMIT` is `git rev-parse --short=12 HEAD`, or `unknown` outside a
//! git checkout (a source tarball). Uncommitted edits are not noted.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=POSGATE_COMMIT={commit}");
    // A commit moves the branch HEAD names (or HEAD itself when detached).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        for file in ["HEAD", "packed-refs"] {
            println!("cargo:rerun-if-changed={dir}/{file}");
        }
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{branch}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
