//! The simulator against the wire contract of `docs/pos-protocol.md`, driven by a minimal
//! independent client (`common`): sessions, supersession, stale epochs, duplicate keys,
//! overlaps, refused SNI, faults, dark intervals and the admin endpoint.

mod common;

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use common::{connect, connect_to, Conn, H_DUPLICATE, H_IDEMPOTENCY_KEY, H_STALE_EPOCH};
use http::StatusCode;
use http_body_util::{channel::Channel, BodyExt};
use posgate_pos_sim::{
    DarkIntervals, Duplicates, FarmConfig, FarmCounters, FaultConfig, PosFarm, Refusals,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T0: &str = "pos-00100";
const T1: &str = "pos-00101";

async fn farm() -> PosFarm {
    farm_with(|_| {}).await
}

async fn farm_with(tweak: impl FnOnce(&mut FarmConfig)) -> PosFarm {
    let mut config = FarmConfig::new(100..104);
    config.listeners = 2;
    config.port = 0;
    tweak(&mut config);
    PosFarm::start(config).await.expect("farm starts")
}

async fn status_of(conn: &mut Conn, epoch: u64) -> StatusCode {
    conn.hello(epoch).await.expect("hello answered").status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_push_supersede_and_stale_epochs() {
    let farm = farm().await;
    let mut a = connect(&farm, T0).await.unwrap();
    assert_eq!(status_of(&mut a, 10).await, StatusCode::OK);
    let first = a.push(10, "k1").await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(
        first.headers().get(H_DUPLICATE).is_none(),
        "a new key is taken"
    );
    let c = farm.counters();
    assert_eq!((c.sessions_accepted, c.pushes_accepted), (1, 1));

    // A second connection while the first is open is a raw overlap (checked after its
    // first answer: the server registers a connection when *its* handshake ends).
    let mut b = connect(&farm, T0).await.unwrap();
    assert_eq!(status_of(&mut b, 11).await, StatusCode::OK);
    assert_eq!(farm.counters().raw_overlaps, 1);
    assert!(
        a.closed_within(Duration::from_secs(3)).await,
        "the terminal must close the superseded connection"
    );
    match a.push(10, "k2").await {
        Err(_) => {}
        Ok(resp) => assert_eq!(resp.status(), StatusCode::CONFLICT),
    }

    // A lower epoch is refused with the highest one seen.
    let mut c = connect(&farm, T0).await.unwrap();
    let resp = c.hello(9).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(resp.headers()[H_STALE_EPOCH], "11");
    let resp = c.push(9, "k3").await.unwrap();
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(resp.headers()[H_STALE_EPOCH], "11");

    // The same key again (and a third time), from a newer session within the window, is
    // one key delivered twice: answered 200 with the duplicate marker each time.
    for _ in 0..2 {
        let repeat = b.push(11, "k1").await.unwrap();
        assert_eq!(repeat.status(), StatusCode::OK);
        assert_eq!(repeat.headers()[H_DUPLICATE], "1");
    }
    // The marker is per (tenant, key): another tenant's k1 is a new push.
    let other_tenant = b
        .request("/push", 11)
        .header(H_IDEMPOTENCY_KEY, "k1")
        .header("posgate-tenant", "bank")
        .body(common::full("x"))
        .unwrap();
    let fresh = b.send(other_tenant).await.unwrap();
    assert_eq!(fresh.status(), StatusCode::OK);
    assert!(fresh.headers().get(H_DUPLICATE).is_none());

    let c = farm.counters();
    assert_eq!(c.sessions_accepted, 2);
    assert_eq!(c.sessions_superseded, 1);
    assert_eq!(c.session_overlaps, 0, "closed well within 1 s: {c:?}");
    assert_eq!(c.session_overlaps_open, 0);
    assert_eq!(c.stale_hellos_refused, 1);
    assert_eq!(c.stale_pushes_refused, 1);
    assert_eq!(c.pushes_accepted, 4);
    assert_eq!(c.keys_delivered_twice, 1);
    assert_eq!(c.duplicate_deliveries, 2);
    assert_eq!((c.keys_remembered, c.keys_forgotten_early), (2, 0));
    assert_eq!(c.connections_open, 2);
    assert_eq!(c.terminals_connected, 1);

    // Each refusal is logged with the refused pod, epoch and kind, for load tests that
    // check what the pod did next.
    let log = farm.refusals();
    assert_eq!(log.dropped, 0);
    let seen: Vec<(&str, &str, &str, u64, u64)> = log
        .refusals
        .iter()
        .map(|r| {
            (
                r.terminal.as_str(),
                r.pod.as_str(),
                r.kind.as_str(),
                r.epoch,
                r.highest,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (T0, "test-pod", "hello", 9, 11),
            (T0, "test-pod", "push", 9, 11)
        ]
    );
    assert!(log.refusals[0].at_unix_ms <= log.refusals[1].at_unix_ms);

    // Each repeat is logged with the delivery before it, for load tests that classify
    // duplicates by which pods delivered them.
    let dups = farm.duplicates();
    assert_eq!(dups.dropped, 0);
    let seen: Vec<(&str, &str, u32, u64, u64, &str)> = dups
        .duplicates
        .iter()
        .map(|d| {
            (
                d.terminal.as_str(),
                d.key.as_str(),
                d.copy,
                d.previous.epoch,
                d.this.epoch,
                d.this.pod.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (T0, "k1", 2, 10, 11, "test-pod"),
            (T0, "k1", 3, 11, 11, "test-pod")
        ]
    );

    let report = farm.terminal_report(T0).unwrap();
    assert_eq!(report.highest_epoch, Some(11));
    assert_eq!(report.stats.keys_delivered_twice, 1);
    assert_eq!(report.recent_pushes.len(), 4);
    assert_eq!(report.open_connections.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_needs_a_current_session_and_correct_headers() {
    let farm = farm().await;
    let mut a = connect(&farm, T0).await.unwrap();
    assert_eq!(
        a.push(5, "k").await.unwrap().status(),
        StatusCode::PRECONDITION_REQUIRED
    );
    assert_eq!(status_of(&mut a, 5).await, StatusCode::OK);
    // An epoch above the session's was never helloed on this connection.
    assert_eq!(
        a.push(6, "k").await.unwrap().status(),
        StatusCode::PRECONDITION_REQUIRED
    );
    // Re-hello on the same connection with a higher epoch moves the session forward.
    assert_eq!(status_of(&mut a, 6).await, StatusCode::OK);
    assert_eq!(a.push(6, "k").await.unwrap().status(), StatusCode::OK);

    let wrong_terminal = a
        .request("/hello", 7)
        .header("posgate-terminal", T1)
        .body(common::full(""))
        .unwrap();
    let mut headers = wrong_terminal.headers().get_all("posgate-terminal").iter();
    assert_eq!(
        headers.next().unwrap(),
        T0,
        "the builder appends: a repeated header is malformed"
    );
    let resp = a.send(wrong_terminal).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    let mut t1 = connect(&farm, T1).await.unwrap();
    t1.terminal = T0.to_owned();
    assert_eq!(status_of(&mut t1, 1).await, StatusCode::BAD_REQUEST);
    let no_key = a.request("/push", 6).body(common::full("x")).unwrap();
    assert_eq!(
        a.send(no_key).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    let c = farm.counters();
    assert_eq!(c.pushes_without_session, 2);
    assert_eq!(c.requests_rejected, 3);
    assert_eq!(c.pushes_accepted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_superseded_session_is_a_session_overlap() {
    let farm = farm_with(|c| c.supersede_grace = Duration::from_millis(1500)).await;
    let mut a = connect(&farm, T0).await.unwrap();
    assert_eq!(status_of(&mut a, 1).await, StatusCode::OK);
    // A push whose body never ends keeps a stream open, so GOAWAY alone does not close A.
    let (mut body_tx, body) = Channel::<Bytes>::new(1);
    let req = a
        .request("/push", 1)
        .header(H_IDEMPOTENCY_KEY, "slow")
        .body(body.boxed())
        .unwrap();
    a.sender.ready().await.unwrap();
    let in_flight = a.sender.send_request(req);
    body_tx.send_data(Bytes::from_static(b"{")).await.unwrap();
    let in_flight = tokio::spawn(in_flight);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut b = connect(&farm, T0).await.unwrap();
    assert_eq!(status_of(&mut b, 2).await, StatusCode::OK);
    assert_eq!(farm.counters().session_overlaps_open, 1);
    assert!(a.closed_within(Duration::from_secs(4)).await);
    let _ = in_flight.await;
    drop(body_tx);
    let c = farm.counters();
    assert_eq!(c.session_overlaps, 1, "{c:?}");
    assert_eq!(c.session_overlaps_open, 0);
    assert!(c.max_session_overlap_ms >= 1000, "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_sni_and_offline_terminals_are_refused() {
    let farm = farm().await;
    let addr = farm.listener_addrs()[0];
    for name in ["pos-00999.pos.test", "pos-100.pos.test", "other.test"] {
        assert!(connect_to(&farm, addr, name, "x").await.is_err(), "{name}");
    }
    assert_eq!(farm.counters().unknown_sni_refused, 3);

    let mut live = connect(&farm, T1).await.unwrap();
    assert_eq!(status_of(&mut live, 1).await, StatusCode::OK);
    let dropped = farm
        .set_faults(FaultConfig {
            offline_terminals: vec![T1.to_owned()],
            ..FaultConfig::default()
        })
        .unwrap();
    assert_eq!(dropped, 1);
    assert!(live.closed_within(Duration::from_secs(2)).await);
    assert!(connect(&farm, T1).await.is_err());
    let mut t0 = connect(&farm, T0).await.unwrap();
    assert_eq!(status_of(&mut t0, 1).await, StatusCode::OK);
    assert!(farm.terminal_report(T1).unwrap().offline);

    farm.set_faults(FaultConfig {
        offline_fraction: 1.0,
        ..FaultConfig::default()
    })
    .unwrap();
    assert!(connect(&farm, T0).await.is_err());
    farm.set_faults(FaultConfig {
        refuse_connections: true,
        ..FaultConfig::default()
    })
    .unwrap();
    assert!(connect(&farm, T0).await.is_err());
    let c = farm.counters();
    assert_eq!((c.offline_refused, c.tcp_refused), (2, 1), "{c:?}");
    assert_eq!(
        c.connections_dropped, 2,
        "T1 offline, then T0 offline: {c:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_fault_and_latency() {
    let farm = farm().await;
    let mut conns = Vec::new();
    for id in [T0, T1] {
        let mut conn = connect(&farm, id).await.unwrap();
        assert_eq!(status_of(&mut conn, 1).await, StatusCode::OK);
        conns.push(conn);
    }
    assert_eq!(farm.drop_connections(1.0).unwrap(), 2);
    for conn in &mut conns {
        assert!(conn.closed_within(Duration::from_secs(2)).await);
    }
    assert!(farm.drop_connections(2.0).is_err());

    farm.set_faults(FaultConfig {
        response_latency_ms: 300,
        ..FaultConfig::default()
    })
    .unwrap();
    let mut a = connect(&farm, T0).await.unwrap();
    let started = std::time::Instant::now();
    assert_eq!(status_of(&mut a, 1).await, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let c = farm.counters();
    assert_eq!((c.connections_dropped, c.connections_open), (2, 1), "{c:?}");
}

/// One HTTP/1.1 request over a fresh connection; returns status and body.
async fn admin_call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoint_serves_counters_faults_and_reports() {
    let farm = farm().await;
    let admin = farm
        .serve_admin("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = admin.local_addr();
    let mut a = connect(&farm, T0).await.unwrap();
    assert_eq!(status_of(&mut a, 3).await, StatusCode::OK);

    let (status, body) = admin_call(addr, "GET", "/counters", "").await;
    assert_eq!(status, 200);
    let counters: FarmCounters = serde_json::from_str(&body).unwrap();
    assert_eq!((counters.terminals, counters.sessions_accepted), (4, 1));

    let (status, body) = admin_call(addr, "GET", &format!("/terminals/{T0}"), "").await;
    assert_eq!(status, 200);
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["highest_epoch"], 3);

    // A stale hello shows up in /refusals with the pod that sent it.
    assert_eq!(status_of(&mut a, 2).await, StatusCode::CONFLICT);
    let (status, body) = admin_call(addr, "GET", "/refusals", "").await;
    assert_eq!(status, 200);
    let log: Refusals = serde_json::from_str(&body).unwrap();
    assert_eq!(log.refusals.len(), 1, "{body}");
    assert_eq!(
        (log.refusals[0].pod.as_str(), log.refusals[0].epoch),
        ("test-pod", 2)
    );

    // A repeated key shows up in /duplicates with the pods of both copies.
    for _ in 0..2 {
        assert_eq!(a.push(3, "again").await.unwrap().status(), StatusCode::OK);
    }
    let (status, body) = admin_call(addr, "GET", "/duplicates", "").await;
    assert_eq!(status, 200);
    let log: Duplicates = serde_json::from_str(&body).unwrap();
    assert_eq!(log.duplicates.len(), 1, "{body}");
    let d = &log.duplicates[0];
    assert_eq!((d.key.as_str(), d.copy), ("again", 2));
    assert_eq!(
        (d.previous.pod.as_str(), d.this.pod.as_str()),
        ("test-pod", "test-pod")
    );

    let (status, _) = admin_call(addr, "POST", "/faults", r#"{"handshake_delay_ms":50}"#).await;
    assert_eq!(status, 200);
    assert_eq!(farm.faults().handshake_delay_ms, 50);
    let (status, _) = admin_call(addr, "POST", "/faults", r#"{"offline_fraction":2}"#).await;
    assert_eq!(status, 400);
    let (status, body) = admin_call(addr, "POST", "/drop", r#"{"fraction":1.0}"#).await;
    assert_eq!(
        (status, body.contains("\"dropped\": 1")),
        (200, true),
        "{body}"
    );
    assert_eq!(admin_call(addr, "GET", "/terminals/pos-1", "").await.0, 404);

    // T0 was dropped: dark until it connects again, then one ended interval in /dark.
    assert!(a.closed_within(Duration::from_secs(2)).await);
    for _ in 0..100 {
        if farm.counters().connections_open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, body) = admin_call(addr, "GET", "/dark", "").await;
    let dark: DarkIntervals = serde_json::from_str(&body).unwrap();
    assert_eq!((dark.intervals.len(), dark.dark_now), (0, 1), "{body}");
    assert_eq!(dark.not_yet_dialed, 3, "{body}");
    let mut b = connect(&farm, T0).await.unwrap();
    assert_eq!(status_of(&mut b, 4).await, StatusCode::OK);
    let (status, body) = admin_call(addr, "GET", "/dark?since=0", "").await;
    assert_eq!(status, 200);
    let dark: DarkIntervals = serde_json::from_str(&body).unwrap();
    assert_eq!(dark.intervals.len(), 1, "{body}");
    let i = &dark.intervals[0];
    assert_eq!(i.terminal, T0);
    assert!(i.end_unix_ms >= i.start_unix_ms, "{body}");
    assert_eq!((dark.summary.count, dark.summary.max), (1, i.ms()));
    assert_eq!(
        (dark.dark_now, dark.dropped, dark.incomplete),
        (0, 0, false)
    );
    assert_eq!(dark, farm.dark_intervals(0));
    let later = format!("/dark?since={}", i.end_unix_ms + 1);
    let (_, body) = admin_call(addr, "GET", &later, "").await;
    let dark: DarkIntervals = serde_json::from_str(&body).unwrap();
    assert!(dark.intervals.is_empty(), "ended before since: {body}");
    assert_eq!(admin_call(addr, "GET", "/dark?since=soon", "").await.0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_config_checks() {
    let farm = farm().await;
    let dir = tempfile::tempdir().unwrap();
    farm.write_files(dir.path()).unwrap();
    let csv = std::fs::read_to_string(dir.path().join("terminals.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "id,addr,server_name");
    assert_eq!(lines.len(), 5);
    let addrs = farm.listener_addrs();
    assert_eq!(
        lines[1],
        format!("pos-00100,{},pos-00100.pos.test", addrs[0])
    );
    assert_eq!(
        lines[2],
        format!("pos-00101,{},pos-00101.pos.test", addrs[1])
    );
    let pem = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));

    assert!(PosFarm::start(FarmConfig::new(5..5)).await.is_err());
    assert!(PosFarm::start(FarmConfig::new(0..15_001)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_terminals_over_several_listeners() {
    // POS_SIM_TEST_TERMINALS raises the count for a manual scale check (both sides live in
    // this process, so keep it under ~9,000 with the 20,000 open-file limit).
    let n: u64 = std::env::var("POS_SIM_TEST_TERMINALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut config = FarmConfig::new(1_000..1_000 + n);
    config.listeners = 4;
    config.port = 0;
    let farm = std::sync::Arc::new(PosFarm::start(config).await.unwrap());
    let mut tasks = tokio::task::JoinSet::new();
    for info in farm.terminals() {
        let farm = farm.clone();
        tasks.spawn(async move {
            let mut conn = connect(&farm, &info.id).await.unwrap();
            assert_eq!(conn.hello(1).await.unwrap().status(), StatusCode::OK);
            let key = format!("{}-k", info.id);
            assert_eq!(conn.push(1, &key).await.unwrap().status(), StatusCode::OK);
            conn
        });
    }
    let conns = tasks.join_all().await;
    let c = farm.counters();
    assert_eq!(c.connections_open, n);
    assert_eq!(c.terminals_connected, n);
    assert_eq!((c.sessions_accepted, c.pushes_accepted), (n, n));
    assert_eq!((c.raw_overlaps, c.keys_delivered_twice), (0, 0));
    let per_listener = farm
        .terminals()
        .iter()
        .filter(|t| t.addr == farm.listener_addrs()[3])
        .count();
    assert_eq!(per_listener as u64, n / 4);
    drop(conns);
}
