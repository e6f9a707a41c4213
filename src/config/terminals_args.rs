//! [`TerminalsArgs`]: the flags of `posgate terminals` (`import`, `export`, `remove`,
//! `count`), which edit and read the terminal directory in Redis.
//!
//! The store flags ([`StoreArgs`]) are those of `posgate serve`, with the same
//! environment variables. `--shards` matters here: it decides each terminal's shard.
//!
//! What it does not do: connect, or read the import file (that is the binary's
//! `terminals.rs`).

use std::path::PathBuf;

use super::store_args::StoreArgs;
use super::{ConfigError, StoreConfig};
use crate::api::valid_terminal_id;

/// Flags of `posgate terminals`. Every flag is global: it may stand before or after the
/// action.
#[derive(Clone, clap::Args)]
#[command(mut_args(|a| a.global(true)))]
pub struct TerminalsArgs {
    #[command(subcommand)]
    pub command: TerminalsCommand,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// What `posgate terminals` does.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum TerminalsCommand {
    /// Add or update the terminals of a CSV file with the header id,addr,server_name
    /// (server_name may be empty: it defaults to the host of addr), or
    /// id,addr,server_name,labels (labels as key=value;key=value, possibly empty). Every
    /// line is checked first; if any is bad, nothing is imported.
    Import {
        /// The CSV file; - reads standard input
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Also remove every terminal that is not in FILE
        #[arg(long)]
        replace: bool,
    },
    /// Remove terminals by id
    Remove {
        #[arg(value_name = "ID", required = true, num_args = 1.., value_parser = parse_id)]
        ids: Vec<String>,
    },
    /// Print the number of terminals in the directory
    Count,
    /// Write every terminal as CSV (the import format, sorted by id) to stdout, or to
    /// FILE (written whole, then renamed into place); `import` reads it back unchanged
    Export {
        /// Write to this file instead of stdout
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

impl TerminalsArgs {
    /// Validates the store flags: the settings to connect with.
    pub fn resolve(&self) -> Result<StoreConfig, ConfigError> {
        self.store.resolve()
    }
}

fn parse_id(s: &str) -> Result<String, String> {
    if valid_terminal_id(s) {
        Ok(s.to_string())
    } else {
        Err("a terminal id is 1-64 characters of [A-Za-z0-9._:-]".to_string())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config::REDIS_PASSWORD_ENV;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(clap::Subcommand)]
    enum Top {
        Terminals(TerminalsArgs),
    }

    fn parse(args: &[&str]) -> Result<TerminalsArgs, clap::Error> {
        let argv = ["posgate", "terminals"].iter().chain(args);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Top::Terminals(t) => t,
        })
    }

    #[test]
    fn flags_before_or_after_the_action() {
        let a = parse(&["--shards", "8", "import", "f.csv", "--replace"]).unwrap();
        assert_eq!(a.store.shards, 8);
        assert!(matches!(
            a.command,
            TerminalsCommand::Import { replace: true, .. }
        ));
        let a = parse(&["remove", "a", "b", "--cluster", "c1"]).unwrap();
        assert_eq!(a.store.cluster, "c1");
        assert!(matches!(a.command, TerminalsCommand::Remove { ref ids } if ids.len() == 2));
        assert!(parse(&["remove"]).is_err());
        assert!(parse(&["remove", "bad id"]).is_err());
        assert!(parse(&["count"]).is_ok());
        let a = parse(&["export", "--output", "all.csv"]).unwrap();
        assert!(
            matches!(a.command, TerminalsCommand::Export { output: Some(ref f) } if f == Path::new("all.csv"))
        );
        assert!(matches!(
            parse(&["export"]).unwrap().command,
            TerminalsCommand::Export { output: None }
        ));
    }

    #[test]
    fn resolve_checks_store_flags() {
        let none = |_: &str| None;
        let a = parse(&["count"]).unwrap();
        let s = a.store.resolve_with(none).unwrap();
        assert_eq!(s.cluster, "default");
        assert_eq!(s.store_timeout, Duration::from_secs(5));
        let pw = |name: &str| (name == REDIS_PASSWORD_ENV).then(|| "s3cret".to_string());
        let s = a.store.resolve_with(pw).unwrap();
        assert!(s.redis_url.contains("s3cret"));
        for (args, flag) in [
            (&["count", "--shards", "0"][..], "shards"),
            (&["count", "--cluster", "a b"], "cluster"),
            (&["count", "--redis-url", "http://x"], "redis-url"),
            (&["count", "--redis-ca-file", "/ca.pem"], "redis-ca-file"),
            (
                &["count", "--redis-client-cert", "/c.pem"],
                "redis-client-cert",
            ),
        ] {
            match parse(args).unwrap().store.resolve_with(none) {
                Err(ConfigError::Invalid { flag: f, .. }) => assert_eq!(f, flag, "{args:?}"),
                other => panic!("{args:?}: {:?}", other.map(|_| ())),
            }
        }
    }
}
