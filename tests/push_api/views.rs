//! What the pods show of the cluster of `status_codes` (its settings and farm): the
//! terminal and cluster views from either pod, and `/metrics` after a few requests.

use http::StatusCode;

use super::status_codes::{cluster, keyed};
use super::{acme, ACME, OPERATOR};
use crate::support::api::{self, get, push, Http};
use crate::support::pod::SHARDS;

/// `GET /v1/terminals/{id}` from both pods agrees with the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_terminal_view_from_either_pod_names_the_owner() {
    let (c, http, t) = cluster().await;
    for base in &c.urls {
        let (status, view) = get(&http, &format!("{base}/v1/terminals/{t}"), Some(ACME)).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(view["owner_pod"].as_str(), c.owner_of(&t).as_deref());
        assert_eq!(view["connected"], true);
    }
}

/// The cluster view with every pod's connected counts, from either pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_view_counts_every_connected_terminal_once() {
    let (c, http, _) = cluster().await;
    for base in &c.urls {
        let url = format!("{base}/v1/cluster?include=terminals");
        let (status, view) = get(&http, &url, Some(OPERATOR)).await;
        assert_eq!(status, StatusCode::OK);
        let shards = view["shards"].as_array().unwrap();
        assert_eq!(shards.len(), SHARDS as usize);
        assert!(
            shards.iter().all(|s| s["terminals_connected"].is_u64()),
            "{view}"
        );
        let connected: u64 = shards
            .iter()
            .map(|s| s["terminals_connected"].as_u64().unwrap())
            .sum();
        assert_eq!(
            connected,
            c.ids().len() as u64,
            "every farm terminal, counted once"
        );
    }
}

/// After a push from each pod, a replay and a refused request, `/metrics` has exactly
/// the documented families and the counters of those requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_have_the_documented_families_and_count_the_requests() {
    let (c, http, t) = cluster().await;
    let (a, b) = (&c.urls[0], &c.urls[1]);
    // Pod `a` owns `t` or forwards to its owner; a terminal of the other pod makes both.
    let other = c
        .ids()
        .iter()
        .find(|x| c.owner_of(x) != c.owner_of(&t))
        .expect("a terminal of each pod");
    for terminal in [&t, other] {
        let (status, _, body) = push(&http, a, terminal, acme()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    for base in [a, b] {
        let (status, _, body) = push(&http, base, &t, keyed("metered")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, _, _) = push(&http, a, "bad%20id!", acme()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    check_metrics(&http, a).await;
}

/// The pod's `/metrics` has exactly the families `docs/metrics.md` lists, and the
/// counters of what this test did moved.
async fn check_metrics(http: &Http, base: &str) {
    let text = api::metrics(http, base).await;
    let doc = include_str!("../../docs/metrics.md");
    let documented: std::collections::BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `posgate_"))
        .map(|l| format!("posgate_{}", l.split('`').next().unwrap()))
        .collect();
    let scraped: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        // The classic text format names counter families with `_total`, like the docs.
        .map(|l| l.split_once(' ').unwrap().0.to_string())
        .collect();
    assert_eq!(documented, scraped, "docs/metrics.md vs /metrics");
    for expected in [
        "posgate_push_requests_total{path=\"local\",result=\"ok\"}",
        "posgate_push_requests_total{path=\"forwarded\",result=\"ok\"}",
        "posgate_push_requests_total{path=\"none\",result=\"invalid_request\"}",
        "posgate_push_replays_total",
        "posgate_dials_total{result=\"ok\"}",
        "posgate_dials_total{result=\"refused\"}",
        "posgate_lease_ops_total{op=\"acquire\",outcome=\"acquired\"}",
        "posgate_terminals{state=\"connected\"}",
        "posgate_store_reachable 1",
        "posgate_members 2",
    ] {
        assert!(
            text.contains(expected),
            "{expected} missing from /metrics:\n{text}"
        );
    }
    assert!(!text.contains("pos-0"), "a terminal id leaked into a label");
}
