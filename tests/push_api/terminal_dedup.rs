//! A key that reaches a terminal a second time, because the owner's idempotency cache
//! was lost with a crash and restart of the owner, is not taken twice: the terminal answers with
//! the duplicate marker (`docs/pos-protocol.md` §5), the caller gets `"duplicate": true`
//! through the forwarding pod, and the owner that heard the marker counts it.

use std::time::Duration;

use http::StatusCode;
use posgate::push::PushConfig;

use super::{acme_keyed, start_pod, Cluster};
use crate::support::api::{self, client, push};
use crate::support::wait::wait_for;

const KEY: &str = "order-dup";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_retried_after_the_owner_crashed_is_answered_as_a_duplicate() {
    let mut c = Cluster::start(2, 50, &[], PushConfig::default()).await;
    let http = client();
    let t = c.ids()[0].clone();
    let keyed = || acme_keyed(KEY);

    // First attempt, through the pod that does not own the terminal: delivered, new.
    let owner = c.owner_index(&t);
    let (status, _, body) = push(&http, &c.urls[1 - owner], &t, keyed()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["duplicate"], false, "{body}");

    // The owner crashes and restarts (a new process: a new pod id, an empty idempotency
    // cache). A crash hands nothing over; a graceful stop would hand its kept answers to
    // the next owner (`kept_answers.rs`).
    c.pods[owner].abort();
    let name = format!("push-pod-{owner}-restarted");
    let (restarted, url) = start_pod(&name, &c.redis.url(), &c.farm, PushConfig::default()).await;
    c.pods[owner] = restarted;
    c.urls[owner] = url;
    let terminals = c.ids().len() as u64;
    wait_for(
        "the cluster to settle again",
        Duration::from_secs(30),
        || c.settled() && c.farm.counters().terminals_connected >= terminals,
    )
    .await;

    // The caller retries the same key through the pod that does not own the terminal now.
    // No cache knows the key, so it reaches the terminal again, which does not take it
    // twice and says so; the forwarder relays the mark.
    let owner = c.owner_index(&t);
    let (status, _, body) = push(&http, &c.urls[1 - owner], &t, keyed()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["duplicate"], true, "{body}");
    assert_eq!(body["pod"].as_str(), c.owner_of(&t).as_deref(), "{body}");
    let counters = c.farm.counters();
    assert_eq!(
        (counters.keys_delivered_twice, counters.duplicate_deliveries),
        (1, 1),
        "{counters:?}"
    );

    // Counted once, by the owner that heard the marker; a replay of its stored answer
    // (still a duplicate) is not counted again.
    let (status, _, body) = push(&http, &c.urls[owner], &t, keyed()).await;
    assert_eq!((status, &body["duplicate"]), (StatusCode::OK, &true.into()));
    let duplicates = |text: &str| api::scraped(text, "posgate_push_duplicates_total");
    let at_owner = api::metrics(&http, &c.urls[owner]).await;
    assert_eq!(duplicates(&at_owner), 1.0);
    assert_eq!(api::scraped(&at_owner, "posgate_push_replays_total"), 1.0);
    let elsewhere = api::metrics(&http, &c.urls[1 - owner]).await;
    assert_eq!(duplicates(&elsewhere), 0.0);
    assert_eq!(c.farm.counters().duplicate_deliveries, 1);
}
