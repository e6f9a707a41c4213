//! Dark time per moved terminal (issue 15), measured terminal-side, with planned moves
//! handed over per terminal (`pos::handover`: the old owner drains, the new owner asks
//! it to close each terminal right before dialing it): three whole pods (in process,
//! `support::gateway`) over 600 simulated terminals settle, then (a) a fourth pod joins
//! and the shards rebalance, (b) one of the original pods shuts down gracefully, and (c)
//! the three left are replaced one by one (a new pod joins, then an old one leaves), and
//! (d) one pod is stopped and a new one started at once, as a Deployment's rollout
//! step does (the new pod learns whom to ask from the release notes).
//! For each step the farm's dark-interval log (`PosFarm::dark_intervals`) says how long
//! each moved terminal had no connection at all; count, p50, p99 and max are printed
//! (`--nocapture`).
//!
//! Asserts behaviour only, never a time: every terminal of a moved shard went dark and
//! came back (an interval that ended, none still dark), no terminal of a shard that kept
//! its owner went dark, no raw overlap (so a move is always close-then-dial), no shard
//! served by two pods at once, and every moved terminal went through the handover: its
//! new owner asked the old one to close it and dialed it after the answer
//! (`posgate_handover_dark_seconds` counts each such terminal), with no ask failed and
//! no drain ended by its budget.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use posgate::core::shard::shard_of;
use posgate::core::{Epoch, PodId, ShardId};
use posgate::metrics::Exposition;
use posgate_loadtest::load::unix_ms;
use posgate_pos_sim::DarkInterval;

use crate::support::api::scraped;
use crate::support::farm::{self, connect_limit};
use crate::support::gateway::{moved, open_loop, sent_between, summary, Gateway};
use crate::support::pod::SHARDS;
use crate::support::wait::{secs, wait_for};

const TERMINALS: u64 = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_a_leave_and_a_rolling_restart_hand_each_moved_terminal_over_on_its_own() {
    let test = "dark-time";
    let mut gw = Gateway::start(3, farm::config(TERMINALS), test).await;
    wait_for("3 pods balanced", connect_limit(), || gw.balanced()).await;

    let step = Step::begin(&gw);
    let joined = gw.add_pod().await;
    wait_for("the join rebalanced", connect_limit(), || gw.balanced()).await;
    let what = format!("join ({} started)", gw.pods[joined].id);
    step.measure(&gw, test, &what);

    let step = Step::begin(&gw);
    let left = gw.stop_pod(0).await;
    wait_for("the leave rebalanced", connect_limit(), || gw.balanced()).await;
    step.measure(&gw, test, &format!("leave ({left} shut down gracefully)"));

    let step = Step::begin(&gw);
    for _ in 0..gw.pods.len() {
        gw.add_pod().await;
        wait_for("the new pod took its share", connect_limit(), || {
            gw.balanced()
        })
        .await;
        gw.stop_pod(0).await;
        wait_for("the old pod's leave rebalanced", connect_limit(), || {
            gw.balanced()
        })
        .await;
    }
    step.measure(&gw, test, "rolling restart (3 pods replaced one by one)");

    // A Deployment's step: the next pod is created the moment the old one is told to
    // stop, so it registers after the old pod announced its drains to the members it
    // knew. The release notes tell it whom to ask.
    let step = Step::begin(&gw);
    let leaving = gw.begin_stop(0);
    // Once the others saw it leave, it has announced its drains and released its
    // leases: the new pod can learn whom to ask only from the release notes. It joins
    // within the membership debounce, so the placement gives it the leaver's shards.
    wait_for("the others saw the leave", Duration::from_secs(5), || {
        gw.pods.iter().all(|p| {
            let status = p.handle.status.borrow();
            status.members.iter().all(|m| &m.pod != leaving.id())
        })
    })
    .await;
    gw.add_pod().await;
    let left = leaving.gone().await;
    wait_for("the leave and the join rebalanced", connect_limit(), || {
        gw.balanced()
    })
    .await;
    step.measure(
        &gw,
        test,
        &format!("{left} stopped and a pod started at once"),
    );

    gw.assert_no_overlap(test);
}

/// A push for a moved terminal that the new owner has not asked for yet goes out on the
/// old owner's draining session (`HANDOVER_RELAY`), instead of waiting for the close and
/// the new owner's dial: under open-loop pushes through the pod that stays, the other
/// one shuts down gracefully. The pod left relayed pushes through it, every push sent
/// meanwhile was answered 200 in the end, and no terminal had two sessions at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_push_for_a_terminal_not_yet_released_goes_out_on_the_old_owners_session() {
    let test = "relay";
    const N: u64 = 1_000;
    let mut gw = Gateway::start(2, farm::config(N), test).await;
    let load = open_loop(gw.targets([1]), 500.0, N, test);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = gw.farm.counters();
    let began = unix_ms();
    gw.stop_pod(0).await;
    wait_for("the leave rebalanced", connect_limit(), || gw.balanced()).await;
    let ended = unix_ms();
    let pushes = load.stop().await;
    let during = summary(
        test,
        "sent during the leave",
        &sent_between(&pushes, began, ended),
    );
    let metrics = gw.pods[0].handle.metrics.encode(Exposition::OpenMetrics);
    let relays = |outcome: &str| {
        scraped(
            &metrics,
            &format!("posgate_handover_relays_total{{outcome=\"{outcome}\"}}"),
        )
    };
    let (relayed, not_relayed) = (relays("relayed"), relays("not_relayed"));
    eprintln!(
        "[{test}] relayed {relayed}, not relayed {not_relayed}, unknown {}",
        relays("unknown")
    );
    assert!(
        relayed > 0.0,
        "[{test}] no push went out on the old owner's session"
    );
    assert!(
        during.final_ok_ratio >= 0.999,
        "[{test}] {:.2}% of the pushes sent during the leave answered 200: {:?}",
        100.0 * during.final_ok_ratio,
        during.by_final_outcome
    );
    let after = gw.farm.counters();
    assert_eq!(
        after.session_overlaps, before.session_overlaps,
        "[{test}] session overlaps"
    );
    assert_eq!(
        after.raw_overlaps, before.raw_overlaps,
        "[{test}] raw overlaps"
    );
    gw.assert_no_overlap(test);
}

/// What a step starts from.
struct Step {
    started: Instant,
    since_unix_ms: u64,
    owners: BTreeMap<ShardId, (PodId, Epoch)>,
    raw_overlaps: u64,
    /// Per pod running at the start.
    handed_over: BTreeMap<PodId, Handovers>,
}

/// The handover counters, summed over the pods running now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Handovers {
    /// Terminals dialed after their previous owner released them.
    released: f64,
    /// Asks that failed or found the shard not draining.
    fallbacks: f64,
    /// Drains ended by the drain budget.
    budget_ended: f64,
}

impl Handovers {
    /// Each running pod's counters.
    fn of(gw: &Gateway) -> BTreeMap<PodId, Handovers> {
        let mut pods = BTreeMap::new();
        for pod in &gw.pods {
            let text = pod.handle.metrics.encode(Exposition::OpenMetrics);
            let count = |series: &str| scraped(&text, series);
            let counted = Handovers {
                released: count("posgate_handover_dark_seconds_count"),
                fallbacks: count("posgate_handover_releases_total{outcome=\"failed\"}")
                    + count("posgate_handover_releases_total{outcome=\"not_draining\"}"),
                budget_ended: count("posgate_drains_ended_total{how=\"budget\"}"),
            };
            pods.insert(pod.id.clone(), counted);
        }
        pods
    }

    /// What the pods running now counted since `before` (a pod that left takes its
    /// counters with it; one that joined counted from zero).
    fn since(gw: &Gateway, before: &BTreeMap<PodId, Handovers>) -> Handovers {
        let mut sum = Handovers::default();
        for (pod, now) in Handovers::of(gw) {
            let was = before.get(&pod).copied().unwrap_or_default();
            sum.released += now.released - was.released;
            sum.fallbacks += now.fallbacks - was.fallbacks;
            sum.budget_ended += now.budget_ended - was.budget_ended;
        }
        sum
    }
}

impl Step {
    fn begin(gw: &Gateway) -> Step {
        Step {
            started: Instant::now(),
            since_unix_ms: unix_ms(),
            owners: gw.owners(),
            raw_overlaps: gw.farm.counters().raw_overlaps,
            handed_over: Handovers::of(gw),
        }
    }

    /// Prints the dark time per moved terminal since the step began and asserts what a
    /// planned move must do to the terminals.
    fn measure(&self, gw: &Gateway, test: &str, what: &str) {
        let shards: BTreeSet<ShardId> = moved(&self.owners, &gw.owners()).into_iter().collect();
        let is_moved = |id: &str| shards.contains(&shard_of(id, SHARDS));
        let dark = gw.farm.dark_intervals(self.since_unix_ms);
        let (of_moved, of_unmoved): (Vec<&DarkInterval>, Vec<&DarkInterval>) =
            dark.intervals.iter().partition(|i| is_moved(&i.terminal));
        let moved_ids: BTreeSet<&str> = gw
            .farm
            .ids
            .iter()
            .map(String::as_str)
            .filter(|id| is_moved(id))
            .collect();
        let went_dark: BTreeSet<&str> = of_moved.iter().map(|i| i.terminal.as_str()).collect();
        let ms = posgate_pos_sim::dist::dist(of_moved.iter().map(|i| i.ms()).collect());
        let raw = gw.farm.counters().raw_overlaps - self.raw_overlaps;
        eprintln!(
            "[{test}] {what}: rebalanced, every terminal current, after {:.3} s; {} shards \
             moved ({} terminals); dark time per moved terminal: \
             {} intervals on {} terminals, p50 {} ms, p99 {} ms, max {} ms; {} intervals of \
             terminals not moved; {} terminals dark now; raw overlaps {raw}",
            secs(self.started.elapsed()),
            shards.len(),
            moved_ids.len(),
            ms.count,
            went_dark.len(),
            ms.p50,
            ms.p99,
            ms.max,
            of_unmoved.len(),
            dark.dark_now
        );
        assert!(!shards.is_empty(), "{what}: no shard moved");
        assert!(!dark.incomplete, "{what}: the farm dropped intervals");
        assert_eq!(
            dark.dark_now, 0,
            "{what}: terminals left without a connection"
        );
        let not_dark: Vec<&&str> = moved_ids.difference(&went_dark).collect();
        assert!(
            not_dark.is_empty(),
            "{what}: moved terminals with no dark interval (a new connection before the \
             old one closed?): {not_dark:?}"
        );
        for i in &dark.intervals {
            assert!(
                i.start_unix_ms <= i.end_unix_ms && i.end_unix_ms >= self.since_unix_ms,
                "{what}: {i:?}"
            );
        }
        assert!(
            of_unmoved.is_empty(),
            "{what}: terminals whose shard kept its owner went dark: {:?}",
            &of_unmoved[..of_unmoved.len().min(5)]
        );
        assert_eq!(raw, 0, "{what}: raw overlaps");
        // Counted by the new owners, which are all still running.
        let step = Handovers::since(gw, &self.handed_over);
        assert!(
            step.released >= moved_ids.len() as f64,
            "{what}: {} moved terminals, {} dialed after a release ({step:?})",
            moved_ids.len(),
            step.released
        );
        assert_eq!(step.fallbacks, 0.0, "{what}: asks that fell back");
        assert_eq!(step.budget_ended, 0.0, "{what}: drains ended by the budget");
    }
}
