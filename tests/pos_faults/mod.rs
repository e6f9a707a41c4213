//! Fault scenarios of the POS connections, end to end: whole pods against a real
//! `redis-server` and a `PosFarm` of simulated terminals (TLS + HTTP/2 on loopback), with
//! short timings (`CoreConfig::fast()`: lease TTL 3 s, renew 1 s, close budget 300 ms).
//!
//! - one pod cut off from Redis (a `RedisProxy` per pod) closes its terminals'
//!   connections before another pod dials them: zero raw and zero session overlaps;
//! - every pod cut off for 2x the lease TTL: not one terminal connection closed or opened,
//!   the shards are served again (new epochs, same connections) once Redis is back;
//! - a dropped connection is redialed exactly once (all of them at once: paced by
//!   `--dial-rate`); an offline terminal (refusing every connection) is redialed with
//!   backoff (attempts bounded, decaying), not in a loop;
//! - a terminal presenting a certificate for another name never gets a session, and the
//!   real `posgate serve` logs the warning once (there is no metric yet);
//! - a `posgate serve` process SIGSTOPped past its lease TTL and resumed causes zero
//!   session overlaps; no push sent through it on waking reaches a terminal under its
//!   old epochs; any stale hello is refused (409) and the cluster converges.
//!
//! Files: `cut_off` (the first two), `redial` (the next two and a wiped directory),
//! `wrong_name`, `paused`.
//!
//! Measured values and farm counters are printed (`--nocapture`). Each test takes about
//! 15-40 s.

mod cut_off;
mod paused;
mod redial;
mod wrong_name;

use posgate::pod::PodHandle;
use posgate::pos::backoff::BackoffPolicy;

use crate::support::farm::Farm;
use crate::support::pod;

/// Pod `fault-pod-{i}` over the Redis at `redis_url`, trusting `farm`'s CA, dialing at
/// most `dial_rate` terminals per second with `backoff` for refusals.
pub(crate) async fn start_pod(
    i: usize,
    redis_url: &str,
    farm: &Farm,
    backoff: BackoffPolicy,
    dial_rate: u32,
) -> PodHandle {
    let (listener, url) = pod::listen().await;
    let mut config = pod::config(&format!("fault-pod-{i}"), &url);
    config.pos = pod::pos(&farm.ca_file, dial_rate);
    config.pos.backoff = backoff;
    pod::start_with_terminals(config, redis_url, listener)
}

/// The dial rate of the in-process pods (`--dial-rate`).
pub(crate) const DIAL_RATE: u32 = 1_000;
