//! Errors of the POS terminal simulator library.
//!
//! Only start-up and file output can fail in a way the caller must handle; failures of single
//! connections are counted in [`super::FarmCounters`] and logged, never returned.

use std::{io, net::SocketAddr, path::PathBuf};

/// Why the simulator could not start or write its files.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The terminal range is empty, reversed or too large for one process.
    #[error("invalid terminal range {start}..{end}: {reason}")]
    InvalidRange {
        start: u64,
        end: u64,
        reason: &'static str,
    },
    /// The farm configuration is inconsistent (e.g. zero listeners).
    #[error("invalid simulator configuration: {0}")]
    InvalidConfig(String),
    /// The planned load does not fit under the per-process open-file limit.
    #[error(
        "{terminals} terminals need about {needed} file descriptors, but this process may \
         open only {limit}; split the range over several pos-sim processes"
    )]
    FdLimit {
        terminals: u64,
        needed: u64,
        limit: u64,
    },
    /// Reading or raising the open-file limit failed.
    #[error("cannot read or raise the open-file limit: {0}")]
    Rlimit(#[source] io::Error),
    /// Certificate generation failed.
    #[error("cannot generate certificates: {0}")]
    Cert(#[from] rcgen::Error),
    /// The TLS configuration was rejected by rustls.
    #[error("cannot build the TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}
