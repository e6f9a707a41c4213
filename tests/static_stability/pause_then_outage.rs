//! A `posgate serve` process frozen (SIGSTOP) while it holds its shards through a store
//! outage, its shards taken by the other pod once the store is back, woken (SIGCONT)
//! into a second outage: the gap in its clock says it was paused, so it gives its held
//! shards up instead of asking its peers for a verdict and delivering on old epochs.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use posgate::core::shard::shard_of;
use posgate::core::ShardId;
use posgate_loadtest::load::unix_ms;

use super::{assert_no_silent_duplicate, fast, RATE, TERMINALS};
use crate::support::binary::{self, BinPod};
use crate::support::farm::{self, connect_limit, Farm};
use crate::support::gateway::{open_loop, summary};
use crate::support::pod::SHARDS;
use crate::support::wait::{secs, wait_for_async};
use crate::support::RedisServer;

/// Both pods answer and together serve every shard, each some.
async fn split(a: &BinPod, b: &BinPod) -> bool {
    match (a.serving().await, b.serving().await) {
        (Some(x), Some(y)) => {
            !x.is_empty() && !y.is_empty() && x.len() + y.len() == SHARDS as usize
        }
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_frozen_past_its_ttl_and_woken_into_an_outage_delivers_nothing() {
    let test = "pause-outage";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let mut config = farm::config(TERMINALS);
    // A frozen pod cannot answer GOAWAY: the terminal closes a superseded session itself
    // after its grace, kept below the 1 s session-overlap threshold.
    config.supersede_grace = Duration::from_millis(500);
    let t = Farm::with_directory(&redis, config).await;
    let mut a = binary::terminal_pod("pause-pod-a", &redis.url(), &t.ca_file, t.dir.path(), &[]);
    let mut b = binary::terminal_pod("pause-pod-b", &redis.url(), &t.ca_file, t.dir.path(), &[]);
    let took = wait_for_async(
        "both pods serving and every terminal settled",
        connect_limit() + Duration::from_secs(5),
        || async { split(&a, &b).await && t.all_settled() },
    )
    .await;
    let a_shards: BTreeMap<ShardId, u64> = a.serving().await.unwrap().into_iter().collect();
    let a_terminals: Vec<(String, u64)> = t
        .ids
        .iter()
        .filter_map(|id| Some((id.clone(), *a_shards.get(&shard_of(id, SHARDS))?)))
        .collect();
    eprintln!(
        "[{test}] settled after {:.3} s: pod a serves {} shards ({} terminals)",
        secs(took),
        a_shards.len(),
        a_terminals.len()
    );
    // Pushes through pod b only: a frozen pod is out of the Service's endpoints.
    let targets = Arc::new(RwLock::new(vec![("pause-pod-b".to_string(), b.url())]));
    let load = open_loop(targets, RATE, TERMINALS, test);

    // Outage 1: both pods hold their shards past the TTL (cluster-wide verdict).
    redis.freeze();
    tokio::time::sleep(fast().lease_ttl + Duration::from_secs(1)).await;
    let held = a.serving().await.map(|s| s.len());
    eprintln!(
        "[{test}] {:.1} s into outage 1 pod a still serves {held:?} shards",
        secs(fast().lease_ttl + Duration::from_secs(1))
    );
    assert_eq!(
        held,
        Some(a_shards.len()),
        "pod a holds and serves its shards through the outage"
    );

    // Pod a frozen; the outage ends; pod b takes pod a's shards with higher epochs.
    a.signal("-STOP");
    let frozen = Instant::now();
    redis.thaw();
    let took_over = wait_for_async(
        "pod b to serve every shard, every terminal settled above pod a's epochs",
        Duration::from_secs(25),
        || async {
            b.serving().await.map(|s| s.len()) == Some(SHARDS as usize)
                && t.all_settled()
                && a_terminals.iter().all(|(id, old)| {
                    t.terminal_report(id)
                        .is_some_and(|r| r.highest_epoch > Some(*old))
                })
        },
    )
    .await;
    eprintln!(
        "[{test}] pod a frozen, Redis back: pod b took every shard over {:.3} s later",
        secs(took_over)
    );

    // Outage 2 begins while pod a is still frozen; pod b, alone in the membership, holds.
    redis.freeze();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before_wake = t.counters();
    let woke = unix_ms();
    a.signal("-CONT");
    eprintln!(
        "[{test}] pod a woken {:.3} s after SIGSTOP, into outage 2",
        secs(frozen.elapsed())
    );
    // Straight away, a push through pod a to every terminal it served before.
    let pushes: Vec<_> = a_terminals
        .iter()
        .map(|(id, _)| {
            let (port, id) = (a.port, id.clone());
            tokio::spawn(async move { binary::push(port, &id, &format!("wake-{id}")).await })
        })
        .collect();
    // Long enough for pod a to probe pod b, judge, and act on any verdict.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let b_serves = b.serving().await.map(|s| s.len());
    redis.thaw();
    let mut statuses = BTreeMap::<String, usize>::new();
    for push in pushes {
        let status = push.await.unwrap();
        let label = status.map_or("no answer".to_string(), |s| s.to_string());
        *statuses.entry(label).or_default() += 1;
    }
    let records = load.stop().await;
    a.assert_running();
    b.assert_running();

    let a_id = "pause-pod-a";
    let delivered_by_a: Vec<String> = t
        .ids
        .iter()
        .flat_map(|id| {
            let report = t.terminal_report(id).unwrap();
            report
                .recent_pushes
                .iter()
                .filter(|p| p.pod == a_id && p.at_unix_ms >= woke)
                .map(|p| format!("{id}: {} at epoch {}", p.idempotency_key, p.epoch))
                .collect::<Vec<_>>()
        })
        .collect();
    let refused_a: Vec<_> = t
        .refusals()
        .refusals
        .into_iter()
        .filter(|r| r.pod == a_id && r.at_unix_ms >= woke)
        .collect();
    let paused_lines = a.log_lines_with(&["shard ownership changed", "\"paused\""]);
    let end = t.counters();
    eprintln!(
        "[{test}] after the wake: {} pushes through pod a answered {statuses:?}; pushes \
         accepted from pod a: {}; hellos or pushes of pod a refused: {}; pod a logged {} \
         shards given up as paused; pod b served {b_serves:?} shards in outage 2; {}",
        a_terminals.len(),
        delivered_by_a.len(),
        refused_a.len(),
        paused_lines.len(),
        end.changes_since(&before_wake)
    );
    summary(test, "through pod b, in all", &records);
    assert!(
        delivered_by_a.is_empty(),
        "pod a delivered after waking: {delivered_by_a:?}"
    );
    assert!(
        refused_a.is_empty(),
        "pod a sent hellos or pushes on its old epochs after waking: {:?}",
        &refused_a[..refused_a.len().min(5)]
    );
    assert_eq!(
        b_serves,
        Some(SHARDS as usize),
        "pod b holds through outage 2"
    );
    assert_eq!(end.session_overlaps, 0, "session overlaps");
    assert_no_silent_duplicate(&t, &records, test);
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}
