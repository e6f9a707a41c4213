//! Tests of `link`: the state transitions and the size of a link task's future.

use std::num::NonZeroU32;

use rand::SeedableRng;

use super::super::dialer::DialerConfig;
use super::super::pacer::Jitter;
use super::*;
use crate::core::PodId;

/// Every held connection keeps its link task's future allocated for as long as it
/// lives, so a dial's state (TLS and HTTP/2 handshakes) must not be part of it.
#[tokio::test]
async fn a_link_task_future_is_small() {
    let tls = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let pod = PodId::new("pod-a").unwrap();
    let pacer = || Pacer::new(NonZeroU32::new(10).unwrap(), Jitter::None, 1);
    let cx = Arc::new(LinkContext {
        dialer: Dialer::new(DialerConfig::new(Arc::new(tls), pod)),
        pacer: pacer(),
        hellos: pacer(),
        backoff: BackoffPolicy::default(),
        close_budget: Duration::from_secs(1),
        stale: mpsc::unbounded_channel().0,
        metrics: Arc::new(Metrics::default()),
    });
    let mode = watch::channel(Mode {
        epoch: 1,
        delivery: Delivery::Delivering,
    });
    let task = LinkTask {
        cx,
        shard: 0,
        terminal: Terminal {
            id: "t-1".into(),
            addr: "127.0.0.1:1".into(),
            server_name: "t-1.test".into(),
            labels: Default::default(),
        },
        mode: mode.1,
        state: watch::channel(LinkStatus::new()).0,
        shared: Arc::new(LinkShared::default()),
        rng: SmallRng::seed_from_u64(1),
        gate: None,
        _ended: tokio::sync::oneshot::channel().0,
    };
    let size = std::mem::size_of_val(&task.run());
    // 1,120 bytes now; 14,000 with the dial and the re-sent hello inline.
    assert!(size <= 2048, "the link task's future is {size} bytes");
}

#[test]
fn link_transitions() {
    let mut rng = SmallRng::seed_from_u64(3);
    let mut link = Link::new(BackoffPolicy::default());
    assert_eq!(link.state(), LinkState::Disconnected);
    link.dialing();
    assert_eq!(link.state(), LinkState::Dialing);
    // Failures back off with growing ceilings.
    let first = link.failed(&mut rng);
    assert_eq!(link.state(), LinkState::Backoff);
    assert!(first <= Duration::from_secs(1));
    link.disconnected();
    link.dialing();
    assert!(link.failed(&mut rng) <= Duration::from_secs(2));
    assert_eq!(link.failures(), 2);
    link.disconnected();
    link.dialing();
    link.connected(7);
    assert_eq!(link.state(), LinkState::Connected { epoch: 7 });
    // Success resets the streak; a new epoch's hello keeps the link connected.
    assert_eq!(link.failures(), 0);
    link.connected(9);
    assert_eq!(link.state(), LinkState::Connected { epoch: 9 });
    // A dead connection redials without backoff.
    link.disconnected();
    assert_eq!(link.state(), LinkState::Disconnected);
    assert_eq!(link.failures(), 0);
}
