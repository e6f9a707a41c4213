//! A fake terminal for the tests: a TLS + HTTP/2 server with a certificate from a CA
//! generated here, answering hellos like a terminal (accept an epoch at least as high
//! as any seen, else `409` with `posgate-stale-epoch`), and a TCP proxy that can freeze.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::core::PodId;
use crate::pos::dialer::{Dialer, DialerConfig, Keepalive};
use crate::pos::tls::{client_config, TlsFiles};
use crate::pos::wire::{
    EPOCH_HEADER as HEADER_EPOCH, POD_HEADER as HEADER_POD,
    STALE_EPOCH_HEADER as HEADER_STALE_EPOCH, TERMINAL_HEADER as HEADER_TERMINAL,
};
use crate::store::directory::Terminal;

/// Generous: only reached when something is broken, never a speed requirement.
pub(super) const LIMIT: Duration = Duration::from_secs(10);

/// A CA, its PEM file, and leaf certificates it issues.
pub(super) struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: tempfile::TempDir,
}

impl Pki {
    pub(super) fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { ca, dir }
    }

    pub(super) fn dialer(&self) -> Dialer {
        self.dialer_with(Keepalive::default())
    }

    pub(super) fn dialer_with(&self, keepalive: Keepalive) -> Dialer {
        let tls = client_config(&TlsFiles {
            ca_file: Some(self.dir.path().join("ca.pem")),
            client: None,
        })
        .unwrap();
        Dialer::new(DialerConfig {
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(2),
            keepalive,
            ..DialerConfig::new(tls, PodId::new("pod-a").unwrap())
        })
    }

    /// A server TLS config with a certificate for `name`, offering `alpn`.
    pub(super) fn server(&self, name: &str, alpn: &[&[u8]]) -> Arc<ServerConfig> {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &self.ca)
            .unwrap();
        let chain = vec![CertificateDer::from(cert.der().to_vec())];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// A hello as the terminal received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub epoch: u64,
    pub pod: String,
    pub terminal: String,
    pub authority: String,
}

/// A fake terminal endpoint (every terminal id may share one).
#[derive(Clone)]
pub(super) struct FakeTerminal {
    pub addr: SocketAddr,
    hellos: Arc<Mutex<Vec<Hello>>>,
    /// The highest epoch accepted so far; lower hellos get `409`.
    pub highest: Arc<Mutex<u64>>,
    /// Connections currently open.
    pub open: Arc<AtomicUsize>,
    /// Per terminal id (from its connections' hellos): connections open now, and the
    /// most ever open at once.
    per_terminal: Arc<Mutex<HashMap<String, (usize, usize)>>>,
}

impl FakeTerminal {
    pub(super) async fn spawn(tls: Arc<ServerConfig>) -> FakeTerminal {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let t = FakeTerminal {
            addr: listener.local_addr().unwrap(),
            hellos: Arc::default(),
            highest: Arc::default(),
            open: Arc::default(),
            per_terminal: Arc::default(),
        };
        let acceptor = TlsAcceptor::from(tls);
        let server = t.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, t) = (acceptor.clone(), server.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    t.open.fetch_add(1, Ordering::SeqCst);
                    // The terminal this connection said hello for, once it did.
                    let of = Arc::new(Mutex::new(None::<String>));
                    let svc = {
                        let (t, of) = (t.clone(), of.clone());
                        service_fn(move |req| {
                            let (t, of) = (t.clone(), of.clone());
                            async move { Ok::<_, hyper::Error>(t.answer(req, &of)) }
                        })
                    };
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                    if let Some(id) = of.lock().unwrap().take() {
                        if let Some((open, _)) = t.per_terminal.lock().unwrap().get_mut(&id) {
                            *open -= 1;
                        }
                    }
                    t.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        t
    }

    fn answer(&self, req: Request<Incoming>, of: &Mutex<Option<String>>) -> Response<Full<Bytes>> {
        let header = |name| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let hello = Hello {
            epoch: header(HEADER_EPOCH).parse().unwrap_or(0),
            pod: header(HEADER_POD),
            terminal: header(HEADER_TERMINAL),
            authority: req
                .uri()
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_default(),
        };
        let mut highest = self.highest.lock().unwrap();
        let mut response = Response::new(Full::new(Bytes::new()));
        if req.uri().path() != "/hello" {
            *response.status_mut() = StatusCode::NOT_FOUND;
        } else if hello.epoch < *highest {
            *response.status_mut() = StatusCode::CONFLICT;
            response
                .headers_mut()
                .insert(HEADER_STALE_EPOCH, (*highest).into());
        } else {
            *highest = hello.epoch;
            let mut of = of.lock().unwrap();
            if of.is_none() {
                *of = Some(hello.terminal.clone());
                let mut per = self.per_terminal.lock().unwrap();
                let (open, most) = per.entry(hello.terminal.clone()).or_default();
                *open += 1;
                *most = (*most).max(*open);
            }
            self.hellos.lock().unwrap().push(hello);
        }
        response
    }

    pub(super) fn terminal(&self, id: &str, server_name: &str) -> Terminal {
        Terminal {
            id: id.into(),
            addr: self.addr.to_string(),
            server_name: server_name.into(),
            labels: Default::default(),
        }
    }

    /// The most connections any one terminal had open at once (after their hellos).
    pub(super) fn most_at_once(&self) -> usize {
        let per = self.per_terminal.lock().unwrap();
        per.values().map(|(_, most)| *most).max().unwrap_or(0)
    }

    pub(super) fn hellos(&self) -> Vec<Hello> {
        self.hellos.lock().unwrap().clone()
    }
}

pub(super) async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP proxy to `upstream` that stops forwarding bytes (both ways, sockets left
/// open) once `frozen` is set: a peer that froze or vanished without a FIN.
pub(super) async fn freezable_proxy(upstream: SocketAddr, frozen: Arc<AtomicBool>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pump(cr, sw, frozen.clone()));
            tokio::spawn(pump(sr, cw, frozen.clone()));
        }
    });
    addr
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let Ok(n @ 1..) = from.read(&mut buf).await else {
            return;
        };
        if frozen.load(Ordering::SeqCst) {
            // Swallow everything from now on, holding both sockets open.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
