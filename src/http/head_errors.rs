//! JSON bodies for the answers hyper writes itself: when an HTTP/1 request head cannot
//! be parsed (`400`), its target is too long (`414`) or the head is too large (`431`),
//! hyper answers before any handler runs, with an empty body. The API promises every
//! error as JSON, so [`JsonHeadErrors`] wraps each accepted connection and rewrites
//! exactly those answers into the documented `{"error", "message"}` body.
//!
//! How an automatic answer is recognised: it is the only response hyper writes with a
//! `4xx` status and `content-length: 0` (every answer of ours carries a JSON body), and
//! it starts a write of its own, because hyper writes it only when no response is being
//! written (`Writing::Init`) and has flushed the previous one. A pipelining client whose
//! malformed request follows unflushed responses may still get the empty body; no
//! client posgate supports pipelines.
//!
//! HTTP/2 connections (the client preface `PRI * HTTP/2.0`, h2c or ALPN `h2`) are passed
//! through untouched: their frames are binary, and the one answer the HTTP/2 layer makes
//! itself, `431` for a header list over the `SETTINGS_MAX_HEADER_LIST_SIZE` the pod
//! advertises (16 KiB), goes to clients that ignored the advertised limit.
//!
//! Not for: errors of our handlers or extractors (`errors.rs`).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::push::answer::{Answer, ErrorCode};

/// The HTTP/2 client preface up to the point where it differs from any HTTP/1 request.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// A listener whose connections are wrapped in [`JsonHeadErrors`].
pub struct JsonHeadErrorsListener<L>(pub L);

impl<L: axum::serve::Listener> axum::serve::Listener for JsonHeadErrorsListener<L> {
    type Io = JsonHeadErrors<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = self.0.accept().await;
        (JsonHeadErrors::new(io), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

#[derive(Debug)]
enum Protocol {
    /// Fewer bytes read than it takes to tell HTTP/2 from HTTP/1.
    Unknown {
        matched: usize,
    },
    Http1,
    Http2,
}

/// One connection; see the module docs.
#[derive(Debug)]
pub struct JsonHeadErrors<T> {
    inner: T,
    protocol: Protocol,
    /// A rewritten answer not yet fully written, and how much of it was.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T> JsonHeadErrors<T> {
    pub fn new(inner: T) -> Self {
        JsonHeadErrors {
            inner,
            protocol: Protocol::Unknown { matched: 0 },
            pending: None,
        }
    }

    fn sniff(&mut self, read: &[u8]) {
        let Protocol::Unknown { matched } = self.protocol else {
            return;
        };
        let want = &H2_PREFACE[matched..];
        let n = want.len().min(read.len());
        self.protocol = if read[..n] != want[..n] {
            Protocol::Http1
        } else if matched + n == H2_PREFACE.len() {
            Protocol::Http2
        } else {
            Protocol::Unknown {
                matched: matched + n,
            }
        };
    }
}

impl<T: AsyncWrite + Unpin> JsonHeadErrors<T> {
    /// Writes what is left of a rewritten answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
            if *written == bytes.len() {
                self.pending = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// The JSON replacement for `head` if it is one of hyper's automatic answers.
fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let rest = text.strip_prefix("HTTP/1.1 ")?;
    let status: u16 = rest.get(..3)?.parse().ok()?;
    let code = match status {
        400 => ErrorCode::InvalidRequest,
        414 => ErrorCode::UriTooLong,
        431 => ErrorCode::HeadersTooLarge,
        _ => return None,
    };
    let lower = text.to_ascii_lowercase();
    if !lower.ends_with("\r\n\r\n") || !lower.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let message = match code {
        ErrorCode::UriTooLong => "the request target is too long",
        ErrorCode::HeadersTooLarge => "the request head (request line and headers) is too large",
        _ => "the request line or a header could not be parsed",
    };
    let body = Answer::error(code, message).body;
    let at = lower.find("\r\ncontent-length: 0\r\n")?;
    let mut out = Vec::with_capacity(head.len() + body.len() + 40);
    out.extend_from_slice(&head[..at]);
    out.extend_from_slice(b"\r\ncontent-type: application/json");
    out.extend_from_slice(format!("\r\ncontent-length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(&head[at + "\r\ncontent-length: 0\r\n".len()..]);
    out.extend_from_slice(&body);
    Some(out)
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonHeadErrors<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let this = &mut *self;
        this.sniff(&buf.filled()[before..]);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonHeadErrors<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if matches!(self.protocol, Protocol::Http1) && buf.starts_with(b"HTTP/1.1 4") {
            if let Some(json) = rewrite(buf) {
                // Taken whole: the caller sees its head written and the JSON goes out
                // instead, now or before the next write, flush or shutdown. Never
                // `Pending` here: the caller would offer the same head again.
                self.pending = Some((json, 0));
                if let Poll::Ready(Err(e)) = self.poll_pending(cx) {
                    return Poll::Ready(Err(e));
                }
                return Poll::Ready(Ok(buf.len()));
            }
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if matches!(self.protocol, Protocol::Http2) {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        }
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        self.poll_write(cx, first)
    }

    /// HTTP/2 keeps the inner stream's vectored writes. HTTP/1 says no, so hyper
    /// flattens each response into one buffer: a head is then always the start of a
    /// write, and head and body leave in one segment (no Nagle delay between them).
    /// hyper asks once the protocol is known: it has read the preface through us.
    fn is_write_vectored(&self) -> bool {
        matches!(self.protocol, Protocol::Http2) && self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_automatic_answers_are_rewritten() {
        let auto =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(rewrite(auto).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("date: x"));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"], "headers_too_large");
        // Ours carry bodies; other statuses are not hyper's parse errors.
        assert!(rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 55\r\n\r\n").is_none());
        assert!(rewrite(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n").is_none());
    }

    #[test]
    fn the_http2_preface_is_recognised_across_reads() {
        let mut io = JsonHeadErrors::new(());
        io.sniff(b"PRI * HT");
        assert!(matches!(io.protocol, Protocol::Unknown { matched: 8 }));
        io.sniff(b"TP/2.0\r\n\r\nSM");
        assert!(matches!(io.protocol, Protocol::Http2));
        let mut io = JsonHeadErrors::new(());
        io.sniff(b"P");
        io.sniff(b"OST / HTTP/1.1\r\n");
        assert!(matches!(io.protocol, Protocol::Http1));
    }
}
