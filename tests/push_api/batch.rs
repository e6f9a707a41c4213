//! Batches (`POST /v1/pushes`) end to end: one request, a result per push in the single
//! push's words; each owner gets its share in one peer request; the same batch again is
//! answered from the owners' kept answers without a second delivery; what is wrong with
//! one push is that push's result; a token reaches only what it may.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::Full;
use posgate::peer::wire::PUSH_BATCH_ROUTE;
use posgate::push::PushConfig;
use serde_json::{json, Value};

use super::{Cluster, ACME, OPERATOR, SHOP};
use crate::support::api::{self, client, Http};

/// `POST /v1/pushes` with `token` and `body`; the status and JSON body.
async fn batch(http: &Http, base: &str, token: &str, body: &Value) -> (StatusCode, Value) {
    let request = Request::post(format!("{base}/v1/pushes?timeout_ms=5000"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(serde_json::to_vec(body).unwrap().into()))
        .unwrap();
    let (status, _, body) = api::send(http, request).await;
    (status, body)
}

/// The pushes (`posgate_push_batch_items_total{from="peer"}`) and batches each pod
/// received from peers, by pod.
async fn peer_batches(c: &Cluster, http: &Http) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for url in &c.urls {
        let scrape = api::metrics(http, url).await;
        let batches = api::value(&scrape, "posgate_push_batches_total{from=\"peer\"}");
        let items = api::value(&scrape, "posgate_push_batch_items_total{from=\"peer\"}");
        out.push((batches.unwrap_or(0.0), items.unwrap_or(0.0)));
    }
    out
}

/// `posgate_push_replays_total` summed over the pods.
async fn replays(c: &Cluster, http: &Http) -> f64 {
    let mut sum = 0.0;
    for url in &c.urls {
        let scrape = api::metrics(http, url).await;
        sum += api::value(&scrape, "posgate_push_replays_total").unwrap_or(0.0);
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_over_every_shard_is_one_peer_request_per_owner_and_delivers_each_push_once() {
    const PUSHES: usize = 1_000;
    let c = Cluster::start(3, 500, &[], PushConfig::default()).await;
    let http = client();
    let pushes: Vec<Value> = (0..PUSHES)
        .map(|i| {
            let terminal = &c.ids()[i % c.ids().len()];
            json!({"terminal": terminal, "idempotency_key": format!("b-{i}"), "body": format!("{{\"n\":{i}}}"), "content_type": "application/json"})
        })
        .collect();
    let request = json!({ "pushes": pushes });
    let entry = 0;
    let before = peer_batches(&c, &http).await;
    let (status, body) = batch(&http, &c.urls[entry], ACME, &request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let results = body["results"].as_array().expect("results");
    assert_eq!(results.len(), PUSHES);
    let mut by_pod: BTreeMap<String, usize> = BTreeMap::new();
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["status"], 200, "push {i}: {r}");
        let answer = &r["answer"];
        assert_eq!(answer["idempotency_key"], format!("b-{i}"), "{r}");
        assert_eq!(
            answer["terminal"],
            c.ids()[i % c.ids().len()].as_str(),
            "{r}"
        );
        // The pod that delivered is the terminal's owner.
        let owner = c.owner_of(answer["terminal"].as_str().unwrap()).unwrap();
        assert_eq!(answer["pod"], owner.as_str(), "{r}");
        *by_pod.entry(owner).or_default() += 1;
    }
    let counters = c.farm.counters();
    assert_eq!(counters.pushes_accepted, PUSHES as u64, "{counters:?}");
    assert_eq!(counters.keys_delivered_twice, 0);
    // Every other owner got its share in one peer request; the entry pod sent none to
    // itself.
    let after = peer_batches(&c, &http).await;
    let entry_id = c.pods[entry]
        .status
        .borrow()
        .pod
        .as_ref()
        .unwrap()
        .to_string();
    for (i, url) in c.urls.iter().enumerate() {
        let (batches, items) = (after[i].0 - before[i].0, after[i].1 - before[i].1);
        let pod = c.pods[i].status.borrow().pod.as_ref().unwrap().to_string();
        let share = by_pod.get(&pod).copied().unwrap_or(0);
        if pod == entry_id {
            assert_eq!((batches, items), (0.0, 0.0), "{url}");
        } else {
            assert!(share > 0, "{pod} owns some of 500 terminals");
            assert_eq!((batches, items), (1.0, share as f64), "{url}: {pod}");
        }
    }
    eprintln!("[batch] {PUSHES} pushes delivered per owner: {by_pod:?}");

    // The same batch again, through another pod: every push answered from the owners'
    // kept answers (the first answer again), none delivered again.
    let replays_before = replays(&c, &http).await;
    let (status, again) = batch(&http, &c.urls[1], ACME, &request).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    let again = again["results"].as_array().unwrap();
    for (i, (r, first)) in again.iter().zip(results).enumerate() {
        assert_eq!(r["status"], 200, "push {i}: {r}");
        for field in ["pod", "epoch", "idempotency_key", "pos_status"] {
            assert_eq!(r["answer"][field], first["answer"][field], "push {i}: {r}");
        }
    }
    assert_eq!(replays(&c, &http).await - replays_before, PUSHES as f64);
    let counters = c.farm.counters();
    assert_eq!(counters.pushes_accepted, PUSHES as u64, "{counters:?}");
    assert_eq!(counters.keys_delivered_twice, 0);
}

/// One terminal that answers 5 s late does not hold the batch: the others are answered
/// `200`, it gets `504 pos_timeout` at the batch's deadline, and the answer comes then,
/// not when the slow terminal answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_slow_terminal_does_not_hold_the_others_past_their_deadline() {
    let c = Cluster::start(3, 60, &[], PushConfig::default()).await;
    let ids = c.ids();
    let slow = ids[0].clone();
    c.farm
        .set_faults(posgate_pos_sim::FaultConfig {
            answer_delay_ms: 5_000,
            slow_terminals: vec![slow.clone()],
            ..Default::default()
        })
        .unwrap();
    let pushes: Vec<Value> = ids
        .iter()
        .map(|t| json!({"terminal": t, "idempotency_key": format!("slow-{t}"), "body": "{}"}))
        .collect();
    let request = Request::post(format!("{}/v1/pushes?timeout_ms=1000", c.urls[0]))
        .header("authorization", format!("Bearer {ACME}"))
        .body(Full::new(
            serde_json::to_vec(&json!({ "pushes": pushes }))
                .unwrap()
                .into(),
        ))
        .unwrap();
    let started = std::time::Instant::now();
    let (status, _, body) = api::send(&client(), request).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{body}");
    for (t, r) in ids.iter().zip(body["results"].as_array().unwrap()) {
        if *t == slow {
            assert_eq!(r["status"], 504, "{r}");
            assert_eq!(r["answer"]["delivery"], "unknown", "{r}");
        } else {
            assert_eq!(r["status"], 200, "{t}: {r}");
        }
    }
    // The deadline is 1 s; the slow terminal answers after 5 s.
    assert!(
        took < Duration::from_millis(3_500),
        "answered after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_without_the_batch_route_gets_the_pushes_one_by_one() {
    const PUSHES: usize = 200;
    let c = Cluster::start_tapped(3, 100).await;
    // Every pod answers the peer batch route 404, as a pod of the previous release would
    // if it were sent one: nothing acted on, so each push goes again on its own.
    for tap in &c.taps {
        tap.unknown_route(PUSH_BATCH_ROUTE);
    }
    let http = client();
    let pushes: Vec<Value> = (0..PUSHES)
        .map(|i| json!({"terminal": c.ids()[i % c.ids().len()], "idempotency_key": format!("old-{i}"), "body": "{}"}))
        .collect();
    let (status, body) = batch(&http, &c.urls[0], ACME, &json!({ "pushes": pushes })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (i, r) in body["results"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["status"], 200, "push {i}: {r}");
    }
    let counters = c.farm.counters();
    assert_eq!(counters.pushes_accepted, PUSHES as u64, "{counters:?}");
    assert_eq!(counters.keys_delivered_twice, 0);
    let captured: Vec<_> = c.taps.iter().flat_map(|t| t.captured()).collect();
    let refused = captured
        .iter()
        .filter(|x| x.target == PUSH_BATCH_ROUTE)
        .count();
    let alone = captured
        .iter()
        .filter(|x| x.target.starts_with("/internal/v1/push/"))
        .count();
    // Pod 0 sent its two peers one batch each, then their pushes one by one.
    assert_eq!(refused, 2, "{captured:?}");
    let forwarded = (0..PUSHES)
        .filter(|i| c.owner_index(&c.ids()[i % c.ids().len()]) != 0)
        .count();
    assert_eq!(alone, forwarded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_push_is_its_own_result_and_a_token_reaches_only_what_it_may() {
    let c = Cluster::start(2, 20, &[], PushConfig::default()).await;
    let http = client();
    let ids = c.ids();
    let request = json!({"pushes": [
        {"terminal": ids[0], "idempotency_key": "ok-0", "body": "{}"},
        {"terminal": "bad id!", "body": "{}"},
        {"terminal": ids[1], "body": "{}", "body_base64": "e30="},
        {"terminal": ids[2], "body_base64": "not base64!"},
        {"terminal": ids[3], "idempotency_key": "ok-3", "body_base64": "AAECAw=="},
        {"terminal": "nowhere-7", "body": "{}"},
        {"terminal": ids[4], "collapse_key": "menu", "body": "{}"},
        {"terminal": ids[15], "idempotency_key": "far", "body": "{}"},
    ]});
    let (status, body) = batch(&http, &c.urls[0], ACME, &request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let statuses: Vec<u64> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 400, 400, 400, 200, 404, 400, 200], "{body}");
    assert_eq!(body["results"][1]["answer"]["error"], "invalid_request");
    assert_eq!(body["results"][5]["answer"]["error"], "unknown_terminal");

    // shop's token reaches pos-0000? only: the rest of its batch is 403, per push.
    let request = json!({"pushes": [
        {"terminal": ids[0], "idempotency_key": "shop-0", "body": "{}"},
        {"terminal": ids[15], "idempotency_key": "shop-15", "body": "{}"},
    ]});
    let (status, body) = batch(&http, &c.urls[1], SHOP, &request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["results"][0]["status"], 200, "{body}");
    assert_eq!(body["results"][1]["status"], 403, "{body}");
    let taken = c.farm.terminal_report(&ids[15]).unwrap().recent_pushes;
    assert!(
        taken.iter().all(|p| !p.idempotency_key.contains("shop")),
        "{taken:?}"
    );

    // Refused whole: an operator token, no pushes, too many, not JSON, unknown fields.
    let one = json!({"terminal": ids[0], "body": "{}"});
    let too_many = json!({"pushes": vec![one.clone(); 1_001]});
    for (token, body, want) in [
        (
            OPERATOR,
            json!({"pushes": [one.clone()]}),
            StatusCode::FORBIDDEN,
        ),
        (ACME, json!({"pushes": []}), StatusCode::BAD_REQUEST),
        (ACME, too_many, StatusCode::BAD_REQUEST),
        (
            ACME,
            json!({"items": [one.clone()]}),
            StatusCode::BAD_REQUEST,
        ),
        (ACME, json!([one.clone()]), StatusCode::BAD_REQUEST),
    ] {
        let (status, answer) = batch(&http, &c.urls[0], token, &body).await;
        assert_eq!(status, want, "{answer}");
    }
    let request = Request::post(format!("{}/v1/pushes", c.urls[0]))
        .header("authorization", format!("Bearer {ACME}"))
        .body(Full::new("{".into()))
        .unwrap();
    let (status, _, answer) = api::send(&http, request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (status, _) = api::get(&http, &format!("{}/v1/pushes", c.urls[0]), Some(ACME)).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}
