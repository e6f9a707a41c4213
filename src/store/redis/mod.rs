//! The production [`CoordStore`](crate::store::CoordStore): Redis, one Lua script per operation.
//!
//! Every operation is exactly one script call (one client round trip, counted by
//! [`RedisStore::round_trips`]), so each is atomic in Redis; the scripts live in
//! `store/lua/` with `lib.lua` prepended, and take every key name as `KEYS` (all under
//! one hash tag, see `store::keys`) so they also run on Redis Cluster; but the snapshot
//! and the renewal, which run every few seconds, name the shards' leases themselves
//! (under the same hash tag, so in the same slot), and the snapshot answers only a
//! digest while the view the pod read last is current: a poll sends and receives about
//! as many bytes at 4,096 shards as at 64.
//!
//! | operation | script | keys (all passed as `KEYS`) | generation check |
//! |---|---|---|---|
//! | `pin_meta` | `pin_meta.lua` | meta | no |
//! | `heartbeat` | `heartbeat.lua` | gen, members, member-info, meta | yes, then meta |
//! | `deregister` | `deregister.lua` | members, member-info | no |
//! | `acquire` | `acquire.lua` | gen, epochs, members, the caller's `pod-lease`, `lease:<s>`..., `release-note:<s>`... (and other owners' `pod-lease`s; every `lease:<s>` when the upkeep changes) | yes |
//! | `renew` | `renew.lua` | gen, epochs, the caller's `pod-lease` (and `lease:<s>`..., named in the script) | yes |
//! | `release` | `release.lua` | `lease:<s>`..., `release-note:<s>`..., epochs, members (and the targets' `pod-lease`s, named in the script) | no (owner check only) |
//! | `snapshot` | `snapshot.lua` | gen, members, member-info, epochs, placement (and `lease:0..n` and the `pod-lease`s of owners that are not members, named in the script) | creates it if missing |
//! | `place` | `place.lua` | placement | no (version compare-and-set) |
//!
//! Connection handling, and why:
//! - A `ConnectionManager` with a response timeout, a connect timeout and a few retries
//!   with backoff. Each call is additionally bounded by the response timeout on our side,
//!   because a call waiting on a reconnect would otherwise wait for all its retries.
//! - A timed-out command leaves the socket in place, so a half-open connection could
//!   linger: TCP keepalive and `TCP_USER_TIMEOUT` make the kernel drop it, and after
//!   [`REBUILD_AFTER_TIMEOUTS`] timeouts in a row the manager is replaced outright.
//! - Errors map to `StoreError::Config` (bad URL or cluster name, TLS set-up),
//!   `Timeout` (no answer in time), `Unavailable` (connection, auth), `Refused` (Redis
//!   answers but cannot serve now: `READONLY`, `OOM`, `LOADING`, `MASTERDOWN`, `BUSY`,
//!   ...) or `Protocol` (script errors, unexpected reply shapes, parsed in `reply.rs`).
//!   None of them panics and nothing retries in a loop: the caller's next call
//!   reconnects. URL checks, socket options and the error mapping are in `client.rs`.
//! - Every script here (not the directory's) starts with `#!lua` (Redis 7): flagged as
//!   writing, so Redis refuses it as a whole, before it runs, on a read-only replica,
//!   when out of memory or when a replica's master is gone. Unflagged, a script runs
//!   there until its first write, so the snapshot (which rarely writes) would answer from
//!   a replica's frozen data while every renewal failed: a store that answers and fails
//!   by turns, where it must be unreachable throughout. `NOSCRIPT` (a restarted or
//!   flushed Redis) is handled by the redis crate: `EVALSHA`, then `SCRIPT LOAD` and
//!   `EVALSHA` again.
//! - `changes()` is fed by a background task holding its own pub/sub connection
//!   (`events.rs`), resubscribing with backoff after any loss.
//!
//! Two ways to start: [`RedisStore::connect`] fails fast, with the server's reason, when
//! Redis is unreachable or refuses the credentials (one-shot CLI commands, tests);
//! [`RedisStore::connect_lazy`] only checks the settings and connects in the background,
//! so a pod can start before Redis does (`posgate serve`).
//!
//! URLs: `redis://[user[:password]@]host[:port][/db]` and `rediss://` (rustls with the
//! ring provider), or `redis+sentinel://[user[:password]@]host:port[,host:port...]/<master>`
//! (`rediss+sentinel://` for TLS): the master the sentinels name (`sentinel_url.rs`,
//! `endpoint.rs`). TLS trusts the system store, or only the certificates of
//! [`RedisOptions::ca_file`] (a private CA), and may present a client certificate; those
//! files are read and checked when the store is created (a bad one is a `Config` error
//! naming it), so replacing them takes a restart. The password never appears in logs or
//! errors.
//!
//! Failovers (`follow.rs`): a call that fails the way a failover explains (`READONLY`,
//! `MASTERDOWN`, `LOADING`, a lost connection) wakes the follower, and so does a
//! sentinel's `+switch-master`; it asks where the master is now and moves the connection
//! (and the event subscription) there. A direct endpoint reconnects on `READONLY`: a
//! managed Redis whose primary moves behind a DNS name is found by a new connection.
//! Meanwhile calls fail, each within its deadline, and the pod rides that out as any
//! other store failure (static stability).
//!
//! Lease upkeep (`docs/design.md`, "Pod leases"): the one choice made here, because it is
//! about the key layout only. While the members of the last full snapshot all read pod
//! leases, `acquire` and `renew` keep this pod's leases by one `pod-lease:<pod>` key;
//! otherwise each lease keeps its own expiry, as pods of earlier releases expect.
//!
//! What it does not do: decide who owns what (policy is in `crate::core`), or talk to a
//! Redis Cluster.

mod broadcast;
mod client;
mod directory;
mod endpoint;
mod events;
mod follow;
mod invoke;
mod ops;
mod queue;
mod reply;
mod scripts;
pub mod sentinel_url;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{AsyncConnectionConfig, Client, Script, Value};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

pub use self::client::ClientCert;
use self::client::{bounded, cannot_connect, lazy_manager};
use self::endpoint::{address, may_have_moved, Endpoint};
use self::events::{Events, Subscription};
pub use self::invoke::Wait;
use self::scripts::Scripts;
use super::keys::Keys;
use super::StoreError;
use crate::core::ShardId;

/// Timeouts in a row after which the connection manager is rebuilt.
pub const REBUILD_AFTER_TIMEOUTS: u32 = 3;

/// Client-side timeouts and the TLS files for `rediss://`. The pod sets
/// `response_timeout` well below `lease TTL - renew interval`, so a stuck call cannot eat
/// a lease's safety margin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// Longest wait for one call's answer (including a reconnect it has to wait for).
    pub response_timeout: Duration,
    /// Longest wait for one connection attempt (TCP, TLS, AUTH).
    pub connect_timeout: Duration,
    /// PEM file with the CA certificates that `rediss://` trusts *instead of* the system
    /// store, e.g. a private CA. `rediss://` only.
    pub ca_file: Option<PathBuf>,
    /// Certificate to present to a server that asks for one (mutual TLS, Redis's
    /// `tls-auth-clients yes`). `rediss://` only.
    pub client_cert: Option<ClientCert>,
    /// The sentinels' own password, when it is not the master's
    /// (`--redis-sentinel-password-file`). `redis+sentinel://` only.
    pub sentinel_password: Option<String>,
    /// Replicas that must acknowledge a lease or placement write (`WAIT`) before it
    /// counts (`--redis-wait-replicas`); fewer make the call fail with
    /// [`StoreError::NotReplicated`], as if it had not been answered.
    pub wait: Option<Wait>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            response_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            ca_file: None,
            client_cert: None,
            sentinel_password: None,
            wait: None,
        }
    }
}

/// A connection to the master `client` reaches (made on first use).
fn link_to(client: Client, opts: &RedisOptions) -> Result<Link, StoreError> {
    // Only an invalid manager configuration fails here; ours is fixed, so this is a bug
    // or an unsupported URL option, not an outage.
    let manager = lazy_manager(&client, opts)
        .map_err(|e| StoreError::Config(format!("cannot set up the Redis connection: {e}")))?;
    Ok(Link {
        address: address(&client),
        client,
        manager,
    })
}

/// The connection to the master as last found.
#[derive(Clone)]
struct Link {
    client: Client,
    /// Calls clone it; replaced by a fresh one after repeated timeouts.
    manager: ConnectionManager,
    /// `host:port`, for logs and to tell whether the master moved.
    address: String,
}

struct Shared {
    endpoint: Endpoint,
    keys: Keys,
    opts: RedisOptions,
    scripts: Scripts,
    /// `None` until a master is found (a Sentinel endpoint started lazily); replaced when
    /// the master moves (`follow.rs`), its manager after repeated timeouts. The events
    /// task resubscribes on a change.
    link: watch::Sender<Option<Link>>,
    /// Wakes the follower: a call failed the way a failover explains.
    follow: Notify,
    /// Set with `follow` when a call reached a node that is not (or no longer) the
    /// master (`READONLY`, `MASTERDOWN`): a direct endpoint then reconnects.
    not_master: std::sync::atomic::AtomicBool,
    timeouts_in_row: AtomicU32,
    /// Rebuilds since a call last ended without timing out: only the first of a streak
    /// is a warning, or a frozen Redis would log one every few calls.
    rebuilds: AtomicU32,
    round_trips: Arc<AtomicU64>,
    url: String,
    /// The queue's wake-ups, fed by the events task.
    wakeups: tokio::sync::broadcast::Sender<crate::store::queue::Wakeup>,
    /// The last view a snapshot read in full: what an unchanged one is rebuilt from.
    view: std::sync::Mutex<Option<Arc<reply::View>>>,
}

impl Shared {
    /// A call ended without timing out: the timeout streak, if any, is over.
    fn no_timeout(&self) {
        self.timeouts_in_row.store(0, Ordering::Relaxed);
        self.rebuilds.store(0, Ordering::Relaxed);
    }
}

/// Aborts the store's tasks (the event subscription, the follower) when the last clone of
/// the store goes away.
struct AbortOnDrop(Vec<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The Redis store. Clones share the connection and the change subscription.
#[derive(Clone)]
pub struct RedisStore {
    shared: Arc<Shared>,
    changes: watch::Receiver<u64>,
    _tasks: Arc<AbortOnDrop>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.shared.url)
            .field("cluster", &self.shared.keys.cluster())
            .finish_non_exhaustive()
    }
}

/// Checks `url`, `cluster` and the TLS files of `opts`; nothing is sent to Redis yet.
/// Returns the endpoint, the key names and the redacted URL.
fn open(
    url: &str,
    cluster: &str,
    opts: &RedisOptions,
) -> Result<(Endpoint, Keys, String), StoreError> {
    let keys = Keys::new(cluster).map_err(|e| StoreError::Config(e.to_string()))?;
    let (endpoint, redacted) = Endpoint::open(url, opts)?;
    Ok((endpoint, keys, redacted))
}

impl RedisStore {
    /// Connects to `url` for cluster `cluster`: checks the URL, the cluster name, finds
    /// the master (asking the sentinels of a `redis+sentinel://` URL), checks
    /// reachability and credentials (one PING), and subscribes to the event channel. For
    /// one-shot commands that should fail at once with the server's reason.
    pub async fn connect(
        url: &str,
        cluster: &str,
        opts: RedisOptions,
    ) -> Result<RedisStore, StoreError> {
        let (endpoint, keys, redacted) = open(url, cluster, &opts)?;
        let context = |e| cannot_connect(&redacted, e);
        let limit = opts.connect_timeout + opts.response_timeout;
        let client = endpoint.master(limit).await.map_err(context)?;
        // A plain connection first: a wrong address or password fails here, once, with
        // the server's reason, instead of inside the manager's retries.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            .set_response_timeout(Some(opts.response_timeout));
        let mut probe = bounded(
            limit,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(context)?;
        bounded(
            opts.response_timeout,
            redis::cmd("PING").query_async::<()>(&mut probe),
        )
        .await
        .map_err(context)?;
        drop(probe);
        let first = events::subscribe(&client, &keys.events(), &opts)
            .await
            .map_err(context)?;
        let store = Self::assemble(endpoint, Some(client), keys, redacted, opts, Some(first), 2)?;
        info!(url = %store.shared.url, cluster = store.keys().cluster(), "connected to redis");
        Ok(store)
    }

    /// Checks the URL and the cluster name (errors are [`StoreError::Config`]) but does
    /// not contact Redis: the first call connects (a Sentinel endpoint's master is looked
    /// up in the background first), and the event subscription is made in the
    /// background, retried with backoff until Redis answers; `changes()` is bumped once
    /// it is in place. Until then calls fail with `Unavailable` or `Timeout`, each
    /// within the response timeout; the first call after Redis comes up may still fail
    /// once, reporting the reconnect that failed before it (the next one succeeds). For
    /// a pod, which may start before Redis does.
    ///
    /// Must be called within a Tokio runtime (it spawns the store's tasks).
    pub fn connect_lazy(
        url: &str,
        cluster: &str,
        opts: RedisOptions,
    ) -> Result<RedisStore, StoreError> {
        let (endpoint, keys, redacted) = open(url, cluster, &opts)?;
        let client = match &endpoint {
            Endpoint::Direct(client) => Some(client.clone()),
            Endpoint::Sentinel(_) => None,
        };
        let store = Self::assemble(endpoint, client, keys, redacted, opts, None, 0)?;
        info!(url = %store.shared.url, cluster = store.keys().cluster(), "using redis (connecting in the background)");
        Ok(store)
    }

    /// The store around `endpoint` and its master's `client` if known, with the events
    /// task started from `first` (or subscribing on its own), the follower started, and
    /// `round_trips` already spent.
    fn assemble(
        endpoint: Endpoint,
        client: Option<Client>,
        keys: Keys,
        url: String,
        opts: RedisOptions,
        first: Option<Subscription>,
        round_trips: u64,
    ) -> Result<RedisStore, StoreError> {
        let link = client.map(|client| link_to(client, &opts)).transpose()?;
        let (link, link_rx) = watch::channel(link);
        let round_trips = Arc::new(AtomicU64::new(round_trips));
        let (tx, rx) = watch::channel(0);
        let wakeups = tokio::sync::broadcast::channel(1024).0;
        let events = Events {
            link: link_rx,
            channel: keys.events(),
            opts: opts.clone(),
            tx,
            queue: wakeups.clone(),
            round_trips: round_trips.clone(),
        };
        let shared = Arc::new(Shared {
            endpoint,
            keys,
            opts,
            scripts: Scripts::new(),
            link,
            follow: Notify::new(),
            not_master: std::sync::atomic::AtomicBool::new(false),
            timeouts_in_row: AtomicU32::new(0),
            rebuilds: AtomicU32::new(0),
            round_trips,
            url,
            wakeups,
            view: std::sync::Mutex::new(None),
        });
        let tasks = vec![
            tokio::spawn(events::run(events, first)),
            tokio::spawn(follow::run(shared.clone())),
        ];
        Ok(RedisStore {
            shared,
            changes: rx,
            _tasks: Arc::new(AbortOnDrop(tasks)),
        })
    }

    /// Client-side round trips so far (one per script call, subscription or PING).
    pub fn round_trips(&self) -> u64 {
        self.shared.round_trips.load(Ordering::Relaxed)
    }

    /// The key names this store uses.
    pub fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    /// One script call with our deadline, latency logging and timeout bookkeeping.
    async fn call(
        &self,
        op: &'static str,
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        self.run(op, script, &keys, &args, None).await
    }

    /// What a lease or placement write waits for: one whose loss in a failover could let
    /// two pods believe they own a shard past the deadline rule. With
    /// [`RedisOptions::wait`] it counts only once that many replicas have it.
    fn durable(&self) -> Option<Wait> {
        self.shared.opts.wait
    }

    async fn run<A: redis::ToRedisArgs + Sync>(
        &self,
        op: &'static str,
        script: &Script,
        keys: &[String],
        args: &[A],
        wait: Option<Wait>,
    ) -> Result<Value, StoreError> {
        let s = &self.shared;
        let Some(mut conn) = s.link.borrow().as_ref().map(|l| l.manager.clone()) else {
            s.follow.notify_one();
            return Err(StoreError::Unavailable(
                "no master found yet: asking the sentinels".into(),
            ));
        };
        s.round_trips.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let result = bounded(
            s.opts.response_timeout,
            invoke::invoke(&mut conn, script, keys, args, wait),
        )
        .await
        .and_then(|(value, acked)| match (wait, acked) {
            (Some(wait), Some(acked)) if acked < u64::from(wait.replicas) => {
                Err(StoreError::NotReplicated {
                    acked,
                    wanted: wait.replicas,
                })
            }
            _ => Ok(value),
        });
        let latency_ms = started.elapsed().as_secs_f64() * 1e3;
        match &result {
            Ok(_) => {
                s.no_timeout();
                debug!(op, latency_ms, "redis call");
            }
            Err(e) => {
                if matches!(e, StoreError::Timeout(_)) {
                    let in_row = s.timeouts_in_row.fetch_add(1, Ordering::Relaxed) + 1;
                    if in_row >= REBUILD_AFTER_TIMEOUTS {
                        self.rebuild(in_row);
                    }
                } else {
                    s.no_timeout();
                }
                if may_have_moved(e) {
                    if matches!(e, StoreError::Refused { code, .. } if code != "LOADING") {
                        s.not_master.store(true, Ordering::Relaxed);
                    }
                    s.follow.notify_one();
                }
                // Every caller reports its failures (the driver once per change of
                // symptom): a line per failed call here would only repeat them.
                debug!(op, latency_ms, error = %e, "redis call failed");
            }
        }
        result
    }

    /// Replaces the connection manager: a socket that keeps timing out may be half-open,
    /// and the manager only reconnects on I/O errors. The new one connects lazily.
    fn rebuild(&self, in_row: u32) {
        let s = &self.shared;
        let mut failed = None;
        s.link.send_if_modified(|link| {
            let Some(link) = link else {
                return false;
            };
            match lazy_manager(&link.client, &s.opts) {
                Ok(fresh) => link.manager = fresh,
                Err(e) => failed = Some(e),
            }
            // The same master: the events task keeps its subscription.
            false
        });
        if let Some(e) = failed {
            warn!(error = %e, "could not rebuild redis connection");
            return;
        }
        s.timeouts_in_row.store(0, Ordering::Relaxed);
        let rebuilds = s.rebuilds.fetch_add(1, Ordering::Relaxed) + 1;
        if rebuilds == 1 {
            warn!(timeouts_in_row = in_row, url = %s.url, "rebuilt redis connection after repeated timeouts (further rebuilds of this streak are logged at debug)");
        } else {
            debug!(
                timeouts_in_row = in_row,
                rebuilds, "rebuilt redis connection again"
            );
        }
    }

    /// `prefix` followed by the lease key of each shard.
    fn with_leases(&self, mut prefix: Vec<String>, shards: &[ShardId]) -> Vec<String> {
        prefix.extend(shards.iter().map(|&s| self.shared.keys.lease(s)));
        prefix
    }
}
