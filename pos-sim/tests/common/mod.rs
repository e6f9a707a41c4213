//! A minimal terminal client for the simulator tests: TLS (trusting the farm's CA, ALPN
//! `h2`) + a hyper HTTP/2 connection, with helpers for hello and push. It is deliberately
//! independent of posgate's dialer, so the tests check the simulator against the written
//! contract rather than against posgate.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use posgate_pos_sim::PosFarm;
use rustls::{pki_types::ServerName, ClientConfig, RootCertStore};
use tokio::{net::TcpStream, task::JoinHandle};
use tokio_rustls::TlsConnector;

/// The protocol's header names, written out from `docs/pos-protocol.md` §2 (not taken
/// from the library the simulator is built on, so a misspelling there fails here).
pub const H_EPOCH: &str = "posgate-epoch";
pub const H_POD: &str = "posgate-pod";
pub const H_TERMINAL: &str = "posgate-terminal";
pub const H_IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const H_STALE_EPOCH: &str = "posgate-stale-epoch";
pub const H_DUPLICATE: &str = "posgate-duplicate";

pub type Body = BoxBody<Bytes, Infallible>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One client connection to a terminal.
pub struct Conn {
    pub sender: SendRequest<Body>,
    pub driver: JoinHandle<Result<(), hyper::Error>>,
    pub terminal: String,
}

/// Connects to `addr` presenting `server_name` as SNI.
pub async fn connect_to(
    farm: &PosFarm,
    addr: SocketAddr,
    server_name: &str,
    terminal: &str,
) -> Result<Conn, BoxError> {
    let mut roots = RootCertStore::empty();
    roots.add(farm.ca_der())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(5))
        .handshake(TokioIo::new(tls))
        .await?;
    let driver = tokio::spawn(connection);
    Ok(Conn {
        sender,
        driver,
        terminal: terminal.to_owned(),
    })
}

/// Connects to terminal `id` as its directory entry says.
pub async fn connect(farm: &PosFarm, id: &str) -> Result<Conn, BoxError> {
    let info = farm.terminal(id).expect("terminal in farm");
    connect_to(farm, info.addr, &info.server_name, id).await
}

pub fn full(body: &'static str) -> Body {
    Full::new(Bytes::from_static(body.as_bytes())).boxed()
}

impl Conn {
    pub fn request(&self, path: &str, epoch: u64) -> http::request::Builder {
        Request::post(path)
            .header(H_EPOCH, epoch.to_string())
            .header(H_POD, "test-pod")
            .header(H_TERMINAL, &self.terminal)
    }

    pub async fn send(&mut self, req: Request<Body>) -> Result<Response<Bytes>, BoxError> {
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let (parts, body) = resp.into_parts();
        Ok(Response::from_parts(
            parts,
            body.collect().await?.to_bytes(),
        ))
    }

    pub async fn hello(&mut self, epoch: u64) -> Result<Response<Bytes>, BoxError> {
        let req = self.request("/hello", epoch).body(full(""))?;
        self.send(req).await
    }

    pub async fn push(&mut self, epoch: u64, key: &str) -> Result<Response<Bytes>, BoxError> {
        let req = self
            .request("/push", epoch)
            .header(H_IDEMPOTENCY_KEY, key)
            .header("content-type", "application/json")
            .body(full(r#"{"amount":1}"#))?;
        self.send(req).await
    }

    /// Waits until the server has closed this connection.
    pub async fn closed_within(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, &mut self.driver).await.is_ok()
    }
}
