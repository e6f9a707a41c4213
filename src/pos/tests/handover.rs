//! A planned move per terminal between two managers over one fake terminal farm: the
//! old owner drains, the new one asks for each terminal before dialing it (`handover`,
//! `manager/drain.rs`), and the fallbacks when asking fails or nobody asks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::mpsc;

use super::fake::{wait_until, FakeTerminal, Pki, LIMIT};
use super::stop;
use crate::core::membership::{Member, HANDOVER_DRAIN, HANDOVER_RELAY};
use crate::core::reconciler::{Close, StopReason};
use crate::core::ShardId;
use crate::metrics::Metrics;
use crate::pos::handover::{Predecessor, ReleaseFailed, Released, WalkConfig};
use crate::pos::manager::{ConnectionManager, Lookup, ManagerConfig, TerminalLink};
use crate::pos::LinkState;
use crate::serving::ServingHook;
use crate::status::PodStatus;
use crate::store::directory::{DirectoryAdmin, MemoryDirectory, Terminal};

const TERMINALS: usize = 40;

/// Asks another manager in this process, recording every batch.
struct Local {
    from: Mutex<Option<ConnectionManager<MemoryDirectory>>>,
    batches: Mutex<Vec<Vec<String>>>,
    fail: bool,
    /// While set, the first ask is held until it is notified.
    hold_first: Option<Arc<tokio::sync::Notify>>,
}

impl Local {
    fn new(from: Option<ConnectionManager<MemoryDirectory>>, fail: bool) -> Arc<Local> {
        Arc::new(Local {
            from: Mutex::new(from),
            batches: Mutex::default(),
            fail,
            hold_first: None,
        })
    }

    /// Asks `from`, holding the first ask until the returned `Notify` is notified.
    fn holding_first(
        from: ConnectionManager<MemoryDirectory>,
    ) -> (Arc<Local>, Arc<tokio::sync::Notify>) {
        let hold = Arc::new(tokio::sync::Notify::new());
        let local = Arc::new(Local {
            from: Mutex::new(Some(from)),
            batches: Mutex::default(),
            fail: false,
            hold_first: Some(hold.clone()),
        });
        (local, hold)
    }
}

impl Predecessor for Local {
    fn release(
        &self,
        _from: &Member,
        shard: ShardId,
        terminals: Vec<String>,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<Released, ReleaseFailed>> {
        let first = {
            let mut batches = self.batches.lock().unwrap();
            batches.push(terminals.clone());
            batches.len() == 1
        };
        let from = self.from.lock().unwrap().clone();
        let fail = self.fail;
        let hold = self.hold_first.clone().filter(|_| first);
        async move {
            if let Some(hold) = hold {
                hold.notified().await;
            }
            match from {
                _ if fail => Err(ReleaseFailed("unreachable".into())),
                Some(m) => Ok(m.release_terminals(shard, terminals).await),
                None => Ok(Released::NotDraining),
            }
        }
        .boxed()
    }

    fn announce(
        &self,
        _to: &Member,
        _shard: ShardId,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<(), ReleaseFailed>> {
        let told = if self.fail {
            Err(ReleaseFailed("unreachable".into()))
        } else {
            Ok(())
        };
        std::future::ready(told).boxed()
    }
}

/// A status naming this pod, with no other member to announce a drain to.
fn alone() -> tokio::sync::watch::Receiver<PodStatus> {
    let status = PodStatus {
        pod: Some(crate::core::testing::pod("pod-a")),
        ..PodStatus::default()
    };
    tokio::sync::watch::channel(status).1
}

fn config(predecessor: Arc<Local>, metrics: Arc<Metrics>, drain: Duration) -> ManagerConfig {
    ManagerConfig {
        directory_poll: Duration::from_millis(100),
        rng_seed: Some(1),
        walk: Some(WalkConfig::new(
            predecessor,
            alone(),
            200,
            Duration::from_secs(1),
        )),
        drain_budget: drain,
        metrics,
        ..ManagerConfig::default()
    }
}

fn member_a() -> Member {
    Member {
        handover: HANDOVER_DRAIN,
        queue: 0,
        batch: 0,
        ..crate::core::testing::member("pod-a")
    }
}

async fn farm(pki: &Pki) -> (FakeTerminal, Arc<MemoryDirectory>, Vec<String>) {
    let server = FakeTerminal::spawn(pki.server("pos-1.test", &[b"h2"])).await;
    let directory = Arc::new(MemoryDirectory::new());
    let ids: Vec<String> = (0..TERMINALS).map(|i| format!("t-{i:02}")).collect();
    let terminals: Vec<Terminal> = ids
        .iter()
        .map(|id| server.terminal(id, "pos-1.test"))
        .collect();
    directory.upsert(1, &terminals).await.unwrap();
    (server, directory, ids)
}

fn connected(m: &ConnectionManager<MemoryDirectory>, epoch: u64) -> bool {
    m.shard(0).is_some_and(|v| {
        v.links.len() == TERMINALS
            && v.links
                .values()
                .all(|s| *s == LinkState::Connected { epoch })
    })
}

fn count(metrics: &Metrics, outcome: &'static str) -> u64 {
    metrics
        .handover_releases
        .get_or_create(&[("outcome", outcome)])
        .get()
}

/// A manager asking `predecessor`, counting in `metrics`, draining for `drain`.
fn manager(
    pki: &Pki,
    directory: &Arc<MemoryDirectory>,
    predecessor: Arc<Local>,
    metrics: Arc<Metrics>,
    drain: Duration,
) -> ConnectionManager<MemoryDirectory> {
    let (stale, _) = mpsc::unbounded_channel();
    let cfg = config(predecessor, metrics, drain);
    ConnectionManager::new(directory.clone(), pki.dialer(), cfg, stale)
}

fn walking(
    pki: &Pki,
    directory: &Arc<MemoryDirectory>,
    predecessor: Arc<Local>,
    drain: Duration,
) -> ConnectionManager<MemoryDirectory> {
    manager(pki, directory, predecessor, Arc::new(Metrics::new()), drain)
}

/// Manager A serving shard 0 with epoch 5, every terminal connected; its own
/// predecessor asks nobody until [`Local::from`] is set.
async fn serving_a_with(
    pki: &Pki,
    directory: &Arc<MemoryDirectory>,
    drain: Duration,
) -> (ConnectionManager<MemoryDirectory>, Arc<Metrics>, Arc<Local>) {
    let metrics = Arc::new(Metrics::new());
    let asks = Local::new(None, false);
    let a = manager(pki, directory, asks.clone(), metrics.clone(), drain);
    a.start(0, 5);
    wait_until("A connected", || connected(&a, 5)).await;
    (a, metrics, asks)
}

async fn serving_a(
    pki: &Pki,
    directory: &Arc<MemoryDirectory>,
    drain: Duration,
) -> (ConnectionManager<MemoryDirectory>, Arc<Metrics>) {
    let (a, metrics, _) = serving_a_with(pki, directory, drain).await;
    (a, metrics)
}

#[tokio::test]
async fn the_new_owner_dials_each_terminal_only_after_the_old_one_closed_it() {
    let pki = Pki::new();
    let (server, directory, ids) = farm(&pki).await;
    let (a, a_metrics) = serving_a(&pki, &directory, LIMIT).await;
    assert_eq!(a.handover(), HANDOVER_RELAY);

    // A drains: the stop resolves, nothing is served, every session stays open.
    tokio::time::timeout(
        LIMIT,
        a.stop(stop(0, 5, StopReason::Rebalance, Close::Drain)),
    )
    .await
    .expect("a drain is acknowledged without waiting for the terminals");
    assert!(a.shard(0).is_none());
    assert!(matches!(a.lookup(0, "t-00"), Lookup::NotServed));
    assert_eq!(
        server.open.load(std::sync::atomic::Ordering::SeqCst),
        TERMINALS
    );
    assert_eq!(a_metrics.draining_sessions.get(), TERMINALS as i64);

    // B takes the shard over from A and walks it.
    let local = Local::new(Some(a.clone()), false);
    let b_metrics = Arc::new(Metrics::new());
    let b = manager(&pki, &directory, local.clone(), b_metrics.clone(), LIMIT);
    b.taken_over(0, 6, &member_a());
    b.start(0, 6);
    wait_until("B connected", || connected(&b, 6)).await;
    tokio::time::timeout(LIMIT, a.drained())
        .await
        .expect("A's drain ended: every terminal was asked for");

    // No terminal ever had two connections: A closed each before B dialed it.
    assert_eq!(
        server.most_at_once(),
        1,
        "a terminal had two sessions at once"
    );
    assert_eq!(
        server.open.load(std::sync::atomic::Ordering::SeqCst),
        TERMINALS
    );
    let batches = local.batches.lock().unwrap().clone();
    let mut asked: Vec<String> = batches.iter().flatten().cloned().collect();
    asked.sort();
    assert_eq!(asked, ids, "each terminal asked for exactly once");
    // The walk window (200 dials/s / 15) bounds each batch.
    assert!(batches.iter().all(|b| b.len() <= 13), "{batches:?}");
    assert!(batches.len() >= TERMINALS.div_ceil(13));
    assert_eq!(count(&b_metrics, "released"), batches.len() as u64);
    assert_eq!(count(&b_metrics, "failed"), 0);
    assert_eq!(b_metrics.handover_waiting.get(), 0);
    assert_eq!(a_metrics.draining_sessions.get(), 0);
    let ended = |how| a_metrics.drains_ended.get_or_create(&[("how", how)]).get();
    assert_eq!(ended("released"), 1);
    // Every terminal took B's hello after A's.
    let hellos = server.hellos();
    for id in &ids {
        let epochs: Vec<u64> = hellos
            .iter()
            .filter(|h| &h.terminal == id)
            .map(|h| h.epoch)
            .collect();
        assert_eq!(epochs, [5, 6], "{id}");
    }
    b.stop(stop(0, 6, StopReason::Shutdown, Close::Now)).await;
}

/// Until the new owner asked for a terminal, a push for it is relayed to the old owner's
/// draining session (`HANDOVER_RELAY`): B's link names A while it waits at its gate, A
/// finds the session with its own epoch, and neither does once the terminal moved.
#[tokio::test]
async fn a_terminal_not_yet_asked_for_is_reached_through_the_old_owners_session() {
    let pki = Pki::new();
    let (_server, directory, ids) = farm(&pki).await;
    let (a, _) = serving_a(&pki, &directory, LIMIT).await;
    a.stop(stop(0, 5, StopReason::Rebalance, Close::Drain))
        .await;
    let session = a.draining_session(0, &ids[0]).expect("a draining session");
    assert_eq!(session.epoch, 5);
    drop(session);

    let relaying = Member {
        handover: HANDOVER_RELAY,
        ..member_a()
    };
    let (b, hold, link) =
        gated_successor(&pki, &directory, &a, &relaying, &ids[TERMINALS - 1]).await;
    let via = link.draining_at().map(|m| m.pod.clone());
    assert_eq!(via, Some(relaying.pod.clone()));
    hold.notify_one();
    wait_until("B connected", || connected(&b, 6)).await;
    assert!(link.draining_at().is_none(), "B has its own session now");
    assert!(a.draining_session(0, &ids[0]).is_none(), "A released it");
    b.stop(stop(0, 6, StopReason::Shutdown, Close::Now)).await;
}

/// A predecessor of an earlier release (`handover` below 3) is never relayed through.
#[tokio::test]
async fn a_predecessor_that_does_not_relay_is_not_named() {
    let pki = Pki::new();
    let (_server, directory, ids) = farm(&pki).await;
    let (a, _) = serving_a(&pki, &directory, LIMIT).await;
    a.stop(stop(0, 5, StopReason::Rebalance, Close::Drain))
        .await;
    let (b, hold, link) = gated_successor(&pki, &directory, &a, &member_a(), &ids[0]).await;
    assert!(link.draining_at().is_none());
    hold.notify_one();
    wait_until("B connected", || connected(&b, 6)).await;
    b.stop(stop(0, 6, StopReason::Shutdown, Close::Now)).await;
}

/// B taking shard 0 over (epoch 6) from the drained `a`, announced as `from`, its first
/// ask held until the returned `Notify` is notified: every link waits at its gate
/// meanwhile. B, the hold, and B's link to `id`.
async fn gated_successor(
    pki: &Pki,
    directory: &Arc<MemoryDirectory>,
    a: &ConnectionManager<MemoryDirectory>,
    from: &Member,
    id: &str,
) -> (
    ConnectionManager<MemoryDirectory>,
    Arc<tokio::sync::Notify>,
    TerminalLink,
) {
    let (local, hold) = Local::holding_first(a.clone());
    let b = manager(pki, directory, local, Arc::new(Metrics::new()), LIMIT);
    b.taken_over(0, 6, from);
    b.start(0, 6);
    let loaded = || b.shard(0).is_some_and(|v| v.links.len() == TERMINALS);
    wait_until("B's links", loaded).await;
    let Lookup::Found(link) = b.lookup(0, id) else {
        panic!("B has the terminal's link");
    };
    (b, hold, link)
}

#[tokio::test]
async fn an_unreachable_predecessor_falls_back_to_dialing_and_the_drain_budget_closes() {
    let pki = Pki::new();
    let (server, directory, _ids) = farm(&pki).await;
    let (a, a_metrics) = serving_a(&pki, &directory, Duration::from_millis(300)).await;
    a.stop(stop(0, 5, StopReason::Rebalance, Close::Drain))
        .await;

    // B cannot reach A: after the first failed ask it dials the whole shard.
    let local = Local::new(Some(a.clone()), true);
    let b_metrics = Arc::new(Metrics::new());
    let b = manager(&pki, &directory, local.clone(), b_metrics.clone(), LIMIT);
    b.taken_over(0, 6, &member_a());
    b.start(0, 6);
    wait_until("B connected", || connected(&b, 6)).await;
    assert_eq!(
        local.batches.lock().unwrap().len(),
        1,
        "asked once, then fell back"
    );
    assert_eq!(count(&b_metrics, "failed"), 1);

    // Nobody asked A: its drain budget closes what it kept.
    tokio::time::timeout(LIMIT, a.drained())
        .await
        .expect("drain budget");
    let ended = |how| a_metrics.drains_ended.get_or_create(&[("how", how)]).get();
    assert_eq!(ended("budget"), 1);
    assert_eq!(a_metrics.draining_sessions.get(), 0);
    wait_until("only B's sessions left", || {
        server.open.load(std::sync::atomic::Ordering::SeqCst) == TERMINALS
    })
    .await;
    b.stop(stop(0, 6, StopReason::Shutdown, Close::Now)).await;
}

#[tokio::test]
async fn a_drain_waits_for_the_push_being_sent_and_a_shard_taken_back_resumes() {
    let pki = Pki::new();
    let (server, directory, _ids) = farm(&pki).await;
    let (a, a_metrics) = serving_a(&pki, &directory, LIMIT).await;
    let Lookup::Found(link) = a.lookup(0, "t-00") else {
        panic!("t-00 is served")
    };
    let sending = link.sending();
    let mut stopped = a
        .stop(stop(0, 5, StopReason::Rebalance, Close::Drain))
        .boxed();
    let early = tokio::time::timeout(Duration::from_millis(200), &mut stopped).await;
    assert!(early.is_err(), "acknowledged while a push was being sent");
    drop(sending);
    tokio::time::timeout(LIMIT, stopped)
        .await
        .expect("acknowledged once the push ended");

    // Handed back before anyone asked: the same sessions say hello with the new epoch.
    a.start(0, 7);
    wait_until("A serves again with epoch 7", || connected(&a, 7)).await;
    assert_eq!(
        server.open.load(std::sync::atomic::Ordering::SeqCst),
        TERMINALS
    );
    assert_eq!(server.most_at_once(), 1);
    let ended = |how| a_metrics.drains_ended.get_or_create(&[("how", how)]).get();
    assert_eq!(ended("resumed"), 1);
    assert_eq!(a_metrics.draining_sessions.get(), 0);
    tokio::time::timeout(LIMIT, a.drained()).await.unwrap();
    a.stop(stop(0, 7, StopReason::Shutdown, Close::Now)).await;
}

#[tokio::test]
async fn a_push_waiting_for_a_terminal_makes_it_the_next_one_asked_for() {
    let pki = Pki::new();
    let (server, directory, ids) = farm(&pki).await;
    let (a, _) = serving_a(&pki, &directory, LIMIT).await;
    a.stop(stop(0, 5, StopReason::Rebalance, Close::Drain))
        .await;

    let (local, hold) = Local::holding_first(a.clone());
    let b = walking(&pki, &directory, local.clone(), LIMIT);
    b.taken_over(0, 6, &member_a());
    b.start(0, 6);
    // The first ask is out (and held); the last terminal in directory order is far
    // behind it in the queue, until a push starts waiting for it.
    wait_until("the first ask", || local.batches.lock().unwrap().len() == 1).await;
    let last = ids.last().unwrap().clone();
    assert!(!local.batches.lock().unwrap()[0].contains(&last));
    let link = loop {
        if let Lookup::Found(link) = b.lookup(0, &last) {
            break link;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let waiting = link.wait(8).expect("admitted");
    tokio::time::sleep(Duration::from_millis(50)).await;
    hold.notify_one();
    wait_until("the second ask", || {
        local.batches.lock().unwrap().len() >= 2
    })
    .await;
    let second = local.batches.lock().unwrap()[1].clone();
    assert_eq!(second.first(), Some(&last), "{second:?}");
    drop(waiting);
    wait_until("B connected", || connected(&b, 6)).await;
    assert_eq!(server.most_at_once(), 1);
    b.stop(stop(0, 6, StopReason::Shutdown, Close::Now)).await;
}

fn member(name: &str) -> Member {
    Member {
        handover: HANDOVER_DRAIN,
        queue: 0,
        batch: 0,
        ..crate::core::testing::member(name)
    }
}

#[tokio::test]
async fn a_shard_handed_on_mid_walk_passes_the_releases_back_to_the_first_owner() {
    let pki = Pki::new();
    let (server, directory, _ids) = farm(&pki).await;
    let (a, _) = serving_a(&pki, &directory, LIMIT).await;
    a.stop(stop(0, 5, StopReason::Rebalance, Close::Drain))
        .await;

    // B's first ask to A hangs: B has dialed nothing when it hands the shard on to C.
    let (to_a, _hold) = Local::holding_first(a.clone());
    let b = walking(&pki, &directory, to_a.clone(), LIMIT);
    b.taken_over(0, 6, &member_a());
    b.start(0, 6);
    wait_until("B asked A", || to_a.batches.lock().unwrap().len() == 1).await;
    b.stop(stop(0, 6, StopReason::Rebalance, Close::Drain))
        .await;

    // C asks B, which passes each release on to A before it answers.
    let c = walking(&pki, &directory, Local::new(Some(b.clone()), false), LIMIT);
    c.taken_over(0, 7, &member("pod-b"));
    c.start(0, 7);
    wait_until("C connected", || connected(&c, 7)).await;
    assert_eq!(server.most_at_once(), 1, "C dialed a terminal A still had");
    tokio::time::timeout(LIMIT, a.drained())
        .await
        .expect("A released everything");
    c.stop(stop(0, 7, StopReason::Shutdown, Close::Now)).await;
}

#[tokio::test]
async fn a_shard_taken_back_mid_handover_walks_the_terminals_it_gave_away() {
    let pki = Pki::new();
    let (server, directory, _ids) = farm(&pki).await;
    let (a, _, a_asks) = serving_a_with(&pki, &directory, LIMIT).await;
    a.stop(stop(0, 5, StopReason::Rebalance, Close::Drain))
        .await;

    // B takes some terminals over, then the shard goes back to A.
    let to_a = Local::new(Some(a.clone()), false);
    // The terminals B never reached stay in its drain until the budget: A, taking the
    // shard back, asks only for those it gave away.
    let b = walking(&pki, &directory, to_a.clone(), Duration::from_millis(500));
    b.taken_over(0, 6, &member_a());
    b.start(0, 6);
    wait_until("B connected some", || {
        b.shard(0).is_some_and(|v| {
            v.links
                .values()
                .any(|s| *s == LinkState::Connected { epoch: 6 })
        })
    })
    .await;
    b.stop(stop(0, 6, StopReason::Rebalance, Close::Drain))
        .await;
    *a_asks.from.lock().unwrap() = Some(b.clone());
    a.taken_over(0, 7, &member("pod-b"));
    a.start(0, 7);
    wait_until("A serves every terminal again", || connected(&a, 7)).await;
    assert_eq!(
        server.most_at_once(),
        1,
        "A dialed a terminal B still had: {:?}",
        server.hellos()
    );
    tokio::time::timeout(LIMIT, b.drained())
        .await
        .expect("B released everything");
    a.stop(stop(0, 7, StopReason::Shutdown, Close::Now)).await;
}

#[tokio::test]
async fn a_drain_no_member_could_be_told_of_closes_the_shard_before_release() {
    let pki = Pki::new();
    let (server, directory, _ids) = farm(&pki).await;
    let metrics = Arc::new(Metrics::new());
    let status = PodStatus {
        pod: Some(crate::core::testing::pod("pod-a")),
        members: vec![member_a(), member("pod-b")],
        ..PodStatus::default()
    };
    let cfg = ManagerConfig {
        walk: Some(WalkConfig::new(
            Local::new(None, true),
            tokio::sync::watch::channel(status).1,
            200,
            Duration::from_secs(1),
        )),
        ..config(Local::new(None, false), metrics.clone(), LIMIT)
    };
    let (stale, _) = mpsc::unbounded_channel();
    let a = ConnectionManager::new(directory.clone(), pki.dialer(), cfg, stale);
    a.start(0, 5);
    wait_until("A connected", || connected(&a, 5)).await;
    // pod-b cannot be told: whoever takes the shard might not ask, so it closes now.
    a.stop(stop(0, 5, StopReason::Rebalance, Close::Drain))
        .await;
    assert_eq!(server.open.load(std::sync::atomic::Ordering::SeqCst), 0);
    let ended = metrics
        .drains_ended
        .get_or_create(&[("how", "unannounced")])
        .get();
    assert_eq!(ended, 1);
    assert_eq!(metrics.draining_sessions.get(), 0);
    tokio::time::timeout(LIMIT, a.drained()).await.unwrap();
}
