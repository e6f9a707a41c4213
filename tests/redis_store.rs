//! `RedisStore` against a real `redis-server`: the rules that depend on Redis itself
//! (epochs across a restart, owner checks in Lua, pub/sub, timeouts, auth, URLs), and a
//! lazily connected store that starts before Redis does.
//!
//! `rediss://` is only exercised here up to the TLS handshake (against a plain server,
//! which must fail cleanly); `redis_tls.rs` runs it against a TLS server.

use crate::support::leases::Deletes;
use std::time::{Duration, Instant};

use crate::support::leases;
use crate::support::redis_server::free_port;
use crate::support::stall_proxy::StallProxy;
use crate::support::{RedisProxy, RedisServer};
use posgate::core::lease::{AcquireOutcome, Checked, RenewOutcome};
use posgate::core::{Epoch, PodId};
use posgate::store::keys::Keys;
use posgate::store::redis::{RedisOptions, RedisStore, REBUILD_AFTER_TIMEOUTS};
use posgate::store::{CoordStore, StoreError};

const TTL: Duration = Duration::from_secs(30);
const FAST: RedisOptions = RedisOptions {
    response_timeout: Duration::from_millis(300),
    connect_timeout: Duration::from_millis(300),
    ca_file: None,
    client_cert: None,
    sentinel_password: None,
    wait: None,
};

fn pod(id: &str) -> PodId {
    PodId::new(id).unwrap()
}

async fn connect(url: &str) -> RedisStore {
    RedisStore::connect(url, "test", RedisOptions::default())
        .await
        .expect("connect")
}

async fn generation(store: &RedisStore) -> String {
    store.snapshot(4).await.expect("snapshot").generation.id
}

fn acquired(c: Checked<Vec<AcquireOutcome>>) -> Vec<Epoch> {
    match c {
        Checked::Ok(outs) => outs
            .into_iter()
            .map(|o| match o {
                AcquireOutcome::Acquired { epoch, .. } => epoch,
                other => panic!("expected Acquired, got {other:?}"),
            })
            .collect(),
        other => panic!("expected Ok, got {other:?}"),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Retries `snapshot` until the store answers (after a restart or a heal).
async fn until_ok(store: &RedisStore, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        match store.snapshot(4).await {
            Ok(snap) => return snap.generation.id,
            Err(e) => assert!(Instant::now() < deadline, "store did not recover: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A store with the [`FAST`] timeouts on `url` (a proxy's), once a call succeeds.
async fn answering(url: &str) -> RedisStore {
    let store = RedisStore::connect(url, "test", FAST)
        .await
        .expect("connect");
    until_ok(&store, Duration::from_secs(2)).await;
    store
}

#[tokio::test]
async fn epochs_never_decrease_across_restart_empty() {
    let mut server = RedisServer::start();
    let store = connect(&server.url()).await;
    let a = pod("a");
    let g = generation(&store).await;
    let before = acquired(
        leases::acquire(&store, &g, &a, &[0, 1, 2, 3], TTL)
            .await
            .unwrap(),
    );
    server.restart_empty();
    let g2 = until_ok(&store, Duration::from_secs(10)).await;
    assert_ne!(g, g2, "a restart without data must start a new generation");
    // The old generation is refused and nothing is written.
    assert!(
        matches!(leases::acquire(&store, &g, &a, &[0], TTL).await.unwrap(), Checked::GenerationChanged(info) if info.id == g2)
    );
    let after = acquired(
        leases::acquire(&store, &g2, &a, &[0, 1, 2, 3], TTL)
            .await
            .unwrap(),
    );
    for (b, a) in before.iter().zip(&after) {
        assert!(a > b, "epoch went from {b} to {a} across the restart");
    }
}

#[tokio::test]
async fn epoch_is_max_of_last_plus_one_and_redis_time() {
    let server = RedisServer::start();
    let store = connect(&server.url()).await;
    let g = generation(&store).await;
    let far = now_ms() + 1_000_000_000;
    let field = far.to_string();
    assert_eq!(
        server.command(&["HSET", &store.keys().epochs(), "2", &field]),
        ":1"
    );
    let t0 = now_ms();
    let epochs = acquired(
        leases::acquire(&store, &g, &pod("a"), &[2, 3], TTL)
            .await
            .unwrap(),
    );
    assert_eq!(epochs[0], far + 1, "last + 1 wins when it is larger");
    assert!(
        epochs[1] >= t0.saturating_sub(5) && epochs[1] <= now_ms() + 5,
        "time wins: {} vs {t0}",
        epochs[1]
    );
}

#[tokio::test]
async fn owner_checks_on_renew_and_release() {
    let server = RedisServer::start();
    let store = connect(&server.url()).await;
    let (a, b) = (pod("a"), pod("b"));
    let g = generation(&store).await;
    let epoch = acquired(leases::acquire(&store, &g, &a, &[1], TTL).await.unwrap())[0];
    assert_eq!(
        leases::renew(&store, &g, &b, &[1], TTL).await.unwrap(),
        Checked::Ok(vec![RenewOutcome::HeldBy {
            owner: a.clone(),
            epoch
        }])
    );
    assert_eq!(
        leases::acquire(&store, &g, &b, &[1], TTL).await.unwrap(),
        Checked::Ok(vec![AcquireOutcome::HeldBy {
            owner: a.clone(),
            epoch
        }])
    );
    assert_eq!(store.delete(&b, &[1], None).await.unwrap(), vec![false]);
    let snap = store.snapshot(4).await.unwrap();
    assert_eq!(
        snap.leases[1].as_ref().map(|l| (&l.owner, l.epoch)),
        Some((&a, epoch))
    );
    assert_eq!(
        leases::renew(&store, &g, &a, &[1], TTL).await.unwrap(),
        Checked::Ok(vec![RenewOutcome::Renewed])
    );
}

#[tokio::test]
async fn release_is_seen_on_changes_within_a_second() {
    let server = RedisServer::start();
    let owner = connect(&server.url()).await;
    let peer = connect(&server.url()).await;
    let a = pod("a");
    let g = generation(&owner).await;
    acquired(leases::acquire(&owner, &g, &a, &[0], TTL).await.unwrap());
    let mut rx = peer.changes();
    rx.borrow_and_update();
    let sent = Instant::now();
    assert_eq!(owner.delete(&a, &[0], None).await.unwrap(), vec![true]);
    tokio::time::timeout(Duration::from_secs(1), rx.changed())
        .await
        .expect("no change within 1 s")
        .unwrap();
    eprintln!("release seen after {:?}", sent.elapsed());
}

#[tokio::test]
async fn changes_resubscribe_after_restart() {
    let mut server = RedisServer::start();
    let store = connect(&server.url()).await;
    let mut rx = store.changes();
    rx.borrow_and_update();
    server.restart_empty();
    // The resubscription itself bumps the counter (messages may have been missed).
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .expect("no bump after resubscribing")
        .unwrap();
    let g = until_ok(&store, Duration::from_secs(5)).await;
    a_release_is_seen(&store, &g, &mut rx, "after resubscribing").await;
}

#[tokio::test]
async fn round_trips_count_one_per_call() {
    let server = RedisServer::start();
    let store = connect(&server.url()).await;
    let start = store.round_trips();
    let g = generation(&store).await;
    leases::acquire(&store, &g, &pod("a"), &[0, 1, 2], TTL)
        .await
        .unwrap();
    store.delete(&pod("a"), &[0, 1, 2], None).await.unwrap();
    assert_eq!(store.round_trips() - start, 3);
}

#[tokio::test]
async fn cut_network_fails_within_the_response_timeout_and_recovers() {
    let server = RedisServer::start();
    let proxy = RedisProxy::start(server.addr()).await.unwrap();
    let store = answering(&proxy.url()).await;
    proxy.cut();
    fails_fast(&store, 5, "a cut network must fail").await;
    proxy.restore();
    until_ok(&store, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn stalled_connection_is_replaced() {
    let server = RedisServer::start();
    let proxy = StallProxy::start(server.addr()).await;
    let store = answering(&proxy.redis_url()).await;
    // The socket stays open and ACKed but never answers: only a rebuild helps.
    proxy.stall();
    let mut timeouts = 0;
    for _ in 0..REBUILD_AFTER_TIMEOUTS + 3 {
        match store.snapshot(4).await {
            Ok(_) => break,
            Err(StoreError::Timeout(_)) => timeouts += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(
        timeouts, REBUILD_AFTER_TIMEOUTS,
        "the connection must be rebuilt after {REBUILD_AFTER_TIMEOUTS} timeouts"
    );
    store
        .snapshot(4)
        .await
        .expect("the rebuilt connection works");
}

#[tokio::test]
async fn unreachable_at_connect_is_a_clear_error() {
    let server = RedisServer::start();
    let proxy = RedisProxy::start(server.addr()).await.unwrap();
    proxy.cut();
    let t = Instant::now();
    let err = RedisStore::connect(&proxy.url(), "test", FAST)
        .await
        .expect_err("must not connect");
    assert!(
        matches!(err, StoreError::Timeout(_) | StoreError::Unavailable(_)),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    let port = free_port();
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}/"), "test", FAST)
        .await
        .expect_err("nothing listens");
    assert!(err.to_string().contains("cannot connect"), "{err}");
}

#[tokio::test]
async fn password_and_acl_user_urls() {
    let server = RedisServer::start_with(&[
        "--requirepass",
        "s3cret",
        "--user",
        "alice",
        "on",
        ">alice-pw",
        "~*",
        "&*",
        "+@all",
    ]);
    let base = format!("127.0.0.1:{}", server.port());
    let store = connect(&format!("redis://:s3cret@{base}/")).await;
    generation(&store).await;
    let alice = connect(&format!("redis://alice:alice-pw@{base}/3")).await;
    generation(&alice).await;
    for url in [
        format!("redis://:wrong-pw@{base}/"),
        format!("redis://alice:wrong-pw@{base}/"),
        format!("redis://{base}/"),
    ] {
        let err = RedisStore::connect(&url, "test", FAST)
            .await
            .expect_err("bad credentials must fail");
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Unavailable(_)), "{msg}");
        assert!(
            msg.contains("cannot connect") && !msg.contains("wrong-pw"),
            "{msg}"
        );
        eprintln!("{msg}");
    }
}

#[tokio::test]
async fn bad_urls_and_names_are_clear_errors() {
    let server = RedisServer::start();
    for url in [
        "http://127.0.0.1:6379",
        "",
        "redis://",
        "redis://u:topsecret@127.0.0.1:notaport/",
        "redis://127.0.0.1:6379/notadb",
    ] {
        let err = RedisStore::connect(url, "test", FAST).await.expect_err(url);
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Config(_)), "{url}: {msg}");
        assert!(
            msg.contains("Redis") && !msg.contains("topsecret"),
            "{url}: {msg}"
        );
        let lazy = RedisStore::connect_lazy(url, "test", FAST).expect_err(url);
        assert!(matches!(lazy, StoreError::Config(_)), "{url}: {lazy}");
    }
    let err = RedisStore::connect(&server.url(), "bad{name}", FAST)
        .await
        .expect_err("bad cluster name");
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    assert!(err.to_string().contains("cluster name"), "{err}");
    let lazy = RedisStore::connect_lazy(&server.url(), "bad{name}", FAST).expect_err("bad name");
    assert!(matches!(lazy, StoreError::Config(_)), "{lazy}");
    // rediss:// against a plain server: the TLS handshake fails, cleanly.
    let tls = format!("rediss://127.0.0.1:{}/", server.port());
    let err = RedisStore::connect(&tls, "test", FAST)
        .await
        .expect_err("no TLS on this server");
    assert!(err.to_string().contains("cannot connect"), "{err}");
    eprintln!("rediss to a plain server: {err}");
}

#[tokio::test]
async fn lazy_store_starts_before_redis_and_catches_up() {
    let port = free_port();
    let store = RedisStore::connect_lazy(&format!("redis://127.0.0.1:{port}/"), "test", FAST)
        .expect("starting must not need Redis");
    let mut rx = store.changes();
    rx.borrow_and_update();
    fails_fast(&store, 3, "nothing listens yet").await;

    let _server = RedisServer::start_on(port);
    let g = until_ok(&store, Duration::from_secs(5)).await;
    // The background subscription bumps the counter once it is in place.
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .expect("no bump after the first subscription")
        .unwrap();
    a_release_is_seen(&store, &g, &mut rx, "after the first subscription").await;
}

/// `times` snapshots in a row fail as unreachable, each within the response timeout
/// (plus 300 ms of slack): `why` says why they must fail.
async fn fails_fast(store: &RedisStore, times: usize, why: &str) {
    for _ in 0..times {
        let t = Instant::now();
        let err = store.snapshot(4).await.expect_err(why);
        assert!(
            matches!(err, StoreError::Timeout(_) | StoreError::Unavailable(_)),
            "{err}"
        );
        assert!(
            t.elapsed() < FAST.response_timeout + Duration::from_millis(300),
            "took {:?}: {err}",
            t.elapsed()
        );
    }
}

/// A lease taken and released in generation `g` is seen on `rx` (the store's
/// `changes()`) within 1 s.
async fn a_release_is_seen(
    store: &RedisStore,
    g: &str,
    rx: &mut tokio::sync::watch::Receiver<u64>,
    when: &str,
) {
    let a = pod("a");
    acquired(leases::acquire(store, g, &a, &[0], TTL).await.unwrap());
    rx.borrow_and_update();
    store.delete(&a, &[0], None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), rx.changed())
        .await
        .unwrap_or_else(|_| panic!("a release not seen on changes() {when}"))
        .unwrap();
}

/// The poll answers only a digest while the view is unchanged (`snapshot.lua`): what the
/// pod rebuilds from the view it read last must be what Redis holds, through an
/// acquisition by another pod, a lease that expires and a different shard count.
#[tokio::test]
async fn a_poll_sees_every_change_to_the_view_it_read_last() {
    let server = RedisServer::start();
    let (poller, writer) = (connect(&server.url()).await, connect(&server.url()).await);
    let owners = |s: &posgate::core::membership::Snapshot| {
        s.leases
            .iter()
            .map(|l| l.as_ref().map(|l| (l.owner.to_string(), l.epoch)))
            .collect::<Vec<_>>()
    };
    let first = poller.snapshot(4).await.unwrap();
    assert_eq!(owners(&first), vec![None; 4]);
    let again = poller.snapshot(4).await.unwrap();
    assert_eq!(owners(&again), owners(&first));
    assert_eq!(again.members, first.members);

    let g = generation(&writer).await;
    let short = Duration::from_millis(300);
    let epoch = acquired(
        leases::acquire(&writer, &g, &pod("b"), &[2], short)
            .await
            .unwrap(),
    )[0];
    let held = poller.snapshot(4).await.unwrap();
    assert_eq!(
        owners(&held),
        vec![None, None, Some(("b".into(), epoch)), None]
    );
    assert_eq!(owners(&poller.snapshot(4).await.unwrap()), owners(&held));
    tokio::time::sleep(short * 2).await;
    assert_eq!(owners(&poller.snapshot(4).await.unwrap()), vec![None; 4]);
    // Another shard count is another view, never the one held for 4.
    assert_eq!(poller.snapshot(8).await.unwrap().leases.len(), 8);
    assert_eq!(poller.snapshot(4).await.unwrap().leases.len(), 4);
}

/// Pod leases (`lib.lua`): while every member reads them, a pod's leases have no expiry
/// of their own and live with the pod: held while it is a member or its pod lease
/// exists, an orphan once neither (deleted by the next snapshot, taken over by an
/// acquire). A member of an earlier release makes every pod give its leases their own
/// expiry again, and its departure takes them back to the pod lease.
#[tokio::test]
async fn a_pods_leases_live_with_its_membership_and_its_pod_lease() {
    use crate::support::pod::member;
    use posgate::core::membership::{Member, POD_LEASE};
    use posgate::store::ClusterMeta;

    let server = RedisServer::start();
    let (a, b) = (connect(&server.url()).await, connect(&server.url()).await);
    let g = generation(&a).await;
    let meta = ClusterMeta::current(4);
    let capable = |id: &str| Member {
        pod_lease: POD_LEASE,
        ..member(id)
    };
    let register = |store: &RedisStore, m: Member| {
        let (store, g, meta) = (store.clone(), g.clone(), meta.clone());
        async move { store.heartbeat(&g, &m, &meta, TTL).await.unwrap() }
    };
    register(&a, capable("a")).await;
    register(&b, capable("b")).await;
    generation(&a).await;
    generation(&b).await;
    let keys = Keys::new("test").unwrap();
    let pod_lease = |id: &str| keys.pod_lease(&pod(id));
    let pttl = |shard: u32| server.command(&["PTTL", &keys.lease(shard)]);

    let epoch = acquired(leases::acquire(&a, &g, &pod("a"), &[1], TTL).await.unwrap())[0];
    assert_eq!(
        pttl(1),
        ":-1",
        "a lease kept by the pod lease has no expiry"
    );
    assert_eq!(server.command(&["EXISTS", &pod_lease("a")]), ":1");
    assert_eq!(
        leases::renew(&a, &g, &pod("a"), &[1], TTL).await.unwrap(),
        Checked::Ok(vec![RenewOutcome::Renewed])
    );
    let held_by_a = Checked::Ok(vec![AcquireOutcome::HeldBy {
        owner: pod("a"),
        epoch,
    }]);
    // A live member's lease is held even without its pod lease (lost in a failover).
    server.command(&["DEL", &pod_lease("a")]);
    assert_eq!(
        leases::acquire(&b, &g, &pod("b"), &[1], TTL).await.unwrap(),
        held_by_a
    );
    // A pod that deregistered to drain keeps its leases by its pod lease.
    leases::renew(&a, &g, &pod("a"), &[1], TTL).await.unwrap();
    a.deregister(&pod("a")).await.unwrap();
    assert_eq!(
        leases::acquire(&b, &g, &pod("b"), &[1], TTL).await.unwrap(),
        held_by_a
    );
    // Neither: an orphan. The snapshot shows it free and deletes it; an acquire takes it.
    server.command(&["DEL", &pod_lease("a")]);
    assert_eq!(b.snapshot(4).await.unwrap().leases[1], None);
    assert_eq!(server.command(&["EXISTS", &keys.lease(1)]), ":0");
    let taken = acquired(leases::acquire(&b, &g, &pod("b"), &[1], TTL).await.unwrap())[0];
    assert!(taken > epoch);

    // A member of an earlier release: b's leases get their own expiry at its next call.
    acquired(leases::acquire(&b, &g, &pod("b"), &[2], TTL).await.unwrap());
    register(&a, member("old")).await;
    generation(&b).await;
    leases::renew(&b, &g, &pod("b"), &[2], TTL).await.unwrap();
    for shard in [1, 2] {
        let ms: i64 = pttl(shard).trim_start_matches(':').parse().unwrap();
        assert!(ms > 0, "lease {shard} without its own expiry: {ms}");
    }
    assert_eq!(server.command(&["EXISTS", &pod_lease("b")]), ":0");
    // It leaves: back to the pod lease, every lease of b persisted.
    a.deregister(&pod("old")).await.unwrap();
    generation(&b).await;
    leases::renew(&b, &g, &pod("b"), &[2], TTL).await.unwrap();
    assert_eq!((pttl(1), pttl(2)), (":-1".into(), ":-1".into()));
    assert_eq!(server.command(&["EXISTS", &pod_lease("b")]), ":1");
}

/// An orphan's lease ended: its owner cannot make it held again, not by renewing it
/// with an expiry, not by writing its pod lease again, not by registering again (each
/// deletes its orphans first, so a re-claim gets a higher epoch, as after an expiry).
#[tokio::test]
async fn an_orphaned_lease_is_never_revived_by_its_owner() {
    use crate::support::pod::member;
    use posgate::core::membership::{Member, POD_LEASE};
    use posgate::store::ClusterMeta;

    const SHORT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    // Two clients of pod "a": one whose last snapshot shows only members that read pod
    // leases, one whose last snapshot also shows a member of an earlier release.
    let (by_pod, by_lease) = (connect(&server.url()).await, connect(&server.url()).await);
    let g = generation(&by_pod).await;
    let meta = ClusterMeta::current(4);
    let a = Member {
        pod_lease: POD_LEASE,
        ..member("a")
    };
    by_pod.heartbeat(&g, &a, &meta, SHORT).await.unwrap();
    generation(&by_pod).await;
    let epochs = acquired(
        leases::acquire(&by_pod, &g, &pod("a"), &[1, 2, 3], SHORT)
            .await
            .unwrap(),
    );
    by_lease
        .heartbeat(&g, &member("old"), &meta, TTL)
        .await
        .unwrap();
    generation(&by_lease).await;
    // a's registration and pod lease lapse: its three leases are orphans.
    tokio::time::sleep(SHORT + Duration::from_millis(200)).await;
    let exists = |shard: u32| server.command(&["EXISTS", &Keys::new("test").unwrap().lease(shard)]);

    // Renewed with an expiry: missing, not revived.
    assert_eq!(
        leases::renew(&by_lease, &g, &pod("a"), &[2], TTL)
            .await
            .unwrap(),
        Checked::Ok(vec![RenewOutcome::Missing { epoch: epochs[1] }])
    );
    assert_eq!(exists(2), ":0");
    // The pod lease written again: a fresh acquisition, and the other orphan gone.
    let again = acquired(
        leases::acquire(&by_pod, &g, &pod("a"), &[3], SHORT)
            .await
            .unwrap(),
    )[0];
    assert!(again > epochs[2]);
    assert_eq!(exists(1), ":0");
    // Registering again: the leases its membership alone held are gone.
    acquired(
        leases::acquire(&by_pod, &g, &pod("a"), &[1], SHORT)
            .await
            .unwrap(),
    );
    tokio::time::sleep(SHORT + Duration::from_millis(200)).await;
    by_pod.heartbeat(&g, &a, &meta, TTL).await.unwrap();
    assert_eq!((exists(1), exists(3)), (":0".into(), ":0".into()));
}

/// A lease handover (`release.lua` with a target): owner-checked, one script, a new
/// epoch above the floor, the key never free. The target finds it its own at its next
/// acquire (`AlreadyMine`, the handed epoch). Under pod leases the key stays without an
/// expiry (the target's pod lease keeps it); for a target that keeps none (a member of
/// an earlier release is live), it gets the lease TTL, no more than the target's
/// registration has left. A target that is no live member gets nothing: the lease is
/// deleted.
#[tokio::test]
async fn a_lease_is_handed_to_a_live_member_with_a_new_epoch() {
    use crate::support::pod::member;
    use posgate::core::lease::{Release, Released};
    use posgate::core::membership::{Member, POD_LEASE};
    use posgate::store::ClusterMeta;

    let server = RedisServer::start();
    let (a, b) = (connect(&server.url()).await, connect(&server.url()).await);
    let g = generation(&a).await;
    let meta = ClusterMeta::current(4);
    for (store, id) in [(&a, "a"), (&b, "b")] {
        let m = Member {
            pod_lease: POD_LEASE,
            ..member(id)
        };
        store.heartbeat(&g, &m, &meta, TTL).await.unwrap();
    }
    generation(&a).await;
    generation(&b).await;
    // b keeps a pod lease once it made a lease call.
    leases::renew(&b, &g, &pod("b"), &[], TTL).await.unwrap();
    let keys = Keys::new("test").unwrap();
    let pttl = |shard: u32| server.command(&["PTTL", &keys.lease(shard)]);
    let epochs = acquired(
        leases::acquire(&a, &g, &pod("a"), &[0, 1, 2], TTL)
            .await
            .unwrap(),
    );
    let to = |shard, to: &str, floor| Release {
        shard,
        to: Some(pod(to)),
        floor,
    };
    // Not a's: nothing changes.
    assert_eq!(
        b.release(&pod("b"), &[to(0, "b", 0)], None, TTL)
            .await
            .unwrap(),
        [Released::NotHeld]
    );
    let far = epochs[1] + 1_000_000;
    let handed = a
        .release(
            &pod("a"),
            &[
                to(0, "b", 0),
                to(1, "b", far),
                to(2, "nobody", 0),
                to(3, "b", 0),
            ],
            None,
            TTL,
        )
        .await
        .unwrap();
    let Released::HandedOver { epoch: e0 } = handed[0] else {
        panic!("{handed:?}");
    };
    assert!(e0 > epochs[0], "{e0} after {}", epochs[0]);
    assert_eq!(handed[1], Released::HandedOver { epoch: far + 1 });
    // To a pod that is no live member: deleted, as a plain release. Not a's: untouched.
    assert_eq!(handed[2..], [Released::Deleted, Released::NotHeld]);
    assert_eq!(server.command(&["EXISTS", &keys.lease(2)]), ":0");
    assert_eq!(pttl(0), ":-1", "b's pod lease keeps it");
    let snap = a.snapshot(4).await.unwrap();
    let lease = snap.leases[0].as_ref().unwrap();
    assert_eq!((&lease.owner, lease.epoch), (&pod("b"), e0));
    assert_eq!(
        leases::acquire(&b, &g, &pod("b"), &[0, 1], TTL)
            .await
            .unwrap(),
        Checked::Ok(vec![
            AcquireOutcome::AlreadyMine { epoch: e0 },
            AcquireOutcome::AlreadyMine { epoch: far + 1 },
        ])
    );
    // a's renewal now finds b's lease: a does not serve it any more.
    assert!(matches!(
        leases::renew(&a, &g, &pod("a"), &[0], TTL).await.unwrap(),
        Checked::Ok(ref o) if matches!(o[..], [RenewOutcome::HeldBy { .. }])
    ));

    // A target without a pod lease (b's calls keep leases by expiry once a member of an
    // earlier release is live): the handed key gets the lease TTL, but no more than b's
    // registration has left (a target that crashed keeps it no longer than its own).
    a.heartbeat(&g, &member("old"), &meta, TTL).await.unwrap();
    generation(&b).await;
    leases::renew(&b, &g, &pod("b"), &[0], TTL).await.unwrap();
    acquired(
        leases::acquire(&a, &g, &pod("a"), &[3, 2], TTL)
            .await
            .unwrap(),
    );
    let b_member = Member {
        pod_lease: POD_LEASE,
        ..member("b")
    };
    let pttl_ms = |shard| -> i64 { pttl(shard).trim_start_matches(':').parse().unwrap() };
    let handed = a
        .release(&pod("a"), &[to(3, "b", 0)], None, TTL)
        .await
        .unwrap();
    assert!(matches!(handed[..], [Released::HandedOver { .. }]));
    let ms = pttl_ms(3);
    assert!(ms > 2_000 && ms <= TTL.as_millis() as i64, "{ms}");
    b.heartbeat(&g, &b_member, &meta, Duration::from_secs(2))
        .await
        .unwrap();
    let handed = a
        .release(&pod("a"), &[to(2, "b", 0)], None, TTL)
        .await
        .unwrap();
    assert!(matches!(handed[..], [Released::HandedOver { .. }]));
    let ms = pttl_ms(2);
    assert!(ms > 0 && ms <= 2_000, "{ms}");
}
