//! The pass/fail checks of one scenario, from what `measure` gathered: overlaps, gaps,
//! refusals, duplicates and the rest of the report's lines, each gated or only shown.
//!
//! Not for: gathering the figures (`measure`) or printing them (`report`).

use std::time::Duration;

use super::{
    alerts, analysis,
    cluster::{Cluster, SHARDS},
    dark,
    handover::{self, Verdict},
    host::STEAL_NOTABLE,
    later,
    observe::{Sample, SAMPLE_EVERY},
    outage, panels,
    report::ScenarioReport,
    scenarios::Scenario,
    upgrade, LoadError,
};
use posgate_pos_sim::{Refusal, Refusals};

/// Handover gaps and the stale-epoch check, from the per-pod samples and the simulators'
/// refusal log (cut to this scenario's window).
pub fn sampled_checks(
    r: &mut ScenarioReport,
    samples: &[Sample],
    refusals: Result<Refusals, LoadError>,
    t0: u64,
    t1: u64,
) {
    let every = SAMPLE_EVERY.as_millis() as u64;
    r.handover = handover::handovers(samples, SHARDS as u32, every);
    let log = refusals.unwrap_or_else(|e| {
        r.notes.push(format!("stale-epoch refusals not read: {e}"));
        Refusals::default()
    });
    // The logs keep each simulator's newest 10,000 and drop the oldest: only if some were
    // dropped and the oldest kept one is from after this scenario began may refusals of
    // this scenario be missing.
    let oldest = log.refusals.first().map_or(u64::MAX, |x| x.at_unix_ms);
    let window: Vec<Refusal> = log
        .refusals
        .into_iter()
        .filter(|x| (t0..=t1).contains(&x.at_unix_ms))
        .collect();
    let missed = if log.dropped > 0 && oldest > t0 {
        log.dropped
    } else {
        0
    };
    // "The next sample" after the 1-s limit: at most two periods late.
    r.stale_check =
        handover::stale_check(samples, &window, SHARDS as u32, 1_000, 2 * every, missed);
    let still = r.stale_check.count(Verdict::StillServing);
    let detail = format!(
        "{} refusals, {still} still served > 1 s after (pods sampled every {every} ms; a pod's \
         own lease epoch can lag a re-acquire, so a hit needs a look at the pod's log)",
        r.stale_check.refusals
    );
    r.check(
        "stale-epoch refusal -> pod stops serving the shard within 1 s (sampled, not gated)",
        false,
        still == 0,
        detail,
    );
}

/// The scenario's checks on the figures `measure` put in `r`.
pub fn checks(c: &Cluster, sc: Scenario, r: &mut ScenarioReport) {
    let raw = r.raw_overlaps;
    r.check(
        "no raw overlap",
        sc.graceful(),
        raw == 0,
        format!("{raw} raw overlaps"),
    );
    let so = r.session_overlaps;
    if sc == Scenario::Pause {
        // A stopped process cannot close its superseded connections: the terminal drops
        // them after its supersede grace (2 s), above the 1 s overlap threshold. They
        // carry a stale epoch (refused with 409), so the gate is "nothing accepted from
        // the paused pod after its deadline" instead.
        let d = format!(
            "{so} superseded connections of the stopped pod open > 1 s (max {} ms)",
            r.max_session_overlap_ms
        );
        r.check(
            "no session overlap (frozen holder, not gated)",
            false,
            so == 0,
            d,
        );
    } else {
        r.check(
            "no session overlap",
            true,
            so == 0,
            format!("{so} session overlaps"),
        );
    }
    if matches!(
        sc,
        Scenario::Pause | Scenario::PodPartition | Scenario::PartialPartition
    ) {
        let n = r.accepted_after_deadline;
        let d = format!("{n} pushes accepted under its epochs after its deadline");
        r.check(
            "faulted pod delivers nothing after its deadline",
            true,
            n == 0,
            d,
        );
    }
    let dups = &r.duplicates;
    let d = format!(
        "{} keys: {} defects ({} not in pos-sim's log), {} inherent (an owner killed after \
         delivering, or a retry after a 504; closed once terminals dedupe by key; not gated)",
        dups.keys, dups.keys_defect, dups.keys_unexplained, dups.keys_inherent
    );
    let pass = dups.keys_defect == 0;
    r.check(
        "no key delivered twice (but by a killed owner's successor)",
        true,
        pass,
        d,
    );
    let (un, p) = (r.pushes.unanswered, &r.pushes);
    r.check(
        "every push attempt answered by its deadline + 1 s",
        true,
        un == 0,
        format!(
            "{un} attempts unanswered (+{} sent to a killed/paused pod); {} pushes with every \
             attempt unanswered",
            p.unanswered_entry_faulted, p.gave_up_unanswered
        ),
    );
    let conv = r.converged_after_s.is_some();
    r.check("converged", false, conv, super::report::converged_text(r));
    let jump = analysis::clock_jump_s(r.duration_wall_ms, Duration::from_secs_f64(r.duration_s));
    let d = jump.map_or("wall and monotonic clocks agree".into(), |s| {
        format!("the wall clock ran {s:.1} s ahead of the monotonic clock: suspended or stepped")
    });
    r.check(
        "machine not suspended, clock not stepped",
        false,
        jump.is_none(),
        d,
    );
    if let Some(h) = r.host_cpu {
        r.check(
            "the host left the machine's CPU to the run (steal < 5%)",
            false,
            h.steal < STEAL_NOTABLE,
            match h.steal < STEAL_NOTABLE {
                true => h.describe(),
                false => format!("{}: not comparable with a run without", h.describe()),
            },
        );
    }
    upgrade::checks(r);
    later::checks(r);
    outage::checks(r, sc);
    dark::check(r, sc);
    alerts::check(r);
    panels::gate(r);
    match sc {
        Scenario::ScaleOut
        | Scenario::ScaleIn
        | Scenario::RollingRestart
        | Scenario::RollingUpgrade
        | Scenario::OfflineLater => {
            // The first attempt: the gateway's answer, before a retry can paper over it.
            let ok = r.pushes.ok_ratio >= 0.999;
            let d = format!(
                "{:.3}% answered 200 at the first attempt ({:.3}% in the end)",
                r.pushes.ok_ratio * 100.0,
                r.pushes.final_ok_ratio * 100.0
            );
            r.check(">= 99.9% pushes 200", false, ok, d);
        }
        _ => {}
    }
    if matches!(
        sc,
        Scenario::ScaleOut | Scenario::ScaleIn | Scenario::RollingRestart
    ) {
        // Milliseconds are the resolution: an idle p99 of 0 counts as 1.
        let l = &r.push_moving;
        let ok = l.moving.p99 <= 2 * l.idle.p99.max(1);
        let d = format!(
            "p99 {} ms over {} attempts while shards moved (to terminals of unmoved shards, \
             the machine's floor then: {} ms over {}); idle p99 {} ms over {} (before the \
             event, after convergence)",
            l.moving.p99, l.moving.count, l.unmoved.p99, l.unmoved.count, l.idle.p99, l.idle.count
        );
        r.check(
            "push p99 while shards move <= 2x idle (issue 41 target, not gated)",
            false,
            ok,
            d,
        );
    }
    match sc {
        Scenario::ScaleOut => {
            let ideal = r.ideal_moved.unwrap_or(0) as f64;
            let ok = (r.terminals_moved as f64) <= 1.35 * ideal;
            let d = format!("{} moved, ideal {ideal:.0}", r.terminals_moved);
            r.check("moved <= 1.35x ideal", false, ok, d);
        }
        Scenario::Kill => {
            let ok = r.raw_overlaps == 0;
            r.check(
                "kill: no raw overlap",
                false,
                ok,
                format!("{raw} raw overlaps"),
            );
            let ttl = c.profile.lease_ttl.max(c.profile.member_ttl).as_millis() as u64;
            let per_pod = (r.pods_after.max(1) as u64) * c.profile.dial_rate;
            let dial = r.terminals_moved * 1000 / per_pod.max(1);
            let limit = ttl + 3000 + dial;
            let ok = r.gap_ms.max <= limit && r.still_without_session == 0;
            let d = format!("max gap {} ms, limit {limit} ms", r.gap_ms.max);
            r.check(
                "orphans back within max(TTLs) + 3 s + dial time",
                false,
                ok,
                d,
            );
        }
        Scenario::RedisRestart => {
            let m = r.shard_moves;
            r.check(
                "no shard changes owner",
                false,
                m == 0,
                format!("{m} moves"),
            );
        }
        Scenario::ColdStart => {
            let (p, pods, took) = (&c.profile, c.pods.len() as u64, r.converged_after_s);
            r.handshake_rate = c.handshake_rate.clone();
            let (pass, d) = match &c.handshake_rate {
                Some(h) => analysis::cold_start(took, p.terminals, pods, p.dial_rate, h.per_s()),
                None => (false, "no handshake calibration (H) before the pods".into()),
            };
            r.check("cold start <= 1.2 x T + 5 s", false, pass, d);
            r.floor = c.floor.clone();
            if let Some(floor) = &c.floor {
                let (pass, d) = analysis::against_floor(took, floor);
                r.check("cold start <= 1.2 x the floor + 5 s", false, pass, d);
            }
            let rt = r.steady_round_trips_per_pod_s.unwrap_or(f64::NAN);
            let d = format!("{rt:.2} round trips/s per pod");
            r.check(
                "steady state <= 2 Redis round trips/s per pod",
                false,
                rt <= 2.0,
                d,
            );
            let kib = r.rss_per_connection_kib.unwrap_or(f64::NAN);
            let d = format!("{kib:.1} KiB per connection (incl. each pod's base)");
            r.check("RSS per held connection <= 64 KiB", false, kib <= 64.0, d);
        }
        Scenario::ColdStartQueued => {
            let (pass, d) = later::drained(r);
            r.check(
                "time to drained reported beside the same cold start's convergence",
                false,
                pass,
                d,
            );
        }
        Scenario::RollingRestart | Scenario::RollingUpgrade | Scenario::OfflineLater => {
            let d = format!(
                "{:.2} connections per terminal (naive ~2)",
                r.reconnects_per_terminal
            );
            r.check("reconnects per terminal reported", false, true, d);
        }
        _ => {}
    }
}
