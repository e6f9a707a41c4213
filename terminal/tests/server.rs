//! The server over real TLS and HTTP/2: what the handler and the persistence hook see,
//! and what a fence reset does to an open session. The protocol as a whole is checked by
//! `posgate conformance` against `examples/terminal.rs` (posgate's tests/conformance.rs).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use posgate_terminal::{
    tls_config, wire, Config, DedupWindow, Persist, Push, Refusal, Server, Terminal,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

/// What the persistence hook was told, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Persist for Log {
    fn fence_raised(&mut self, epoch: u64) {
        self.0.lock().unwrap().push(format!("fence {epoch}"));
    }
    fn key_taken(&mut self, key: &str, _at_unix_ms: u64) {
        self.0.lock().unwrap().push(format!("key {key}"));
    }
}

struct Running {
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
}

/// A terminal `pos-1` on a free port whose handler refuses bodies reading `refuse` with
/// `503` and records the others in `taken`.
async fn start(
    taken: Arc<Mutex<Vec<String>>>,
    log: Log,
) -> (Running, Server<impl posgate_terminal::Handler, Log>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["pos-1.test".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let der = CertificateDer::from(cert.der().to_vec());
    let tls = tls_config(
        vec![der.clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        None,
    )
    .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];

    let handler = move |push: Push| {
        let taken = taken.clone();
        async move {
            if push.body == "refuse" {
                return Err(Refusal {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    reason: "out of paper".into(),
                });
            }
            taken.lock().unwrap().push(push.head.dedup_key());
            Ok(())
        }
    };
    let server = Server::new(
        Terminal::new("pos-1", DedupWindow::default()),
        Config::default(),
        handler,
        log,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = server.clone();
    tokio::spawn(async move {
        serving
            .run(listener, Arc::new(tls), std::future::pending::<()>())
            .await
    });
    (
        Running {
            addr,
            client: Arc::new(client),
        },
        server,
    )
}

impl Running {
    /// A new connection; its driver task ends when the connection does.
    async fn connect(&self) -> (SendRequest<Full<Bytes>>, tokio::task::JoinHandle<()>) {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let name = ServerName::try_from("pos-1.test").unwrap();
        let tls = tokio_rustls::TlsConnector::from(self.client.clone())
            .connect(name, tcp)
            .await
            .unwrap();
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        (
            send,
            tokio::spawn(async move {
                let _ = conn.await;
            }),
        )
    }
}

async fn post(
    send: &mut SendRequest<Full<Bytes>>,
    path: &str,
    epoch: u64,
    key: Option<&str>,
    body: &'static str,
) -> (StatusCode, Option<String>) {
    let mut req = Request::post(format!("https://pos-1.test{path}"))
        .header(wire::EPOCH, epoch)
        .header(wire::POD, "pod-a")
        .header(wire::TERMINAL, "pos-1");
    if let Some(key) = key {
        req = req
            .header(wire::TENANT, "acme")
            .header(wire::IDEMPOTENCY_KEY, key);
    }
    let resp = send
        .send_request(
            req.body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap(),
        )
        .await
        .unwrap();
    let marker = resp
        .headers()
        .get(wire::DUPLICATE)
        .map(|v| v.to_str().unwrap().to_string());
    let status = resp.status();
    resp.into_body().collect().await.unwrap();
    (status, marker)
}

#[tokio::test]
async fn a_refused_push_leaves_its_key_free_and_a_taken_one_is_kept_and_saved() {
    let (taken, log) = (Arc::new(Mutex::new(Vec::new())), Log::default());
    let (running, _server) = start(taken.clone(), log.clone()).await;
    let (mut send, _conn) = running.connect().await;
    assert_eq!(
        post(&mut send, "/hello", 5, None, "").await.0,
        StatusCode::OK
    );
    // The handler's refusal reaches the pod with its status; the key stays free.
    assert_eq!(
        post(&mut send, "/push", 5, Some("k"), "refuse").await,
        (StatusCode::SERVICE_UNAVAILABLE, None)
    );
    assert_eq!(
        post(&mut send, "/push", 5, Some("k"), "ok").await,
        (StatusCode::OK, None)
    );
    // A repeat is answered with the marker, and the handler does not see it.
    assert_eq!(
        post(&mut send, "/push", 5, Some("k"), "ok").await,
        (StatusCode::OK, Some("1".into()))
    );
    assert_eq!(*taken.lock().unwrap(), ["acme:k"]);
    assert_eq!(*log.0.lock().unwrap(), ["fence 5", "key acme:k"]);
}

#[tokio::test]
async fn a_fence_reset_closes_the_session_and_takes_a_lower_epoch_after() {
    let (taken, log) = (Arc::new(Mutex::new(Vec::new())), Log::default());
    let (running, server) = start(taken, log).await;
    let (mut send, conn) = running.connect().await;
    assert_eq!(
        post(&mut send, "/hello", 1 << 60, None, "").await.0,
        StatusCode::OK
    );
    assert_eq!(
        post(&mut send, "/push", 1 << 60, Some("k"), "ok").await.0,
        StatusCode::OK
    );
    let (mut other, _c) = running.connect().await;
    assert_eq!(
        post(&mut other, "/hello", 7, None, "").await.0,
        StatusCode::CONFLICT
    );

    server.reset_fence();
    assert_eq!(server.highest_epoch(), None);
    // The session's connection gets a GOAWAY and ends.
    tokio::time::timeout(std::time::Duration::from_secs(5), conn)
        .await
        .unwrap()
        .unwrap();
    let (mut send, _c) = running.connect().await;
    assert_eq!(
        post(&mut send, "/hello", 7, None, "").await.0,
        StatusCode::OK
    );
    // The key taken before the reset is still a duplicate.
    assert_eq!(
        post(&mut send, "/push", 7, Some("k"), "ok").await,
        (StatusCode::OK, Some("1".into()))
    );
}
