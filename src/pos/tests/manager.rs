//! The connection manager against fake terminals: epochs, directory changes, stale
//! epochs, dead connections, stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::fake::{freezable_proxy, wait_until, FakeTerminal, Pki, LIMIT};
use super::stop;
use crate::core::lease::{StaleEpoch, MAX_EPOCH};
use crate::core::reconciler::{Close, StopReason};
use crate::pos::dialer::Keepalive;
use crate::pos::manager::{ConnectionManager, Lookup, ManagerConfig};
use crate::pos::LinkState;
use crate::serving::ServingHook;
use crate::store::directory::{DirectoryAdmin, MemoryDirectory, Terminal};

fn manager_config() -> ManagerConfig {
    ManagerConfig {
        directory_poll: Duration::from_millis(100),
        close_budget: Duration::from_secs(2),
        rng_seed: Some(1),
        ..ManagerConfig::default()
    }
}

fn all_connected(m: &ConnectionManager<MemoryDirectory>, n: usize, epoch: u64) -> bool {
    m.shard(0).is_some_and(|v| {
        v.links.len() == n
            && v.links
                .values()
                .all(|s| *s == LinkState::Connected { epoch })
    })
}

/// One fake terminal server answering for `ids`, all in one directory (one shard in these
/// tests' cluster, so every terminal is in shard 0).
async fn farm(pki: &Pki, ids: &[&str]) -> (FakeTerminal, Arc<MemoryDirectory>) {
    let server = FakeTerminal::spawn(pki.server("pos-1.test", &[b"h2"])).await;
    let directory = Arc::new(MemoryDirectory::new());
    let terminals: Vec<Terminal> = ids
        .iter()
        .map(|id| server.terminal(id, "pos-1.test"))
        .collect();
    directory.upsert(1, &terminals).await.unwrap();
    (server, directory)
}

/// One fake terminal, "pos-1", that the directory lists at the address of a proxy which
/// stops forwarding (both ways, connections left open) while the flag is set.
async fn behind_a_freezable_proxy(
    pki: &Pki,
) -> (FakeTerminal, Arc<AtomicBool>, Arc<MemoryDirectory>) {
    let server = FakeTerminal::spawn(pki.server("pos-1.test", &[b"h2"])).await;
    let frozen = Arc::new(AtomicBool::new(false));
    let proxy = freezable_proxy(server.addr, frozen.clone()).await;
    let directory = Arc::new(MemoryDirectory::new());
    let terminal = Terminal {
        id: "pos-1".into(),
        addr: proxy.to_string(),
        server_name: "pos-1.test".into(),
        labels: Default::default(),
    };
    directory.upsert(1, &[terminal]).await.unwrap();
    (server, frozen, directory)
}

/// New labels reach the link's terminal without a redial: relabeling a region must not
/// reconnect it. A new address does redial.
#[tokio::test]
async fn relabeling_keeps_the_session_and_readdressing_redials() {
    let pki = Pki::new();
    let (server, directory) = farm(&pki, &["pos-1"]).await;
    let (stale, _stale_rx) = mpsc::unbounded_channel();
    let m = ConnectionManager::new(directory.clone(), pki.dialer(), manager_config(), stale);
    m.start(0, 10);
    wait_until("connected", || all_connected(&m, 1, 10)).await;
    let labels = crate::api::Labels::parse("store=17").unwrap();
    let relabeled = server
        .terminal("pos-1", "pos-1.test")
        .with_labels(labels.clone());
    directory.upsert(1, &[relabeled]).await.unwrap();
    let labels_of = |m: &ConnectionManager<MemoryDirectory>| match m.lookup(0, "pos-1") {
        Lookup::Found(link) => link.terminal.labels.clone(),
        other => panic!("{other:?}"),
    };
    wait_until("the new labels read", || labels_of(&m) == labels).await;
    assert!(all_connected(&m, 1, 10));
    assert_eq!(
        server.open.load(Ordering::SeqCst),
        1,
        "no redial for labels"
    );
    // The same terminal at another address.
    let other = FakeTerminal::spawn(pki.server("pos-1.test", &[b"h2"])).await;
    directory
        .upsert(1, &[other.terminal("pos-1", "pos-1.test")])
        .await
        .unwrap();
    wait_until("redialed at the new address", || {
        other.open.load(Ordering::SeqCst) == 1 && all_connected(&m, 1, 10)
    })
    .await;
    assert!(labels_of(&m).is_empty());
    m.stop(stop(0, 10, StopReason::Shutdown, Close::Now)).await;
}

#[tokio::test]
async fn manager_follows_epochs_directory_changes_and_stop() {
    let pki = Pki::new();
    let (server, directory) = farm(&pki, &["pos-1", "pos-2"]).await;
    let (stale, _stale_rx) = mpsc::unbounded_channel();
    let m = ConnectionManager::new(directory.clone(), pki.dialer(), manager_config(), stale);

    m.start(0, 10);
    wait_until("both connected with epoch 10", || all_connected(&m, 2, 10)).await;

    // Re-claimed with a new epoch: the hello is re-sent on the live connections.
    m.start(0, 11);
    wait_until("both re-hello'd with epoch 11", || all_connected(&m, 2, 11)).await;
    assert_eq!(
        server.open.load(Ordering::SeqCst),
        2,
        "no redial for a new epoch"
    );
    let mut with_11: Vec<String> = server
        .hellos()
        .into_iter()
        .filter(|h| h.epoch == 11)
        .map(|h| h.terminal)
        .collect();
    with_11.sort();
    assert_eq!(with_11, ["pos-1", "pos-2"]);

    // Suspended: connections stay, nothing is delivered, nothing is dialed.
    m.suspend(0, 11);
    let view = m.shard(0).unwrap();
    assert_eq!(view.delivery, crate::pos::Delivery::Holding);
    assert_eq!(view.links.len(), 2);

    // A directory change is picked up by the poller: one added, one removed. While the
    // shard holds, the new terminal is known but not dialed.
    directory
        .upsert(1, &[server.terminal("pos-3", "pos-1.test")])
        .await
        .unwrap();
    directory.remove(1, &["pos-1".to_string()]).await.unwrap();
    wait_until("pos-3 known, not dialed while holding", || {
        m.shard(0).is_some_and(|v| {
            v.links.keys().map(String::as_str).eq(["pos-2", "pos-3"])
                && v.links["pos-3"] == LinkState::Disconnected
        })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        m.shard(0).unwrap().links["pos-3"],
        LinkState::Disconnected,
        "a holding shard dials nothing"
    );
    // Delivering again (the same epoch): the new terminal is dialed.
    m.start(0, 11);
    wait_until("pos-3 in, pos-1 out", || {
        m.shard(0).is_some_and(|v| {
            v.links.keys().map(String::as_str).eq(["pos-2", "pos-3"])
                && v.links
                    .values()
                    .all(|s| *s == LinkState::Connected { epoch: 11 })
        })
    })
    .await;
    wait_until("pos-1's connection closed", || {
        server.open.load(Ordering::SeqCst) == 2
    })
    .await;

    // Stop resolves only after every session closed (GOAWAY).
    m.stop(stop(0, 11, StopReason::Rebalance, Close::Now)).await;
    assert!(m.shard(0).is_none());
    wait_until("server sees every connection end", || {
        server.open.load(Ordering::SeqCst) == 0
    })
    .await;
}

#[tokio::test]
async fn manager_reports_stale_epochs() {
    let pki = Pki::new();
    let (server, directory) = farm(&pki, &["pos-1"]).await;
    *server.highest.lock().unwrap() = 1000;
    let (stale, mut stale_rx) = mpsc::unbounded_channel();
    let m = ConnectionManager::new(directory, pki.dialer(), manager_config(), stale);
    m.start(0, 5);
    let reported = tokio::time::timeout(LIMIT, stale_rx.recv()).await.unwrap();
    let refused = StaleEpoch {
        shard: 0,
        epoch: 5,
        highest: Some(1000),
    };
    assert_eq!(reported, Some(refused));
    let state = m.shard(0).unwrap().links["pos-1"];
    assert!(
        !matches!(state, LinkState::Connected { .. }),
        "a refused hello never counts as connected: {state:?}"
    );
    m.stop(stop(0, 5, StopReason::StaleEpoch, Close::Now)).await;
}

#[tokio::test]
async fn a_fence_no_store_can_pass_is_not_reported() {
    let pki = Pki::new();
    let (server, directory) = farm(&pki, &["pos-1"]).await;
    *server.highest.lock().unwrap() = MAX_EPOCH + 1;
    let (stale, mut stale_rx) = mpsc::unbounded_channel();
    let config = manager_config();
    let metrics = config.metrics.clone();
    let m = ConnectionManager::new(directory, pki.dialer(), config, stale);
    m.start(0, 5);
    let refused = || {
        metrics
            .dials
            .get_or_create(&[("result", "stale_epoch")])
            .get()
    };
    wait_until("the hello is refused", || refused() > 0).await;
    // Reported, it would stop the shard and every other terminal's session with it.
    let reported = tokio::time::timeout(Duration::from_millis(300), stale_rx.recv()).await;
    assert!(reported.is_err(), "{reported:?}");
    m.stop(stop(0, 5, StopReason::Shutdown, Close::Now)).await;
}

#[tokio::test]
async fn manager_redials_a_dead_connection() {
    let pki = Pki::new();
    let (server, frozen, directory) = behind_a_freezable_proxy(&pki).await;
    let dialer = pki.dialer_with(Keepalive {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(100),
    });
    let (stale, _stale_rx) = mpsc::unbounded_channel();
    let m = ConnectionManager::new(directory, dialer, manager_config(), stale);
    m.start(0, 7);
    wait_until("connected", || all_connected(&m, 1, 7)).await;
    frozen.store(true, Ordering::SeqCst);
    wait_until("keep-alive notices the freeze", || !all_connected(&m, 1, 7)).await;
    frozen.store(false, Ordering::SeqCst);
    wait_until("redialed", || all_connected(&m, 1, 7)).await;
    assert_eq!(server.hellos().len(), 2, "one hello per connection");
    m.stop(stop(0, 7, StopReason::Shutdown, Close::Now)).await;
}

#[tokio::test]
async fn stop_does_not_wait_for_a_frozen_terminal() {
    let pki = Pki::new();
    // Kept alive to the end: the proxy forwards to it.
    let (_server, frozen, directory) = behind_a_freezable_proxy(&pki).await;
    let (stale, _stale_rx) = mpsc::unbounded_channel();
    let config = ManagerConfig {
        close_budget: Duration::from_millis(200),
        ..manager_config()
    };
    let m = ConnectionManager::new(directory, pki.dialer(), config, stale);
    m.start(0, 3);
    wait_until("connected", || all_connected(&m, 1, 3)).await;
    // The terminal never sees the GOAWAY, and keep-alive (10 s) would notice much
    // later; stop must still resolve (closing our side is what the lease needs).
    frozen.store(true, Ordering::SeqCst);
    tokio::time::timeout(LIMIT, m.stop(stop(0, 3, StopReason::Expired, Close::Now)))
        .await
        .expect("stop resolves after the close budget");
    assert!(m.shard(0).is_none());
}

#[tokio::test]
async fn stop_closes_idle_sessions_without_waiting_out_the_budget() {
    let pki = Pki::new();
    let (server, directory) = farm(&pki, &["pos-1", "pos-2", "pos-3"]).await;
    let (stale, _stale_rx) = mpsc::unbounded_channel();
    // A budget far beyond LIMIT: a stop that had to wait it out fails the timeout below.
    let config = ManagerConfig {
        close_budget: LIMIT * 10,
        ..manager_config()
    };
    let m = ConnectionManager::new(directory, pki.dialer(), config, stale);
    m.start(0, 4);
    wait_until("connected", || all_connected(&m, 3, 4)).await;
    // Idle sessions have nothing in flight: GOAWAY closes them at once, as long as no
    // request handle is left behind (the one published for pushes included).
    tokio::time::timeout(LIMIT, m.stop(stop(0, 4, StopReason::Rebalance, Close::Now)))
        .await
        .expect("idle sessions close gracefully, long before the close budget");
    wait_until("server sees every connection end", || {
        server.open.load(Ordering::SeqCst) == 0
    })
    .await;
}

/// A re-claim gives every session of a shard a new epoch at once; the hellos that follow
/// are paced (`--hello-rate`), and a terminal with a push waiting is served first. At 1
/// hello per second, when the waiting terminal's hello lands at most one other has been
/// sent; unpaced, all six would be out within milliseconds.
#[tokio::test]
async fn re_sent_hellos_are_paced_and_a_waiting_push_goes_first() {
    let pki = Pki::new();
    let ids = ["pos-1", "pos-2", "pos-3", "pos-4", "pos-5", "pos-6"];
    let (server, directory) = farm(&pki, &ids).await;
    let (stale, _stale_rx) = mpsc::unbounded_channel();
    let config = ManagerConfig {
        dial_rate: std::num::NonZeroU32::new(1000).unwrap(),
        hello_rate: std::num::NonZeroU32::MIN,
        ..manager_config()
    };
    let m = ConnectionManager::new(directory.clone(), pki.dialer(), config, stale);
    m.start(0, 10);
    wait_until("all connected with epoch 10", || all_connected(&m, 6, 10)).await;

    m.start(0, 11);
    let Lookup::Found(link) = m.lookup(0, "pos-6") else {
        panic!("pos-6 is in the shard");
    };
    let _waiting = link.wait(10).expect("room to wait");
    let re_sent = || {
        server
            .hellos()
            .into_iter()
            .filter(|h| h.epoch == 11)
            .map(|h| h.terminal)
            .collect::<Vec<_>>()
    };
    wait_until("pos-6 re-hello'd", || {
        re_sent().contains(&"pos-6".to_string())
    })
    .await;
    let first = re_sent();
    assert!(first.len() <= 2, "hellos not paced: {first:?}");
    wait_until("all re-hello'd with epoch 11", || all_connected(&m, 6, 11)).await;
    assert_eq!(
        server.open.load(Ordering::SeqCst),
        6,
        "no redial for a new epoch"
    );
}
