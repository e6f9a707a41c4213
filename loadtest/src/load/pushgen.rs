//! The push generator: pushes at a fixed rate to a random in-service pod for a random
//! terminal, each push with its own idempotency key, and records every attempt.
//!
//! It retries like a real sender ([`retry_delay`]): a push answered `503` (not delivered;
//! after its `Retry-After`, loosely), `504` (delivery unknown), `409
//! idempotency_conflict` (the harness never reuses a key with another body, so that is
//! "the first attempt is still in flight") or not answered at all is sent again with the
//! same key and body through a different entry pod when there is one, up to
//! [`MAX_ATTEMPTS`] attempts. Only these retries reuse a key, so a key a terminal accepts
//! twice is either the gateway's doing or the crash gap `duplicates` classifies.
//!
//! With [`PushPlan::ttl_s`] the pushes wait for their terminal (`?ttl_s=`): a `202` is
//! recorded with its `state` (`202 queued`) and not retried; `later` follows them to
//! where they end. offline-later's rounds send such pushes one by one ([`Push::send`]).
//!
//! Not for: judging outcomes (`measure`, `later`) or classifying duplicates (`duplicates`).

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
use posgate_pos_sim::FaultConfig;

/// Pods pushes may be sent to now: `(pod id, base URL)`. Like a Service's endpoints, the
/// harness removes a pod before it stops, kills or pauses it.
pub type Targets = Arc<RwLock<Vec<(String, String)>>>;

/// Most attempts per push (the first one included).
pub const MAX_ATTEMPTS: usize = 3;
/// Pause before retrying a `504`, a `409` or a push without an answer.
const BACKOFF: Duration = Duration::from_millis(250);
/// `503` without `Retry-After`: what the gateway sends (`Retry-After: 1`).
const DEFAULT_RETRY_AFTER_S: u64 = 1;
/// A longer `Retry-After` is cut to this: a load test must not wait out a long hint.
const MAX_RETRY_AFTER_S: u64 = 2;

/// One attempt of a push and what came back.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    pub sent_unix_ms: u64,
    pub entry_pod: String,
    /// HTTP status, 0 without an answer.
    pub status: u16,
    /// `ok` (200), the `state` of a `202`, the `error` code of another answer,
    /// `transport` / `unanswered` without one.
    pub outcome: String,
    pub latency_ms: u64,
    /// No answer within the push deadline + 1 s, or the connection failed before one.
    pub unanswered: bool,
    /// A `200`'s `pod`: the owner that delivered (the entry pod, or the one it forwarded
    /// to).
    pub delivered_by: Option<String>,
}

/// One push: its key and every attempt, in order.
#[derive(Debug, Clone, Serialize)]
pub struct PushRecord {
    pub terminal: String,
    pub idempotency_key: String,
    pub first: Attempt,
    /// The retries, in order; the last one (or `first`) is the push's final outcome.
    pub retries: Vec<Attempt>,
}

impl PushRecord {
    /// The first attempt, then the retries.
    pub fn attempts(&self) -> impl Iterator<Item = &Attempt> {
        std::iter::once(&self.first).chain(&self.retries)
    }

    /// The last attempt: the outcome the sender ends with.
    pub fn last(&self) -> &Attempt {
        self.retries.last().unwrap_or(&self.first)
    }
}

/// Generator settings.
#[derive(Debug, Clone)]
pub struct PushPlan {
    pub rate_per_s: f64,
    pub timeout_ms: u64,
    pub terminals: u64,
    pub run_tag: String,
    /// `?ttl_s=` of every push: they wait for their terminal up to this long.
    pub ttl_s: Option<u64>,
    /// The terminals the scenario takes offline (offline-later's fifth, pos-sim's fault):
    /// a push without a TTL to them could only fail, so the generator leaves them out.
    pub offline: FaultConfig,
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

    /// Stops starting pushes and returns every record once all pushes ended, retries
    /// included (each attempt is bounded by its deadline + 1 s).
    pub async fn stop(self) -> Vec<PushRecord> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// How long a sender waits before retrying after `attempt` (`retry_after_s`: the answer's
/// `Retry-After`), or `None` when it does not retry: after a `200`, and after answers
/// that a retry cannot change (`400`, `401`, `404`, `413`, `502`: the terminal's own
/// refusal).
pub fn retry_delay(attempt: &Attempt, retry_after_s: Option<u64>) -> Option<Duration> {
    match attempt.status {
        0 | 504 => Some(BACKOFF),
        409 if attempt.outcome == "idempotency_conflict" => Some(BACKOFF),
        503 => {
            let s = retry_after_s.unwrap_or(DEFAULT_RETRY_AFTER_S);
            Some(Duration::from_secs(s.min(MAX_RETRY_AFTER_S)))
        }
        _ => None,
    }
}

/// A target for the next attempt: one not `tried` yet if there is one, else any.
pub fn pick_target(targets: &[(String, String)], tried: &[String]) -> Option<(String, String)> {
    let fresh: Vec<&(String, String)> = targets.iter().filter(|t| !tried.contains(&t.0)).collect();
    let pool: Vec<&(String, String)> = if fresh.is_empty() {
        targets.iter().collect()
    } else {
        fresh
    };
    if pool.is_empty() {
        return None;
    }
    Some(pool[fastrand::usize(..pool.len())].clone())
}

pub(crate) fn snapshot(targets: &Targets) -> Vec<(String, String)> {
    targets.read().unwrap_or_else(|p| p.into_inner()).clone()
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
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            _ = tick.tick() => {}
        }
        while tasks.try_join_next().is_some() {}
        let Some(target) = pick_target(&snapshot(&targets), &[]) else {
            continue;
        };
        let Some(terminal) = (0..100)
            .map(|_| fastrand::u64(..plan.terminals))
            .map(|n| (n, format!("pos-{n:05}")))
            .find(|(n, id)| !plan.offline.is_offline(*n, id))
        else {
            continue;
        };
        seq += 1;
        let push = Push {
            terminal: terminal.1,
            key: format!("{tag}-{seq}"),
            body: Bytes::from(format!("{{\"seq\":{seq}}}")),
            timeout_ms: plan.timeout_ms,
            ttl_s: plan.ttl_s,
        };
        let (client, targets, records) = (client.clone(), targets.clone(), records.clone());
        tasks.spawn(async move {
            let record = push.send(&client, &targets, target).await;
            records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(record);
        });
    }
    while tasks.join_next().await.is_some() {}
    let mut out = std::mem::take(&mut *records.lock().unwrap_or_else(|p| p.into_inner()));
    out.sort_by_key(|r| r.first.sent_unix_ms);
    out
}

/// What every attempt of one push sends.
pub(crate) struct Push {
    pub(crate) terminal: String,
    pub(crate) key: String,
    pub(crate) body: Bytes,
    pub(crate) timeout_ms: u64,
    pub(crate) ttl_s: Option<u64>,
}

impl Push {
    /// The first attempt through `target`, then the retries [`retry_delay`] allows, each
    /// through a pod not tried yet when there is one.
    pub(crate) async fn send(
        self,
        client: &HttpClient,
        targets: &Targets,
        target: (String, String),
    ) -> PushRecord {
        let (first, mut retry_after) = self.attempt(client, target.clone()).await;
        let mut tried = vec![target.0];
        let mut record = PushRecord {
            terminal: self.terminal.clone(),
            idempotency_key: self.key.clone(),
            first,
            retries: Vec::new(),
        };
        while tried.len() < MAX_ATTEMPTS {
            let Some(delay) = retry_delay(record.last(), retry_after) else {
                break;
            };
            // Jitter, as senders do, so retries after one event do not arrive in lockstep.
            tokio::time::sleep(delay.mul_f64(0.75 + fastrand::f64() / 2.0)).await;
            let Some(next) = pick_target(&snapshot(targets), &tried) else {
                break;
            };
            tried.push(next.0.clone());
            let (attempt, after) = self.attempt(client, next).await;
            record.retries.push(attempt);
            retry_after = after;
        }
        record
    }

    /// One attempt through `target`, and the answer's `Retry-After`.
    async fn attempt(
        &self,
        client: &HttpClient,
        target: (String, String),
    ) -> (Attempt, Option<u64>) {
        let ttl = self.ttl_s.map_or(String::new(), |s| format!("&ttl_s={s}"));
        let url = format!(
            "{}/v1/terminals/{}/push?timeout_ms={}{ttl}",
            target.1, self.terminal, self.timeout_ms
        );
        let limit = Duration::from_millis(self.timeout_ms + 1000);
        let sent_unix_ms = unix_ms();
        let started = Instant::now();
        let auth = format!("Bearer {TOKEN}");
        let headers = [
            ("authorization", auth.as_str()),
            ("idempotency-key", self.key.as_str()),
            ("content-type", "application/json"),
        ];
        let result = exchange(
            client,
            Method::POST,
            &url,
            &headers,
            self.body.clone(),
            limit,
        )
        .await;
        let latency_ms = started.elapsed().as_millis() as u64;
        let field = |body: &[u8], name: &str| {
            serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get(name)?.as_str().map(str::to_owned))
        };
        let mut delivered_by = None;
        let (status, outcome, unanswered, retry_after) = match result {
            Ok(a) if a.status == 200 => {
                delivered_by = field(&a.body, "pod");
                (200, "ok".to_owned(), false, None)
            }
            Ok(a) => {
                let code = field(&a.body, "error")
                    .or_else(|| field(&a.body, "state"))
                    .unwrap_or_else(|| "?".into());
                (a.status, code, false, a.retry_after_s)
            }
            Err(ExchangeError::Timeout) => (0, "unanswered".to_owned(), true, None),
            Err(ExchangeError::Transport(_)) => (0, "transport".to_owned(), true, None),
        };
        let attempt = Attempt {
            sent_unix_ms,
            entry_pod: target.0,
            status,
            outcome,
            latency_ms,
            unanswered,
            delivered_by,
        };
        (attempt, retry_after)
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Records for the load tool's unit tests.

    use super::{Attempt, PushRecord};

    /// An attempt through `pod` sent at `sent`; status 0 is "no answer".
    pub(crate) fn attempt(pod: &str, sent: u64, status: u16, outcome: &str) -> Attempt {
        Attempt {
            sent_unix_ms: sent,
            entry_pod: pod.into(),
            status,
            outcome: outcome.into(),
            latency_ms: 3,
            unanswered: status == 0,
            delivered_by: None,
        }
    }

    /// A push to terminal "t" whose key names its first attempt's send time.
    pub(crate) fn push(first: Attempt, retries: Vec<Attempt>) -> PushRecord {
        PushRecord {
            terminal: "t".into(),
            idempotency_key: format!("k{}", first.sent_unix_ms),
            first,
            retries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(status: u16, outcome: &str) -> Attempt {
        Attempt {
            sent_unix_ms: 0,
            entry_pod: "p".into(),
            status,
            outcome: outcome.into(),
            latency_ms: 0,
            unanswered: status == 0,
            delivered_by: None,
        }
    }

    #[test]
    fn retries_what_a_real_sender_retries() {
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
        assert_eq!(ms(retry_delay(&attempt(200, "ok"), None)), None);
        assert_eq!(
            ms(retry_delay(&attempt(504, "pos_timeout"), None)),
            Some(250)
        );
        assert_eq!(ms(retry_delay(&attempt(0, "unanswered"), None)), Some(250));
        assert_eq!(ms(retry_delay(&attempt(0, "transport"), None)), Some(250));
        let in_flight = attempt(409, "idempotency_conflict");
        assert_eq!(ms(retry_delay(&in_flight, None)), Some(250));
        // 503 waits for Retry-After, 1 s without one, at most 2 s.
        let unavailable = attempt(503, "terminal_unavailable");
        assert_eq!(ms(retry_delay(&unavailable, None)), Some(1_000));
        assert_eq!(ms(retry_delay(&unavailable, Some(0))), Some(0));
        assert_eq!(
            ms(retry_delay(&attempt(503, "overloaded"), Some(30))),
            Some(2_000)
        );
        // A push with a TTL not stored now (a rolling upgrade): the same key later.
        let later = attempt(503, "queue_unavailable");
        assert_eq!(ms(retry_delay(&later, Some(1))), Some(1_000));
        for (status, code) in [
            (400, "invalid_request"),
            (401, "unauthorized"),
            (404, "unknown_terminal"),
            (409, "?"),
            (413, "payload_too_large"),
            (502, "pos_rejected"),
            // A push with a TTL stored for later: answered, nothing to retry.
            (202, "queued"),
        ] {
            assert_eq!(retry_delay(&attempt(status, code), None), None, "{status}");
        }
    }

    #[test]
    fn retries_go_to_a_pod_not_tried_yet() {
        let targets: Vec<(String, String)> = ["a", "b", "c"]
            .iter()
            .map(|p| (p.to_string(), format!("http://{p}")))
            .collect();
        for _ in 0..50 {
            let tried = ["a".to_string(), "c".to_string()];
            assert_eq!(pick_target(&targets, &tried).unwrap().0, "b");
        }
        // Every pod tried: any will do; none in service: none.
        let all: Vec<String> = targets.iter().map(|t| t.0.clone()).collect();
        assert!(pick_target(&targets, &all).is_some());
        assert!(pick_target(&[], &[]).is_none());
    }

    #[test]
    fn the_last_attempt_is_the_final_outcome() {
        let mut r = PushRecord {
            terminal: "t".into(),
            idempotency_key: "k".into(),
            first: attempt(504, "pos_timeout"),
            retries: Vec::new(),
        };
        assert_eq!(r.last().status, 504);
        r.retries.push(attempt(200, "ok"));
        assert_eq!(r.last().status, 200);
        assert_eq!(r.attempts().count(), 2);
    }
}
