//! The terminal as a server: accepts TLS connections (ALPN `h2` only), serves HTTP/2
//! `POST /hello` and `POST <push path>` by the rules of [`crate::state`], hands each push
//! it may take to the vendor's [`Handler`], tells a [`Persist`] hook what to keep across
//! a reboot, and closes superseded connections (GOAWAY, then a drop after a grace
//! period).
//!
//! Not for: the decisions themselves ([`crate::state`]) or header parsing
//! ([`crate::wire`]). The TLS configuration (certificate, client-certificate
//! verification of the pods) is the caller's: see [`tls_config`].

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    pin::pin,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, server::conn::http2, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::watch, time::timeout};
use tracing::{debug, warn};

use crate::{
    state::{ConnId, Delivery, HelloOutcome, PushOutcome, Terminal},
    wire::{self, Answer},
};

/// How a [`Server`] serves.
#[derive(Debug, Clone)]
pub struct Config {
    /// The path pushes are posted to (the pods' `--pos-push-path`, `/push` by default).
    pub push_path: String,
    /// How long a superseded connection may take to close after its GOAWAY before it is
    /// dropped.
    pub supersede_grace: Duration,
    /// Bound of the TLS handshake.
    pub handshake_timeout: Duration,
    /// Largest push body; larger ones get `413`.
    pub max_body: usize,
}

impl Default for Config {
    /// `/push`, 2 s grace, 10 s handshake, 1 MiB bodies.
    fn default() -> Self {
        Config {
            push_path: "/push".into(),
            supersede_grace: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(10),
            max_body: 1 << 20,
        }
    }
}

/// A push the terminal may take: its headers and its whole body.
#[derive(Debug, Clone)]
pub struct Push {
    pub head: wire::PushHead,
    pub body: Bytes,
}

/// A refusal of a push by the terminal's own rules (a payload it does not take, a
/// printer out of paper): any status but `2xx`, `409` and `428`, which the protocol
/// reserves. The sender sees `502 pos_rejected` with this status.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: String,
}

/// What the terminal does with a push: `Ok` once it has taken the payload (its key is
/// then remembered for the dedup window), `Err` to refuse it (the key stays free, so a
/// retry is a new push). Called at most once per key at a time, never for a duplicate.
pub trait Handler: Send + Sync + 'static {
    fn push(&self, push: Push) -> impl Future<Output = Result<(), Refusal>> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Push) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Refusal>> + Send,
{
    fn push(&self, push: Push) -> impl Future<Output = Result<(), Refusal>> + Send {
        self(push)
    }
}

/// Where the terminal keeps what should survive a reboot (§3, RECOMMENDED): called
/// before the answer leaves, with the terminal's lock held, so keep it short (an append
/// to a file). Restore with [`Terminal::restore`]. `()` keeps nothing.
pub trait Persist: Send + 'static {
    /// The fence went up to `epoch`.
    fn fence_raised(&mut self, epoch: u64) {
        let _ = epoch;
    }
    /// The dedup key was taken at `at_unix_ms`.
    fn key_taken(&mut self, key: &str, at_unix_ms: u64) {
        let _ = (key, at_unix_ms);
    }
}

impl Persist for () {}

/// A rustls server configuration for a terminal: its certificate chain and key, TLS 1.2
/// and 1.3 with the ring provider, ALPN `h2`, and the pods' client certificates verified
/// against `pods_ca` (mutual TLS, §1) or none asked for.
pub fn tls_config(
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
    pods_ca: Option<rustls::RootCertStore>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match pods_ca {
        Some(roots) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// One terminal serving the pods: cheap to clone (all clones serve the same terminal).
pub struct Server<H, P = ()> {
    inner: Arc<Inner<H, P>>,
}

impl<H, P> Clone for Server<H, P> {
    fn clone(&self) -> Self {
        Server {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<H, P> {
    /// The terminal's id (fixed for its life), read here without the state's lock.
    id: String,
    config: Config,
    handler: H,
    state: Mutex<Shared<P>>,
}

struct Shared<P> {
    terminal: Terminal,
    persist: P,
    /// Each open connection's close signal (`true`: close gracefully).
    closers: HashMap<ConnId, watch::Sender<bool>>,
    next_conn: ConnId,
}

impl<H: Handler, P: Persist> Server<H, P> {
    pub fn new(terminal: Terminal, config: Config, handler: H, persist: P) -> Self {
        let shared = Shared {
            terminal,
            persist,
            closers: HashMap::new(),
            next_conn: 0,
        };
        Server {
            inner: Arc::new(Inner {
                id: shared.terminal.id().to_owned(),
                config,
                handler,
                state: Mutex::new(shared),
            }),
        }
    }

    /// Serves connections from `listener` until `shutdown` completes (mini-redis's
    /// `run(listener, shutdown)`: the caller owns the IO). Connections open then are
    /// left to end on their own.
    pub async fn run(
        &self,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        shutdown: impl Future,
    ) {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let mut shutdown = pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                accepted = listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        let _ = tcp.set_nodelay(true);
                        let server = self.clone();
                        let acceptor = acceptor.clone();
                        tokio::spawn(async move {
                            match timeout(server.inner.config.handshake_timeout, acceptor.accept(tcp)).await {
                                Ok(Ok(tls)) if tls.get_ref().1.alpn_protocol() == Some(b"h2") => {
                                    server.serve(TokioIo::new(tls)).await;
                                }
                                Ok(Ok(_)) => debug!(%peer, "client did not negotiate ALPN h2"),
                                Ok(Err(error)) => debug!(%peer, %error, "TLS handshake failed"),
                                Err(_) => debug!(%peer, "TLS handshake timed out"),
                            }
                        });
                    }
                    Err(error) => {
                        // Out of descriptors, say: back off instead of spinning.
                        warn!(%error, "accept failed; backing off");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }

    /// §3, "Resetting the fence" (for the device's own management, never the protocol):
    /// forgets `highest_epoch`, keeps the keys, closes the connections with a current
    /// session. Save the fence as none if you keep it.
    pub fn reset_fence(&self) {
        let mut s = self.lock();
        for conn in s.terminal.reset_fence() {
            s.close(conn);
        }
    }

    /// The terminal's fence now.
    pub fn highest_epoch(&self) -> Option<u64> {
        self.lock().terminal.highest_epoch()
    }

    fn lock(&self) -> MutexGuard<'_, Shared<P>> {
        // A panic while holding the lock leaves the state as consistent as any single
        // step does (every method is one decision), so go on with it.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One HTTP/2 connection, from open to close.
    async fn serve<IO>(&self, io: TokioIo<IO>)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (close_tx, mut close_rx) = watch::channel(false);
        let conn = {
            let mut s = self.lock();
            let conn = s.next_conn;
            s.next_conn += 1;
            s.terminal.open(conn);
            s.closers.insert(conn, close_tx);
            conn
        };
        // Forgets the connection even if this task is aborted.
        let _guard = CloseGuard { server: self, conn };
        let server = self.clone();
        let service = service_fn(move |req| {
            let server = server.clone();
            async move { Ok::<_, Infallible>(server.handle(conn, req).await) }
        });
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder.timer(TokioTimer::new());
        let mut http = pin!(builder.serve_connection(io, service));
        tokio::select! {
            result = http.as_mut() => {
                if let Err(error) = result {
                    debug!(conn, %error, "connection ended with an error");
                }
                return;
            }
            _ = close_rx.wait_for(|close| *close) => http.as_mut().graceful_shutdown(),
        }
        // Superseded: in-flight requests finish, then the connection goes, at the latest
        // after the grace period.
        let _ = timeout(self.inner.config.supersede_grace, http).await;
    }

    async fn handle(&self, conn: ConnId, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let answer = match (req.method(), req.uri().path()) {
            (&Method::POST, "/hello") => self.hello(conn, &req),
            (&Method::POST, path) if path == self.inner.config.push_path => {
                self.push(conn, req).await
            }
            _ => Answer::NotFound,
        };
        answer.response()
    }

    fn hello(&self, conn: ConnId, req: &Request<Incoming>) -> Answer {
        let hello = match wire::hello(req.headers(), &self.inner.id) {
            Ok(hello) => hello,
            Err(why) => return Answer::Malformed(why),
        };
        let mut s = self.lock();
        match s.terminal.handle_hello(conn, hello.epoch) {
            HelloOutcome::Accepted { superseded, raised } => {
                if raised {
                    s.persist.fence_raised(hello.epoch);
                }
                for old in superseded {
                    s.close(old);
                }
                debug!(conn, epoch = hello.epoch, pod = %hello.pod, "session opened");
                Answer::Hello
            }
            HelloOutcome::Stale { highest } => {
                debug!(conn, epoch = hello.epoch, highest, pod = %hello.pod, "stale hello refused");
                Answer::Stale { highest }
            }
            HelloOutcome::Closing => Answer::Superseded,
        }
    }

    async fn push(&self, conn: ConnId, req: Request<Incoming>) -> Answer {
        let (parts, body) = req.into_parts();
        let head = match wire::push(&parts.headers, &self.inner.id) {
            Ok(head) => head,
            Err(why) => return Answer::Malformed(why),
        };
        // The whole payload first, as the pod sends it before waiting for the answer.
        let Ok(body) = Limited::new(body, self.inner.config.max_body)
            .collect()
            .await
        else {
            return Answer::TooLarge;
        };
        let key = head.dedup_key();
        let this = Delivery {
            pod: head.pod.clone(),
            epoch: head.epoch,
            at_unix_ms: unix_ms(),
        };
        let outcome = self
            .lock()
            .terminal
            .handle_push(conn, head.epoch, &key, this, unix_ms());
        match outcome {
            PushOutcome::Take => {}
            PushOutcome::Duplicate { .. } => return Answer::Duplicate,
            PushOutcome::InFlight => return Answer::InFlight,
            PushOutcome::Stale { highest } => return Answer::Stale { highest },
            PushOutcome::NoSession => return Answer::NoSession,
        }
        // The handler runs in a task of its own, so a pod that stops waiting (the
        // connection dropped) does not cut it short: the key ends taken or free by what
        // the handler did, never by when the pod gave up.
        let server = self.clone();
        let push = Push {
            head,
            body: body.to_bytes(),
        };
        let taking = tokio::spawn(async move {
            let result = server.inner.handler.push(push).await;
            let now = unix_ms();
            let mut s = server.lock();
            s.terminal.finish_push(&key, result.is_ok(), now);
            if result.is_ok() {
                s.persist.key_taken(&key, now);
            }
            result
        });
        match taking.await {
            Ok(Ok(())) => Answer::Taken,
            Ok(Err(Refusal { status, reason })) => {
                let reserved = status.is_success()
                    || matches!(
                        status,
                        StatusCode::CONFLICT | StatusCode::PRECONDITION_REQUIRED
                    );
                // The protocol gives these statuses their own meaning; a refusal that
                // picked one is answered 500, which the sender sees as a refusal too.
                let status = if reserved {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    status
                };
                Answer::Refused { status, reason }
            }
            // The handler panicked: whether it acted is unknown, so its key stays in
            // flight and every copy is refused until the terminal restarts, rather than
            // taken twice or reported as taken.
            Err(_) => Answer::Refused {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                reason: "the push handler failed".into(),
            },
        }
    }
}

impl<P> Shared<P> {
    fn close(&mut self, conn: ConnId) {
        if let Some(closer) = self.closers.get(&conn) {
            let _ = closer.send(true);
        }
    }
}

struct CloseGuard<'a, H: Handler, P: Persist> {
    server: &'a Server<H, P>,
    conn: ConnId,
}

impl<H: Handler, P: Persist> Drop for CloseGuard<'_, H, P> {
    fn drop(&mut self) {
        let mut s = self.server.lock();
        s.terminal.close(self.conn);
        s.closers.remove(&self.conn);
    }
}

/// The wall clock in Unix milliseconds (0 before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
