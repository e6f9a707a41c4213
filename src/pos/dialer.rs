//! Dialing one terminal: TCP connect, TLS (SNI and verification against the terminal's
//! `server_name`), ALPN `h2`, the HTTP/2 handshake with PING keep-alive, and the fenced
//! `hello`, each step bounded by a timeout; failures are classified into [`DialError`]
//! so the manager can log, count and react (back off, or report a stale epoch).
//!
//! Not for: pacing or retrying (the manager does both), or keeping the connection
//! (that is the [`Session`]).

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConfig};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::session::{self, Session, TerminalPeer};
use super::wire::{DialError, Stage};
use crate::core::{Epoch, PodId};
use crate::store::directory::Terminal;
use crate::tls::ALPN_H2;

/// HTTP/2 PING keep-alive: a connection whose PING is unanswered for `timeout` is dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
        }
    }
}

/// Settings of a [`Dialer`].
#[derive(Clone, Debug)]
pub struct DialerConfig {
    pub tls: Arc<ClientConfig>,
    /// This pod, as the hello names it.
    pub pod: PodId,
    pub connect_timeout: Duration,
    /// Bounds the TLS handshake, the HTTP/2 handshake and the hello, each.
    pub handshake_timeout: Duration,
    pub keepalive: Keepalive,
}

impl DialerConfig {
    /// Defaults: connect and each handshake step 5 s, keep-alive 10 s / 5 s.
    pub fn new(tls: Arc<ClientConfig>, pod: PodId) -> Self {
        DialerConfig {
            tls,
            pod,
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            keepalive: Keepalive::default(),
        }
    }
}

/// Dials terminals with one pod's TLS and HTTP/2 settings. Cheap to clone; clones
/// share the TLS config, which [`Dialer::set_tls`] replaces for later dials.
#[derive(Clone, Debug)]
pub struct Dialer {
    cfg: Arc<DialerConfig>,
    tls: Arc<RwLock<Arc<ClientConfig>>>,
}

impl Dialer {
    pub fn new(cfg: DialerConfig) -> Self {
        let tls = Arc::new(RwLock::new(cfg.tls.clone()));
        Dialer {
            cfg: Arc::new(cfg),
            tls,
        }
    }

    /// Uses `tls` (a reloaded CA bundle or client certificate) for every dial from now
    /// on; live sessions keep theirs.
    pub fn set_tls(&self, tls: Arc<ClientConfig>) {
        *self.tls.write().unwrap_or_else(PoisonError::into_inner) = tls;
    }

    /// This pod, as the hellos name it.
    pub fn pod(&self) -> &PodId {
        &self.cfg.pod
    }

    /// The handshake timeout, also used for hellos on live sessions.
    pub fn handshake_timeout(&self) -> Duration {
        self.cfg.handshake_timeout
    }

    /// Connects to `terminal` and says hello with `epoch`. The returned session is
    /// fenced with `epoch` and its connection is driven by a task of its own.
    pub async fn dial(&self, terminal: &Terminal, epoch: Epoch) -> Result<Session, DialError> {
        let Some(result) = self
            .dial_unless(terminal, epoch, std::future::pending())
            .await
        else {
            unreachable!("a pending future never stops the dial")
        };
        result
    }

    /// [`Dialer::dial`], given up (`None`) as soon as `stop` resolves. Whatever the
    /// outcome, no connection of this dial is left open when it returns: cancelled
    /// before the hello, nothing was spawned yet; a session whose hello failed or was
    /// cut short by `stop` is closed and its socket awaited, not merely dropped, so a
    /// caller may release the terminal's lease right after.
    pub async fn dial_unless(
        &self,
        terminal: &Terminal,
        epoch: Epoch,
        stop: impl Future<Output = ()>,
    ) -> Option<Result<Session, DialError>> {
        let mut stop = pin!(stop);
        let connected = tokio::select! {
            result = self.connect(terminal) => result,
            () = &mut stop => return None,
        };
        let mut session = match connected {
            Ok(session) => session,
            Err(e) => return Some(Err(e)),
        };
        let hello = tokio::select! {
            r = session.hello(epoch, self.cfg.handshake_timeout) => Some(r),
            () = &mut stop => None,
        };
        match hello {
            Some(Ok(())) => Some(Ok(session)),
            Some(Err(e)) => {
                session.close(Duration::ZERO).await;
                Some(Err(e))
            }
            None => {
                session.close(Duration::ZERO).await;
                None
            }
        }
    }

    /// Everything before the hello: TCP, TLS, ALPN check, HTTP/2 handshake (the
    /// conformance kit sends its own hellos on it). Dropping the future at any await
    /// leaves no connection behind: the connection task is spawned only right before
    /// returning the session.
    pub async fn connect(&self, terminal: &Terminal) -> Result<Session, DialError> {
        let name = ServerName::try_from(terminal.server_name.clone()).map_err(|e| {
            DialError::BadTerminal(format!("server name {:?}: {e}", terminal.server_name))
        })?;
        let step = self.cfg.handshake_timeout;

        let tcp = timeout(
            self.cfg.connect_timeout,
            Stage::Connect,
            TcpStream::connect(&terminal.addr),
        )
        .await?
        .map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused => DialError::Refused,
            _ => DialError::Connect(e),
        })?;
        // Pushes are small and latency-sensitive; Nagle would only delay them.
        tcp.set_nodelay(true).map_err(DialError::Connect)?;

        let current = self
            .tls
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let connector = TlsConnector::from(current);
        let tls = timeout(step, Stage::Tls, connector.connect(name, tcp))
            .await?
            .map_err(|e| tls_error(e, &terminal.server_name))?;
        let alpn = tls.get_ref().1.alpn_protocol();
        if alpn != Some(ALPN_H2) {
            return Err(DialError::NoH2 {
                alpn: alpn.map(|p| String::from_utf8_lossy(p).into_owned()),
            });
        }

        let (send, conn) = timeout(
            step,
            Stage::Http2,
            h2::client::Builder::new()
                // Terminals answer with tiny bodies and we send small pushes: small
                // windows and send buffers bound what one of tens of thousands of
                // connections may hold in memory.
                .initial_window_size(64 * 1024)
                .initial_connection_window_size(256 * 1024)
                .max_send_buffer_size(64 * 1024)
                .max_frame_size(16 * 1024)
                .max_header_list_size(16 * 1024)
                // A terminal has nothing to push to a pod; promises would only pile up.
                .enable_push(false)
                .handshake::<_, bytes::Bytes>(tls),
        )
        .await?
        .map_err(DialError::Http)?;

        // Its end, and why, is read from the join handle (`Session::ended`).
        let task = tokio::spawn(session::drive(conn, self.cfg.keepalive));
        let peer = TerminalPeer {
            terminal: terminal.id.clone(),
            origin: format!("https://{}", terminal.server_name),
            pod: self.cfg.pod.clone(),
        };
        Ok(Session::new(send, task, peer))
    }
}

async fn timeout<T>(
    limit: Duration,
    stage: Stage,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, DialError> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| DialError::Timeout(stage))
}

/// Tells a certificate for the wrong name apart from other TLS failures: it is the one
/// an operator must fix in the directory or on the terminal, not a network problem.
fn tls_error(e: io::Error, server_name: &str) -> DialError {
    let rustls_error = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(
            c @ (CertificateError::NotValidForName
            | CertificateError::NotValidForNameContext { .. }),
        )) => DialError::WrongName {
            server_name: server_name.to_string(),
            detail: format!("{c:?}"),
        },
        _ => DialError::Tls(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_name_is_told_apart_from_other_tls_errors() {
        let wrong = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
        );
        let e = tls_error(wrong, "pos-1.example");
        assert!(
            matches!(&e, DialError::WrongName { server_name, .. } if server_name == "pos-1.example")
        );
        assert!(e.to_string().contains("pos-1.example"), "{e}");
        assert_eq!(e.label(), "tls_error");

        let expired = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::Expired),
        );
        assert!(matches!(tls_error(expired, "x"), DialError::Tls(_)));
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert!(matches!(tls_error(reset, "x"), DialError::Tls(_)));
    }

    #[test]
    fn labels_match_the_metric_contract() {
        assert_eq!(DialError::Refused.label(), "refused");
        assert_eq!(DialError::Timeout(Stage::Tls).label(), "timeout");
        assert_eq!(DialError::NoH2 { alpn: None }.label(), "tls_error");
        assert_eq!(
            DialError::StaleEpoch { highest: None }.label(),
            "stale_epoch"
        );
    }
}
