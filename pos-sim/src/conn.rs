//! The terminal side of one connection: TCP accept, faults, SNI routing, the TLS handshake,
//! HTTP/2 serving of `POST /hello` and `POST <push path>` (answering a repeated key with
//! the duplicate marker and logging it with the pods of both copies), logging the dark
//! interval a new connection ends, and closing on request.
//!
//! Which terminal a connection belongs to is decided by the SNI of the ClientHello, read
//! before the handshake completes, so unknown and offline terminals are refused without
//! spending a full handshake. Headers are read and answers written by
//! `posgate_terminal::wire`, the decisions are [`super::record`]'s (on
//! `posgate_terminal::Terminal`); this module adds the farm's faults, waits and answers.

use std::{convert::Infallible, net::SocketAddr, pin::pin, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, server::conn::http2, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    time::{sleep, sleep_until, timeout, Instant},
};
use tokio_rustls::{server::TlsStream, LazyConfigAcceptor};
use tracing::{debug, warn};

use posgate_terminal::{
    wire::{self, Answer},
    HelloOutcome,
};

use super::{
    certs::ALPN_H2,
    counters::Counters,
    duplicates::Duplicate,
    record::{unix_ms, CloseCmd, ConnId, PushOutcome},
    refusals::Refusal,
    Shared,
};

/// Largest push body accepted; larger ones get 413.
const MAX_BODY: usize = 1 << 20;
/// Back-off after a failed accept (e.g. out of file descriptors), instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections on one listener until the task is aborted.
pub(crate) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                Counters::bump(&shared.counters.tcp_accepted);
                tokio::spawn(serve(shared.clone(), tcp, peer));
            }
            Err(error) => {
                warn!(%error, "accept failed; backing off");
                sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// What a request handler needs to know about its connection.
struct ConnCtx {
    shared: Arc<Shared>,
    index: usize,
    id: String,
    conn: ConnId,
}

/// Records the connection's end even if its task is aborted or panics.
struct CloseGuard {
    shared: Arc<Shared>,
    index: usize,
    conn: ConnId,
}

impl Drop for CloseGuard {
    fn drop(&mut self) {
        let s = &self.shared;
        s.terminal(self.index)
            .close(self.conn, s.config.session_overlap_threshold, &s.counters);
    }
}

async fn serve(shared: Arc<Shared>, tcp: TcpStream, peer: SocketAddr) {
    let faults = shared.faults();
    if faults.refuse_connections {
        Counters::bump(&shared.counters.tcp_refused);
        return;
    }
    if !faults.handshake_delay().is_zero() {
        sleep(faults.handshake_delay()).await;
    }
    // Pushes are small request/response exchanges; do not let Nagle delay them.
    let _ = tcp.set_nodelay(true);
    let handshake = timeout(shared.config.handshake_timeout, handshake(&shared, tcp)).await;
    let Ok(Some((index, tls))) = handshake else {
        if handshake.is_err() {
            Counters::bump(&shared.counters.handshakes_failed);
        }
        return;
    };
    let conn = shared.next_conn_id();
    let (ctl_tx, mut ctl) = watch::channel(CloseCmd::Keep);
    let ended = shared
        .terminal(index)
        .open(conn, peer, ctl_tx, &shared.counters);
    if let Some(span) = ended {
        // Logged outside the terminal's lock: the log is farm-wide.
        shared.dark.ended(shared.number_of_index(index), span);
    }
    let _guard = CloseGuard {
        shared: shared.clone(),
        index,
        conn,
    };
    let id = shared.id_of_index(index);
    debug!(terminal = %id, conn, %peer, "connection opened");
    let ctx = Arc::new(ConnCtx {
        shared: shared.clone(),
        index,
        id,
        conn,
    });
    let service = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(handle(&ctx, req).await) }
    });
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new());
    let mut http = pin!(builder.serve_connection(TokioIo::new(tls), service));
    let mut grace_deadline: Option<Instant> = None;
    loop {
        tokio::select! {
            result = http.as_mut() => {
                if let Err(error) = result {
                    debug!(conn, %error, "connection ended with an error");
                }
                return;
            }
            changed = ctl.changed(), if grace_deadline.is_none() => {
                let cmd = if changed.is_ok() { *ctl.borrow_and_update() } else { CloseCmd::Abort };
                match cmd {
                    CloseCmd::Keep => {}
                    CloseCmd::Graceful => {
                        // GOAWAY: the client sees the session end; in-flight requests finish.
                        http.as_mut().graceful_shutdown();
                        grace_deadline = Some(Instant::now() + shared.config.supersede_grace);
                    }
                    CloseCmd::Abort => {
                        Counters::bump(&shared.counters.connections_dropped);
                        return;
                    }
                }
            }
            () = sleep_until(grace_deadline.unwrap_or_else(Instant::now)), if grace_deadline.is_some() => {
                debug!(conn, "superseded connection outlived its grace period; closing");
                return;
            }
        }
    }
}

/// Reads the ClientHello, routes by SNI, and completes the handshake. `None` when the
/// connection was refused or failed (already counted).
async fn handshake(shared: &Shared, tcp: TcpStream) -> Option<(usize, TlsStream<TcpStream>)> {
    let c = &shared.counters;
    let start = match LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await {
        Ok(start) => start,
        Err(error) => {
            debug!(%error, "no valid ClientHello");
            Counters::bump(&c.handshakes_failed);
            return None;
        }
    };
    let sni = start.client_hello().server_name().map(str::to_owned);
    let Some((n, index)) = sni.as_deref().and_then(|s| shared.route(s)) else {
        debug!(sni = ?sni, "unknown SNI refused");
        Counters::bump(&c.unknown_sni_refused);
        return None;
    };
    if shared.faults().is_offline(n, &shared.id_of_index(index)) {
        Counters::bump(&c.offline_refused);
        return None;
    }
    match start.into_stream(shared.tls.clone()).await {
        Ok(tls) if tls.get_ref().1.alpn_protocol() == Some(ALPN_H2) => Some((index, tls)),
        Ok(_) => {
            debug!(sni = ?sni, "client did not negotiate ALPN h2");
            Counters::bump(&c.handshakes_failed);
            None
        }
        Err(error) => {
            debug!(sni = ?sni, %error, "TLS handshake failed");
            Counters::bump(&c.handshakes_failed);
            None
        }
    }
}

fn respond(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp
}

/// Logs a stale-epoch refusal (who, what, when: the counters alone cannot tell a load test
/// whether the refused pod dropped the shard afterwards) and answers it.
fn refuse(ctx: &ConnCtx, pod: &str, kind: &str, epoch: u64, highest: u64) -> Response<Full<Bytes>> {
    ctx.shared.refusals.record(Refusal {
        terminal: ctx.id.clone(),
        pod: pod.to_owned(),
        kind: kind.to_owned(),
        epoch,
        highest,
        at_unix_ms: unix_ms(),
    });
    Answer::Stale { highest }.response()
}

async fn handle(ctx: &ConnCtx, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let latency = ctx.shared.faults().response_latency();
    if !latency.is_zero() {
        sleep(latency).await;
    }
    let is_push = req.uri().path() == ctx.shared.config.push_path;
    let resp = match (req.method(), req.uri().path()) {
        (&Method::POST, "/hello") => hello(ctx, req.headers()),
        (&Method::POST, _) if is_push => push(ctx, req).await,
        _ => Answer::NotFound.response(),
    };
    if resp.status().is_client_error()
        && !matches!(
            resp.status(),
            StatusCode::CONFLICT | StatusCode::PRECONDITION_REQUIRED
        )
    {
        Counters::bump(&ctx.shared.counters.requests_rejected);
    }
    resp
}

fn hello(ctx: &ConnCtx, headers: &HeaderMap) -> Response<Full<Bytes>> {
    let hello = match wire::hello(headers, &ctx.id) {
        Ok(hello) => hello,
        Err(why) => return Answer::Malformed(why).response(),
    };
    let (s, epoch) = (&ctx.shared, hello.epoch);
    let outcome = s.terminal(ctx.index).hello(ctx.conn, epoch, &s.counters);
    debug!(terminal = %ctx.id, conn = ctx.conn, epoch, pod = %hello.pod, ?outcome, "hello");
    match outcome {
        HelloOutcome::Accepted { .. } => Answer::Hello.response(),
        HelloOutcome::Stale { .. } if s.faults().accept_stale_epochs => {
            respond(StatusCode::OK, "hello (stale, accepted: fault)\n")
        }
        HelloOutcome::Stale { highest } => refuse(ctx, &hello.pod, "hello", epoch, highest),
        HelloOutcome::Closing => Answer::Superseded.response(),
    }
}

async fn push(ctx: &ConnCtx, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let head = match wire::push(&parts.headers, &ctx.id) {
        Ok(head) => head,
        Err(why) => return Answer::Malformed(why).response(),
    };
    // The payload is opaque here: a push without a content type is as good as any, and
    // only the fault (a terminal that wrongly insists on the header) refuses it.
    if ctx.shared.faults().require_content_type && head.content_type.is_none() {
        return respond(StatusCode::BAD_REQUEST, "missing content-type (fault)\n");
    }
    // Keys are unique per tenant: dedupe on (tenant, key), recorded as `tenant:key`.
    let key = head.dedup_key();
    let key = key.as_str();
    if let Some(expires) = head.expires_at_unix_ms {
        Counters::bump(&ctx.shared.counters.queued_pushes);
        if unix_ms() > expires {
            Counters::bump(&ctx.shared.counters.pushes_after_expiry);
            warn!(terminal = %ctx.id, key, expires, "push arrived after its posgate-expires-at");
        }
    }
    // The payload is read in full (as a terminal would) but not kept: only its size matters.
    let size = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes().len(),
        Err(_) => return Answer::TooLarge.response(),
    };
    let s = &ctx.shared;
    let refuse_with = s.faults().push_status;
    if refuse_with != 0 {
        // Validated when the fault was set.
        let status = StatusCode::from_u16(refuse_with).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return respond(status, "push refused (fault)\n");
    }
    let (epoch, pod) = (head.epoch, head.pod.as_str());
    let outcome = s
        .terminal(ctx.index)
        .push(ctx.conn, epoch, pod, key, unix_ms(), &s.counters);
    debug!(terminal = %ctx.id, conn = ctx.conn, epoch, key, size, ?outcome, "push");
    let faults = s.faults();
    let delay = faults.answer_delay(&ctx.id);
    if !delay.is_zero() {
        // Taken (or refused) already: a pod that stops waiting loses only the answer.
        sleep(delay).await;
    }
    match outcome {
        PushOutcome::Accepted => Answer::Taken.response(),
        PushOutcome::Repeated { .. } if faults.forget_keys => {
            respond(StatusCode::OK, "accepted (again: fault)\n")
        }
        PushOutcome::Stale { .. } if faults.accept_stale_epochs => {
            respond(StatusCode::OK, "accepted (stale: fault)\n")
        }
        PushOutcome::NoSession if faults.accept_without_hello => {
            respond(StatusCode::OK, "accepted (no session: fault)\n")
        }
        PushOutcome::Repeated {
            copy,
            previous,
            this,
        } => {
            s.duplicates.record(Duplicate {
                terminal: ctx.id.clone(),
                key: key.to_owned(),
                copy,
                previous,
                this,
            });
            Answer::Duplicate.response()
        }
        PushOutcome::Stale { highest } => refuse(ctx, pod, "push", epoch, highest),
        PushOutcome::NoSession => Answer::NoSession.response(),
    }
}
