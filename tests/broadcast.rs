//! Broadcasts on `posgate serve` processes over a real `redis-server`, with `pos-sim`'s
//! terminals: a broadcast to a label reaches every terminal with it once and no other,
//! while a pod joins and another is stopped (`SIGTERM`); a token scoped to `pos-0000*`
//! reaches only those; a tenant without the grant cannot broadcast; a dry run counts
//! what a broadcast would select; the same request again is the same broadcast.

use std::time::Duration;

use posgate::api::Labels;
use serde_json::Value;

use crate::support::binary::{
    request, terminal_pod, BinPod, API_TOKEN, BROADCAST_TENANT, BROADCAST_TOKEN, OPERATOR_TOKEN,
    SCOPED_BROADCAST_TOKEN,
};
use crate::support::farm::{self, connect_limit, Farm};
use crate::support::wait::wait_for;
use crate::support::RedisServer;

const TERMINALS: u64 = 60;

/// `POST /v1/broadcasts?<query>` with `token` and `key`: status and JSON body.
async fn broadcast(port: u16, query: &str, token: &str, key: &str) -> (u16, Value) {
    let head = format!(
        "POST /v1/broadcasts?{query} HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\n"
    );
    let (status, body) = request(port, &head, "{\"menu\":7}", Duration::from_secs(10))
        .await
        .expect("an answer to the broadcast");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

async fn status_of(port: u16, id: &str, token: &str) -> (u16, Value) {
    let head = format!("GET /v1/broadcasts/{id} HTTP/1.1\r\nAuthorization: Bearer {token}\r\n");
    let (status, body) = request(port, &head, "", Duration::from_secs(5))
        .await
        .expect("an answer to the status");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The terminals' labels: even numbers `store=17`, odd `store=18`.
fn store_of(id: &str) -> &'static str {
    let n: u64 = id.trim_start_matches("pos-").parse().unwrap();
    if n.is_multiple_of(2) {
        "17"
    } else {
        "18"
    }
}

/// How many copies of `key` terminal `id` took (duplicates included).
fn taken(farm: &Farm, id: &str, key: &str) -> usize {
    farm.terminal_report(id)
        .unwrap()
        .recent_pushes
        .iter()
        .filter(|p| p.idempotency_key == key)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broadcast_reaches_each_selected_terminal_once_while_pods_come_and_go() {
    let redis = RedisServer::start();
    let farm = Farm::start(farm::config(TERMINALS)).await;
    let entries: Vec<_> = farm
        .entries()
        .into_iter()
        .map(|mut t| {
            t.labels = Labels::parse(&format!("store={}", store_of(&t.id))).unwrap();
            t
        })
        .collect();
    farm::import(&redis, &entries).await;
    // Slow enough (2 copies a second per pod) that the pods come and go mid-broadcast.
    let grant = [
        "--broadcast-tenants",
        BROADCAST_TENANT,
        "--broadcast-rate",
        "2",
    ];
    let pod = |i: usize| {
        let id = format!("bc-pod-{i}");
        terminal_pod(&id, &redis.url(), &farm.ca_file, farm.dir.path(), &grant)
    };
    let mut pods: Vec<BinPod> = vec![pod(0), pod(1)];
    let farm = &farm;
    wait_for("every terminal connected", connect_limit(), || {
        farm.counters().terminals_connected == TERMINALS
    })
    .await;
    let port = pods[1].port;

    // A tenant without the grant may not; a dry run counts within the token's patterns.
    let (status, body) = broadcast(port, "selector=store%3D17&ttl_s=120", API_TOKEN, "x").await;
    assert_eq!(
        (status, &body["error"]),
        (403, &Value::from("forbidden")),
        "{body}"
    );
    let dry = "selector=store%3D17&dry_run=true";
    let (status, body) = broadcast(port, dry, BROADCAST_TOKEN, "d").await;
    assert_eq!(
        (status, &body["matched"]),
        (200, &Value::from(30)),
        "{body}"
    );
    let (status, body) = broadcast(port, dry, SCOPED_BROADCAST_TOKEN, "d").await;
    assert_eq!((status, &body["matched"]), (200, &Value::from(5)), "{body}");
    let (status, body) = broadcast(port, "ttl_s=120", BROADCAST_TOKEN, "n").await;
    assert_eq!(status, 400, "no selector: {body}");

    // The broadcast, then a pod joins and another stops while it is sent.
    let query = "selector=store%3D17&ttl_s=120";
    let (status, created) = broadcast(port, query, BROADCAST_TOKEN, "menu-1").await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let (status, again) = broadcast(pods[0].port, query, BROADCAST_TOKEN, "menu-1").await;
    assert_eq!(
        (status, &again["id"]),
        (200, &Value::from(id.clone())),
        "{again}"
    );
    let (status, conflict) = broadcast(
        port,
        "selector=store%3D18&ttl_s=120",
        BROADCAST_TOKEN,
        "menu-1",
    )
    .await;
    assert_eq!(status, 409, "{conflict}");
    let (status, scoped) = broadcast(port, query, SCOPED_BROADCAST_TOKEN, "menu-2").await;
    assert_eq!(status, 202, "{scoped}");
    let scoped_id = scoped["id"].as_str().unwrap().to_string();
    // Some copies delivered before the moves, so that new owners find their outcomes.
    let delivered = || async {
        let (_, body) = status_of(port, &id, BROADCAST_TOKEN).await;
        body["counts"]["delivered"].as_u64().unwrap_or(0)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while delivered().await < 6 {
        assert!(tokio::time::Instant::now() < deadline, "nothing delivered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pods.push(pod(2));
    let joined = || async { pods[2].serving().await.is_some_and(|s| !s.is_empty()) };
    let deadline = tokio::time::Instant::now() + connect_limit();
    while !joined().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod 2 serves no shard"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, body) = status_of(port, &id, BROADCAST_TOKEN).await;
    assert_eq!(body["state"], "running", "finished before the join: {body}");
    // Operators see it running: on the status page and in `posgate status`.
    if let Some(bin) = crate::status_page::browser() {
        let page = format!("http://127.0.0.1:{port}/#token={OPERATOR_TOKEN}");
        let (dom, _) = crate::status_page::dump_dom(bin, &page).await;
        let line = format!(
            "broadcast {} ({BROADCAST_TENANT}, store=17) running: ",
            &id[..8]
        );
        assert!(dom.contains(&line), "{dom}");
    }
    let status = crate::support::binary::posgate(
        &["status", "--url", &format!("http://127.0.0.1:{port}")],
        &[("POSGATE_OPERATOR_TOKEN", OPERATOR_TOKEN)],
    );
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!("\n  {id} {BROADCAST_TENANT} [store=17] running: ")),
        "{text}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    pods[0].signal("-TERM");

    let complete = |id: String, n: u64| async move {
        let (status, body) = status_of(port, &id, BROADCAST_TOKEN).await;
        status == 200
            && body["state"] == "complete"
            && body["counts"]["delivered"] == n
            && body["counts"]["matched"] == n
    };
    for (id, n) in [(id.clone(), 30), (scoped_id.clone(), 5)] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        while !complete(id.clone(), n).await {
            let (_, body) = status_of(port, &id, BROADCAST_TOKEN).await;
            assert!(
                tokio::time::Instant::now() < deadline,
                "not complete: {body}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let (_, body) = status_of(port, &id, BROADCAST_TOKEN).await;
    assert_eq!(body["shards_walked"], body["shards"], "{body}");
    assert_eq!(body["counts"]["failed"], 0, "{body}");
    let senders: Vec<&str> = body["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["delivered"].as_u64() > Some(0))
        .map(|p| p["pod"].as_str().unwrap())
        .collect();
    assert!(
        senders.contains(&"bc-pod-2"),
        "the joined pod sent none: {body}"
    );

    // At the terminals: each selected one took each broadcast's key once, no other did.
    for t in &farm.ids {
        let selected = store_of(t) == "17";
        let copies = taken(farm, t, &format!("{BROADCAST_TENANT}:broadcast-{id}"));
        assert_eq!(copies, usize::from(selected), "{t}: broadcast {id}");
        let in_scope = selected && t.starts_with("pos-0000");
        let copies = taken(
            farm,
            t,
            &format!("{BROADCAST_TENANT}:broadcast-{scoped_id}"),
        );
        assert_eq!(
            copies,
            usize::from(in_scope),
            "{t}: scoped broadcast {scoped_id}"
        );
    }
    assert_eq!(farm.counters().keys_delivered_twice, 0);

    // Another tenant does not see it.
    let (status, _) = status_of(port, &id, API_TOKEN).await;
    assert_eq!(status, 404);
}
