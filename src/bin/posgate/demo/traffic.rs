//! The demo's push traffic: a steady rate of pushes to random terminals, spread over the
//! live pods, counting answers per receiving pod. It never retries: what the table shows
//! is what callers would have seen.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use tokio::task::JoinHandle;

/// Answers per receiving pod URL: (ok, failed).
#[derive(Clone, Debug, Default)]
pub struct TrafficCounts(HashMap<String, (u64, u64)>);

impl TrafficCounts {
    pub fn of(&self, url: &str) -> (u64, u64) {
        self.0.get(url).copied().unwrap_or_default()
    }

    pub fn total(&self) -> (u64, u64) {
        self.0
            .values()
            .fold((0, 0), |(a, b), (ok, failed)| (a + ok, b + failed))
    }
}

#[derive(Default)]
struct Shared {
    urls: Vec<String>,
    counts: TrafficCounts,
}

/// The running generator.
pub struct Traffic {
    shared: Arc<Mutex<Shared>>,
    task: JoinHandle<()>,
}

impl Traffic {
    /// Sends `rate` pushes per second (each with its own task and a 5 s deadline).
    pub fn start(urls: Vec<String>, terminals: Vec<String>, token: String, rate: u32) -> Self {
        let shared = Arc::new(Mutex::new(Shared {
            urls,
            ..Shared::default()
        }));
        let task = tokio::spawn(generate(shared.clone(), terminals, token, rate.max(1)));
        Traffic { shared, task }
    }

    /// Pods to send to from now on.
    pub fn set_urls(&self, urls: Vec<String>) {
        lock(&self.shared).urls = urls;
    }

    pub fn counts(&self) -> TrafficCounts {
        lock(&self.shared).counts.clone()
    }

    /// Stops sending, waits for answers already due (5 s at most), returns the counts.
    pub async fn stop(self) -> TrafficCounts {
        self.task.abort();
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.counts()
    }
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn generate(shared: Arc<Mutex<Shared>>, terminals: Vec<String>, token: String, rate: u32) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    let mut n = 0u64;
    loop {
        tick.tick().await;
        let url = {
            let s = lock(&shared);
            if s.urls.is_empty() || terminals.is_empty() {
                continue;
            }
            s.urls[n as usize % s.urls.len()].clone()
        };
        let terminal = &terminals[rand::rng().random_range(0..terminals.len())];
        let request = Request::post(format!(
            "{url}/v1/terminals/{terminal}/push?timeout_ms=5000"
        ))
        .header("authorization", format!("Bearer {token}"))
        .header("idempotency-key", format!("demo-{n}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")));
        n += 1;
        let Ok(request) = request else { continue };
        let (client, shared) = (client.clone(), shared.clone());
        tokio::spawn(async move {
            let ok = client
                .request(request)
                .await
                .is_ok_and(|r| r.status().is_success());
            let mut s = lock(&shared);
            let entry = s.counts.0.entry(url).or_default();
            if ok {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        });
    }
}
