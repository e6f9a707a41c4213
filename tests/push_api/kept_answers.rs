//! A shard's kept push answers move with it in a planned move (`push::handover`): the
//! owner of a terminal shuts down gracefully, the pod that takes the shard over asks it
//! for the answers it kept, and the caller's retry of a key delivered before the move is
//! answered from the new owner's cache — the terminal never sees the key again.

use std::time::Duration;

use http::StatusCode;
use posgate::push::PushConfig;

use super::{acme_keyed, Cluster};
use crate::support::api::{self, client, push};
use crate::support::pod;
use crate::support::wait::wait_for;

const KEY: &str = "order-moved";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_retried_across_a_planned_move_is_answered_from_the_kept_answers() {
    let mut c = Cluster::start(2, 50, &[], PushConfig::default()).await;
    let http = client();
    let t = c.ids()[0].clone();
    let keyed = || acme_keyed(KEY);
    let owner = c.owner_index(&t);
    let other = 1 - owner;
    let (status, _, first) = push(&http, &c.urls[other], &t, keyed()).await;
    assert_eq!(status, StatusCode::OK, "{first}");

    // The owner shuts down gracefully: its shards move to the other pod.
    c.pods[owner].shutdown();
    tokio::time::timeout(Duration::from_secs(15), c.pods[owner].wait())
        .await
        .expect("the owner stops within 15 s")
        .expect("a clean stop");
    wait_for(
        "the survivor to serve every shard",
        Duration::from_secs(30),
        || pod::settled([&c.pods[other]]),
    )
    .await;

    // The retry is the answer the old owner gave, replayed by the new one: not a
    // duplicate at the terminal, which saw the key once.
    let (status, _, body) = push(&http, &c.urls[other], &t, keyed()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["duplicate"], false, "{body}");
    assert_eq!(
        body["epoch"], first["epoch"],
        "the old owner's answer: {body}"
    );
    let counters = c.farm.counters();
    assert_eq!(
        (counters.keys_delivered_twice, counters.duplicate_deliveries),
        (0, 0),
        "{counters:?}"
    );
    let metrics = api::metrics(&http, &c.urls[other]).await;
    assert_eq!(api::scraped(&metrics, "posgate_push_replays_total"), 1.0);
    let taken = r#"posgate_kept_answers_handoffs_total{outcome="taken"}"#;
    assert!(api::scraped(&metrics, taken) >= 1.0, "{metrics}");
    assert!(api::scraped(&metrics, "posgate_kept_answers_taken_total") >= 1.0);
}
