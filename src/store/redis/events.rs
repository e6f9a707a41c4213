//! The task behind [`RedisStore::changes`](super::RedisStore): one pub/sub connection,
//! kept alive for the store's lifetime.
//!
//! Every message on the cluster's event channel bumps a `watch` counter. After any loss
//! (closed socket, failed PING) the task resubscribes with capped exponential backoff
//! and then bumps the counter once, because messages published while it was away are
//! lost and the pod must poll instead. A store built by `connect_lazy` starts without a
//! subscription: the task makes its first attempt at once and bumps the counter when it
//! succeeds, like after any other resubscription.
//!
//! What it does not do: interpret the messages (the counter is only a hint to poll), or
//! give up; it runs until the store's last clone is dropped and it is aborted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{Client, Value};
use tokio::sync::watch;
use tracing::{info, warn};

use super::client::bounded;
use super::RedisOptions;
use crate::store::StoreError;

/// Pub/sub liveness check interval (a PING on the subscribed connection). Missed
/// notifications are only a latency cost (the poll is the fallback), so 5 s is enough,
/// and it keeps a pod's steady state near 1.85 round trips/s, clear of the 2/s budget.
const PING_EVERY: Duration = Duration::from_secs(5);
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A subscribed pub/sub connection, split into its command and message halves.
pub(super) type Subscription = (PubSubSink, PubSubStream);

/// What the task needs besides its connection.
pub(super) struct Events {
    pub client: Client,
    pub channel: String,
    pub opts: RedisOptions,
    pub tx: watch::Sender<u64>,
    pub round_trips: Arc<AtomicU64>,
}

/// Opens a pub/sub connection and subscribes to `channel`.
pub(super) async fn subscribe(
    client: &Client,
    channel: &str,
    opts: &RedisOptions,
) -> Result<Subscription, StoreError> {
    let pubsub = bounded(opts.connect_timeout, client.get_async_pubsub()).await?;
    let (mut sink, stream) = pubsub.split();
    bounded(opts.response_timeout, sink.subscribe(channel)).await?;
    Ok((sink, stream))
}

fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|n| *n = n.wrapping_add(1));
}

/// Forwards notifications until the connection fails; returns why.
async fn pump(events: &Events, (sink, stream): &mut Subscription) -> String {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(_) => bump(&events.tx),
                None => return "connection closed".into(),
            },
            _ = ping.tick() => {
                events.round_trips.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = bounded(events.opts.response_timeout, sink.ping::<Value>()).await {
                    return format!("ping failed: {e}");
                }
            }
        }
    }
}

/// The `changes()` feed: keeps one subscription alive for the store's lifetime, starting
/// from `first` if the caller already subscribed.
pub(super) async fn run(events: Events, first: Option<Subscription>) {
    let channel = &events.channel;
    let mut conn = first;
    let mut backoff = MIN_BACKOFF;
    // Zero only before a lazy store's first attempt: there is nothing to back off from.
    let mut delay = Duration::ZERO;
    loop {
        let mut sub = match conn.take() {
            Some(sub) => sub,
            None => {
                tokio::time::sleep(delay).await;
                events.round_trips.fetch_add(1, Ordering::Relaxed);
                match subscribe(&events.client, channel, &events.opts).await {
                    Ok(sub) => {
                        info!(channel = %channel, "redis event subscription established");
                        // Messages published while we were away are gone: make peers poll.
                        bump(&events.tx);
                        sub
                    }
                    Err(e) => {
                        delay = backoff;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        warn!(channel = %channel, error = %e, retry_in_ms = delay.as_millis() as u64, "redis event subscription failed");
                        continue;
                    }
                }
            }
        };
        let since = Instant::now();
        let reason = pump(&events, &mut sub).await;
        // A subscription that held for a while was healthy: start backing off afresh.
        if since.elapsed() > MAX_BACKOFF * 2 {
            backoff = MIN_BACKOFF;
        }
        delay = backoff;
        backoff = (backoff * 2).min(MAX_BACKOFF);
        warn!(channel = %channel, reason = %reason, "redis event subscription lost; resubscribing");
    }
}
