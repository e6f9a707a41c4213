//! The `broadcast` scenario: every terminal labeled `fleet=all` (an import that changes
//! only labels, so nothing redials), live pushes for an idle window, then one broadcast
//! to every terminal, followed with `GET /v1/broadcasts/{id}` until it completes. It
//! reports the time to complete and the live pushes' latency while it ran against the
//! idle window of the same run: a benchmark (two shared cores measure contention, so
//! the ratio is reported, not gated).
//!
//! Not for: the live pushes themselves (`pushgen`) or checks common to every scenario.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde::Serialize;

use super::cluster::Cluster;
use super::http::exchange;
use super::pods::{import_directory, TOKEN};
use super::pushgen::PushRecord;
use super::{unix_ms, LoadError};
use posgate_pos_sim::dist::{dist, Dist};

/// The label every terminal gets, and the selector of the broadcast.
const LABEL: &str = "fleet=all";
/// How long the broadcast may run (every pod sends at `--broadcast-rate`).
const LIMIT: Duration = Duration::from_secs(300);

/// What the scenario did, for the report.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub id: String,
    /// Live pushes sent in `[idle.0, idle.1)` are the baseline, those in
    /// `[during.0, during.1)` ran beside the broadcast (unix ms).
    pub idle: (u64, u64),
    pub during: (u64, u64),
    /// The broadcast's last status: complete or not, and its counts.
    pub complete: bool,
    pub matched: u64,
    pub delivered: u64,
    pub duplicates: u64,
    pub failed: u64,
}

/// What the report shows of it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BroadcastReport {
    pub complete: bool,
    pub took_s: f64,
    pub matched: u64,
    pub delivered: u64,
    pub duplicates: u64,
    pub failed: u64,
    /// Items per second over the whole broadcast.
    pub items_per_s: f64,
    /// Live pushes answered 200: latency in the idle window and during the broadcast.
    pub idle_ms: Dist,
    pub during_ms: Dist,
    /// `during_ms.p99 / idle_ms.p99`.
    pub p99_ratio: f64,
}

/// Labels every terminal, waits `idle` with live pushes flowing (its second half is the
/// baseline), then sends the broadcast and follows it.
pub async fn run(c: &Cluster, idle: Duration) -> Result<Run, LoadError> {
    let labeled = c.sims.csv.with_extension("labeled.csv");
    let csv = std::fs::read_to_string(&c.sims.csv)
        .map_err(|e| LoadError::io(format!("reading {}", c.sims.csv.display()), e))?;
    let mut out = String::from("id,addr,server_name,labels\n");
    for line in csv.lines().skip(1) {
        let _ = writeln!(out, "{line},{LABEL}");
    }
    std::fs::write(&labeled, out)
        .map_err(|e| LoadError::io(format!("writing {}", labeled.display()), e))?;
    import_directory(&c.plan.posgate, &labeled, c.redis.addr()).await?;
    // The owners re-read every shard's directory after the relabel (in the full profile
    // the live pushes' p99 stays up for about 20 s): the baseline is the second half.
    tokio::time::sleep(idle / 2).await;
    let idle_from = unix_ms();
    tokio::time::sleep(idle / 2).await;
    let from = unix_ms();
    let pod = c
        .pods
        .iter()
        .find(|p| p.ready)
        .ok_or_else(|| LoadError::Plan("no ready pod to send the broadcast to".into()))?;
    let url = format!(
        "{}/v1/broadcasts?selector={}&ttl_s=600",
        pod.url,
        LABEL.replace('=', "%3D")
    );
    let auth = format!("Bearer {TOKEN}");
    let key = format!("load-broadcast-{from}");
    let headers = [
        ("authorization", auth.as_str()),
        ("idempotency-key", key.as_str()),
        ("content-type", "application/json"),
    ];
    let body = Bytes::from_static(b"{\"price_list\":\"2026-12\"}");
    let answer = exchange(
        &c.client,
        Method::POST,
        &url,
        &headers,
        body,
        Duration::from_secs(10),
    )
    .await
    .map_err(|e| LoadError::Plan(format!("sending the broadcast: {e}")))?;
    let created: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
    let Some(id) = created["id"].as_str().filter(|_| answer.status == 202) else {
        return Err(LoadError::Plan(format!(
            "the broadcast was answered {}: {created}",
            answer.status
        )));
    };
    let mut run = Run {
        id: id.to_string(),
        idle: (idle_from, from),
        ..Run::default()
    };
    let status_url = format!("{}/v1/broadcasts/{id}", pod.url);
    while unix_ms() < from + LIMIT.as_millis() as u64 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let answer = exchange(
            &c.client,
            Method::GET,
            &status_url,
            &headers[..1],
            Bytes::new(),
            Duration::from_secs(5),
        )
        .await;
        let Ok(answer) = answer else { continue };
        let status: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        let count = |k: &str| status["counts"][k].as_u64().unwrap_or(0);
        (run.matched, run.delivered) = (count("matched"), count("delivered"));
        (run.duplicates, run.failed) = (count("duplicates"), count("failed"));
        if status["state"] == "complete" {
            run.complete = true;
            break;
        }
    }
    run.during = (from, unix_ms());
    Ok(run)
}

/// The report of `run`, with the live pushes' latency from `pushes`.
pub fn report(run: &Run, pushes: &[PushRecord]) -> BroadcastReport {
    let window = |(from, to): (u64, u64)| {
        dist(
            pushes
                .iter()
                .flat_map(PushRecord::attempts)
                .filter(|a| a.status == 200 && (from..to).contains(&a.sent_unix_ms))
                .map(|a| a.latency_ms)
                .collect(),
        )
    };
    let (idle_ms, during_ms) = (window(run.idle), window(run.during));
    let took_s = run.during.1.saturating_sub(run.during.0) as f64 / 1000.0;
    BroadcastReport {
        complete: run.complete,
        took_s,
        matched: run.matched,
        delivered: run.delivered,
        duplicates: run.duplicates,
        failed: run.failed,
        items_per_s: run.delivered as f64 / took_s.max(0.001),
        p99_ratio: during_ms.p99 as f64 / idle_ms.p99.max(1) as f64,
        idle_ms,
        during_ms,
    }
}

/// The report's lines about it.
pub fn lines(md: &mut String, b: &BroadcastReport) {
    let _ = writeln!(
        md,
        "- broadcast to every terminal ({LABEL}): {} of {} delivered ({} duplicates, {} \
         failed) in {:.1} s ({:.0} items/s){}; live pushes p99 {} ms during it against {} \
         ms idle: {:.2} x (p50 {} ms against {} ms; {} and {} pushes)",
        b.delivered,
        b.matched,
        b.duplicates,
        b.failed,
        b.took_s,
        b.items_per_s,
        if b.complete { "" } else { ", NOT complete" },
        b.during_ms.p99,
        b.idle_ms.p99,
        b.p99_ratio,
        b.during_ms.p50,
        b.idle_ms.p50,
        b.during_ms.count,
        b.idle_ms.count
    );
}
