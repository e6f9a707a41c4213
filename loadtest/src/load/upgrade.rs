//! What `rolling-upgrade` adds to a scenario report: proof that pods of the previous
//! release and of this one talked while both ran, and what the pushes of that mixed phase
//! did.
//!
//! - Before the run, [`check_serve_flags`]: the previous release must list every `serve`
//!   flag the harness passes (a pod that exits on an unknown flag would otherwise look
//!   like a failed upgrade). A missing flag refuses the run; dropping it would silently
//!   give old and new pods different timings.
//! - During the replacement, one [`Step`] per replaced pod, with the peer counters of
//!   the new pods' `/metrics` right after the old pod exited.
//! - At the end, [`UpgradeReport`]: the mixed window (first new pod started -> last old
//!   pod exited), its pushes by path (entry pod's release -> delivering pod's release,
//!   from the `200`'s `pod`), and the counters again.
//!
//! Not for: the replacement loop itself (`scenarios`, shared with rolling-restart) or
//! the safety figures every scenario reports (`measure`).

use std::{collections::BTreeMap, ffi::OsString, fmt::Write as _};

use serde::Serialize;
use tokio::process::Command;

use super::{
    cluster::Cluster,
    pods::{PodPlan, Release},
    pushgen::PushRecord,
    report::ScenarioReport,
    LoadError,
};

const LEGACY: &str = "posgate_peer_legacy_requests_total";
const REFUSED: &str = "posgate_peer_requests_refused_total";

/// The flags (`--name`) among `args` that `help` (a binary's `serve --help`, clap's
/// layout) does not list. A flag counts as listed where a line starts with it (`-h,
/// --help`, `      --lease-ttl <LEASE_TTL>`), not where a description mentions it.
pub fn missing_flags(help: &str, args: &[OsString]) -> Vec<String> {
    let listed: Vec<&str> = help
        .lines()
        .flat_map(|l| {
            l.split([' ', ',', '='])
                .filter(|w| !w.is_empty())
                .take_while(|w| w.starts_with('-'))
        })
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .collect();
    let mut missing: Vec<String> = args
        .iter()
        .filter_map(|a| a.to_str())
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_owned())
        .filter(|a| !listed.contains(&a.as_str()))
        .collect();
    missing.dedup();
    missing
}

/// Refuses `release`'s binary if its `serve --help` lacks a flag the harness passes.
pub async fn check_serve_flags(plan: &PodPlan, release: Release) -> Result<(), LoadError> {
    let binary = plan.binary(release)?;
    let out = Command::new(binary)
        .args(["serve", "--help"])
        .output()
        .await
        .map_err(|source| LoadError::Spawn {
            what: format!("{} serve --help", binary.display()),
            source,
        })?;
    if !out.status.success() {
        return Err(LoadError::Exited {
            what: format!("{} serve --help", binary.display()),
            status: out.status.to_string(),
        });
    }
    let help = String::from_utf8_lossy(&out.stdout);
    let missing = missing_flags(&help, &plan.serve_args("pod-0", 1, "redis://127.0.0.1:1/"));
    if missing.is_empty() {
        return Ok(());
    }
    Err(LoadError::Plan(format!(
        "{} ({} release) has no serve flag {}, which the harness passes to every pod",
        binary.display(),
        release.name(),
        missing.join(", ")
    )))
}

/// The peer counters of one pod's `/metrics`, or a sum of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PeerCounters {
    /// `posgate_peer_legacy_requests_total`: protocol-1 requests accepted.
    pub legacy_accepted: u64,
    /// `posgate_peer_requests_refused_total` by `reason` (zeros left out).
    pub refused: BTreeMap<String, u64>,
}

impl PeerCounters {
    /// Reads the two counters from a scrape (either text format: only samples are read).
    pub fn parse(text: &str) -> Self {
        let mut c = PeerCounters::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let value = value as u64;
            if name == LEGACY {
                c.legacy_accepted += value;
            } else if let Some(labels) =
                name.strip_prefix(REFUSED).and_then(|l| l.strip_prefix('{'))
            {
                let reason = labels
                    .split_once("reason=\"")
                    .and_then(|(_, r)| r.split_once('"'))
                    .map_or("?", |(r, _)| r);
                if value > 0 {
                    *c.refused.entry(reason.to_owned()).or_default() += value;
                }
            }
        }
        c
    }

    pub fn add(&mut self, other: &PeerCounters) {
        self.legacy_accepted += other.legacy_accepted;
        for (reason, n) in &other.refused {
            *self.refused.entry(reason.clone()).or_default() += n;
        }
    }

    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }
}

/// The new pods' counters, summed, and the pods whose `/metrics` did not answer.
pub async fn scrape_new_pods(c: &Cluster) -> (PeerCounters, Vec<String>) {
    let mut sum = PeerCounters::default();
    let mut unanswered = Vec::new();
    for pod in c.pods.iter().filter(|p| p.release == Release::Current) {
        match pod.metrics(&c.client).await {
            Ok(text) => sum.add(&PeerCounters::parse(&text)),
            Err(_) => unanswered.push(pod.id.clone()),
        }
    }
    (sum, unanswered)
}

/// One replaced pod.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub new_pod: String,
    pub old_pod: String,
    pub new_started_unix_ms: u64,
    pub new_ready_unix_ms: u64,
    /// When the old pod got SIGTERM (the next step starts right after).
    pub old_signalled_unix_ms: u64,
    /// Pods of the previous release still running after this step.
    pub old_left: usize,
    /// The new pods' counters (summed) right after the old pod got SIGTERM.
    pub peer: PeerCounters,
    /// New pods whose `/metrics` did not answer then.
    pub unscraped: Vec<String>,
}

/// What the replacement recorded.
#[derive(Debug, Clone, Default)]
pub struct UpgradeTrace {
    /// The release of every pod that ran during the scenario.
    pub releases: BTreeMap<String, Release>,
    pub steps: Vec<Step>,
    /// When the last pod of the previous release exited: the end of the mixed window.
    pub old_gone_unix_ms: u64,
    /// The new pods' counters (summed) then.
    pub mixed_end: PeerCounters,
}

/// The pushes of the mixed window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MixedPushes {
    /// Pushes whose first attempt was sent in the window.
    pub pushes: usize,
    pub first_ok: usize,
    pub final_ok: usize,
    /// `200` attempts sent in the window by path: `old -> new` (entry pod of the previous
    /// release, delivered by a new pod), `new -> old`, `old -> old`, `new -> new`, or
    /// `old local` / `new local` (the entry pod owned the terminal).
    pub delivered_by_path: BTreeMap<String, usize>,
    /// `old -> new` plus `new -> old`: forwarded between the releases.
    pub across_releases: usize,
    /// Every attempt sent in the window, by its entry pod's release and its outcome.
    pub outcomes_by_entry: BTreeMap<String, usize>,
}

fn release_name(releases: &BTreeMap<String, Release>, pod: &str) -> &'static str {
    releases.get(pod).map_or("?", |r| r.name())
}

/// The pushes sent in `[from, to]` (unix ms), attributed with `releases`.
pub fn mixed_pushes(
    pushes: &[PushRecord],
    releases: &BTreeMap<String, Release>,
    from: u64,
    to: u64,
) -> MixedPushes {
    let mut m = MixedPushes::default();
    let inside = |t: u64| (from..=to).contains(&t);
    for p in pushes.iter().filter(|p| inside(p.first.sent_unix_ms)) {
        m.pushes += 1;
        m.first_ok += usize::from(p.first.status == 200);
        m.final_ok += usize::from(p.last().status == 200);
    }
    let attempts = pushes.iter().flat_map(PushRecord::attempts);
    for a in attempts.filter(|a| inside(a.sent_unix_ms)) {
        let entry = release_name(releases, &a.entry_pod);
        let outcome = match a.status {
            0 => a.outcome.clone(),
            s => format!("{s} {}", a.outcome),
        };
        *m.outcomes_by_entry
            .entry(format!("{entry}: {outcome}"))
            .or_default() += 1;
        let Some(owner) = a.delivered_by.as_deref() else {
            continue;
        };
        let path = if owner == a.entry_pod {
            format!("{entry} local")
        } else {
            let to = release_name(releases, owner);
            if entry != to && entry != "?" && to != "?" {
                m.across_releases += 1;
            }
            format!("{entry} -> {to}")
        };
        *m.delivered_by_path.entry(path).or_default() += 1;
    }
    m
}

/// The rolling-upgrade part of a scenario report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UpgradeReport {
    pub steps: Vec<Step>,
    /// First new pod started (it joins the members at once) -> last old pod exited.
    pub mixed_from_unix_ms: u64,
    pub mixed_to_unix_ms: u64,
    pub mixed: MixedPushes,
    /// The new pods' counters (summed) when the last old pod had exited.
    pub mixed_end: PeerCounters,
    /// The new pods' counters (summed) at the end of the scenario.
    pub end: PeerCounters,
    pub end_unscraped: Vec<String>,
}

impl UpgradeReport {
    pub fn mixed_s(&self) -> f64 {
        self.mixed_to_unix_ms
            .saturating_sub(self.mixed_from_unix_ms) as f64
            / 1000.0
    }
}

/// Builds the report from the trace, the pushes and a last scrape of the new pods.
pub async fn report(c: &Cluster, trace: &UpgradeTrace, pushes: &[PushRecord]) -> UpgradeReport {
    let from = trace.steps.first().map_or(0, |s| s.new_started_unix_ms);
    let to = trace.old_gone_unix_ms;
    let (end, end_unscraped) = scrape_new_pods(c).await;
    UpgradeReport {
        steps: trace.steps.clone(),
        mixed_from_unix_ms: from,
        mixed_to_unix_ms: to,
        mixed: mixed_pushes(pushes, &trace.releases, from, to),
        mixed_end: trace.mixed_end.clone(),
        end,
        end_unscraped,
    }
}

/// The gate (protocol-1 requests accepted while both releases ran) and the refusal
/// target.
pub fn checks(r: &mut ScenarioReport) {
    let Some(u) = r.upgrade.clone() else {
        return;
    };
    let mixed = &u.mixed_end;
    let d = format!(
        "{} protocol-1 requests accepted by the new pods by the time the last old pod exited \
         ({} at the end); {} pushes forwarded between an old and a new pod",
        mixed.legacy_accepted, u.end.legacy_accepted, u.mixed.across_releases
    );
    // Pushes forwarded between the releases prove they talked whatever peer protocol the
    // old one speaks (protocol-1 requests appear only when it predates protocol 2; a
    // refused one fails the next check).
    r.check(
        "old and new pods talked: pushes forwarded between the releases > 0",
        true,
        u.mixed.across_releases > 0,
        d,
    );
    let after: u64 = u
        .end
        .refused
        .iter()
        .filter(|(reason, _)| reason.as_str() != "legacy_refused")
        .map(|(_, n)| n)
        .sum();
    let ok = mixed.refused_total() == 0 && after == 0;
    let d = format!(
        "refused by the new pods: {:?} when the last old pod exited, {:?} at the end",
        mixed.refused, u.end.refused
    );
    r.check(
        "no peer request refused (but legacy_refused after the last old pod left)",
        false,
        ok,
        d,
    );
}

/// The report's Markdown lines about the upgrade.
pub fn lines(md: &mut String, u: &UpgradeReport) {
    let m = &u.mixed;
    let pct = |n: usize| 100.0 * n as f64 / m.pushes.max(1) as f64;
    let _ = writeln!(
        md,
        "- mixed phase (first new pod started -> last old pod exited): {:.1} s, {} pushes, \
         {:.2}% 200 at the first attempt, {:.2}% in the end; 200s by path (entry -> \
         delivering pod) {:?}; {} forwarded between an old and a new pod; attempts by entry \
         pod's release {:?}",
        u.mixed_s(),
        m.pushes,
        pct(m.first_ok),
        pct(m.final_ok),
        m.delivered_by_path,
        m.across_releases,
        m.outcomes_by_entry
    );
    for s in &u.steps {
        let _ = writeln!(
            md,
            "- step: {} ready {} ms after its start, then {} got SIGTERM {} ms later; {} old pods \
             left; new pods' legacy accepted {}, refused {:?}{}",
            s.new_pod,
            s.new_ready_unix_ms.saturating_sub(s.new_started_unix_ms),
            s.old_pod,
            s.old_signalled_unix_ms.saturating_sub(s.new_ready_unix_ms),
            s.old_left,
            s.peer.legacy_accepted,
            s.peer.refused,
            unscraped(&s.unscraped)
        );
    }
    let _ = writeln!(
        md,
        "- at the end: new pods' legacy accepted {}, refused {:?}{}",
        u.end.legacy_accepted,
        u.end.refused,
        unscraped(&u.end_unscraped)
    );
}

fn unscraped(pods: &[String]) -> String {
    if pods.is_empty() {
        String::new()
    } else {
        format!(" (no /metrics from {})", pods.join(", "))
    }
}

/// The release of each pod now in `c`, for the trace.
pub fn releases_of(c: &Cluster) -> BTreeMap<String, Release> {
    c.pods.iter().map(|p| (p.id.clone(), p.release)).collect()
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;
