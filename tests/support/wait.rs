//! Waiting for what other tasks or processes bring about: a condition polled until it
//! holds, failing the test with what was awaited once a limit has passed.
//!
//! Not for: letting time pass (a test that needs that sleeps) or virtual time.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is checked: fine enough for the handover times the cluster
/// tests print and bound (their bounds leave seconds), coarse enough that a check over a
/// few thousand simulated terminals, or a request to a pod, costs little on a shared
/// machine.
const EVERY: Duration = Duration::from_millis(20);

/// Polls `cond` until it holds; panics after `limit`, naming `what`. Returns the wait.
pub async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    wait_for_async(what, limit, || std::future::ready(cond())).await
}

/// [`wait_for`] for a condition that has to await (a request to a pod or to Redis).
pub async fn wait_for_async<F, Fut>(what: &str, limit: Duration, mut cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !cond().await {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(EVERY).await;
    }
    started.elapsed()
}

/// `d` in seconds, as the tests print their waits.
pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
