//! The task behind [`RedisStore::changes`](super::RedisStore): one pub/sub connection,
//! kept alive for the store's lifetime.
//!
//! Every message on the cluster's event channel bumps a `watch` counter, except
//! `queue <shard> <terminal>` (a push queued by a pod that does not hold the shard) and
//! `broadcast <id>` (a broadcast created), which go to the push layer's wake-ups
//! instead: news for one drain or for the broadcasts, not a reason for every pod to
//! poll. After any loss (closed socket, failed PING) the task
//! resubscribes with capped exponential backoff and then bumps the counter once and
//! wakes every drain, because messages published while it was away are lost and the
//! pod must look instead. A store built by `connect_lazy` starts without a
//! subscription: the task makes its first attempt at once and bumps the counter when it
//! succeeds, like after any other resubscription. It subscribes on the master as last
//! found, and again when the master moved (`follow.rs`), before it waits for one.
//!
//! What it does not do: interpret the messages (the counter is only a hint to poll), or
//! give up; it runs until the store's last clone is dropped and it is aborted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{Client, Value};
use tokio::sync::{broadcast, watch};
use tracing::{info, warn};

use super::client::bounded;
use super::{Link, RedisOptions};
use crate::core::ShardId;
use crate::store::queue::Wakeup;
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
    /// The master as last found (`None`: not yet).
    pub link: watch::Receiver<Option<Link>>,
    pub channel: String,
    pub opts: RedisOptions,
    pub tx: watch::Sender<u64>,
    /// The queue's wake-ups.
    pub queue: broadcast::Sender<Wakeup>,
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

/// The wake-up a `queue <shard> <terminal>` or `broadcast <id>` message carries, if it
/// is one.
fn queue_wakeup(payload: &[u8]) -> Option<Wakeup> {
    let text = std::str::from_utf8(payload).ok()?;
    if text.starts_with("broadcast ") {
        return Some(Wakeup::Broadcast);
    }
    let mut words = text.strip_prefix("queue ")?.split(' ');
    let shard = words.next()?.parse::<ShardId>().ok()?;
    let terminal = words.next()?;
    (words.next().is_none() && crate::api::valid_terminal_id(terminal))
        .then(|| Wakeup::Terminal(shard, terminal.to_string()))
}

/// Why a subscription ended.
enum Ended {
    Lost(String),
    /// The master moved: subscribe on the new one at once.
    Moved,
}

/// Forwards notifications until the connection fails or the master moves.
async fn pump(events: &mut Events, (sink, stream): &mut Subscription) -> Ended {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(msg) => match queue_wakeup(msg.get_payload_bytes()) {
                    Some(wakeup) => {
                        let _ = events.queue.send(wakeup);
                    }
                    None => bump(&events.tx),
                },
                None => return Ended::Lost("connection closed".into()),
            },
            moved = events.link.changed() => {
                if moved.is_err() {
                    // The store is gone; the task is about to be aborted.
                    std::future::pending::<()>().await;
                }
                return Ended::Moved;
            }
            _ = ping.tick() => {
                events.round_trips.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = bounded(events.opts.response_timeout, sink.ping::<Value>()).await {
                    return Ended::Lost(format!("ping failed: {e}"));
                }
            }
        }
    }
}

/// The master's client as last found, waiting until one is; `None` once the store is gone.
async fn master(link: &mut watch::Receiver<Option<Link>>) -> Option<Client> {
    loop {
        if let Some(link) = link.borrow_and_update().as_ref() {
            return Some(link.client.clone());
        }
        link.changed().await.ok()?;
    }
}

/// The `changes()` feed: keeps one subscription alive for the store's lifetime, starting
/// from `first` if the caller already subscribed.
pub(super) async fn run(mut events: Events, first: Option<Subscription>) {
    let channel = events.channel.clone();
    let mut conn = first;
    let mut backoff = MIN_BACKOFF;
    // Zero only before a lazy store's first attempt and after a move: there is nothing
    // to back off from.
    let mut delay = Duration::ZERO;
    loop {
        let mut sub = match conn.take() {
            Some(sub) => sub,
            None => {
                tokio::time::sleep(delay).await;
                let Some(client) = master(&mut events.link).await else {
                    return;
                };
                events.round_trips.fetch_add(1, Ordering::Relaxed);
                match subscribe(&client, &channel, &events.opts).await {
                    Ok(sub) => {
                        info!(channel = %channel, "redis event subscription established");
                        // Messages published while we were away are gone: make peers poll
                        // and drains look.
                        bump(&events.tx);
                        let _ = events.queue.send(Wakeup::All);
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
        let ended = pump(&mut events, &mut sub).await;
        // A subscription that held for a while was healthy: start backing off afresh.
        if since.elapsed() > MAX_BACKOFF * 2 {
            backoff = MIN_BACKOFF;
        }
        match ended {
            Ended::Moved => {
                delay = Duration::ZERO;
                info!(channel = %channel, "redis master moved; subscribing there");
            }
            Ended::Lost(reason) => {
                delay = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                warn!(channel = %channel, reason = %reason, "redis event subscription lost; resubscribing");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_messages_name_a_shard_and_a_terminal() {
        assert_eq!(
            queue_wakeup(b"queue 7 pos-00042"),
            Some(Wakeup::Terminal(7, "pos-00042".into()))
        );
        assert_eq!(
            queue_wakeup(b"broadcast 0123456789abcdef0123456789abcdef"),
            Some(Wakeup::Broadcast)
        );
        for other in [
            &b"release 7"[..],
            b"queue 7",
            b"queue x pos-1",
            b"queue 7 bad id!",
            b"queue 7 pos-1 more",
            b"join pod-a",
            b"\xff",
        ] {
            assert_eq!(queue_wakeup(other), None, "{other:?}");
        }
    }
}
