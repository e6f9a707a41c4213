//! Dialer, session and manager against fake terminals (`fake`): real TLS, HTTP/2 and
//! sockets on localhost.

mod fake;
mod handover;
mod lost_directory;
mod manager;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use self::fake::{freezable_proxy, wait_until, FakeTerminal, Hello, Pki, LIMIT};
use crate::core::reconciler::{Close, Stop, StopReason};
use crate::core::{Epoch, ShardId};
use crate::pos::dialer::Keepalive;
use crate::pos::wire::DialError;
use crate::store::directory::Terminal;

/// What the driver's `StopServing` hands the manager.
fn stop(shard: ShardId, epoch: Epoch, reason: StopReason, close: Close) -> Stop {
    Stop {
        shard,
        epoch,
        reason,
        close,
    }
}

#[tokio::test]
async fn hello_names_epoch_pod_and_terminal_then_close_ends_connection() {
    let pki = Pki::new();
    let server = FakeTerminal::spawn(pki.server("pos-1.test", &[b"h2"])).await;
    let session = pki
        .dialer()
        .dial(&server.terminal("pos-1", "pos-1.test"), 42)
        .await
        .unwrap();
    assert_eq!(session.epoch(), Some(42));
    let expected = Hello {
        epoch: 42,
        pod: "pod-a".into(),
        terminal: "pos-1".into(),
        authority: "pos-1.test".into(),
    };
    assert_eq!(server.hellos(), vec![expected]);
    assert_eq!(server.open.load(Ordering::SeqCst), 1);
    assert!(session.close(Duration::from_secs(2)).await, "GOAWAY close");
    wait_until("server sees the connection end", || {
        server.open.load(Ordering::SeqCst) == 0
    })
    .await;
}

#[tokio::test]
async fn stale_epoch_is_reported_with_the_highest_seen() {
    let pki = Pki::new();
    let server = FakeTerminal::spawn(pki.server("pos-1.test", &[b"h2"])).await;
    *server.highest.lock().unwrap() = 100;
    let err = pki
        .dialer()
        .dial(&server.terminal("pos-1", "pos-1.test"), 50)
        .await
        .unwrap_err();
    assert!(
        matches!(err, DialError::StaleEpoch { highest: Some(100) }),
        "{err:?}"
    );
}

#[tokio::test]
async fn wrong_name_certificate_and_missing_h2_are_refused() {
    let pki = Pki::new();
    let other = FakeTerminal::spawn(pki.server("other.test", &[b"h2"])).await;
    let err = pki
        .dialer()
        .dial(&other.terminal("pos-1", "pos-1.test"), 1)
        .await
        .unwrap_err();
    assert!(matches!(err, DialError::WrongName { .. }), "{err:?}");
    assert_eq!(err.label(), "tls_error");
    assert!(other.hellos().is_empty());

    let no_alpn = FakeTerminal::spawn(pki.server("pos-1.test", &[])).await;
    let err = pki
        .dialer()
        .dial(&no_alpn.terminal("pos-1", "pos-1.test"), 1)
        .await
        .unwrap_err();
    assert!(matches!(err, DialError::NoH2 { alpn: None }), "{err:?}");
}

#[tokio::test]
async fn closed_port_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let pki = Pki::new();
    let terminal = Terminal {
        id: "pos-1".into(),
        addr: addr.to_string(),
        server_name: "pos-1.test".into(),
        labels: Default::default(),
    };
    let err = pki.dialer().dial(&terminal, 1).await.unwrap_err();
    assert!(matches!(err, DialError::Refused), "{err:?}");
}

#[tokio::test]
async fn unanswered_keepalive_ends_the_session() {
    let pki = Pki::new();
    let server = FakeTerminal::spawn(pki.server("pos-1.test", &[b"h2"])).await;
    let frozen = Arc::new(AtomicBool::new(false));
    let proxy = freezable_proxy(server.addr, frozen.clone()).await;
    let dialer = pki.dialer_with(Keepalive {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(100),
    });
    let terminal = Terminal {
        id: "pos-1".into(),
        addr: proxy.to_string(),
        server_name: "pos-1.test".into(),
        labels: Default::default(),
    };
    let mut session = dialer.dial(&terminal, 1).await.unwrap();
    // Answered PINGs keep an idle connection up.
    let idle = tokio::time::timeout(Duration::from_millis(500), session.ended()).await;
    assert!(idle.is_err(), "ended while the peer answered: {idle:?}");
    frozen.store(true, Ordering::SeqCst);
    let end = tokio::time::timeout(LIMIT, session.ended()).await.unwrap();
    assert!(end.error.is_some(), "{end:?}");
}
