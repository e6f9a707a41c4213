//! The accept loop: takes connections from a listener (plain TCP, or TLS whose
//! handshake finished), serves each with hyper (HTTP/1.1 or HTTP/2) under the
//! [`ConnectionLimits`], and on shutdown stops accepting and lets the requests in flight
//! finish. The [`Connections`] table decides which connection waits too long and which
//! one makes room; this loop only carries its verdicts out.
//!
//! Why not `axum::serve`: it holds every connection for as long as the client likes. A
//! client that opens connections and sends nothing, or a head a byte at a time, held
//! them forever, each a file descriptor the pod's terminal sessions need.
//!
//! [`bind`] makes the listener with an accept queue sized for a flood.
//!
//! Not for: routing (`super::Routes`), TLS handshakes (`super::tls::TlsListener`), the
//! JSON bodies of hyper's own answers (`super::head_errors`).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tower_service::Service;

use super::connections::{Admission, ConnId, ConnectionLimits, Connections, Deadline};
use super::Routes;
use crate::metrics::Metrics;
use crate::rate_log::RateLog;

/// The listener's accept queue, connections the kernel has set up that the loop has not
/// taken yet (the kernel caps it at `net.core.somaxconn`, 4,096 by default since Linux
/// 5.4). `TcpListener::bind` asks for 128, as the standard library does: a flood fills
/// that at moments, and then the kernel drops SYNs, a probe's or a push's among them,
/// which their clients send again only after 1 s (and 3 s).
pub const LISTEN_BACKLOG: u32 = 4_096;

/// How long a connection closed for waiting too long after a request gets to finish its
/// close (an HTTP/2 GOAWAY exchange) before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// The same for a connection without a request in flight when the pod shuts down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The table, how to tell a connection's task to look at it again, and how the accept
/// loop learns that a connection is gone.
struct Shared {
    inner: Mutex<Inner>,
    /// Notified whenever a connection's descriptor is dropped.
    freed: Notify,
}

struct Inner {
    table: Connections,
    wakers: HashMap<ConnId, Arc<Notify>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A listener on `addr` with an accept queue of [`LISTEN_BACKLOG`]. Like
/// `TcpListener::bind` it sets `SO_REUSEADDR`, so a restarted pod binds its port while
/// the old process's connections are in `TIME_WAIT`. Call it inside the runtime.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `routes` on `listener` under `limits` until `shutdown` resolves, then stops
/// accepting and waits for the connections to finish their requests in flight.
pub async fn run<L>(
    mut listener: L,
    routes: Routes,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) where
    L: axum::serve::Listener,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let builder = Arc::new(builder(limits));
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            table: Connections::new(limits),
            wakers: HashMap::new(),
        }),
        freed: Notify::new(),
    });
    let shed_log = RateLog::default();
    let shed = |reason: &'static str, message: &'static str| {
        metrics
            .http_connections_closed
            .get_or_create(&[("reason", reason)])
            .inc();
        if let Some(suppressed) = shed_log.admit(reason, Instant::now()) {
            let max_connections = limits.max_connections;
            tracing::warn!(max_connections, suppressed, "{message}");
        }
    };
    let (stop, stopping) = watch::channel(());
    // Dropped (aborting every connection) if this future is: the pod bounds its drain.
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        // Too many chosen to make room are still held: accept nothing more until one is
        // gone (newcomers wait in the kernel's queue meanwhile).
        if !shared.lock().table.may_accept() {
            tokio::select! {
                _ = shared.freed.notified() => {}
                Some(_) = tasks.join_next() => {}
                _ = &mut shutdown => break,
            }
            continue;
        }
        let (io, _addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = tasks.join_next() => continue,
            _ = &mut shutdown => break,
        };
        let (id, wake, evicted) = {
            let mut inner = shared.lock();
            let (id, evicted) = match inner.table.handle_accept(Instant::now()) {
                Admission::Admitted(id) => (id, None),
                Admission::Evicting { admitted, evict } => {
                    (admitted, inner.wakers.get(&evict).cloned())
                }
                Admission::Refused => {
                    drop(inner);
                    shed(
                        "refused",
                        "client connection refused: every connection is in a request",
                    );
                    continue;
                }
            };
            let wake = Arc::new(Notify::new());
            inner.wakers.insert(id, wake.clone());
            metrics.http_connections.set(inner.table.len() as i64);
            (id, wake, evicted)
        };
        if let Some(evicted) = evicted {
            evicted.notify_one();
            shed(
                "evicted",
                "client connections full: closed the one waiting longest without a request",
            );
        }
        let conn = Conn {
            id,
            wake,
            shared: shared.clone(),
            metrics: metrics.clone(),
            look_again: limits.idle_timeout,
        };
        let routes = routes.clone();
        tasks.spawn(conn.serve(io, builder.clone(), routes, stopping.clone()));
    }
    drop(listener);
    let _ = stop.send(());
    while tasks.join_next().await.is_some() {}
}

/// hyper's connection settings for `limits`. hyper's own HTTP/1.1 header read timeout
/// is off: its timer also runs between keep-alive requests, so it would close an idle
/// keep-alive connection after the header timeout, and a load balancer or ingress that
/// keeps connections to the pod for a minute would send requests into closing ones
/// (intermittent 502s). The table bounds the first head by the header read timeout and
/// the time between requests by the idle timeout instead.
fn builder(limits: ConnectionLimits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams);
    builder
}

/// Where a connection's task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Serving requests.
    Open,
    /// Told to close (HTTP/2 GOAWAY, HTTP/1.1 no further request): dropped at `until`,
    /// or whenever its requests are done if `None`.
    Closing { until: Option<tokio::time::Instant> },
}

impl Phase {
    fn closing_within(grace: Duration) -> Phase {
        Phase::Closing {
            until: Some(tokio::time::Instant::now() + grace),
        }
    }

    /// Resolves when a closing connection's time is up; never otherwise.
    async fn expired(self) {
        match self {
            Phase::Closing { until: Some(until) } => tokio::time::sleep_until(until).await,
            _ => std::future::pending().await,
        }
    }
}

/// One accepted connection.
struct Conn {
    id: ConnId,
    /// Told when it was chosen to make room.
    wake: Arc<Notify>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    /// The longest its loop waits before it looks at the table again (the idle
    /// timeout; see the loop in `serve`).
    look_again: Duration,
}

impl Conn {
    async fn serve<I>(
        self,
        io: I,
        builder: Arc<Builder<TokioExecutor>>,
        routes: Routes,
        mut stopping: watch::Receiver<()>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let wake = self.wake.clone();
        let service = TowerToHyperService::new(Requests {
            id: self.id,
            shared: self.shared.clone(),
            routes,
        });
        let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
        let mut phase = Phase::Open;
        loop {
            // Requests starting and ending do not wake this loop: that was two more
            // polls of the connection (and a timer) per request, paid by every push.
            // The loop looks at the table when the deadline passes, and at the latest
            // one idle timeout from now: a request that ends after now sets its
            // deadline no earlier than that (its end + the idle timeout), so the loop
            // has seen it before it passes, and every deadline is kept to the instant.
            let look_again = Instant::now() + self.look_again;
            let look_at = match self.shared.lock().table.poll_deadline(self.id) {
                // Evicted (counted by the accept loop): it has no request in flight.
                Deadline::Closed => break,
                Deadline::FirstRequest(at) | Deadline::NextRequest(at) => at.min(look_again),
                Deadline::InRequest => look_again,
            };
            let deadline_passed = tokio::time::sleep_until(look_at.into());
            tokio::select! {
                served = conn.as_mut() => {
                    if let Err(error) = served {
                        tracing::debug!(%error, "client connection ended with an error");
                    }
                    break;
                }
                // Evicted: look again.
                _ = wake.notified() => {}
                _ = stopping.changed(), if phase == Phase::Open => {
                    // Shutdown: requests in flight finish (the pod bounds the wait); a
                    // connection without one gets a moment to see the GOAWAY.
                    conn.as_mut().graceful_shutdown();
                    // Read again: a request may have started since the loop looked.
                    phase = match self.shared.lock().table.poll_deadline(self.id) {
                        Deadline::InRequest => Phase::Closing { until: None },
                        _ => Phase::closing_within(SHUTDOWN_GRACE),
                    };
                }
                _ = deadline_passed, if phase == Phase::Open => {
                    match self.shared.lock().table.poll_deadline(self.id) {
                        Deadline::FirstRequest(at) if at <= Instant::now() => {
                            // Never brought a request (a slowloris, a silent client):
                            // nothing to finish or to tell.
                            self.closed("timeout");
                            break;
                        }
                        Deadline::NextRequest(at) if at <= Instant::now() => {
                            self.closed("timeout");
                            conn.as_mut().graceful_shutdown();
                            phase = Phase::closing_within(CLOSE_GRACE);
                        }
                        _ => {}
                    }
                }
                _ = phase.expired() => {
                    // A request may have begun during the grace (its head was on the
                    // way when the GOAWAY or the shutdown came): it finishes like one
                    // in flight at shutdown. The connection is not polled here, so no
                    // request can begin between this look and the break.
                    match self.shared.lock().table.poll_deadline(self.id) {
                        Deadline::InRequest => phase = Phase::Closing { until: None },
                        _ => break,
                    }
                }
            }
        }
        {
            let mut inner = self.shared.lock();
            inner.table.handle_close(self.id);
            inner.wakers.remove(&self.id);
            self.metrics.http_connections.set(inner.table.len() as i64);
        }
        self.shared.freed.notify_one();
    }

    fn closed(&self, reason: &'static str) {
        self.metrics
            .http_connections_closed
            .get_or_create(&[("reason", reason)])
            .inc();
    }
}

/// The routes, telling the table when each request starts and ends.
#[derive(Clone)]
struct Requests {
    id: ConnId,
    shared: Arc<Shared>,
    routes: Routes,
}

impl Service<Request<Incoming>> for Requests {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Answering;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        self.shared.lock().table.handle_request_start(self.id);
        let in_flight = InFlight {
            id: self.id,
            shared: self.shared.clone(),
        };
        Answering {
            answer: self.routes.answer(request.map(axum::body::Body::new)),
            in_flight: Some(in_flight),
        }
    }
}

/// A request's answer on its way, and the request in flight until it is answered or
/// dropped. Not an `async` block around the answer: that would be a second box, and a
/// move of it.
pub(super) struct Answering {
    answer: futures::future::BoxFuture<'static, axum::response::Response>,
    in_flight: Option<InFlight>,
}

impl std::future::Future for Answering {
    type Output = Result<axum::response::Response, std::convert::Infallible>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let answer = std::task::ready!(self.answer.as_mut().poll(cx));
        self.in_flight = None;
        std::task::Poll::Ready(Ok(answer))
    }
}

/// One request in flight; its end is recorded when dropped, answered or abandoned.
struct InFlight {
    id: ConnId,
    shared: Arc<Shared>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared
            .lock()
            .table
            .handle_request_end(self.id, Instant::now());
    }
}
