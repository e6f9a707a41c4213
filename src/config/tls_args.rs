//! [`TlsArgs`]: the flags of `posgate serve` about HTTPS — the listener's certificate
//! (`--tls-cert`/`--tls-key`) and how peers' certificates are verified (`--peer-ca-file`,
//! `--peer-tls-name`) — and their resolution.
//!
//! What it does not do: read the files (the pod does when it starts, naming a bad file,
//! and again on every reload).

use std::path::PathBuf;

use super::{invalid, ConfigError};
use rustls::pki_types::ServerName;

use crate::http::tls::ServerTlsFiles;
use crate::peer::tls::PeerVerify;

/// HTTPS flags of `posgate serve`.
#[derive(Clone, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain of the HTTP listener: serve HTTPS (HTTP/2 and HTTP/1.1 by
    /// ALPN) instead of plain HTTP (with --tls-key)
    #[arg(long, env = "POSGATE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long, env = "POSGATE_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM file with the CA certificates https:// peers are verified against, instead of
    /// the system store
    #[arg(long, env = "POSGATE_PEER_CA_FILE", value_name = "FILE")]
    pub peer_ca_file: Option<PathBuf>,
    /// Verify every https:// peer's certificate for this DNS name instead of the host of
    /// its URL, so all pods can share one certificate from a Secret
    #[arg(long, env = "POSGATE_PEER_TLS_NAME", value_name = "NAME")]
    pub peer_tls_name: Option<String>,
}

impl TlsArgs {
    /// The listener's certificate files (`None`: plain HTTP) and how peers are verified.
    /// Both or neither of `--tls-cert` and `--tls-key`: one alone is a mistake, not a
    /// wish for plain HTTP.
    pub fn resolve(self) -> Result<(Option<ServerTlsFiles>, PeerVerify), ConfigError> {
        let server = match (self.tls_cert, self.tls_key) {
            (Some(cert_file), Some(key_file)) => Some(ServerTlsFiles {
                cert_file,
                key_file,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(invalid(
                    "tls-cert",
                    "needs --tls-key too (give both or neither)",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "tls-key",
                    "needs --tls-cert too (give both or neither)",
                ))
            }
        };
        let name = match self.peer_tls_name {
            None => None,
            Some(name) => match ServerName::try_from(name) {
                Ok(dns @ ServerName::DnsName(_)) => Some(dns),
                _ => return Err(invalid("peer-tls-name", "must be a DNS name")),
            },
        };
        let peers = PeerVerify {
            ca_file: self.peer_ca_file,
            name,
        };
        Ok((server, peers))
    }
}
