//! The push generator: pushes at a fixed rate to a random target pod for a random
//! terminal, each with a fresh idempotency key, and records every outcome. It never
//! retries, so a key a terminal accepts twice is the gateway's doing.

use std::{
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Method;
use serde::Serialize;
use tokio::{sync::watch, task::JoinSet};

use super::{
    http::{exchange, ExchangeError, HttpClient},
    pods::TOKEN,
    unix_ms,
};

/// Pods pushes may be sent to now: `(pod id, base URL)`. Like a Service's endpoints, the
/// harness removes a pod before it stops, kills or pauses it.
pub type Targets = Arc<RwLock<Vec<(String, String)>>>;

/// One push and what came back.
#[derive(Debug, Clone, Serialize)]
pub struct PushRecord {
    pub sent_unix_ms: u64,
    pub entry_pod: String,
    pub terminal: String,
    /// HTTP status, 0 without an answer.
    pub status: u16,
    /// The `error` code of a non-200 answer, `transport` / `unanswered` without one.
    pub outcome: String,
    pub latency_ms: u64,
    /// No answer within the push deadline + 1 s, or the connection failed before one.
    pub unanswered: bool,
}

/// Generator settings.
#[derive(Debug, Clone)]
pub struct PushPlan {
    pub rate_per_s: f64,
    pub timeout_ms: u64,
    pub terminals: u64,
    pub run_tag: String,
}

/// A running generator; [`PushGen::stop`] ends it and waits for the answers.
pub struct PushGen {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<PushRecord>>,
}

impl PushGen {
    pub fn start(plan: PushPlan, client: HttpClient, targets: Targets, scenario: &str) -> Self {
        let (stop, stopped) = watch::channel(false);
        let tag = format!("{}-{scenario}", plan.run_tag);
        let task = tokio::spawn(run(plan, client, targets, tag, stopped));
        PushGen { stop, task }
    }

    /// Stops sending and returns every record once all pushes ended (each is bounded by
    /// its deadline + 1 s).
    pub async fn stop(self) -> Vec<PushRecord> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

async fn run(
    plan: PushPlan,
    client: HttpClient,
    targets: Targets,
    tag: String,
    mut stopped: watch::Receiver<bool>,
) -> Vec<PushRecord> {
    let records = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    let period = Duration::from_secs_f64(1.0 / plan.rate_per_s.max(0.1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let limit = Duration::from_millis(plan.timeout_ms + 1000);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            _ = tick.tick() => {}
        }
        while tasks.try_join_next().is_some() {}
        let target = {
            let t = targets.read().unwrap_or_else(|p| p.into_inner());
            if t.is_empty() {
                continue;
            }
            t[fastrand::usize(..t.len())].clone()
        };
        seq += 1;
        let terminal = format!("pos-{:05}", fastrand::u64(..plan.terminals));
        let key = format!("{tag}-{seq}");
        let url = format!(
            "{}/v1/terminals/{terminal}/push?timeout_ms={}",
            target.1, plan.timeout_ms
        );
        let (client, records) = (client.clone(), records.clone());
        tasks.spawn(async move {
            let sent_unix_ms = unix_ms();
            let started = Instant::now();
            let auth = format!("Bearer {TOKEN}");
            let headers = [
                ("authorization", auth.as_str()),
                ("idempotency-key", key.as_str()),
                ("content-type", "application/json"),
            ];
            let body = Bytes::from(format!("{{\"seq\":{seq}}}"));
            let result = exchange(&client, Method::POST, &url, &headers, body, limit).await;
            let latency_ms = started.elapsed().as_millis() as u64;
            let (status, outcome, unanswered) = match result {
                Ok(a) if a.status == 200 => (200, "ok".to_owned(), false),
                Ok(a) => {
                    let code = serde_json::from_slice::<serde_json::Value>(&a.body)
                        .ok()
                        .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
                        .unwrap_or_else(|| "?".into());
                    (a.status, code, false)
                }
                Err(ExchangeError::Timeout) => (0, "unanswered".to_owned(), true),
                Err(ExchangeError::Transport(_)) => (0, "transport".to_owned(), true),
            };
            let record = PushRecord {
                sent_unix_ms,
                entry_pod: target.0,
                terminal,
                status,
                outcome,
                latency_ms,
                unanswered,
            };
            records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(record);
        });
    }
    while tasks.join_next().await.is_some() {}
    let mut out = std::mem::take(&mut *records.lock().unwrap_or_else(|p| p.into_inner()));
    out.sort_by_key(|r| r.sent_unix_ms);
    out
}
