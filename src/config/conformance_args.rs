//! [`ConformanceArgs`]: the flags of `posgate conformance`, which checks a terminal
//! implementation against `docs/pos-protocol.md`, and what they resolve to: the terminal
//! as a directory entry would name it and the TLS files a pod would dial it with.
//!
//! What it does not do: dial, or print (that is `crate::pos::conformance` and the
//! binary's `conformance.rs`).

use std::path::PathBuf;

use super::{invalid, ConfigError};
use crate::pos::tls::{ClientIdentity, TlsFiles};
use crate::pos::wire::DEFAULT_PUSH_PATH;
use crate::store::directory::Terminal;

/// Flags of `posgate conformance`.
#[derive(Clone, Debug, clap::Args)]
pub struct ConformanceArgs {
    /// The terminal's address, host:port
    #[arg(long)]
    pub addr: String,
    /// The name its certificate must hold (sent as SNI) [default: the host of --addr]
    #[arg(long)]
    pub server_name: Option<String>,
    /// The terminal's id (what posgate-terminal must name)
    #[arg(long)]
    pub terminal_id: String,
    /// CA bundle (PEM) to verify the terminal with [default: the system roots]
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM chain) to present, as pods do with --pos-client-cert
    #[arg(long, value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// Its private key (PEM)
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// The deployment's push path
    #[arg(long, default_value = DEFAULT_PUSH_PATH)]
    pub push_path: String,
    /// Print the results as JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

/// What `posgate conformance` runs with.
#[derive(Clone, Debug)]
pub struct ConformanceConfig {
    pub terminal: Terminal,
    pub tls: TlsFiles,
    pub push_path: String,
    pub json: bool,
}

impl ConformanceArgs {
    /// Checks the terminal's id, address and name as `terminals import` would, and the
    /// push path.
    pub fn resolve(&self) -> Result<ConformanceConfig, ConfigError> {
        let terminal = Terminal::new(&self.terminal_id, &self.addr, self.server_name.as_deref())
            .map_err(|e| invalid("addr", e.to_string()))?;
        if !self.push_path.starts_with('/') || self.push_path.contains(char::is_whitespace) {
            return Err(invalid("push-path", "must be a path such as /push"));
        }
        let client =
            self.client_cert
                .clone()
                .zip(self.client_key.clone())
                .map(|(cert_file, key_file)| ClientIdentity {
                    cert_file,
                    key_file,
                });
        Ok(ConformanceConfig {
            terminal,
            tls: TlsFiles {
                ca_file: self.ca.clone(),
                client,
            },
            push_path: self.push_path.clone(),
            json: self.json,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ConformanceArgs,
    }

    fn resolve(args: &[&str]) -> Result<ConformanceConfig, String> {
        let argv = ["conformance"].iter().chain(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        cli.args.resolve().map_err(|e| e.to_string())
    }

    #[test]
    fn the_terminal_is_checked_like_a_directory_entry() {
        let s = resolve(&["--addr", "10.0.0.7:8443", "--terminal-id", "pos-7"]).unwrap();
        assert_eq!(s.terminal.server_name, "10.0.0.7");
        assert_eq!(s.push_path, "/push");
        let s = resolve(&[
            "--addr",
            "t.example:443",
            "--server-name",
            "pos-7.example",
            "--terminal-id",
            "pos-7",
            "--client-cert",
            "c.pem",
            "--client-key",
            "k.pem",
        ])
        .unwrap();
        assert_eq!(s.terminal.server_name, "pos-7.example");
        assert!(s.tls.client.is_some());
        for bad in [
            &["--addr", "no-port", "--terminal-id", "pos-7"][..],
            &["--addr", "h:1", "--terminal-id", "bad id"],
            &["--addr", "h:1", "--terminal-id", "t", "--push-path", "push"],
            &[
                "--addr",
                "h:1",
                "--terminal-id",
                "t",
                "--client-cert",
                "c.pem",
            ],
        ] {
            assert!(resolve(bad).is_err(), "{bad:?}");
        }
    }
}
