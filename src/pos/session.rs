//! One live HTTP/2 connection to a terminal: the request handle, a signal that the
//! connection ended, the fenced `hello`, and a bounded graceful close.
//!
//! The connection is driven by one task of its own ([`drive`]: the `h2` connection and
//! its PING keep-alive); its end (keep-alive PING unanswered, GOAWAY from the terminal,
//! socket error), read from the task's join handle, is the death signal the manager
//! watches. A session may carry requests only after a `hello` with the current epoch got
//! a 2xx answer: the terminal checks that epoch, which is what fences a former owner.
//!
//! Not for: dialing (`dialer`), retry policy (`manager`), pushes (`push`).

use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use h2::client::{Connection, SendRequest};
use h2::{Ping, RecvStream};
use http::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tracing::debug;

use super::dialer::Keepalive;
use super::wire::{self, DialError, Stage};
use crate::core::{Epoch, PodId};

/// The handle requests are sent on; clones share the connection.
pub type RequestSender = SendRequest<Bytes>;

/// How a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnEnd {
    /// Why it ended, when it was not a clean close.
    pub error: Option<String>,
}

/// Why the connection task ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("HTTP/2: {0}")]
    Http(#[from] h2::Error),
    /// A PING went unanswered for the keep-alive timeout: the terminal or the path to it
    /// is dead, though the socket may never say so.
    #[error("keep-alive timed out: no PING answer within {0:?}")]
    KeepaliveTimedOut(Duration),
}

/// The connection's task: it drives the HTTP/2 connection and owns the socket.
pub(super) type ConnFuture = JoinHandle<Result<(), ConnError>>;

/// Drives `conn` until it ends, PINGing the terminal every `keepalive.interval` (idle
/// or not: a push connection is idle most of the time, which is when a dead peer must
/// still be noticed) and ending it when an answer takes longer than
/// `keepalive.timeout`. The keep-alive runs in the same task as the connection: a task
/// per connection is what every held connection pays for.
pub(super) async fn drive<T>(
    mut conn: Connection<T, Bytes>,
    keepalive: Keepalive,
) -> Result<(), ConnError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let Some(mut pings) = conn.ping_pong() else {
        unreachable!("the PING handle is taken once, here")
    };
    let pinging = async move {
        loop {
            tokio::time::sleep(keepalive.interval).await;
            pings.send_ping(Ping::opaque())?;
            match tokio::time::timeout(keepalive.timeout, poll_fn(|cx| pings.poll_pong(cx))).await {
                Ok(answer) => answer?,
                Err(_) => return Err(ConnError::KeepaliveTimedOut(keepalive.timeout)),
            };
        }
    };
    tokio::select! {
        // The connection's own end first: a PING handle fails once the connection has.
        biased;
        end = &mut conn => end.map_err(ConnError::Http),
        end = pinging => end,
    }
}

/// Who a session speaks for and to: fixed for the session's life.
#[derive(Clone, Debug)]
pub(super) struct TerminalPeer {
    pub terminal: String,
    /// `https://<server_name>`: the `:authority` and scheme of every request.
    pub origin: String,
    pub pod: PodId,
}

/// A live HTTP/2 connection to one terminal.
#[derive(Debug)]
pub struct Session {
    send: RequestSender,
    /// The connection's task itself, awaited for its end: a watcher task and a channel
    /// per connection would cost every held connection ~0.6 KiB.
    conn: ConnTask,
    /// How the connection ended, once it has.
    end: Option<ConnEnd>,
    peer: TerminalPeer,
    /// The epoch of the last accepted hello, if any.
    epoch: Option<Epoch>,
}

impl Session {
    pub(super) fn new(send: RequestSender, conn: ConnFuture, peer: TerminalPeer) -> Self {
        Session {
            send,
            conn: ConnTask(Some(conn)),
            end: None,
            peer,
            epoch: None,
        }
    }

    /// The epoch whose hello the terminal accepted on this connection, if any. Only a
    /// session whose hello epoch is the shard's current epoch may carry pushes.
    pub fn epoch(&self) -> Option<Epoch> {
        self.epoch
    }

    /// A handle to send requests on this connection (pushes use it directly). The
    /// connection closes once the session and every such handle are gone.
    pub fn sender(&self) -> RequestSender {
        self.send.clone()
    }

    /// Sends `POST /hello` for `epoch` and waits up to `timeout` for the answer. On
    /// success the session is fenced with `epoch`; on any failure it is not fenced with
    /// any epoch (an earlier accepted one no longer counts).
    pub async fn hello(&mut self, epoch: Epoch, timeout: Duration) -> Result<(), DialError> {
        self.epoch = None;
        let request = wire::hello(
            &self.peer.origin,
            epoch,
            &self.peer.pod,
            &self.peer.terminal,
        )
        .map_err(|e| DialError::BadTerminal(e.to_string()))?;
        let response = tokio::time::timeout(timeout, self.request(request))
            .await
            .map_err(|_| DialError::Timeout(Stage::Hello))?
            .map_err(|e| DialError::Http(e.into_inner()))?;
        match wire::verdict(response.status(), response.headers()) {
            wire::Verdict::Accepted => {}
            wire::Verdict::Stale { highest } => return Err(DialError::StaleEpoch { highest }),
            wire::Verdict::Refused { status } => return Err(DialError::HelloRejected { status }),
        }
        self.epoch = Some(epoch);
        Ok(())
    }

    /// Sends one request on this connection (the hello now, pushes later) and waits for
    /// the answer's head; the caller may read or drop its body.
    pub async fn request(
        &mut self,
        request: Request<Bytes>,
    ) -> Result<Response<RecvStream>, SendError> {
        send(&mut self.send, request).await
    }

    /// Resolves when the connection has ended, with why. Cancel-safe; may be awaited
    /// again after it resolved.
    pub async fn ended(&mut self) -> ConnEnd {
        if let Some(end) = &self.end {
            return end.clone();
        }
        let end = self.conn.finished().await;
        debug!(terminal = %self.peer.terminal, ?end, "terminal connection ended");
        self.end = Some(end.clone());
        end
    }

    /// Closes the connection: dropping the last request handle makes the HTTP/2 layer
    /// send GOAWAY and close once in-flight streams are done. Waits up to `budget`,
    /// then cancels the connection task and waits until it is gone. Either way the
    /// socket is closed when this returns, which is what lets the shard's lease be
    /// released right after (the next owner may dial at once). Returns whether it
    /// closed within budget.
    pub async fn close(self, budget: Duration) -> bool {
        let Session { send, mut conn, .. } = self;
        drop(send);
        // The task finishes after it dropped the connection, socket included.
        let graceful = tokio::time::timeout(budget, conn.finished()).await.is_ok();
        if !graceful {
            conn.cancel_and_wait().await;
        }
        graceful
    }
}

/// Queues `request` on `sender` (h2 opens its stream once the terminal's
/// `SETTINGS_MAX_CONCURRENT_STREAMS` leaves room) and waits for the answer's head.
/// An error before the request was queued means nothing was sent
/// ([`SendError::NotSent`]); any later one leaves it open whether the terminal has it.
pub(super) async fn send(
    sender: &mut RequestSender,
    request: Request<Bytes>,
) -> Result<Response<RecvStream>, SendError> {
    poll_fn(|cx| sender.poll_ready(cx))
        .await
        .map_err(SendError::NotSent)?;
    let (head, body) = request.into_parts();
    let end_of_stream = body.is_empty();
    let (answer, mut stream) = sender
        .send_request(Request::from_parts(head, ()), end_of_stream)
        .map_err(SendError::NotSent)?;
    if !end_of_stream {
        // Queued whole: the body is small and the stream's window (the terminal's
        // SETTINGS) is what h2 sends it within.
        stream.send_data(body, true).map_err(SendError::Unknown)?;
    }
    answer.await.map_err(SendError::Unknown)
}

/// Why [`send`] got no answer, by what it proves.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The connection refused the request before it was queued (closed, GOAWAY).
    #[error("not sent: {0}")]
    NotSent(#[source] h2::Error),
    /// The request was queued, and may have reached the terminal.
    #[error("{0}")]
    Unknown(#[source] h2::Error),
}

impl SendError {
    /// The HTTP/2 error, whichever side of sending it came from.
    pub fn into_inner(self) -> h2::Error {
        match self {
            SendError::NotSent(e) | SendError::Unknown(e) => e,
        }
    }
}

/// The task that owns the connection (and its socket). Cancelled when the session goes
/// away, however it goes: a session dropped without `close` (its link task aborted at a
/// stop deadline) must not leave its socket open. Only `close` can also wait for the
/// cancellation to finish; a drop merely requests it.
#[derive(Debug)]
struct ConnTask(Option<ConnFuture>);

impl ConnTask {
    /// Waits until the task has finished and says how it ended. Cancel-safe; after it
    /// returned once, it returns at once.
    async fn finished(&mut self) -> ConnEnd {
        let Some(task) = &mut self.0 else {
            return ConnEnd {
                error: Some("connection task already finished".into()),
            };
        };
        let result = task.await;
        // A finished task's handle must not be polled again.
        self.0 = None;
        let error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(format!("connection task: {e}")),
        };
        ConnEnd { error }
    }

    /// Cancels the task and waits until it has been dropped, socket included.
    async fn cancel_and_wait(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
            // Err(cancelled) is the expected outcome; a panic there is not ours to
            // propagate either.
            let _ = task.await;
        }
    }
}

impl Drop for ConnTask {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets its flag when dropped: stands in for the socket the connection task owns.
    struct Socket(std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl Drop for Socket {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_cancelled_connection_task_is_gone_when_close_returns() {
        let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let socket = Socket(closed.clone());
        // A connection that never ends on its own (a terminal that ignores GOAWAY).
        let task = tokio::spawn(async move {
            let _socket = socket;
            std::future::pending::<Result<(), ConnError>>().await
        });
        tokio::task::yield_now().await; // let it start and park
        let mut conn = ConnTask(Some(task));
        conn.cancel_and_wait().await;
        // Requesting the abort alone would leave the task (and its socket) alive until
        // the scheduler next ran it; the lease may be released right after this.
        assert!(closed.load(std::sync::atomic::Ordering::SeqCst));
    }
}
