//! Following the master through failovers: the store's second task.
//!
//! It looks where the master is (`Endpoint::master`) when a call failed the way a
//! failover explains (the store's `follow` notification), when a sentinel announces
//! `+switch-master` for our master, and every second while no master is known. A master
//! at another address gets a new connection (`Link`), which the calls use from then on
//! and the event subscription moves to. A direct endpoint (`redis://`, `rediss://`) has
//! one address: there a call that reached a replica (`READONLY`, `MASTERDOWN`) makes it
//! reconnect, so a managed Redis whose primary moved behind a DNS name is found again.
//!
//! Lookups are paced (one per [`LOOK_EVERY`]): during a failover every call fails, and
//! each asks for one. The `+switch-master` subscription is an early warning only; failed
//! calls find the new master without it.
//!
//! What it does not do: retry calls (the reconciler does, as for any store failure) or
//! count sentinel traffic in the round trips (those are Redis's).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{Msg, Value};
use tokio::time::{sleep_until, Instant};
use tracing::{debug, info, warn};

use super::client::bounded;
use super::endpoint::{address, Endpoint};
use super::{link_to, Shared};

/// At most one lookup of the master this often.
const LOOK_EVERY: Duration = Duration::from_millis(250);
/// While no master is known, look again this often.
const RETRY: Duration = Duration::from_secs(1);
/// Keep-alive of the `+switch-master` subscription, and the wait before subscribing again
/// after it failed.
const SENTINEL_PING: Duration = Duration::from_secs(5);
/// The channel sentinels announce a completed failover on.
const SWITCH_MASTER: &str = "+switch-master";

/// The `+switch-master` subscription on one sentinel, if there is one now.
struct Announcements {
    sub: Option<(PubSubSink, PubSubStream)>,
    /// When to (re)subscribe or ping next.
    next: Instant,
}

/// What the subscription brought.
enum Heard {
    /// `+switch-master` for our master.
    Switched,
    /// Something else (another master's failover, a pong).
    Nothing,
    Lost(String),
}

pub(super) async fn run(shared: Arc<Shared>) {
    let limit = shared.opts.connect_timeout + shared.opts.response_timeout;
    let sentinels = shared.endpoint.master_name().is_some();
    let mut ann = Announcements {
        sub: None,
        next: Instant::now(),
    };
    let mut last_look: Option<Instant> = None;
    let mut failing = false;
    loop {
        let known = shared.link.borrow().is_some();
        let retry = last_look.map_or_else(Instant::now, |t| t + RETRY);
        tokio::select! {
            () = shared.follow.notified() => {}
            () = sleep_until(retry), if !known => {}
            heard = hear(&shared, &mut ann, limit), if sentinels => match heard {
                Heard::Switched => info!("a sentinel announced a new master (+switch-master)"),
                Heard::Nothing => continue,
                Heard::Lost(why) => {
                    debug!(reason = %why, "sentinel announcement subscription lost; subscribing again later");
                    ann.sub = None;
                    ann.next = Instant::now() + SENTINEL_PING;
                    continue;
                }
            },
        }
        if let Some(t) = last_look {
            sleep_until(t + LOOK_EVERY).await;
        }
        last_look = Some(Instant::now());
        failing = look(&shared, limit, failing).await;
    }
}

/// One lookup; moves the connection if the master moved (or, for a direct endpoint, if a
/// call reached a replica). Returns whether it failed, so only the first failure of a
/// streak is a warning.
async fn look(shared: &Shared, limit: Duration, was_failing: bool) -> bool {
    let not_master = shared.not_master.swap(false, Ordering::Relaxed);
    let client = match shared.endpoint.master(limit).await {
        Ok(client) => client,
        Err(e) => {
            if was_failing {
                debug!(error = %e, "redis master still not found");
            } else {
                warn!(error = %e, "cannot find the redis master (retrying while calls fail)");
            }
            return true;
        }
    };
    let to = address(&client);
    let from = shared.link.borrow().as_ref().map(|l| l.address.clone());
    let moved = from.as_deref() != Some(to.as_str());
    // A direct endpoint has one address: a node that is not the master is only left by
    // reconnecting through its name.
    let reconnect = not_master && matches!(shared.endpoint, Endpoint::Direct(_));
    if !(moved || reconnect) {
        return false;
    }
    match link_to(client, &shared.opts) {
        Ok(link) => {
            shared.link.send_replace(Some(link));
            match (moved, from) {
                (true, Some(from)) => warn!(%from, %to, "redis master moved: using the new one"),
                (true, None) => info!(master = %to, "redis master found"),
                (false, _) => warn!(
                    address = %to,
                    "redis answered as a replica: reconnecting (a DNS name may lead to the new primary)"
                ),
            }
        }
        Err(e) => warn!(error = %e, "cannot connect to the redis master"),
    }
    false
}

/// Waits for the next thing the `+switch-master` subscription brings, subscribing first
/// when there is none (and it is time), and pinging the sentinel while it is quiet.
async fn hear(shared: &Shared, ann: &mut Announcements, limit: Duration) -> Heard {
    let Some((sink, stream)) = ann.sub.as_mut() else {
        sleep_until(ann.next).await;
        ann.next = Instant::now() + SENTINEL_PING;
        return match subscribe(shared, limit).await {
            Ok(sub) => {
                ann.sub = Some(sub);
                Heard::Nothing
            }
            Err(why) => Heard::Lost(why),
        };
    };
    tokio::select! {
        msg = stream.next() => match msg {
            Some(msg) => heard(&msg, shared.endpoint.master_name()),
            None => Heard::Lost("connection closed".into()),
        },
        () = sleep_until(ann.next) => {
            ann.next = Instant::now() + SENTINEL_PING;
            match bounded(limit, sink.ping::<Value>()).await {
                Ok(_) => Heard::Nothing,
                Err(e) => Heard::Lost(format!("ping failed: {e}")),
            }
        }
    }
}

/// Subscribes to `+switch-master` on the first sentinel that lets it, in the URL's order.
async fn subscribe(shared: &Shared, limit: Duration) -> Result<(PubSubSink, PubSubStream), String> {
    let mut why = Vec::new();
    for sentinel in shared.endpoint.sentinels() {
        let subscribed = async {
            let (mut sink, stream) = bounded(limit, sentinel.get_async_pubsub()).await?.split();
            bounded(limit, sink.subscribe(SWITCH_MASTER)).await?;
            Ok::<_, crate::store::StoreError>((sink, stream))
        };
        match subscribed.await {
            Ok(sub) => {
                debug!("subscribed to the sentinels' +switch-master announcements");
                return Ok(sub);
            }
            Err(e) => why.push(e.to_string()),
        }
    }
    Err(why.join("; "))
}

/// `+switch-master` says `<master-name> <old-ip> <old-port> <new-ip> <new-port>`.
fn heard(msg: &Msg, ours: Option<&str>) -> Heard {
    let payload: String = msg.get_payload().unwrap_or_default();
    match (payload.split(' ').next(), ours) {
        (Some(name), Some(ours)) if name == ours => Heard::Switched,
        _ => Heard::Nothing,
    }
}
