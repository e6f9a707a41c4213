//! What a scenario reports ([`ScenarioReport`], written as JSON) and the Markdown summary
//! of a whole run.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    alerts::{self, AlertReport},
    analysis::{self, clock_jump_s, LatencyBucket, MovingLatency},
    calibrate::HandshakeRate,
    dark::DarkTime,
    duplicates::DuplicateSummary,
    floor::Floor,
    handover::{HandoverSummary, StaleCheck, Verdict},
    host::CpuShares,
    later::{self, LaterReport},
    observe::Sample,
    outage::{PushWindow, Takeover},
    panels::PanelCheck,
    push_summary::PushSummary,
    redis::CommandStats,
    upgrade::{self, UpgradeReport},
};
use posgate_pos_sim::dist::Dist;

/// One pass/fail line: `gate` lines decide the exit code, the others are the issue's
/// targets, reported but not enforced.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub pass: bool,
    pub gate: bool,
    pub detail: String,
}

/// Everything measured in one scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub graceful: bool,
    /// When the event (scale, signal, cut) began, unix ms.
    pub event_unix_ms: u64,
    /// Monotonic clock.
    pub duration_s: f64,
    /// The same span by the wall clock (what pos-sim stamps events with).
    pub duration_wall_ms: u64,
    /// From the event to every shard served by its assigned pod and every terminal
    /// connected; `None` if that did not happen within the limit.
    pub converged_after_s: Option<f64>,
    pub pods_before: usize,
    pub pods_after: usize,
    pub terminals: u64,
    pub shards_moved: usize,
    pub shard_moves: u64,
    pub terminals_moved: u64,
    /// Moves counted with multiplicity (a shard that left and came back counts twice).
    pub terminal_moves: u64,
    pub ideal_moved: Option<u64>,
    /// Per moved terminal: time without any connection (ms).
    pub gap_ms: Dist,
    pub gap_terminals_sampled: usize,
    /// Every interval in which a moved terminal had no connection at all, terminal-side
    /// (pos-sim's dark-interval logs): reported, never gated.
    pub dark: DarkTime,
    pub still_without_session: usize,
    pub connections_opened: u64,
    pub connections_closed: u64,
    pub reconnects_per_terminal: f64,
    pub min_terminals_connected: u64,
    pub raw_overlaps: u64,
    pub session_overlaps: u64,
    pub max_session_overlap_ms: u64,
    pub keys_delivered_twice: u64,
    pub duplicate_deliveries: u64,
    /// The keys delivered twice by cause (pos-sim's duplicate log against the kills).
    pub duplicates: DuplicateSummary,
    pub stale_hellos_refused: u64,
    pub stale_pushes_refused: u64,
    pub pushes_without_session: u64,
    /// Pause / pod-partition / partial-partition: pushes terminals accepted under the
    /// faulted pods' epochs more than one lease TTL after the fault began (sampled
    /// terminals of moved shards).
    pub accepted_after_deadline: u64,
    /// Per shard whose serving pod changed: old owner stopped -> new owner serving, from
    /// every pod's own `/v1/cluster`, sampled.
    pub handover: HandoverSummary,
    /// Stale-epoch refusals (pos-sim's log) and whether the refused pod stopped serving
    /// that shard within 1 s (sampled).
    pub stale_check: StaleCheck,
    pub pushes: PushSummary,
    /// The outage scenarios: pushes by the span they were first sent in (during the
    /// outage, after the takeover, ...), some gated.
    pub push_windows: Vec<PushWindow>,
    /// partial-partition: the cut-off pods' shards taken over by the rest.
    pub takeover: Option<Takeover>,
    /// Push latency per second of send time (the latency chart's data).
    pub push_latency_per_s: Vec<LatencyBucket>,
    /// Push latency while shards moved, beside idle and the machine's floor.
    pub push_moving: MovingLatency,
    pub dial_limit_per_s: u64,
    /// TLS handshakes/s overall: the steepest 1-s rise of open connections (a lower
    /// bound while connections also close). A figure of the run, noisy (the sims are
    /// sampled at different moments); the cold-start bound uses the calibration below.
    pub handshakes_per_s_max: u64,
    /// Cold start only: H, the machine's TLS handshake rate measured before the pods
    /// started (`calibrate`), which the cold-start bound is built on.
    pub handshake_rate: Option<HandshakeRate>,
    /// Cold start only: the same dials without posgate, measured after H and before the
    /// pods (`floor`).
    pub floor: Option<Floor>,
    pub dial_rate_max_per_pod: BTreeMap<String, u64>,
    pub redis_commandstats: CommandStats,
    pub redis_round_trips_per_pod_s: f64,
    /// Cold start only: client round trips per pod per second over a quiet window after
    /// convergence (top-level commands of `INFO commandstats`).
    pub steady_round_trips_per_pod_s: Option<f64>,
    /// Cold start only: sum of pod RSS / terminals (an upper bound per held connection).
    pub rss_per_connection_kib: Option<f64>,
    pub rss_kib: BTreeMap<String, u64>,
    pub cpu_s: BTreeMap<String, f64>,
    /// The machine's CPU over the same span as `cpu_s` (`None` without `/proc/stat`).
    pub host_cpu: Option<CpuShares>,
    /// rolling-upgrade: the mixed phase and the new pods' peer counters.
    pub upgrade: Option<UpgradeReport>,
    /// offline-later, cold-start-queued, rolling-upgrade: the pushes with a TTL and where
    /// they ended.
    pub later: Option<LaterReport>,
    /// broadcast: its time to complete and the live pushes beside it.
    pub broadcast: Option<super::broadcast::BroadcastReport>,
    /// The alerts the run's Prometheus raised in the scenario; `None` without Prometheus.
    pub alerts: Option<AlertReport>,
    /// Every dashboard query evaluated over the scenario; `None` without Prometheus.
    pub panels: Option<PanelCheck>,
    pub checks: Vec<Check>,
    pub notes: Vec<String>,
    /// PNG charts, relative to the directory of `summary.md`.
    pub charts: Vec<String>,
    /// Why there are no charts (e.g. built without the `charts` feature).
    pub charts_note: Option<String>,
    pub series: Vec<Sample>,
}

impl ScenarioReport {
    /// Whether every gating check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.pass || !c.gate)
    }

    /// How far the wall clock ran ahead of the monotonic one, when a gate failed in a
    /// run during which the machine was suspended. Such a failure says nothing about
    /// posgate: every process froze at once, and Redis, whose keys expire by the wall
    /// clock, let leases and member records run out together. The runner then runs
    /// the scenario once more (those that can start over), keeping the first report.
    pub fn failed_while_suspended(&self) -> Option<f64> {
        let monotonic = std::time::Duration::from_secs_f64(self.duration_s);
        clock_jump_s(self.duration_wall_ms, monotonic).filter(|_| !self.passed())
    }

    pub fn check(&mut self, name: &str, gate: bool, pass: bool, detail: String) {
        self.checks.push(Check {
            name: name.into(),
            pass,
            gate,
            detail,
        });
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("not reached".into(), |s| format!("{s:.1} s"))
}

/// The Markdown summary of a run.
pub fn markdown(header: &str, reports: &[ScenarioReport]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{header}\n");
    md.push_str(
        "| scenario | converged | moved (ideal) | gap p50/p99/max ms | handover gap p50/p99/max ms | \
         dark p50/p99/max ms (intervals) | raw ovl | session ovl | keys twice (defect) | dup inherent (by cause) | \
         stale refused | pushes sent | retried | 200 first/final | 200 in gated window first/final | \
         unanswered | latency p50/p99/max ms | max dials/s/pod | gate |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let ideal = r.ideal_moved.map_or("-".into(), |i| i.to_string());
        let dials = r.dial_rate_max_per_pod.values().max().copied().unwrap_or(0);
        let _ = writeln!(
            md,
            "| {} | {} | {} ({}) | {}/{}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2}%/{:.2}% | {} | {} (+{} entry pod faulted) | {}/{}/{} | {} | {} |",
            r.name,
            opt(r.converged_after_s),
            r.terminals_moved,
            ideal,
            r.gap_ms.p50,
            r.gap_ms.p99,
            r.gap_ms.max,
            handover_cell(&r.handover),
            r.dark.cell(),
            r.raw_overlaps,
            r.session_overlaps,
            r.duplicates.keys_defect,
            r.duplicates.keys_inherent,
            r.stale_hellos_refused + r.stale_pushes_refused,
            r.pushes.sent,
            r.pushes.retried,
            r.pushes.ok_ratio * 100.0,
            r.pushes.final_ok_ratio * 100.0,
            window_cell(&r.push_windows),
            r.pushes.unanswered,
            r.pushes.unanswered_entry_faulted,
            r.pushes.latency_ms.p50,
            r.pushes.latency_ms.p99,
            r.pushes.latency_ms.max,
            dials,
            if r.passed() { "pass" } else { "**FAIL**" },
        );
    }
    for r in reports {
        let _ = writeln!(md, "\n### {}\n", r.name);
        let _ = writeln!(
            md,
            "- pods {} -> {}, {} terminals, {:.1} s; shards moved {} ({} moves), terminals moved {} \
             ({} with multiplicity), gap sampled on {} terminals, {} still without a session",
            r.pods_before,
            r.pods_after,
            r.terminals,
            r.duration_s,
            r.shards_moved,
            r.shard_moves,
            r.terminals_moved,
            r.terminal_moves,
            r.gap_terminals_sampled,
            r.still_without_session
        );
        let _ = writeln!(
            md,
            "- connections opened {} / closed {} (reconnects per terminal {:.2}), fewest terminals \
             connected during the run {}; max session overlap {} ms; pushes without session (428) {}; \
             duplicate deliveries {}",
            r.connections_opened,
            r.connections_closed,
            r.reconnects_per_terminal,
            r.min_terminals_connected,
            r.max_session_overlap_ms,
            r.pushes_without_session,
            r.duplicate_deliveries
        );
        let p = &r.pushes;
        let _ = writeln!(
            md,
            "- pushes: {} sent in {} attempts, {} retried (same key, another entry pod); \
             outcomes per attempt {:?}; final outcomes {:?}; every attempt unanswered: {}",
            p.sent, p.attempts, p.retried, p.by_outcome, p.by_final_outcome, p.gave_up_unanswered
        );
        for w in &r.push_windows {
            let _ = writeln!(md, "- {}", w.figures());
        }
        if let Some(t) = &r.takeover {
            let _ = writeln!(
                md,
                "- takeover: {} of the {} shards the cut-off pods held taken over by the rest \
                 under a higher epoch while the cut stood; not taken over {:?}",
                t.taken_over, t.shards, t.not_taken_over
            );
        }
        let d = &r.duplicates;
        let _ = writeln!(
            md,
            "- keys delivered twice: {} ({} inherent, by cause below: not gated; {} defects, \
             {} of them not in pos-sim's duplicate log); repeats by cause {:?}",
            d.keys, d.keys_inherent, d.keys_defect, d.keys_unexplained, d.repeats_by_cause
        );
        handover_lines(&mut md, r);
        let _ = writeln!(md, "- {}", r.dark.figures());
        let _ = writeln!(
            md,
            "- dial rate max per pod over 1-s windows (limit {}/s): {:?}",
            r.dial_limit_per_s, r.dial_rate_max_per_pod
        );
        let _ = writeln!(
            md,
            "- TLS handshakes/s overall (steepest 1-s rise of open connections; a lower bound while connections also close): {}",
            r.handshakes_per_s_max
        );
        if let Some(h) = &r.handshake_rate {
            let _ = writeln!(
                md,
                "- H, TLS handshakes/s the machine sustains: {}",
                h.describe()
            );
            if let Some(f) = &r.floor {
                let pods = r.pods_after as u64;
                let t = analysis::cold_start_t(r.terminals, pods, r.dial_limit_per_s, h.per_s());
                let _ = writeln!(
                    md,
                    "- the floor, the same dials without posgate before the pods: {}",
                    f.describe(t, analysis::bound_s(t))
                );
            }
        }
        let _ = writeln!(
            md,
            "- Redis: ~{:.2} client round trips/s per pod; commandstats calls {:?}",
            r.redis_round_trips_per_pod_s, r.redis_commandstats
        );
        if let Some(s) = r.steady_round_trips_per_pod_s {
            let _ = writeln!(md, "- steady state: {s:.2} Redis round trips/s per pod");
        }
        if let Some(s) = r.rss_per_connection_kib {
            let _ = writeln!(
                md,
                "- RSS per held connection (all pod RSS / terminals): {s:.1} KiB"
            );
        }
        let _ = writeln!(md, "- RSS KiB per pod at the end: {:?}", r.rss_kib);
        let _ = writeln!(md, "- CPU s per pod during the scenario: {:?}", r.cpu_s);
        if let Some(h) = &r.host_cpu {
            let _ = writeln!(md, "- the machine meanwhile: {}", h.describe());
        }
        if let Some(u) = &r.upgrade {
            upgrade::lines(&mut md, u);
        }
        if let Some(l) = &r.later {
            later::lines(&mut md, l);
        }
        if let Some(b) = &r.broadcast {
            super::broadcast::lines(&mut md, b);
        }
        alerts::lines(&mut md, r);
        for c in &r.checks {
            let _ = writeln!(
                md,
                "- [{}] {}{}: {}",
                if c.pass { "x" } else { " " },
                c.name,
                if c.gate { " (gate)" } else { "" },
                c.detail
            );
        }
        for n in &r.notes {
            let _ = writeln!(md, "- note: {n}");
        }
        chart_lines(&mut md, r);
    }
    md
}

/// The gated push window's share of 200s at the first attempt / after retries, or a dash.
fn window_cell(windows: &[PushWindow]) -> String {
    windows
        .iter()
        .find(|w| w.gate_min.is_some())
        .map_or("-".into(), |w| {
            format!(
                "{:.2}%/{:.2}% {}",
                w.first_ok_ratio * 100.0,
                w.final_ok_ratio * 100.0,
                w.name
            )
        })
}

fn handover_cell(h: &HandoverSummary) -> String {
    if h.handovers == 0 {
        "-".into()
    } else {
        format!("{}/{}/{}", h.gap_ms.p50, h.gap_ms.p99, h.gap_ms.max)
    }
}

/// The handover and stale-epoch lines of one scenario, with their sampling resolution.
fn handover_lines(md: &mut String, r: &ScenarioReport) {
    let h = &r.handover;
    let _ = writeln!(
        md,
        "- handover gap (old owner stopped serving -> new owner serving, per shard; each pod's \
         /v1/cluster sampled every {} ms, actual spacing p50 {} / max {} ms, so each gap is \
         accurate to about one spacing): {} handovers on {} shards, p50/p99/max {}/{}/{} ms; \
         {} unfinished at the end; {} samples with two pods serving one shard",
        h.sample_every_ms,
        h.sample_spacing_ms.p50,
        h.sample_spacing_ms.max,
        h.handovers,
        h.shards,
        h.gap_ms.p50,
        h.gap_ms.p99,
        h.gap_ms.max,
        h.unfinished,
        h.two_serving_samples
    );
    let c = &r.stale_check;
    let _ = writeln!(
        md,
        "- stale-epoch refusals: {} ({} hellos, {} pushes; {} pod/shard/epoch grants); \
         refused pod seen no longer serving the shard within {} ms: {}, by the first sample \
         after it: {}, still serving after it: {}, undetermined (pod not answering): {}{}",
        c.refusals,
        c.hellos,
        c.pushes,
        c.grants,
        c.limit_ms,
        c.count(Verdict::DroppedWithin),
        c.count(Verdict::DroppedByNextSample),
        c.count(Verdict::StillServing),
        c.count(Verdict::Undetermined),
        if c.log_dropped > 0 {
            format!(
                "; {} refusals dropped from pos-sim's log, not checked",
                c.log_dropped
            )
        } else {
            String::new()
        }
    );
}

/// Links to the scenario's charts, or why there are none.
fn chart_lines(md: &mut String, r: &ScenarioReport) {
    if let Some(note) = &r.charts_note {
        let _ = writeln!(md, "- charts: {note}");
    }
    for path in &r.charts {
        // `scale-out/sessions-per-pod.png` -> alt text "scale-out: sessions per pod".
        let stem = path.rsplit('/').next().unwrap_or(path);
        let what = stem.trim_end_matches(".png").replace('-', " ");
        let _ = writeln!(md, "\n![{}: {what}]({path})", r.name);
    }
}

/// "converged after X s" / "not converged".
pub fn converged_text(r: &ScenarioReport) -> String {
    r.converged_after_s.map_or_else(
        || "not converged within the limit".into(),
        |s| format!("converged {s:.1} s after the event"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_links_charts_and_states_the_sampling() {
        let mut r = ScenarioReport {
            name: "kill".into(),
            charts: vec!["kill/sessions-per-pod.png".into()],
            ..ScenarioReport::default()
        };
        r.handover.sample_every_ms = 250;
        let md = markdown("# run", std::slice::from_ref(&r));
        assert!(md.contains("\n![kill: sessions per pod](kill/sessions-per-pod.png)\n"));
        assert!(md.contains("sampled every 250 ms"), "{md}");
        assert!(
            md.contains("| 0/0/0 | - | - | 0 | 0 |"),
            "no handover, no dark interval: dashes, not zeros; then the overlaps"
        );
        r.dark.per_interval_ms = posgate_pos_sim::dist::dist(vec![5, 7]);
        let md = markdown("# run", std::slice::from_ref(&r));
        assert!(md.contains("| - | 5/7/7 (2) | 0 | 0 |"), "{md}");
        assert!(md.contains("\n- dark time per moved terminal "), "{md}");
        assert!(
            !md.contains("pushes first sent"),
            "no window, no window line"
        );
        r.push_windows = vec![PushWindow {
            name: "during the outage".into(),
            rule: "from the cut to the restore".into(),
            sent: 1_000,
            ok_first: 990,
            ok_final: 1_000,
            first_ok_ratio: 0.99,
            final_ok_ratio: 1.0,
            gate_min: Some(0.999),
            ..PushWindow::default()
        }];
        let md = markdown("# run", std::slice::from_ref(&r));
        assert!(md.contains("| 99.00%/100.00% during the outage |"), "{md}");
        assert!(md.contains(
            "- 1000 pushes first sent during the outage (from the cut to the restore): 200 at \
             the first attempt 990 (99.000%), after retries 1000 (100.000%)\n"
        ));
        r.charts.clear();
        r.charts_note = Some(super::super::charts::ChartError::Disabled.to_string());
        let md = markdown("# run", &[r]);
        assert!(md.contains("- charts: built without the `charts` feature"));
    }

    #[test]
    fn a_failed_run_is_repeated_only_when_the_machine_was_suspended_meanwhile() {
        let mut r = ScenarioReport {
            duration_s: 37.0,
            duration_wall_ms: 155_200,
            ..ScenarioReport::default()
        };
        r.check("a gate", true, true, String::new());
        assert_eq!(r.failed_while_suspended(), None, "suspended but passed");
        r.check("another gate", true, false, String::new());
        assert_eq!(r.failed_while_suspended(), Some(118.2));
        r.duration_wall_ms = 37_500;
        assert_eq!(r.failed_while_suspended(), None, "failed on its own");
    }
}
