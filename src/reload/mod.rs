//! Replacing a running pod's secrets and certificates without a restart, which would
//! cost a rebalance: API tokens and the cluster secret ([`crate::credentials`]), the
//! POS TLS config (for later dials), the listener's certificate (for later TLS
//! handshakes) and the peer CA (for later peer connections). Live sessions, open
//! connections and leases are not touched.
//!
//! Two triggers take the same path ([`Reloader::reload_from_args`]): `SIGHUP`, and the
//! poller (`watch.rs`) noticing that a file's content changed — Kubernetes updates a
//! mounted Secret by swapping a symlink, so content is compared, not file events.
//!
//! A reload is all or nothing: every file is read and checked before anything is
//! replaced, so a broken file (a half-written certificate, a key of another pair)
//! leaves every old value in place, is logged and counted
//! (`posgate_reloads_total{result="error"}`), and the pod carries on.
//!
//! Not for: parsing flags (`crate::config`) or reading PEM files (`crate::tls`).

mod watch;

use std::sync::Arc;

pub use self::watch::{run, FileWatch, Fingerprints};
use crate::config::{ConfigError, PodConfig, ServeArgs};
use crate::credentials::{self, Credentials};
use crate::http::tls::ServerCert;
use crate::metrics::Metrics;
use crate::peer::{self, PeerTls};
use crate::pos::dialer::Dialer;
use crate::pos::tls;
use crate::tls::TlsConfigError;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The flags, read again, no longer resolve (e.g. a token file that lost its colon).
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] TlsConfigError),
    #[error(transparent)]
    Credentials(#[from] credentials::ModeChanged),
    /// The listener's scheme is fixed when it starts.
    #[error("the pod started {0}; restart it to turn TLS on the listener on or off")]
    TlsMode(&'static str),
}

/// Replaces a running pod's secrets and certificates (see the module docs). Cheap to
/// clone; clones act on the same pod.
#[derive(Clone, Debug)]
pub struct Reloader {
    credentials: Credentials,
    /// `None` for pods without a connection layer.
    dialer: Option<Dialer>,
    /// `None` when the listener serves plain HTTP.
    server_cert: Option<ServerCert>,
    peer_tls: PeerTls,
    metrics: Arc<Metrics>,
}

impl Reloader {
    pub(crate) fn new(
        credentials: Credentials,
        dialer: Option<Dialer>,
        server_cert: Option<ServerCert>,
        peer_tls: PeerTls,
        metrics: Arc<Metrics>,
    ) -> Self {
        Reloader {
            credentials,
            dialer,
            server_cert,
            peer_tls,
            metrics,
        }
    }

    /// Applies the secrets `config` holds and the TLS files it names. The previous
    /// cluster secret stays accepted. All or nothing: on an error nothing changed.
    pub fn reload(&self, config: &PodConfig) -> Result<(), ReloadError> {
        // Read every file before replacing anything.
        let pos_tls = match &self.dialer {
            Some(_) => Some(tls::client_config(&config.pos.tls)?),
            None => None,
        };
        let server_key = match (&self.server_cert, &config.tls) {
            (Some(_), Some(files)) => Some(files.load()?),
            (None, None) => None,
            (Some(_), None) => return Err(ReloadError::TlsMode("with --tls-cert")),
            (None, Some(_)) => return Err(ReloadError::TlsMode("without --tls-cert")),
        };
        let peer_tls = match &config.peers.ca_file {
            Some(path) => Some(peer::tls::client_config(Some(path))?),
            None => None,
        };
        // The one step that can still refuse; it changes nothing when it does.
        self.credentials
            .reload(config.api_tokens.clone(), config.cluster_secret.clone())?;
        if let (Some(dialer), Some(tls)) = (&self.dialer, pos_tls) {
            dialer.set_tls(tls);
        }
        if let (Some(cert), Some(key)) = (&self.server_cert, server_key) {
            cert.set(key);
        }
        if let Some(tls) = peer_tls {
            self.peer_tls.set(tls);
        }
        Ok(())
    }

    /// Resolves `args` again (reading every secret file) and applies the result; logs
    /// and counts the outcome. `trigger` says why, for the log line.
    pub fn reload_from_args(&self, args: &ServeArgs, trigger: &str) -> Result<(), ReloadError> {
        let done = args
            .clone()
            .resolve()
            .map_err(ReloadError::from)
            .and_then(|(config, _, _)| self.reload(&config));
        let result = if done.is_ok() { "ok" } else { "error" };
        self.metrics
            .reloads
            .get_or_create(&[("result", result)])
            .inc();
        match &done {
            Ok(()) => tracing::info!(trigger, "reloaded API tokens, cluster secret and TLS files"),
            Err(error) => tracing::error!(
                trigger,
                error = %error,
                "reload failed; keeping the old secrets and certificates"
            ),
        }
        done
    }
}
