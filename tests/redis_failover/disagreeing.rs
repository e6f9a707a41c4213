//! Sentinels that disagree: one still names the old master (a sentinel cut off from a
//! failover), one names the new, and both nodes answer `ROLE` as masters (an old master
//! cut off from its sentinels but not from the pod). The store takes the view with the
//! highest config epoch, whichever sentinel answers first, and only that one: when its
//! master does not answer, it finds no master rather than the old one. A sentinel whose
//! ACL refuses the epoch is still used.

use std::time::Duration;

use posgate::core::PodId;
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate::store::CoordStore;
use posgate_loadtest::load::sentinels;

use crate::support::leases;
use crate::support::redis_ha::LoneSentinel;
use crate::support::RedisServer;

/// Generous: a sentinel that missed the deadline would drop out of the answers.
fn options() -> RedisOptions {
    RedisOptions {
        response_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

/// Connects through `url` as `cluster`, takes a lease and says which of `nodes` holds
/// it (`EXISTS` of its key on each).
async fn lease_written_on(url: &str, cluster: &str, nodes: &[&RedisServer]) -> Vec<String> {
    let store = RedisStore::connect(url, cluster, options())
        .await
        .expect("connect through the sentinels");
    let generation = store.snapshot(4).await.unwrap().generation.id;
    let pod = PodId::new("a").unwrap();
    leases::acquire(&store, &generation, &pod, &[0], Duration::from_secs(30))
        .await
        .unwrap();
    let key = format!("posgate:{{{cluster}}}:lease:0");
    nodes.iter().map(|n| n.command(&["EXISTS", &key])).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_writes_where_the_newest_sentinel_view_says() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let stale = LoneSentinel::start(old.port(), 0);
    let current = LoneSentinel::start(new.port(), 7);
    // The stale sentinel first in the URL: on an idle machine it tends to answer first,
    // so a resolver that took the first answer would write to the old master.
    let url = sentinels::url([stale.port(), current.port()]);
    for round in 0..8 {
        let written = lease_written_on(&url, &format!("views{round}"), &[&old, &new]).await;
        assert_eq!(
            written,
            [":0", ":1"],
            "round {round}: the lease went to the master of the older view"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_master_is_not_taken_when_the_newest_one_does_not_answer() {
    let old = RedisServer::start();
    // The master of the newest view is gone (or out of this pod's reach).
    let gone = RedisServer::start();
    let gone_port = gone.port();
    drop(gone);
    let stale = LoneSentinel::start(old.port(), 0);
    let current = LoneSentinel::start(gone_port, 7);
    let url = sentinels::url([stale.port(), current.port()]);
    let Err(err) = RedisStore::connect(&url, "gone", options()).await else {
        panic!("no master: the old one must not be taken");
    };
    assert!(err.to_string().contains("config epoch 7"), "{err}");
    assert_eq!(old.command(&["DBSIZE"]), ":0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_that_refuses_the_epoch_is_still_used() {
    let node = RedisServer::start();
    // An ACL written for the address lookup alone, as a locked-down deployment may have.
    let acl = "user default on nopass ~* &* +@all -sentinel|master\n";
    let sentinel = LoneSentinel::start_with(node.port(), acl);
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", sentinel.port())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let refused: redis::RedisResult<redis::Value> = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(crate::support::redis_ha::MASTER)
        .query_async(&mut conn)
        .await;
    assert!(
        refused.as_ref().is_err_and(|e| e.code() == Some("NOPERM")),
        "the ACL must refuse it: {refused:?}"
    );
    let url = sentinels::url([sentinel.port()]);
    assert_eq!(lease_written_on(&url, "acl", &[&node]).await, [":1"]);
}
