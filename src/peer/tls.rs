//! `https://` peers: the TLS half of [`super::PeerClient`]'s transport.
//!
//! A pod advertising an `https://` URL (it serves with `--tls-cert`) is reached over
//! TLS with ALPN `h2`, its certificate verified for the URL's host (or for
//! `--peer-tls-name`, when every pod presents one shared certificate) against
//! `--peer-ca-file`, or the system roots when that is not given (like `--pos-ca` and
//! `--redis-ca-file`). Verification is never turned off: the HMAC signs requests, but
//! only the certificate keeps a forwarded push's body from being read on the way.
//! `http://` peers keep using h2c through the same connector.
//!
//! [`PeerTls`] is shared by every peer client of a pod, so a reloaded CA bundle applies
//! to the next connection of each; pooled connections keep theirs.
//!
//! Not for: signing (`super`), or the server side (`crate::http::tls`).

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use http::uri::Scheme;
use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::tls::ALPN_H2;
use crate::tls::{provider, roots_from_file, system_roots, TlsConfigError};

/// How `https://` peers are verified.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerVerify {
    /// `--peer-ca-file`: the CA bundle; `None`: the system roots.
    pub ca_file: Option<PathBuf>,
    /// `--peer-tls-name`: the name every peer's certificate must hold; `None`: the host
    /// of the peer's advertised URL.
    pub name: Option<ServerName<'static>>,
}

/// The TLS client config for `https://` peers; cheap to clone, clones share it.
#[derive(Clone, Debug, Default)]
pub struct PeerTls {
    /// `None`: the system roots, loaded at the first `https://` peer, so a pod whose
    /// peers are all `http://` never needs a trust store.
    config: Arc<RwLock<Option<Arc<ClientConfig>>>>,
    /// `--peer-tls-name`: the name every peer's certificate is verified for; `None`:
    /// the host of its URL.
    name: Option<ServerName<'static>>,
}

impl PeerTls {
    /// Verifies peers as `peers` says: against its CA bundle (read now) or the system
    /// roots, for its name or each peer's host.
    pub fn new(peers: &PeerVerify) -> Result<Self, TlsConfigError> {
        let tls = PeerTls {
            name: peers.name.clone(),
            ..PeerTls::default()
        };
        if let Some(path) = &peers.ca_file {
            tls.set(client_config(Some(path))?);
        }
        Ok(tls)
    }

    /// The name a peer at `host` is verified for.
    fn name_for(&self, host: String) -> Result<ServerName<'static>, BoxError> {
        match &self.name {
            Some(name) => Ok(name.clone()),
            None => Ok(ServerName::try_from(host)?),
        }
    }

    /// Uses `config` for every new peer connection from now on.
    pub fn set(&self, config: Arc<ClientConfig>) {
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = Some(config);
    }

    fn current(&self) -> Result<Arc<ClientConfig>, TlsConfigError> {
        if let Some(config) = &*self.config.read().unwrap_or_else(PoisonError::into_inner) {
            return Ok(config.clone());
        }
        let config = client_config(None)?;
        self.set(config.clone());
        Ok(config)
    }
}

/// The client config for `https://` peers: ALPN `h2`, trusting `ca_file` or the system
/// roots.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, TlsConfigError> {
    h2_client_config("--peer-ca-file", ca_file)
}

/// A client config for pods' HTTPS (ALPN `h2`), trusting `ca_file` or the system roots;
/// errors name `flag`, the flag that gave `ca_file` (`posgate status` has its own).
pub fn h2_client_config(
    flag: &'static str,
    ca_file: Option<&Path>,
) -> Result<Arc<ClientConfig>, TlsConfigError> {
    let roots = match ca_file {
        Some(path) => roots_from_file(flag, path)?,
        None => system_roots(flag)?,
    };
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// Connects to `http://` peers in plain TCP and to `https://` peers with TLS (also what
/// `posgate status` reaches a pod with).
#[derive(Clone, Debug)]
pub struct PeerConnector {
    http: HttpConnector,
    tls: PeerTls,
}

impl PeerConnector {
    pub fn new(mut http: HttpConnector, tls: PeerTls) -> Self {
        // The TLS layer is ours; the TCP connector must accept `https://` URIs too.
        http.enforce_http(false);
        PeerConnector { http, tls }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for PeerConnector {
    type Response = PeerStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<PeerStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let https = uri.scheme() == Some(&Scheme::HTTPS);
        // An IPv6 host comes bracketed; the certificate names the bare address.
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tls = https.then(|| (self.tls.current(), self.tls.name_for(host)));
        let connecting = tower_service::Service::call(&mut self.http, uri);
        Box::pin(async move {
            let tcp = connecting.await?;
            let Some((config, name)) = tls else {
                return Ok(PeerStream::Plain(tcp));
            };
            let name = name?;
            let stream = TlsConnector::from(config?)
                .connect(name, tcp.into_inner())
                .await?;
            Ok(PeerStream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// One connection to a peer, plain or TLS.
pub enum PeerStream {
    Plain(TokioIo<TcpStream>),
    // Boxed: a TLS stream is a few hundred bytes larger than a TCP one.
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for PeerStream {
    fn connected(&self) -> Connected {
        match self {
            PeerStream::Plain(tcp) => tcp.connected(),
            PeerStream::Tls(tls) => tls.inner().get_ref().0.connected(),
        }
    }
}

impl Read for PeerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerStream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl Write for PeerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerStream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerStream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PeerStream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            PeerStream::Plain(s) => s.is_write_vectored(),
            PeerStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            PeerStream::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }
}
