//! `posgate terminals import|remove|count` through a `redis+sentinel://` URL: each run
//! resolves the master through the sentinels, so an operator's command written before a
//! failover works unchanged after it, against the promoted master.

use std::time::Duration;

use crate::cli_terminals::{count, good_csv, ok, write};
use crate::support::redis_ha::{HaOptions, RedisHa};

/// Runs a blocking CLI call off the runtime's workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_commands_follow_the_master_through_a_failover() {
    let (ha, _first) = RedisHa::start(HaOptions::default()).await;
    let url = ha.url();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "terminals.csv", &good_csv(200));
    let (u, f) = (url.clone(), file.clone());
    let out = blocking(move || ok(&u, &["import", f.to_str().unwrap()])).await;
    assert!(
        out.starts_with("imported 200 terminals (200 added"),
        "{out}"
    );
    ha.wait_replicated(2).await;

    let old = ha.master_addr().await;
    ha.failover().await;
    let (new, _) = ha.wait_failed_over(&old, Duration::from_secs(30)).await;
    // Until every sentinel names the new master and the old one is demoted, a command
    // may still be sent to the old one and its write be lost with it (what an operator
    // avoids by waiting, or by `min-replicas-to-write`: docs/operations.md).
    ha.wait_settled(&old, &new, Duration::from_secs(30)).await;

    // The same URL now reaches the promoted master: the import is there, and a removal
    // is written to it (read back straight from that node, not through the sentinels).
    let u = url.clone();
    assert_eq!(blocking(move || count(&u)).await, 200);
    let u = url.clone();
    let out = blocking(move || ok(&u, &["remove", "pos-0001", "pos-0002"])).await;
    assert!(out.starts_with("removed 2 terminals"), "{out}");
    let direct = format!("redis://{new}");
    assert_eq!(blocking(move || count(&direct)).await, 198);
}
