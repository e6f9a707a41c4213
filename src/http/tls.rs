//! HTTPS for the pod's listener (`--tls-cert`/`--tls-key`): the certificate a pod
//! presents, replaceable while it runs, and the listener that does the TLS handshakes.
//!
//! [`ServerCert`] is the rustls certificate resolver: every handshake asks it for the
//! current certificate, so a reload ([`ServerCert::set`]) applies to the next handshake
//! while established connections keep the session they negotiated. ALPN offers `h2`
//! and `http/1.1`, so peers get HTTP/2 and probes, Prometheus and curl get what they ask
//! for, on the same port as before.
//!
//! [`TlsListener`] runs handshakes concurrently (bounded in number and time) and hands
//! only finished ones to axum, so one slow or silent client cannot hold up the others.
//!
//! Not for: reading PEM files (`crate::tls`) or client-side TLS (`crate::peer::tls`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::tls::{certified_key, provider, TlsConfigError};

/// How long a client gets to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; beyond it, new connections wait in the kernel's
/// accept queue instead of costing memory here.
const MAX_HANDSHAKES: usize = 1024;
/// Pause after an accept error other than a failed connection (e.g. out of file
/// descriptors), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// The listener's certificate chain and private key, both PEM files. Only paths, so
/// `Debug` may show them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl ServerTlsFiles {
    /// Reads and checks the pair (the key must belong to the certificate).
    pub fn load(&self) -> Result<Arc<CertifiedKey>, TlsConfigError> {
        let key = certified_key(
            ("TLS certificate (--tls-cert)", &self.cert_file),
            ("TLS key (--tls-key)", &self.key_file),
            &provider(),
        )?;
        Ok(Arc::new(key))
    }
}

/// The certificate the listener presents; cheap to clone, clones share it.
#[derive(Clone, Debug)]
pub struct ServerCert {
    current: Arc<RwLock<Arc<CertifiedKey>>>,
}

impl ServerCert {
    pub fn new(key: Arc<CertifiedKey>) -> Self {
        ServerCert {
            current: Arc::new(RwLock::new(key)),
        }
    }

    /// Presents `key` from the next handshake on; open connections are not touched.
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = key;
    }

    /// The server config presenting this (reloadable) certificate: TLS 1.2 and 1.3,
    /// ALPN `h2` then `http/1.1`, no client certificates (peers sign requests instead).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsConfigError> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(self.clone()));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // One certificate for every name: the pod has one identity.
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

type Handshake = Pin<Box<dyn Future<Output = Option<(TlsStream<TcpStream>, SocketAddr)>> + Send>>;

/// A TCP listener that hands out connections after their TLS handshake.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    /// Kept across `accept` calls: axum drops an `accept` future at shutdown, and a
    /// handshake in progress must not be lost before that.
    handshakes: FuturesUnordered<Handshake>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> Self {
        TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(config),
            handshakes: FuturesUnordered::new(),
        }
    }

    fn start_handshake(&mut self, tcp: TcpStream, addr: SocketAddr) {
        // Responses are small and latency-sensitive; Nagle would only delay them.
        let _ = tcp.set_nodelay(true);
        let accepting = self.acceptor.accept(tcp);
        self.handshakes.push(Box::pin(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, accepting).await {
                Ok(Ok(tls)) => Some((tls, addr)),
                // Scanners, probes with the wrong scheme, clients distrusting the
                // certificate: the client sees the failure; debug keeps it findable.
                Ok(Err(error)) => {
                    tracing::debug!(%addr, %error, "TLS handshake failed");
                    None
                }
                Err(_) => {
                    tracing::debug!(%addr, "TLS handshake timed out");
                    None
                }
            }
        }));
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let room = self.handshakes.len() < MAX_HANDSHAKES;
            tokio::select! {
                accepted = self.tcp.accept(), if room => match accepted {
                    Ok((tcp, addr)) => self.start_handshake(tcp, addr),
                    Err(error) if is_connection_error(&error) => {}
                    Err(error) => {
                        tracing::error!(%error, "accept failed");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    }
                },
                Some(done) = self.handshakes.next(), if !self.handshakes.is_empty() => {
                    if let Some(connection) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// Errors that concern one connection (the client went away), not the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    fn write_pair(dir: &Path, name: &str) -> ServerTlsFiles {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let files = ServerTlsFiles {
            cert_file: dir.join(format!("{name}.crt")),
            key_file: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert_file, cert.pem()).unwrap();
        std::fs::write(&files.key_file, key.serialize_pem()).unwrap();
        files
    }

    #[test]
    fn pairs_are_checked_and_errors_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let one = write_pair(dir.path(), "one.test");
        let two = write_pair(dir.path(), "two.test");
        one.load().unwrap();
        let crossed = ServerTlsFiles {
            cert_file: one.cert_file.clone(),
            key_file: two.key_file.clone(),
        };
        let err = crossed.load().unwrap_err().to_string();
        assert!(
            err.contains("--tls-cert") && err.contains("does not match"),
            "{err}"
        );
        let missing = ServerTlsFiles {
            cert_file: dir.path().join("nope.crt"),
            key_file: one.key_file.clone(),
        };
        let err = missing.load().unwrap_err().to_string();
        assert!(err.contains("nope.crt"), "{err}");
    }

    #[test]
    fn alpn_offers_h2_then_http1() {
        let dir = tempfile::tempdir().unwrap();
        let cert = ServerCert::new(write_pair(dir.path(), "one.test").load().unwrap());
        let config = cert.server_config().unwrap();
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }
}
