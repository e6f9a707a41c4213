//! Running one scenario under load and measuring it: counters, Redis stats and CPU before
//! and after, the sampler and the push generator throughout (and in rolling-upgrade a
//! second one of pushes with a TTL), the simulators' logs (refusals, duplicates, dark
//! intervals) after, then the analysis into a [`ScenarioReport`], whose pass/fail lines
//! `checks` writes.
//!
//! Session gaps come from the simulators' per-terminal connection events (the cheapest
//! sound source: the terminals saw every close and open, no pod-side logs needed). A
//! connection's open stands for its hello (the hello follows within one round trip).
//! They are fetched for the terminals of shards whose owner changed (at most 5,000, a
//! random sample beyond), and for up to 20,000 terminals at cold start (dial rates).

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, Instant},
};

use super::{
    alerts, analysis,
    checks::{checks, sampled_checks},
    cluster::{Cluster, SHARDS},
    dark, duplicates,
    host::{CpuShares, CpuTimes},
    later::{self, How, Sent},
    observe::{Owners, Sampler},
    outage, panels,
    pods::TENANT,
    procs::CLOCK_TICKS,
    push_summary,
    pushgen::{PushGen, PushPlan},
    redis::{stats_delta, TOP_LEVEL},
    report::ScenarioReport,
    scenarios::{act, prepare, Scenario},
    sims::Counters,
    unix_ms, upgrade, LoadError,
};
use posgate_pos_sim::{dist::dist, Duplicate};

/// Most terminals whose reports are fetched for gaps in one scenario.
const GAP_SAMPLE: usize = 5_000;
/// Most terminals fetched at cold start.
const COLD_SAMPLE: usize = 20_000;

fn delta(before: &Counters, after: &Counters, key: &str) -> u64 {
    let a = after.get(key).copied().unwrap_or(0);
    a.saturating_sub(before.get(key).copied().unwrap_or(0))
}

fn sample(mut v: Vec<u64>, cap: usize) -> Vec<u64> {
    fastrand::shuffle(&mut v);
    v.truncate(cap);
    v
}

fn cpu_ticks(c: &Cluster) -> BTreeMap<String, u64> {
    c.pods
        .iter()
        .filter_map(|p| Some((p.id.clone(), p.proc.cpu_ticks()?)))
        .collect()
}

/// Prepares, runs and measures one scenario.
pub async fn run_scenario(c: &mut Cluster, sc: Scenario) -> Result<ScenarioReport, LoadError> {
    prepare(c, sc).await?;
    let started = Instant::now();
    let t0 = unix_ms();
    let before_owners = c.owners().await;
    let c0 = c.sims.counters().await?;
    let cs0 = c.redis.command_stats().await.unwrap_or_default();
    let (cpu0, host0) = (cpu_ticks(c), CpuTimes::now());
    let pods_before = c.pods.len();
    let sampler = Sampler::start(
        c.client.clone(),
        c.observers.clone(),
        c.sims.clone(),
        SHARDS,
    );
    let plan = PushPlan {
        rate_per_s: c.profile.push_rate,
        timeout_ms: c.profile.push_timeout_ms,
        terminals: c.profile.terminals,
        run_tag: format!("r{t0}"),
        ttl_s: None,
        offline: sc.offline(),
    };
    // rolling-upgrade: pushes with a TTL throughout, at half the rate, which pods of the
    // previous release refuse (400) and new ones refuse while the releases mix (503).
    let ttl_gen = (sc == Scenario::RollingUpgrade).then(|| {
        let plan = PushPlan {
            rate_per_s: plan.rate_per_s / 2.0,
            ttl_s: Some(later::TTL_S),
            ..plan.clone()
        };
        let tag = format!("{}-ttl", sc.name());
        PushGen::start(plan, c.client.clone(), c.targets.clone(), &tag)
    });
    let gen = PushGen::start(plan, c.client.clone(), c.targets.clone(), sc.name());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let action = act(c, sc).await?;
    let since_event = Duration::from_millis(unix_ms().saturating_sub(action.event_unix_ms));
    tokio::time::sleep(action.settle.saturating_sub(since_event)).await;
    let converged = c.wait_converged(c.profile.converge_limit).await;
    let converged_after_s =
        converged.map(|_| unix_ms().saturating_sub(action.event_unix_ms) as f64 / 1000.0);
    let (cpu1, host1) = (cpu_ticks(c), CpuTimes::now());
    let steady = if sc == Scenario::ColdStart && converged.is_some() {
        Some(steady_round_trips(c).await)
    } else {
        tokio::time::sleep(Duration::from_secs(2)).await;
        None
    };
    let pushes = gen.stop().await;
    let ttl_pushes = match ttl_gen {
        Some(g) => Some(g.stop().await),
        None => None,
    };
    let samples = sampler.stop().await;
    let t1 = unix_ms();
    let refusals = c.sims.refusals().await;
    let dark_log = c.sims.dark_intervals(t0).await;
    let dup_log = c.sims.duplicates().await;
    let after_owners = c.owners().await;
    let c1 = c.sims.counters().await?;
    let cs1 = c.redis.command_stats().await.unwrap_or_default();
    let duration_s = started.elapsed().as_secs_f64();

    let mut r = ScenarioReport {
        name: sc.name().into(),
        graceful: sc.graceful(),
        event_unix_ms: action.event_unix_ms,
        duration_s,
        duration_wall_ms: t1.saturating_sub(t0),
        converged_after_s,
        pods_before,
        pods_after: c.pods.len(),
        terminals: c.profile.terminals,
        ideal_moved: action.ideal_moved,
        dial_limit_per_s: c.profile.dial_rate,
        notes: action.notes.clone(),
        ..ScenarioReport::default()
    };

    // Ownership moves.
    let mut series: Vec<&Owners> = Vec::new();
    series.extend(before_owners.iter());
    series.extend(samples.iter().filter_map(|s| s.owners.as_ref()));
    series.extend(after_owners.iter());
    let changes = analysis::owner_changes(&series, SHARDS);
    let epochs = analysis::epoch_owners(&series);
    let mut moved_terminals = Vec::new();
    for (shard, &n) in changes.iter().enumerate() {
        if n > 0 {
            r.shards_moved += 1;
            r.shard_moves += u64::from(n);
            let terms = &c.shard_terminals[shard];
            r.terminals_moved += terms.len() as u64;
            r.terminal_moves += terms.len() as u64 * u64::from(n);
            moved_terminals.extend_from_slice(terms);
        }
    }
    let moved_ids: HashSet<String> = moved_terminals.iter().map(|&n| c.sims.id(n)).collect();
    match &dark_log {
        Ok(log) => r.dark = dark::summarize(log, &moved_ids, t0, t1),
        Err(e) => r.notes.push(format!("dark intervals not read: {e}")),
    }

    // Per-terminal gaps and dial rates.
    let fetch = if sc == Scenario::ColdStart {
        sample((0..c.profile.terminals).collect(), COLD_SAMPLE)
    } else {
        sample(moved_terminals, GAP_SAMPLE)
    };
    let views = c.sims.reports(&fetch).await;
    if sc != Scenario::ColdStart {
        let gaps: Vec<(u64, bool)> = views
            .iter()
            .filter_map(|v| analysis::session_gap(v, action.event_unix_ms, t1))
            .collect();
        r.gap_terminals_sampled = views.len();
        r.still_without_session = gaps.iter().filter(|g| g.1).count();
        r.gap_ms = dist(gaps.iter().map(|g| g.0).collect());
    }
    r.dial_rate_max_per_pod = analysis::dial_rate_max(&views, &epochs, SHARDS as u32, t0);
    let ttl = c.profile.lease_ttl.as_millis() as u64;
    for (pod, from) in &action.deadline_faults {
        // The grants the pod held when the fault began; later grants are legitimate.
        let held = before_owners
            .iter()
            .flat_map(|o| o.iter().enumerate())
            .filter_map(|(s, slot)| match slot {
                Some((p, e)) if p == pod => Some((s as u32, *e)),
                _ => None,
            })
            .collect();
        let n = analysis::accepted_from_after(&views, &held, SHARDS as u32, from + ttl);
        r.accepted_after_deadline += n as u64;
    }

    // Terminal-side counters.
    let d = |k: &str| delta(&c0, &c1, k);
    r.connections_opened = d("connections_opened");
    r.connections_closed = d("connections_closed");
    r.reconnects_per_terminal = r.connections_opened as f64 / c.profile.terminals as f64;
    r.raw_overlaps = d("raw_overlaps");
    r.session_overlaps = d("session_overlaps");
    // A running maximum: only a new maximum is this scenario's.
    let (m0, m1) = (
        c0.get("max_session_overlap_ms").copied().unwrap_or(0),
        c1.get("max_session_overlap_ms").copied().unwrap_or(0),
    );
    r.max_session_overlap_ms = if m1 > m0 { m1 } else { 0 };
    r.keys_delivered_twice = d("keys_delivered_twice");
    r.duplicate_deliveries = d("duplicate_deliveries");
    let window: Vec<Duplicate> = match dup_log {
        Ok(log) => log
            .duplicates
            .into_iter()
            .filter(|x| (t0..=t1).contains(&x.this.at_unix_ms))
            .collect(),
        Err(e) => {
            r.notes.push(format!("duplicate log not read: {e}"));
            Vec::new()
        }
    };
    let evidence = duplicates::Evidence {
        kills: action.kills.clone(),
        retried_after_unknown: pushes
            .iter()
            .filter(|p| p.attempts().take(p.retries.len()).any(|a| a.status == 504))
            .map(|p| format!("{TENANT}:{}", p.idempotency_key))
            .collect(),
    };
    r.duplicates = duplicates::summarize(&window, r.keys_delivered_twice, &evidence);
    r.stale_hellos_refused = d("stale_hellos_refused");
    r.stale_pushes_refused = d("stale_pushes_refused");
    r.pushes_without_session = d("pushes_without_session");
    r.min_terminals_connected = samples
        .iter()
        .filter(|s| s.at_unix_ms >= action.event_unix_ms)
        .map(|s| s.terminals_connected)
        .min()
        .unwrap_or(0);

    sampled_checks(&mut r, &samples, refusals, t0, t1);

    // Pushes, Redis, processes.
    r.pushes = push_summary::summarize(&pushes, &action.hard_faults, c.profile.push_timeout_ms);
    r.push_latency_per_s = analysis::latency_buckets(&pushes, action.event_unix_ms);
    let converged_ms = converged_after_s.map(|s| action.event_unix_ms + (s * 1000.0) as u64);
    let window = (action.event_unix_ms, converged_ms);
    r.push_moving = analysis::moving_latency(&pushes, window, &moved_ids);
    r.redis_commandstats = stats_delta(&cs0, &cs1);
    let top: u64 = TOP_LEVEL
        .iter()
        .filter_map(|k| r.redis_commandstats.get(*k))
        .sum();
    let pod_avg = (pods_before + c.pods.len()).max(1) as f64 / 2.0;
    r.redis_round_trips_per_pod_s = top as f64 / duration_s / pod_avg;
    r.rss_kib = c
        .pods
        .iter()
        .filter_map(|p| Some((p.id.clone(), p.proc.rss_kib()?)))
        .collect();
    r.host_cpu = host0.zip(host1).and_then(|(a, b)| CpuShares::between(a, b));
    r.cpu_s = cpu1
        .iter()
        .map(|(id, t)| {
            let t0 = cpu0.get(id).copied().unwrap_or(0);
            (id.clone(), t.saturating_sub(t0) as f64 / CLOCK_TICKS)
        })
        .collect();
    r.steady_round_trips_per_pod_s = steady;
    if let Some(trace) = &action.upgrade {
        r.upgrade = Some(upgrade::report(c, trace, &pushes).await);
    }
    if let Some(run) = &action.broadcast {
        r.broadcast = Some(super::broadcast::report(run, &pushes));
    }
    let sent = action.later.clone().or(ttl_pushes.map(|pushes| Sent {
        pushes,
        how: How::Generator,
    }));
    if let Some(sent) = &sent {
        let (queued, late) = (d("queued_pushes"), d("pushes_after_expiry"));
        r.later = Some(later::report(c, sent, queued, late).await);
    }
    if sc == Scenario::ColdStart {
        let rss: u64 = r.rss_kib.values().sum();
        r.rss_per_connection_kib = Some(rss as f64 / c.profile.terminals.max(1) as f64);
    }
    if let Some(cut) = &action.cut {
        r.push_windows = outage::push_windows(sc, cut, &c.profile, &pushes, t1);
        if sc == Scenario::PartialPartition {
            r.takeover = before_owners
                .as_ref()
                .map(|before| outage::takeover(before, &samples, cut));
        }
    }
    let opens: Vec<(u64, u64)> = samples
        .iter()
        .map(|s| (s.at_unix_ms, s.connections_open))
        .collect();
    r.handshakes_per_s_max = analysis::open_rise_max_per_s(&opens);
    r.series = samples;
    // After the measurement: the wait for active alerts to resolve is not the scenario's.
    r.alerts = alerts::observe(c, sc, t0).await?;
    let until = r.alerts.as_ref().map_or(t1, |a| a.until_unix_ms);
    r.panels = panels::check(c, t0, until).await;
    checks(c, sc, &mut r);
    Ok(r)
}

/// Client round trips per pod per second over a quiet 6-s window.
async fn steady_round_trips(c: &Cluster) -> f64 {
    let window = Duration::from_secs(6);
    let a = c.redis.command_stats().await.unwrap_or_default();
    tokio::time::sleep(window).await;
    let b = c.redis.command_stats().await.unwrap_or_default();
    let d = stats_delta(&a, &b);
    let top: u64 = TOP_LEVEL.iter().filter_map(|k| d.get(*k)).sum();
    // The two INFO calls are the harness's own.
    top.saturating_sub(2) as f64 / window.as_secs_f64() / c.pods.len().max(1) as f64
}
