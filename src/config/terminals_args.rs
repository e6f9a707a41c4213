//! [`TerminalsArgs`]: the flags of `posgate terminals` (`import`, `export`, `remove`,
//! `count`), which edit and read the terminal directory in Redis.
//!
//! The store flags are those of `posgate serve`, with the same environment variables
//! (`POSGATE_REDIS_URL`, `POSGATE_REDIS_PASSWORD[_FILE]`, `POSGATE_REDIS_CA_FILE`,
//! `POSGATE_REDIS_CLIENT_CERT`/`_KEY`, `POSGATE_CLUSTER`, `POSGATE_SHARDS`), so a command
//! run in a pod's environment reaches that pod's cluster. `--shards` matters: it decides
//! each terminal's shard, and is checked against the cluster's pinned metadata.
//!
//! What it does not do: connect, or read the import file (that is the binary's
//! `terminals.rs`).

use std::path::PathBuf;
use std::time::Duration;

use super::redis_args::RedisArgs;
use super::{invalid, valid_cluster, ConfigError, StoreSettings, DEFAULT_CLUSTER};
use crate::api::valid_terminal_id;

/// Flags of `posgate terminals`. Every flag is global: it may stand before or after the
/// action.
#[derive(Clone, clap::Args)]
#[command(mut_args(|a| a.global(true)))]
pub struct TerminalsArgs {
    #[command(subcommand)]
    pub command: TerminalsCommand,
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Name of the cluster ([A-Za-z0-9._-], 1-64)
    #[arg(long, env = "POSGATE_CLUSTER", default_value = DEFAULT_CLUSTER)]
    pub cluster: String,
    /// Number of shards of the cluster (decides each terminal's shard)
    #[arg(long, env = "POSGATE_SHARDS", default_value_t = 64)]
    pub shards: u32,
    /// Redis response timeout per call (a call writes at most 1,000 terminals)
    #[arg(long, default_value = "5s", value_parser = parse_timeout)]
    pub store_timeout: Duration,
}

/// What `posgate terminals` does.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum TerminalsCommand {
    /// Add or update the terminals of a CSV file with the header id,addr,server_name
    /// (server_name may be empty: it defaults to the host of addr). Every line is checked
    /// first; if any is bad, nothing is imported.
    Import {
        /// The CSV file
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
    pub fn resolve(&self) -> Result<StoreSettings, ConfigError> {
        self.resolve_with(|name| std::env::var(name).ok())
    }

    /// [`Self::resolve`] with environment variables read through `env`.
    pub fn resolve_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<StoreSettings, ConfigError> {
        if self.shards == 0 || self.shards > 4096 {
            return Err(invalid(
                "shards",
                format!("must be between 1 and 4096, got {}", self.shards),
            ));
        }
        if !valid_cluster(&self.cluster) {
            return Err(invalid(
                "cluster",
                "must be 1-64 characters of [A-Za-z0-9._-]",
            ));
        }
        self.redis
            .clone()
            .resolve(self.cluster.clone(), self.store_timeout, &env)
    }
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be greater than zero".to_string()),
        Err(e) => Err(format!("not a duration ({e}); use e.g. 500ms, 5s, 1m")),
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
        assert_eq!(a.shards, 8);
        assert!(matches!(
            a.command,
            TerminalsCommand::Import { replace: true, .. }
        ));
        let a = parse(&["remove", "a", "b", "--cluster", "c1"]).unwrap();
        assert_eq!(a.cluster, "c1");
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
        let s = a.resolve_with(none).unwrap();
        assert_eq!(s.cluster, "default");
        assert_eq!(s.store_timeout, Duration::from_secs(5));
        let pw = |name: &str| (name == REDIS_PASSWORD_ENV).then(|| "s3cret".to_string());
        let s = a.resolve_with(pw).unwrap();
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
            match parse(args).unwrap().resolve_with(none) {
                Err(ConfigError::Invalid { flag: f, .. }) => assert_eq!(f, flag, "{args:?}"),
                other => panic!("{args:?}: {:?}", other.map(|_| ())),
            }
        }
    }
}
