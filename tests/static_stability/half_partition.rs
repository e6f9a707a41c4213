//! Half the pods cut off from Redis (a `RedisProxy` each), not from each other or the
//! terminals, under open-loop pushes through every pod: the cut-off half hears peers
//! that reach the store, so it is a minority and gives up by its deadline; the rest take
//! the shards over with higher epochs.

use std::time::{Duration, Instant};

use posgate_loadtest::load::unix_ms;

use super::{assert_no_key_twice, fast, RATE, TERMINALS};
use crate::support::farm::{self, Farm};
use crate::support::gateway::{open_loop, sent_between, summary, Gateway};
use crate::support::pod;
use crate::support::wait::{secs, wait_for};

/// Terminals whose accepted pushes (the farm keeps each terminal's last 32) went back to
/// an older epoch after a newer one: two sessions of different epochs delivered.
fn epochs_gone_back(farm: &Farm) -> Vec<String> {
    let mut back = Vec::new();
    for id in &farm.ids {
        let report = farm.terminal_report(id).unwrap();
        let mut pushes = report.recent_pushes.clone();
        pushes.sort_by_key(|p| p.at_unix_ms);
        for pair in pushes.windows(2) {
            if pair[1].epoch < pair[0].epoch {
                back.push(format!(
                    "{id}: {} at epoch {} after {} at epoch {}",
                    pair[1].idempotency_key, pair[1].epoch, pair[0].idempotency_key, pair[0].epoch
                ));
            }
        }
    }
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn half_the_pods_cut_off_from_redis_give_up_and_the_rest_take_over() {
    const PODS: usize = 4;
    let test = "half-cut";
    let test_started = Instant::now();
    let gw = Gateway::start(PODS, farm::config(TERMINALS), test).await;
    let (cut, kept) = (0..PODS / 2, PODS / 2..PODS);
    let owners = gw.owners();
    let before = gw.farm.counters();
    let load = open_loop(gw.all_targets(), RATE, TERMINALS, test);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let cut_at = Instant::now();
    let cut_ms = unix_ms();
    for p in &gw.pods[cut.clone()] {
        p.proxy().cut();
    }
    // Given up: neither serving nor holding a shard, as the cut-off pods' drivers say.
    let holds_nothing = |i: usize| {
        let status = gw.pods[i].handle.status.borrow();
        status.shards.iter().all(|s| !s.serving && !s.suspended)
    };
    let gave_up = wait_for(
        "the cut-off pods to give up every shard",
        Duration::from_secs(10),
        || cut.clone().all(holds_nothing),
    )
    .await;
    let survivors: Vec<_> = gw.pods[kept.clone()].iter().map(|p| &p.handle).collect();
    wait_for(
        "the other half to serve every shard with every terminal current",
        Duration::from_secs(20),
        || pod::settled(survivors.iter().copied()) && gw.farm.all_sessions_current(&survivors),
    )
    .await;
    let took_over = cut_at.elapsed();
    let taken = unix_ms();
    let deadline = fast().serve_window();
    eprintln!(
        "[{test}] {} of {PODS} pods cut off from Redis: they gave up every shard {:.3} s after \
         the cut (deadline: the last renewal + {:.1} s); the others serve every shard, every \
         terminal current, {:.3} s after the cut (takeover)",
        PODS / 2,
        secs(gave_up),
        secs(deadline),
        secs(took_over)
    );
    assert!(
        gave_up <= deadline + Duration::from_millis(500),
        "the cut-off half gave up {:.3} s after the cut, past its deadline",
        secs(gave_up)
    );
    let after_owners = gw.owners();
    let cut_ids: Vec<_> = gw.pods[cut.clone()].iter().map(|p| p.id.clone()).collect();
    let kept_ids: Vec<String> = gw.pods[kept.clone()]
        .iter()
        .map(|p| p.id.to_string())
        .collect();
    for (shard, (pod, epoch)) in &owners {
        if cut_ids.contains(pod) {
            let (new_pod, new_epoch) = &after_owners[shard];
            assert!(
                new_epoch > epoch,
                "shard {shard}: taken over by {new_pod} with epoch {new_epoch}, not above \
                 {pod}'s {epoch}"
            );
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ended = unix_ms();
    let pushes = load.stop().await;
    summary(
        test,
        "sent from the cut to the takeover",
        &sent_between(&pushes, cut_ms, taken),
    );
    let after = sent_between(&pushes, taken, ended);
    let (through_kept, through_cut): (Vec<_>, Vec<_>) = after
        .iter()
        .cloned()
        .partition(|p| kept_ids.contains(&p.first.entry_pod));
    let after = summary(test, "sent after the takeover", &after);
    let through_kept = summary(
        test,
        "sent after the takeover through the pods that reach Redis",
        &through_kept,
    );
    // A cut-off pod still routes by the owners it last knew, so where its own shards
    // moved it finds no owner and answers 503 at the deadline; the sender's retry through
    // another pod is what delivers those.
    summary(
        test,
        "sent after the takeover through the cut-off pods",
        &through_cut,
    );
    summary(test, "sent in all", &pushes);
    assert!(after.sent > 0 && through_kept.sent > 0);
    assert!(
        after.final_ok_ratio >= 0.99,
        "{:.2}% of the pushes sent after the takeover answered 200 (with retries): {:?}",
        100.0 * after.final_ok_ratio,
        after.by_final_outcome
    );
    assert!(
        through_kept.ok_ratio >= 0.99,
        "{:.2}% of the pushes sent after the takeover through the pods that reach Redis \
         answered 200 first time: {:?}",
        100.0 * through_kept.ok_ratio,
        through_kept.by_outcome
    );
    let end = gw.farm.counters();
    eprintln!("[{test}] farm: {}", end.changes_since(&before));
    assert_eq!(end.session_overlaps, 0, "session overlaps");
    assert_eq!(end.terminals_connected, TERMINALS);
    assert_no_key_twice(&gw.farm, &pushes, test);
    let back = epochs_gone_back(&gw.farm);
    assert!(
        back.is_empty(),
        "older epochs delivered after newer: {back:?}"
    );
    gw.assert_no_overlap(test);
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}
