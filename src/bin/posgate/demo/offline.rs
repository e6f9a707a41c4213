//! The demo's offline phase: a few terminals go offline (the simulated farm refuses
//! them and drops their connections), a push with a TTL to each is answered `202` (kept
//! in the store), the terminals come back, and each push is delivered right after its
//! terminal's hello, as its status (`GET /v1/terminals/{id}/pushes/{key}`) says. It
//! prints the script's lines as it goes and gives the summary its [`Outcome`].
//!
//! Not for: the steady traffic (`traffic`), which pushes without a TTL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::join_all;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use posgate_pos_sim::{FaultConfig, PosFarm};
use serde_json::Value;

/// How many terminals go offline.
const TERMINALS: usize = 5;
/// How long they stay offline: the table shows them missing meanwhile.
const OFFLINE_FOR: Duration = Duration::from_secs(2);
/// How long the pushes may take to drain once the terminals are back (the demo's pods
/// redial within 2 s).
const DRAIN_LIMIT: Duration = Duration::from_secs(15);

pub(super) type Http = Client<HttpConnector, Full<Bytes>>;

/// What the phase came to, for the summary.
pub enum Outcome {
    /// The farm refused the faults: nothing was pushed.
    NotStarted,
    /// The run ended first (the demo brings the terminals back then).
    CutShort,
    /// `queued` of `tried` pushes answered `202`; `delivered` of them delivered once
    /// their terminals were back (within `DRAIN_LIMIT`), the longest after `longest_ms`
    /// from its acceptance.
    Ran {
        tried: usize,
        queued: usize,
        delivered: usize,
        longest_ms: u64,
    },
}

/// `TERMINALS` of `ids`, spread over them (so over shards and pods).
pub fn pick(ids: &[String]) -> Vec<String> {
    let n = TERMINALS.min(ids.len());
    (0..n).map(|i| ids[i * ids.len() / n].clone()).collect()
}

/// The summary's line about the phase.
pub fn summary_line(outcome: &Outcome) -> String {
    let what = "pushes with a TTL to offline terminals";
    match outcome {
        Outcome::NotStarted => format!("{what}: none, the phase could not start"),
        Outcome::CutShort => format!("{what}: the run ended before they were delivered"),
        Outcome::Ran {
            tried,
            queued,
            delivered,
            longest_ms,
        } => format!(
            "{what}: {queued} of {tried} answered 202, {delivered} delivered once back \
             (the longest waited {:.1} s)",
            *longest_ms as f64 / 1e3
        ),
    }
}

/// Runs the phase on `terminals` of `farm`, pushing through `urls` in turn as the
/// tenant with `token`.
pub async fn run(
    farm: Arc<PosFarm>,
    urls: Vec<String>,
    terminals: Vec<String>,
    token: String,
) -> Outcome {
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    let n = terminals.len();
    let faults = FaultConfig {
        offline_terminals: terminals.clone(),
        ..FaultConfig::default()
    };
    let went = Instant::now();
    if let Err(err) = farm.set_faults(faults) {
        println!("- the offline phase could not start: {err}");
        return Outcome::NotStarted;
    }
    println!(
        "- {n} terminals offline ({}): pushes with a TTL to them wait in the store",
        terminals.join(" ")
    );
    // The pods see the dropped connections first; a push that finds a session still up
    // would wait the same way, after its copy failed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pushes = terminals.iter().zip(urls.iter().cycle()).map(|(t, url)| {
        let uri = format!("{url}/v1/terminals/{t}/push?ttl_s=60&timeout_ms=500");
        let request = Request::post(uri)
            .header("idempotency-key", key(t))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"amount\":1}")));
        call(&http, request, &token)
    });
    let answers = join_all(pushes).await;
    let queued: Vec<&String> = terminals
        .iter()
        .zip(&answers)
        .filter(
            |(_, a)| matches!(a, Some((StatusCode::ACCEPTED, body)) if body["state"] == "queued"),
        )
        .map(|(t, _)| t)
        .collect();
    println!(
        "- {} of {n} pushes with ?ttl_s=60 answered 202 queued",
        queued.len()
    );
    tokio::time::sleep(OFFLINE_FOR.saturating_sub(went.elapsed())).await;
    if let Err(err) = farm.set_faults(FaultConfig::default()) {
        println!("- the terminals could not come back: {err}");
    }
    let back = Instant::now();
    println!("+ the {n} terminals back online: their queued pushes go right after their hello");
    let url = &urls[0];
    let mut waits = Vec::new();
    let mut states = Vec::new();
    while back.elapsed() < DRAIN_LIMIT {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let asks = queued.iter().map(|t| {
            let uri = format!("{url}/v1/terminals/{t}/pushes/{}", key(t));
            call(&http, Request::get(uri).body(Full::default()), &token)
        });
        let answers = join_all(asks).await;
        states = answers
            .iter()
            .map(|a| a.as_ref().map_or("unanswered", |(_, s)| state_of(s)))
            .map(str::to_string)
            .collect();
        let waiting = |s: &String| matches!(s.as_str(), "queued" | "sending" | "unanswered");
        if !states.iter().any(waiting) {
            waits = answers
                .iter()
                .flatten()
                .filter_map(|(_, s)| Some(s["final_ms"].as_u64()? - s["accepted_ms"].as_u64()?))
                .collect();
            break;
        }
    }
    let (delivered, rest): (Vec<String>, Vec<String>) =
        states.into_iter().partition(|s| s == "delivered");
    let longest_ms = waits.iter().max().copied().unwrap_or(0);
    let longest = longest_ms as f64 / 1e3;
    let mut line = format!(
        "= {} of {} queued pushes delivered, {:.1} s after the terminals came back (the \
         longest waited {longest:.1} s)",
        delivered.len(),
        queued.len(),
        back.elapsed().as_secs_f64(),
    );
    if !rest.is_empty() {
        line.push_str(&format!("; the rest: {}", rest.join(" ")));
    }
    println!("{line}");
    Outcome::Ran {
        tried: n,
        queued: queued.len(),
        delivered: delivered.len(),
        longest_ms,
    }
}

/// The idempotency key of `terminal`'s push.
fn key(terminal: &str) -> String {
    format!("demo-offline-{terminal}")
}

fn state_of(status: &Value) -> &str {
    status["state"].as_str().unwrap_or("unanswered")
}

/// Sends `request` with the tenant's token: its status and JSON body, `None` when it
/// got no answer.
pub(super) async fn call(
    http: &Http,
    request: http::Result<Request<Full<Bytes>>>,
    token: &str,
) -> Option<(StatusCode, Value)> {
    let mut request = request.ok()?;
    let bearer = format!("Bearer {token}").parse().ok()?;
    request
        .headers_mut()
        .insert(http::header::AUTHORIZATION, bearer);
    let answer = http.request(request).await.ok()?;
    let status = answer.status();
    let body = answer.into_body().collect().await.ok()?.to_bytes();
    Some((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}
