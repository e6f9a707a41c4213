//! A `posgate serve` process SIGSTOPped past its lease TTL and resumed.

use std::time::{Duration, Instant};

use posgate::core::shard::shard_of;
use posgate::core::ShardId;

use crate::support::binary::{self, BinPod};
use crate::support::farm::{self, connect_limit, Farm};
use crate::support::pod::SHARDS;
use crate::support::wait::{secs, wait_for_async};
use crate::support::RedisServer;

// ----- `posgate serve` processes ------------------------------------------------------------

/// Shards served by each pod (`None` for a pod that did not answer).
async fn serving_of(pods: &[&BinPod]) -> Vec<Option<Vec<(ShardId, u64)>>> {
    let mut out = Vec::new();
    for pod in pods {
        out.push(pod.serving().await);
    }
    out
}

/// Waits until the two binary pods `a` and `b` both serve shards, together all of them,
/// and every terminal of `t` is settled; how long it took.
async fn both_serving_and_settled(
    a: &BinPod,
    b: &BinPod,
    t: &Farm,
    what: &str,
    limit: Duration,
) -> Duration {
    wait_for_async(what, limit, || async {
        let views = serving_of(&[a, b]).await;
        let counts: Vec<usize> = views.iter().flatten().map(Vec::len).collect();
        counts.len() == 2
            && counts.iter().all(|&c| c > 0)
            && counts.iter().sum::<usize>() == SHARDS as usize
            && t.all_settled()
    })
    .await
}

// ----- 5. a pod SIGSTOPped past its TTL ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_stopped_past_its_ttl_and_resumed_causes_no_session_overlap() {
    const N: u64 = 300;
    let test = "sigstop";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let mut config = farm::config(N);
    // A frozen pod cannot answer GOAWAY: the terminal closes a superseded session itself
    // after its grace period. Keep that grace below the 1 s session-overlap threshold, as
    // the protocol asks of terminals ("closes its older sessions").
    config.supersede_grace = Duration::from_millis(500);
    let t = Farm::with_directory(&redis, config).await;
    let mut a = binary::terminal_pod("stop-pod-a", &redis.url(), &t.ca_file, t.dir.path(), &[]);
    let mut b = binary::terminal_pod("stop-pod-b", &redis.url(), &t.ca_file, t.dir.path(), &[]);

    let startup = Instant::now();
    while startup.elapsed() < connect_limit() + Duration::from_secs(5)
        && !(a.serving().await.is_some() && b.serving().await.is_some())
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if a.serving().await.is_none() || b.serving().await.is_none() {
        a.assert_running();
        b.assert_running();
        panic!("no /v1/cluster answer; logs:\n{}\n{}", a.log(), b.log());
    }
    let took = both_serving_and_settled(
        &a,
        &b,
        &t,
        "both pods serving and every terminal settled",
        connect_limit() + Duration::from_secs(5),
    )
    .await;
    a.assert_running();
    b.assert_running();
    let a_shards = a.serving().await.unwrap();
    let a_terminals: Vec<(String, u64)> = t
        .ids
        .iter()
        .filter_map(|id| {
            let shard = shard_of(id, SHARDS);
            a_shards
                .iter()
                .find(|(s, _)| *s == shard)
                .map(|&(_, epoch)| (id.clone(), epoch))
        })
        .collect();
    let before = t.counters();
    eprintln!(
        "[{test}] settled after {:.3} s: pod a serves {} shards ({} terminals); {before:?}",
        secs(took),
        a_shards.len(),
        a_terminals.len()
    );
    assert_eq!(before.session_overlaps, 0);

    // Freeze pod a for the lease TTL + 4 s.
    let frozen = Instant::now();
    a.signal("-STOP");
    let took_over = wait_for_async(
        "pod b to serve every shard and every terminal to be settled",
        Duration::from_secs(20),
        || async { b.serving().await.map(|s| s.len()) == Some(SHARDS as usize) && t.all_settled() },
    )
    .await;
    let pause = Duration::from_secs(3 + 4);
    if frozen.elapsed() < pause {
        tokio::time::sleep(pause - frozen.elapsed()).await;
    }
    let during = t.counters();
    eprintln!(
        "[{test}] pod a frozen: pod b serves all shards, every terminal settled {:.3} s after \
         SIGSTOP; {}",
        secs(took_over),
        during.changes_since(&before)
    );
    for (id, old) in &a_terminals {
        let report = t.terminal_report(id).unwrap();
        assert!(
            report.highest_epoch > Some(*old),
            "{id}: epoch not raised past pod a's {old}: {:?}",
            report.highest_epoch
        );
    }

    // Resume: pod a must not get a session back with its old epochs; it rejoins.
    let resumed = Instant::now();
    a.signal("-CONT");
    // Right after waking, push to every terminal pod a served before the freeze, through
    // pod a itself: none of it may reach a terminal under pod a's old epochs.
    let pushes: Vec<_> = a_terminals
        .iter()
        .map(|(id, _)| {
            let (port, id) = (a.port, id.clone());
            tokio::spawn(async move { binary::push(port, &id, &format!("resume-{id}")).await })
        })
        .collect();
    let took = both_serving_and_settled(
        &a,
        &b,
        &t,
        "both pods serving again and every terminal settled",
        Duration::from_secs(30),
    )
    .await;
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for push in pushes {
        let status = push.await.unwrap();
        let label = status.map_or("no answer".to_string(), |s| s.to_string());
        *statuses.entry(label).or_default() += 1;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.assert_running();
    b.assert_running();
    let mut old_epoch_pushes = Vec::new();
    for (id, old) in &a_terminals {
        let report = t.terminal_report(id).unwrap();
        for p in &report.recent_pushes {
            if p.epoch <= *old {
                old_epoch_pushes.push(format!(
                    "{id}: {} at epoch {} <= {old}",
                    p.idempotency_key, p.epoch
                ));
            }
        }
    }
    eprintln!(
        "[{test}] {} pushes through pod a right after SIGCONT answered {statuses:?}",
        a_terminals.len()
    );
    let end = t.counters();
    let stale_lines_a = a.log_lines_with(&["terminal refused our epoch"]).len();
    let stale_lines_b = b.log_lines_with(&["terminal refused our epoch"]).len();
    eprintln!(
        "[{test}] resumed: converged {:.3} s after SIGCONT (frozen {:.3} s); stale hellos \
         refused {} (pod a logged {stale_lines_a}, pod b {stale_lines_b}), stale pushes \
         refused {}, max session overlap {} ms; {}",
        secs(took),
        secs(resumed - frozen),
        end.stale_hellos_refused,
        end.stale_pushes_refused,
        end.max_session_overlap_ms,
        end.changes_since(&before)
    );
    eprintln!("[{test}] counters: {end:?}");
    assert_eq!(end.session_overlaps, 0, "session overlaps");
    assert_eq!(end.keys_delivered_twice, 0);
    assert!(
        old_epoch_pushes.is_empty(),
        "pushes accepted under pod a's pre-freeze epochs: {old_epoch_pushes:?}"
    );
    assert!(end.pushes_accepted <= a_terminals.len() as u64);
    assert_eq!(
        end.stale_hellos_refused,
        (stale_lines_a + stale_lines_b) as u64,
        "every stale hello the farm refused was seen as a 409 by a pod"
    );
    assert!(t.all_settled());
    assert_eq!(end.connections_open, N);
    a.signal("-TERM");
    b.signal("-TERM");
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}
