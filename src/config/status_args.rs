//! [`StatusArgs`]: the flags of `posgate status`, which shows the cluster in a terminal
//! from one pod's `GET /v1/cluster`, and [`StatusConfig`], what they resolve to.
//!
//! The operator token comes from `POSGATE_OPERATOR_TOKEN` or a file
//! (`--token-file`, `POSGATE_OPERATOR_TOKEN_FILE`), never from a flag: a command line
//! is visible to every user of the machine in `ps`. Without either it is the `operator`
//! entry of the pod's own tokens (`POSGATE_API_TOKENS_FILE` or `POSGATE_API_TOKENS`),
//! and an `https://` pod is verified with the pod's own peer settings
//! (`POSGATE_PEER_CA_FILE`, `POSGATE_PEER_TLS_NAME`): inside a pod
//! (`kubectl exec deploy/posgate -- posgate status`) it needs no setup.
//!
//! What it does not do: connect, or draw (that is the binary's `status.rs`).

use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

use super::{invalid, parse_duration, ConfigError};

/// The environment variable holding the operator token.
pub const OPERATOR_TOKEN_ENV: &str = "POSGATE_OPERATOR_TOKEN";

/// Flags of `posgate status`.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    /// A pod's base URL (http:// or https://); any pod shows the whole cluster
    #[arg(long, env = "POSGATE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// File holding the operator token (the token of an `operator:` entry of the tokens
    /// file); or set POSGATE_OPERATOR_TOKEN
    #[arg(long, env = "POSGATE_OPERATOR_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// CA bundle (PEM) to verify an https:// pod with [default: the system roots]
    #[arg(long, env = "POSGATE_PEER_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// The name an https:// pod's certificate must hold, when it does not name the
    /// URL's host (pods share one certificate issued for a service name)
    #[arg(long, env = "POSGATE_PEER_TLS_NAME", value_name = "NAME")]
    pub tls_name: Option<String>,
    /// Draw again every --interval until interrupted
    #[arg(long)]
    pub watch: bool,
    /// How often --watch draws
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub interval: Duration,
    /// How long one request may take
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// What `posgate status` runs with.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    /// `<url>/v1/cluster?include=terminals`.
    pub cluster_url: Uri,
    /// `None`: no token (a pod in `--insecure` mode answers without one).
    pub token: Option<String>,
    pub ca_file: Option<PathBuf>,
    /// `--tls-name`: the name to verify instead of the URL's host.
    pub tls_name: Option<rustls::pki_types::ServerName<'static>>,
    /// `Some(interval)` with `--watch`.
    pub watch: Option<Duration>,
    pub timeout: Duration,
}

impl StatusArgs {
    /// Validates the flags and reads the token.
    pub fn resolve(&self) -> Result<StatusConfig, ConfigError> {
        self.resolve_with(|name| std::env::var(name).ok())
    }

    /// [`Self::resolve`] with environment variables read through `env`.
    pub fn resolve_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<StatusConfig, ConfigError> {
        let base = self.url.trim_end_matches('/');
        let cluster_url: Uri = format!("{base}/v1/cluster?include=terminals")
            .parse()
            .map_err(|e| invalid("url", format!("not a URL ({e})")))?;
        if !matches!(cluster_url.scheme_str(), Some("http" | "https"))
            || cluster_url.host().is_none()
        {
            return Err(invalid("url", "must be http://host[:port] or https://..."));
        }
        for (flag, d) in [("interval", self.interval), ("timeout", self.timeout)] {
            if d.is_zero() {
                return Err(invalid(flag, "must be greater than zero"));
            }
        }
        let token = match (&self.token_file, env(OPERATOR_TOKEN_ENV)) {
            (Some(file), _) => Some(token_from_file(file)?),
            (None, Some(token)) if !token.trim().is_empty() => Some(token.trim().to_string()),
            (None, _) => pods_operator_token(&env)?,
        };
        let tls_name = match &self.tls_name {
            Some(name) => Some(
                rustls::pki_types::ServerName::try_from(name.clone())
                    .map_err(|_| invalid("tls-name", "not a DNS name or IP address"))?,
            ),
            None => None,
        };
        Ok(StatusConfig {
            cluster_url,
            token,
            tls_name,
            ca_file: self.ca_file.clone(),
            watch: self.watch.then_some(self.interval),
            timeout: self.timeout,
        })
    }
}

/// The `operator` entry of the pod's tokens (`POSGATE_API_TOKENS_FILE`, else
/// `POSGATE_API_TOKENS`), as `posgate serve` in the same environment reads them.
fn pods_operator_token(
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    if let Some(file) = env("POSGATE_API_TOKENS_FILE") {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            let why = format!(
                "no operator token given, and the pod's tokens file {file} cannot be read: {e}"
            );
            invalid("token-file", why)
        })?;
        return Ok(crate::credentials::operator_token(&text, false));
    }
    Ok(env("POSGATE_API_TOKENS").and_then(|v| crate::credentials::operator_token(&v, true)))
}

/// The token in `file`: its content, trimmed (a trailing newline is usual).
fn token_from_file(file: &std::path::Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| invalid("token-file", format!("cannot read {}: {e}", file.display())))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(invalid(
            "token-file",
            format!("{} must hold one token and nothing else", file.display()),
        ));
    }
    Ok(token.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        status: StatusArgs,
    }

    fn resolve(args: &[&str], token: Option<&str>) -> Result<StatusConfig, ConfigError> {
        let argv = ["status"].iter().chain(args);
        let cli = Cli::try_parse_from(argv).expect("flags parse");
        cli.status.resolve_with(|name| {
            token
                .filter(|_| name == OPERATOR_TOKEN_ENV)
                .map(String::from)
        })
    }

    #[test]
    fn the_url_token_and_timings_are_checked() {
        let s = resolve(&["--url", "https://pod-0.posgate:8443/"], Some(" op-1\n")).unwrap();
        assert_eq!(
            s.cluster_url.to_string(),
            "https://pod-0.posgate:8443/v1/cluster?include=terminals"
        );
        assert_eq!(s.token.as_deref(), Some("op-1"));
        assert_eq!(s.watch, None);
        let s = resolve(&["--watch", "--interval", "1s"], None).unwrap();
        assert_eq!(s.token, None);
        assert_eq!(s.watch, Some(Duration::from_secs(1)));
        for (args, flag) in [
            (&["--url", "pod-0:8080"][..], "url"),
            (&["--url", "ftp://pod-0"][..], "url"),
            (&["--interval", "0s"][..], "interval"),
            (&["--token-file", "/nonexistent/token"][..], "token-file"),
        ] {
            match resolve(args, None) {
                Err(ConfigError::Invalid { flag: f, .. }) => assert_eq!(f, flag, "{args:?}"),
                other => panic!("{args:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn inside_a_pod_the_pods_own_tokens_and_peer_name_serve() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("api-tokens");
        std::fs::write(&file, "# tokens\nacme:acme-token\noperator:op-token\n").unwrap();
        let path = file.to_str().unwrap().to_string();
        let argv = ["status", "--tls-name", "posgate-peer.posgate.svc"];
        let cli = Cli::try_parse_from(argv).expect("flags parse");
        let env = |name: &str| (name == "POSGATE_API_TOKENS_FILE").then(|| path.clone());
        let s = cli.status.resolve_with(env).unwrap();
        assert_eq!(s.token.as_deref(), Some("op-token"));
        assert_eq!(
            s.tls_name.map(|n| n.to_str().into_owned()).as_deref(),
            Some("posgate-peer.posgate.svc")
        );
        let env = |name: &str| {
            (name == "POSGATE_API_TOKENS").then(|| "acme:a-token, operator:op-2".to_string())
        };
        let s = cli.status.resolve_with(env).unwrap();
        assert_eq!(s.token.as_deref(), Some("op-2"));
        let argv = ["status", "--tls-name", "not a name"];
        let cli = Cli::try_parse_from(argv).expect("flags parse");
        assert!(cli.status.resolve_with(|_| None).is_err());
    }

    #[test]
    fn a_token_file_holds_one_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "op-secret\n").unwrap();
        let path = file.to_str().unwrap();
        let s = resolve(&["--token-file", path], Some("from-env")).unwrap();
        assert_eq!(s.token.as_deref(), Some("op-secret"), "the file wins");
        std::fs::write(&file, "operator:op-secret extra\n").unwrap();
        assert!(resolve(&["--token-file", path], None).is_err());
    }
}
