//! The harness's error type.

use std::time::Duration;

/// What can go wrong while running a scenario.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A child process could not be started.
    #[error("starting {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Local I/O (files, sockets) failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Something did not happen within its time limit.
    #[error("{what} did not happen within {:.1} s", limit.as_secs_f64())]
    Timeout { what: String, limit: Duration },
    /// An HTTP exchange with a pod or a simulator failed.
    #[error("HTTP {url}: {message}")]
    Http { url: String, message: String },
    /// A child process ended when it should not have.
    #[error("{what} exited early: {status}")]
    Exited { what: String, status: String },
    /// The cold start's floor (`floor`) could not be measured: a dialer failed, or the
    /// farm disagrees with what the dialers report.
    #[error("the floor: {0}")]
    Floor(String),
    /// The plan cannot run on this machine (limits) or was asked for something invalid.
    #[error("{0}")]
    Plan(String),
}

impl LoadError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LoadError::Io {
            context: context.into(),
            source,
        }
    }
}
