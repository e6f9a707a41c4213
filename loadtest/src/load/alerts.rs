//! The alerts of a scenario: which of the project's rules (as the run's Prometheus
//! evaluates them, [`super::rules`]) went pending, fired and resolved, when, relative to
//! the scenario's start and its event, and the gate on them: every alert the scenario
//! must raise fired, and nothing fired that the scenario does not allow ([`expect`]).
//!
//! The timeline comes from the `ALERTS` series over the scenario (`query_range`, step
//! 1 s, the evaluation interval), after the harness waited for every active alert to
//! resolve, so each scenario starts with none active and owns the alerts it raised.
//!
//! Not for: running Prometheus ([`super::prometheus`]) or the dashboard ([`super::panels`]).

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use serde::Serialize;

use super::{
    cluster::Cluster,
    prometheus::{Prometheus, Series, INTERVAL},
    report::ScenarioReport,
    scenarios::Scenario,
    unix_ms, LoadError,
};

/// What a scenario's alerts must be.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Expectation {
    /// Must fire during the scenario (a gate).
    pub must: Vec<&'static str>,
    /// May fire or not, with why: the fault is about as long as the rule's `for`, so
    /// whether it fires depends on a second either way (reported, not gated).
    pub may: Vec<(&'static str, &'static str)>,
    /// Rules one might expect here that cannot fire in the harness, and why.
    pub cannot: Vec<(&'static str, &'static str)>,
}

/// What `sc` must and may raise. Everything not listed must not fire. The same in both
/// profiles: the quick one loads the rules scaled as its timings are ([`super::rules`]).
pub fn expect(sc: Scenario) -> Expectation {
    const OUTAGE_SHORT: &str = "its threshold is 120 s without Redis (+ for), longer than the \
         outage (4x the lease TTL: 12 s quick, 60 s full); short outages are ridden out \
         without a page by design";
    const CRASH_GAP: &str = "a lost holder's shards are served again about one lease TTL \
         after it stopped renewing, under the rule's for (30 s; 6 s scaled) by design \
         (observed quick: pending ~4 s)";
    let mut e = Expectation::default();
    match sc {
        Scenario::Kill | Scenario::Pause => e.cannot.push(("PosgateShardWithoutOwner", CRASH_GAP)),
        Scenario::RedisOutage | Scenario::SinglePodOutage => {
            e.cannot.push(("PosgateRedisOutage", OUTAGE_SHORT));
        }
        Scenario::PodPartition => {
            e.may.push((
                "PosgateLeaseRenewFailures",
                "the cut pod's failed renews (> 2) fire it, unless a pod judged an outage \
                 cluster-wide within the rule's window (5 min; 1 min scaled): in `all` the \
                 redis-outage scenario shortly before does",
            ));
            e.cannot.push((
                "PosgateRedisUnreachable",
                "the cut lasts 2x the lease TTL (6 s quick, 30 s full), under its for \
                 (1 min; 12 s scaled)",
            ));
        }
        Scenario::PartialPartition => {
            e.must.push("PosgateLeaseRenewFailures");
            e.may.push((
                "PosgateRedisUnreachable",
                "the cut (12 s quick, 60 s full) is as long as its for (1 min; 12 s scaled): \
                 it fires or not by a second",
            ));
            e.may.push((
                "PosgatePushErrorRatio",
                "the takeover's failed pushes (~10% for ~10 s) keep the ratio over 1 min \
                 (5 min full) above 1% for about as long as its for",
            ));
        }
        Scenario::RollingUpgrade => e.may.push((
            "PosgatePushErrorRatio",
            "the pushes with a TTL (half the plain rate) that new pods refuse with 503 \
             queue_unavailable while the releases mix count as failures (the old pods' 400s \
             are left out as the caller's); quick, the mix lasts about as long as the rule's \
             window + for (1 min + 1 min scaled)",
        )),
        Scenario::ColdStartQueued => e.may.push((
            "PosgatePushErrorRatio",
            "every terminal is offline while the pushes with a TTL are sent (~17 s quick), \
             so the plain pushes of that span end 503 terminal_unavailable: the ratio over \
             the rule's window (1 min scaled) stays above 1% about as long as its for",
        )),
        _ => {}
    }
    e
}

/// One alert instance (one label set) from pending to resolved, unix ms.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Episode {
    pub alert: String,
    /// Its labels but `__name__`, `alertname`, `alertstate`, `severity` and the scrape's
    /// `instance` and `job` (the `pod` label names the pod), as `k=v` joined by `,`.
    pub labels: String,
    pub severity: String,
    pub pending_unix_ms: u64,
    /// First evaluation it was firing; `None`: it resolved while pending.
    pub fired_unix_ms: Option<u64>,
    /// First evaluation it was gone; `None`: still active at the end.
    pub resolved_unix_ms: Option<u64>,
}

/// The alert part of a scenario's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AlertReport {
    /// The rules' `for` and range windows were divided by this (1: as written).
    pub rules_scale: u32,
    /// The scenario's start (before its event), unix ms.
    pub started_unix_ms: u64,
    pub expected: Expectation,
    /// Alerts that went pending during the scenario (or while the harness waited for
    /// them to resolve after it).
    pub episodes: Vec<Episode>,
    /// Alerts already active when the scenario began (not its own; not gated).
    pub carried_over: Vec<Episode>,
    /// How long the harness waited after the measurement for active alerts to resolve.
    pub settle_s: f64,
    /// When the alerts were last looked at (the end of the timeline), unix ms.
    pub until_unix_ms: u64,
}

impl AlertReport {
    /// Names of the alerts that fired in the scenario.
    pub fn fired(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .episodes
            .iter()
            .filter(|e| e.fired_unix_ms.is_some())
            .map(|e| e.alert.as_str())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The episodes of `series` (`ALERTS` over a range at `step_ms`); an instance seen at
/// `end_ms` (the range's last step) is still active.
pub fn episodes(series: &[Series], step_ms: u64, end_ms: u64) -> Vec<Episode> {
    // Per instance: every (step, firing?) it was seen at.
    let mut seen: BTreeMap<(String, String, String), Vec<(u64, bool)>> = BTreeMap::new();
    for s in series {
        let m = &s.metric;
        let get = |k: &str| m.get(k).cloned().unwrap_or_default();
        let labels = m
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "__name__" | "alertname" | "alertstate" | "severity" | "instance" | "job"
                )
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let firing = get("alertstate") == "firing";
        let points = seen
            .entry((get("alertname"), labels, get("severity")))
            .or_default();
        points.extend(s.values.iter().map(|(t, _)| ((t * 1000.0) as u64, firing)));
    }
    let mut out = Vec::new();
    for ((alert, labels, severity), mut points) in seen {
        points.sort_unstable();
        let mut i = 0;
        while i < points.len() {
            // One episode: consecutive steps (a missing step ends it).
            let mut j = i;
            while j + 1 < points.len() && points[j + 1].0 <= points[j].0 + step_ms * 3 / 2 {
                j += 1;
            }
            let last = points[j].0;
            out.push(Episode {
                alert: alert.clone(),
                labels: labels.clone(),
                severity: severity.clone(),
                pending_unix_ms: points[i].0,
                fired_unix_ms: points[i..=j].iter().find(|p| p.1).map(|p| p.0),
                resolved_unix_ms: (last + step_ms / 2 < end_ms).then_some(last + step_ms),
            });
            i = j + 1;
        }
    }
    out.sort_by_key(|e| (e.pending_unix_ms, e.alert.clone()));
    out
}

/// The gate lines of the alerts in `r` (none without Prometheus).
pub fn check(r: &mut ScenarioReport) {
    let Some(a) = r.alerts.clone() else {
        return;
    };
    let fired = a.fired();
    for must in &a.expected.must {
        let ok = fired.contains(must);
        let detail = match a.episodes.iter().find(|e| e.alert == *must) {
            Some(e) => describe(e, r.event_unix_ms),
            None => "never pending".into(),
        };
        r.check(&format!("alert {must} fired"), true, ok, detail);
    }
    let allowed = |n: &str| a.expected.must.contains(&n) || a.expected.may.iter().any(|m| m.0 == n);
    let unexpected: Vec<&str> = fired.iter().copied().filter(|n| !allowed(n)).collect();
    let detail = if unexpected.is_empty() {
        format!("fired: {fired:?}")
    } else {
        format!("fired but not expected here: {unexpected:?} (all fired: {fired:?})")
    };
    r.check(
        "no unexpected alert fired",
        true,
        unexpected.is_empty(),
        detail,
    );
}

fn rel(at: u64, event: u64) -> String {
    format!("{:+.0} s", (at as f64 - event as f64) / 1000.0)
}

/// "pending +2 s, firing +8 s, resolved +40 s" (relative to the event at `event`).
fn describe(e: &Episode, event: u64) -> String {
    let mut s = format!("pending {}", rel(e.pending_unix_ms, event));
    match e.fired_unix_ms {
        Some(f) => s += &format!(", firing {}", rel(f, event)),
        None => s += ", never firing",
    }
    match e.resolved_unix_ms {
        Some(t) => s += &format!(", resolved {}", rel(t, event)),
        None => s += ", still active",
    }
    s
}

/// The alert lines of one scenario's Markdown: per alert, its instances and the span
/// from the first pending to the last resolved, relative to the event.
pub fn lines(md: &mut String, r: &ScenarioReport) {
    let Some(a) = &r.alerts else {
        let _ = writeln!(md, "- alerts: not checked (no prometheus)");
        return;
    };
    let ev = r.event_unix_ms;
    let _ = writeln!(
        md,
        "- alerts (rules' for and range windows / {}; times relative to the event, which \
         was {:.1} s into the scenario; waited {:.1} s after the measurement for them to \
         resolve){}",
        a.rules_scale,
        ev.saturating_sub(a.started_unix_ms) as f64 / 1000.0,
        a.settle_s,
        if a.episodes.is_empty() {
            ": none went pending"
        } else {
            ":"
        }
    );
    for (what, list) in [("", &a.episodes), ("carried over: ", &a.carried_over)] {
        let mut by: BTreeMap<&str, Vec<&Episode>> = BTreeMap::new();
        for e in list.iter() {
            by.entry(e.alert.as_str()).or_default().push(e);
        }
        for (alert, es) in by {
            let first = es.iter().map(|e| e.pending_unix_ms).min().unwrap_or(0);
            let fired = es.iter().filter_map(|e| e.fired_unix_ms).min();
            let active = es.iter().any(|e| e.resolved_unix_ms.is_none());
            let last = es.iter().filter_map(|e| e.resolved_unix_ms).max();
            let mut labels: Vec<&str> = es.iter().map(|e| e.labels.as_str()).collect();
            labels.sort_unstable();
            labels.dedup();
            labels.retain(|l| !l.is_empty());
            let more = if labels.len() > 6 { "; ..." } else { "" };
            labels.truncate(6);
            let _ = writeln!(
                md,
                "  - {what}{alert} ({}), {} episode(s){}: pending {}, {}, {}",
                es[0].severity,
                es.len(),
                if labels.is_empty() {
                    String::new()
                } else {
                    format!(" [{}{more}]", labels.join("; "))
                },
                rel(first, ev),
                fired.map_or("never firing".into(), |f| format!("firing {}", rel(f, ev))),
                match (active, last) {
                    (true, _) => "still active".into(),
                    (false, Some(t)) => format!("all resolved {}", rel(t, ev)),
                    (false, None) => "resolved".into(),
                }
            );
        }
    }
    for (alert, why) in &a.expected.may {
        let _ = writeln!(md, "  - may fire, not gated: {alert}: {why}");
    }
    for (alert, why) in &a.expected.cannot {
        let _ = writeln!(md, "  - cannot fire here: {alert}: {why}");
    }
}

/// The one-line timeline of stderr.
pub fn timeline(r: &ScenarioReport) -> String {
    let Some(a) = &r.alerts else {
        return "alerts: not checked (no prometheus)".into();
    };
    let fired: Vec<String> = a
        .fired()
        .into_iter()
        .map(|n| {
            let first = a
                .episodes
                .iter()
                .find(|e| e.alert == n && e.fired_unix_ms.is_some());
            first.map_or(n.to_owned(), |e| {
                format!("{n} ({})", describe(e, r.event_unix_ms))
            })
        })
        .collect();
    format!(
        "alerts fired: {}",
        if fired.is_empty() {
            "none".into()
        } else {
            fired.join("; ")
        }
    )
}

/// How long to wait at most for active alerts to resolve: the longest `for` twice over
/// (the rules' range windows are no longer than their longest `for`, a test in
/// `rules.rs` says so), plus 10 s.
fn settle_limit(p: &Prometheus) -> Duration {
    p.longest_for() * 2 + Duration::from_secs(10)
}

/// After the scenario's measurement: waits until no alert is active (pending or
/// firing; at most [`settle_limit`]), then reads the timeline since `t0` (unix ms).
pub async fn observe(c: &Cluster, sc: Scenario, t0: u64) -> Result<Option<AlertReport>, LoadError> {
    let Some(p) = &c.prometheus else {
        return Ok(None);
    };
    let waited = std::time::Instant::now();
    let limit = settle_limit(p);
    while !p.query(&c.client, "ALERTS").await?.is_empty() && waited.elapsed() < limit {
        tokio::time::sleep(INTERVAL).await;
    }
    let until = unix_ms();
    let step = INTERVAL.as_millis() as u64;
    // From one step before: an alert active at t0 shows as carried over.
    let series = p
        .query_range(&c.client, "ALERTS", t0 - step, until, INTERVAL)
        .await?;
    let (carried_over, episodes) = episodes(&series, step, until)
        .into_iter()
        .partition(|e| e.pending_unix_ms < t0);
    Ok(Some(AlertReport {
        rules_scale: p.rules_scale,
        started_unix_ms: t0,
        expected: expect(sc),
        episodes,
        carried_over,
        settle_s: waited.elapsed().as_secs_f64(),
        until_unix_ms: until,
    }))
}

#[cfg(test)]
#[path = "alerts_tests.rs"]
mod tests;
