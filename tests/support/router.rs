//! The pod's HTTP router served on a real socket ([`Server`]) with a status channel the
//! test feeds itself instead of a driver, no terminals and no peers; and raw HTTP/1.1
//! exchanges with it ([`raw_exchange`]) for requests no client library would send.
//!
//! Not for: whole pods ([`super::pod`], [`super::binary`]).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use posgate::core::PodId;
use posgate::credentials::{ClusterSecret, Credentials};
use posgate::http::{serve, ConnectionLimits, HttpState, ReadyLatch, Routes};
use posgate::metrics::Metrics;
use posgate::peer::{PeerClient, PeerReceiver};
use posgate::push::{NoTerminals, PushConfig, PushService};
use posgate::serving::{NoSessions, ServingTable};
use posgate::status::PodStatus;
use serde_json::Value;
use tokio::sync::{oneshot, watch};

/// A running router plus the handles the test drives it with.
pub struct Server {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// What the handlers read as the driver's status.
    pub status: watch::Sender<PodStatus>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    pub async fn start(secrets: Option<Vec<ClusterSecret>>) -> Server {
        Server::start_with(secrets, ConnectionLimits::default()).await
    }

    /// [`Server::start`] holding client connections under `limits`.
    pub async fn start_with(
        secrets: Option<Vec<ClusterSecret>>,
        limits: ConnectionLimits,
    ) -> Server {
        let (status, receiver) = watch::channel(PodStatus::default());
        // The first secret is the current one; a second one is the previous (rotation).
        let credentials = match secrets {
            Some(list) => Credentials::rotating(None, list.first().cloned(), list.get(1).cloned()),
            None => Credentials::new(None, None),
        };
        let metrics = Arc::new(Metrics::new());
        let peers = PeerClient::new(
            PodId::new("test-pod").unwrap(),
            credentials.clone(),
            Duration::from_secs(1),
        );
        let push = PushService::new(
            ServingTable::new(64),
            receiver.clone(),
            Arc::new(NoTerminals),
            peers.clone(),
            PushConfig {
                body_read_timeout: BODY_READ_TIMEOUT,
                ..PushConfig::default()
            },
            metrics.clone(),
        );
        let app = Routes::new(HttpState {
            status: receiver,
            credentials,
            push: Arc::new(push),
            stats: Arc::new(NoSessions),
            handovers: Arc::new(posgate::pos::handover::NoHandovers),
            metrics: metrics.clone(),
            peers,
            ready: ReadyLatch::default(),
            push_lines: Default::default(),
            peer: PeerReceiver::default(),
            directory: None,
        });
        let listener = posgate::http::bind(([127, 0, 0, 1], 0).into()).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, None, app, limits, metrics, async {
            let _ = stopped.await;
        }));
        Server {
            base,
            status,
            stop: Some(stop),
            task,
        }
    }

    /// Drops the status sender, as a pod whose driver ended does.
    pub fn drop_status(&mut self) {
        self.status = watch::channel(PodStatus::default()).0;
    }

    /// Shuts the server down gracefully and checks it ended cleanly.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let ended = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        ended.expect("graceful shutdown finishes").unwrap().unwrap();
    }
}

/// One raw HTTP/1.1 exchange on a new connection: writes `request` as is and reads the
/// answer until the server closes (every request here ends the connection), so requests
/// no client library would send can be tried.
///
/// The write runs beside the read: the server may answer (and close) before it has
/// read all of an oversized request, and a client that only reads after writing
/// everything would then depend on socket buffer sizes.
pub async fn raw_exchange(base: &str, request: &[u8]) -> (u16, HeaderMap, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = tcp.into_split();
    let bytes = request.to_vec();
    // The server may refuse before reading everything; a reset write is part of that.
    let write = tokio::spawn(async move { writer.write_all(&bytes).await.map(|()| writer) });
    let mut answer = Vec::new();
    // Generous: a loaded CI machine can take seconds to push 500 KiB through loopback.
    let read = tokio::time::timeout(Duration::from_secs(20), reader.read_to_end(&mut answer));
    let outcome = read.await;
    write.abort();
    if outcome.is_err() {
        let first_line = String::from_utf8_lossy(&request[..request.len().min(60)]);
        let got = String::from_utf8_lossy(&answer[..answer.len().min(300)]);
        panic!("the connection was still open after 20 s: {first_line:?}; received {got:?}");
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    parse_raw(&text)
}

/// The first HTTP/1.1 response in `text`: status, headers, body (by content-length).
pub fn parse_raw(text: &str) -> (u16, HeaderMap, String) {
    let (head, rest) = text.split_once("\r\n\r\n").expect("a complete head");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = line.split_once(": ").unwrap();
        headers.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let length: usize = headers["content-length"].to_str().unwrap().parse().unwrap();
    (status, headers, rest[..length].to_string())
}

/// Asserts the documented JSON error with `status` and `code`.
pub fn assert_json_error(case: &str, answer: &(u16, HeaderMap, String), status: u16, code: &str) {
    let (got, headers, body) = answer;
    assert_eq!(*got, status, "{case}: {body}");
    assert_eq!(headers["content-type"], "application/json", "{case}");
    let json: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{case}: {body:?}"));
    assert_eq!(json["error"], code, "{case}: {body}");
    assert!(
        json["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{case}: {body}"
    );
}

/// `--body-read-timeout` of the test server.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(1);
