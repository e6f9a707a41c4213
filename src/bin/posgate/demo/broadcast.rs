//! The demo's broadcast: one request sends a menu to the 40 terminals of one store
//! (label `store=17`; the demo labels its terminals `store=0` to `store=74` in turn),
//! and the script prints its progress (`GET /v1/broadcasts/{id}`) until every selected
//! terminal took it.
//!
//! Not for: pushes to single terminals (`traffic`, `offline`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::offline::{call, Http};

/// How many stores the demo's terminals are spread over.
pub const STORES: usize = 75;
/// How long the broadcast may take to complete.
const LIMIT: Duration = Duration::from_secs(15);

/// What the broadcast came to, for the summary.
pub struct Outcome {
    /// `delivered` of `matched` terminals, and whether it completed within `LIMIT`.
    pub matched: u64,
    pub delivered: u64,
    pub took: Option<Duration>,
}

/// The summary's line about the broadcast.
pub fn summary_line(outcome: &Option<Outcome>) -> String {
    match outcome {
        None => "broadcast to store=17: not sent".to_string(),
        Some(o) => match o.took {
            Some(took) => format!(
                "broadcast to store=17: {} of {} terminals took it, in {:.1} s",
                o.delivered,
                o.matched,
                took.as_secs_f64()
            ),
            None => format!(
                "broadcast to store=17: {} of {} terminals took it; not complete",
                o.delivered, o.matched
            ),
        },
    }
}

/// Sends the broadcast through `url` as the tenant with `token` and follows it.
pub async fn run(url: String, token: String) -> Option<Outcome> {
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    let uri = format!("{url}/v1/broadcasts?selector=store%3D17&ttl_s=60");
    let request = Request::post(uri)
        .header("idempotency-key", "demo-menu")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"menu\":\"autumn\"}")));
    let started = Instant::now();
    let (status, body) = call(&http, request, &token).await?;
    if status != StatusCode::ACCEPTED {
        println!("- the broadcast was refused: {status} {body}");
        return None;
    }
    let id = body["id"].as_str()?.to_string();
    println!("* broadcast {} to store=17 accepted: one request", &id[..8]);
    let mut outcome = Outcome {
        matched: 0,
        delivered: 0,
        took: None,
    };
    while started.elapsed() < LIMIT {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ask = Request::get(format!("{url}/v1/broadcasts/{id}")).body(Full::default());
        let Some((StatusCode::OK, status)) = call(&http, ask, &token).await else {
            continue;
        };
        let counts = &status["counts"];
        outcome.matched = counts["matched"].as_u64().unwrap_or(0);
        outcome.delivered = counts["delivered"].as_u64().unwrap_or(0);
        println!(
            "* broadcast {}: {}/{} delivered, {} remaining, {}/{} shards walked",
            &id[..8],
            outcome.delivered,
            outcome.matched,
            counts["remaining"],
            status["shards_walked"],
            status["shards"]
        );
        if status["state"] == "complete" {
            outcome.took = Some(started.elapsed());
            break;
        }
    }
    Some(outcome)
}
