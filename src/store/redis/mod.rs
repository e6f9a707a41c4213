//! The production [`CoordStore`]: Redis, one Lua script per operation.
//!
//! Every operation is exactly one script call (one client round trip, counted by
//! [`RedisStore::round_trips`]), so each is atomic in Redis; the scripts live in
//! `store/lua/` with `lib.lua` prepended, and take every key name as `KEYS` (all under
//! one hash tag, see `store::keys`) so they also run on Redis Cluster.
//!
//! | operation | script | keys (all passed as `KEYS`) | generation check |
//! |---|---|---|---|
//! | `pin_meta` | `pin_meta.lua` | meta | no |
//! | `heartbeat` | `heartbeat.lua` | gen, members, member-info, meta | yes, then meta |
//! | `deregister` | `deregister.lua` | members, member-info | no |
//! | `acquire` | `acquire.lua` | gen, epochs, `lease:<s>`... | yes |
//! | `renew` | `renew.lua` | gen, `lease:<s>`... | yes |
//! | `release` | `release.lua` | `lease:<s>`... | no (owner check only) |
//! | `snapshot` | `snapshot.lua` | gen, members, member-info, epochs, placement, `lease:0..n` | creates it if missing |
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
//! ring provider). `rediss://` trusts the system store, or only the certificates of
//! [`RedisOptions::ca_file`] (a private CA), and may present a client certificate; those
//! files are read and checked when the store is created (a bad one is a `Config` error
//! naming it), so replacing them takes a restart. The password never appears in logs or
//! errors.
//!
//! What it does not do: decide anything (policy is in `crate::core`), or talk to more
//! than one Redis endpoint (no Sentinel or cluster client).

mod client;
mod directory;
mod events;
mod ops;
mod reply;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{AsyncConnectionConfig, Client, Script, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

pub use self::client::ClientCert;
use self::client::{bounded, cannot_connect, lazy_manager, open};
use self::events::{Events, Subscription};
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
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            response_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            ca_file: None,
            client_cert: None,
        }
    }
}

/// A script body with the shared helpers prepended, flagged as a writing script (the
/// `#!lua` line without `no-writes`; see the module docs).
macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            "#!lua\n",
            include_str!("../lua/lib.lua"),
            include_str!(concat!("../lua/", $file))
        ))
    };
}

struct Scripts {
    pin_meta: Script,
    heartbeat: Script,
    deregister: Script,
    acquire: Script,
    renew: Script,
    release: Script,
    snapshot: Script,
    place: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            pin_meta: script!("pin_meta.lua"),
            heartbeat: script!("heartbeat.lua"),
            deregister: script!("deregister.lua"),
            acquire: script!("acquire.lua"),
            renew: script!("renew.lua"),
            release: script!("release.lua"),
            snapshot: script!("snapshot.lua"),
            place: script!("place.lua"),
        }
    }
}

struct Shared {
    client: Client,
    keys: Keys,
    opts: RedisOptions,
    scripts: Scripts,
    /// Swapped for a fresh one after repeated timeouts; calls clone it out of the lock.
    manager: Mutex<ConnectionManager>,
    timeouts_in_row: AtomicU32,
    /// Rebuilds since a call last ended without timing out: only the first of a streak
    /// is a warning, or a frozen Redis would log one every few calls.
    rebuilds: AtomicU32,
    round_trips: Arc<AtomicU64>,
    url: String,
}

impl Shared {
    /// A call ended without timing out: the timeout streak, if any, is over.
    fn no_timeout(&self) {
        self.timeouts_in_row.store(0, Ordering::Relaxed);
        self.rebuilds.store(0, Ordering::Relaxed);
    }
}

/// Aborts the pub/sub task when the last clone of the store goes away.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The Redis store. Clones share the connection and the change subscription.
#[derive(Clone)]
pub struct RedisStore {
    shared: Arc<Shared>,
    changes: watch::Receiver<u64>,
    _events: Arc<AbortOnDrop>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.shared.url)
            .field("cluster", &self.shared.keys.cluster())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` for cluster `cluster`: checks the URL, the cluster name,
    /// reachability and credentials (one PING), and subscribes to the event channel.
    /// For one-shot commands that should fail at once with the server's reason.
    pub async fn connect(
        url: &str,
        cluster: &str,
        opts: RedisOptions,
    ) -> Result<RedisStore, StoreError> {
        let (client, keys, redacted) = open(url, cluster, &opts)?;
        let context = |e| cannot_connect(&redacted, e);
        // A plain connection first: a wrong address or password fails here, once, with
        // the server's reason, instead of inside the manager's retries.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            .set_response_timeout(Some(opts.response_timeout));
        let mut probe = bounded(
            opts.connect_timeout + opts.response_timeout,
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
        let store = Self::assemble(client, keys, redacted, opts, Some(first), 2)?;
        info!(url = %store.shared.url, cluster = store.keys().cluster(), "connected to redis");
        Ok(store)
    }

    /// Checks the URL and the cluster name (errors are [`StoreError::Config`]) but does
    /// not contact Redis: the first call connects, and the event subscription is made in
    /// the background, retried with backoff until Redis answers; `changes()` is bumped
    /// once it is in place. Until then calls fail with `Unavailable` or `Timeout`, each
    /// within the response timeout; the first call after Redis comes up may still fail
    /// once, reporting the reconnect that failed before it (the next one succeeds). For
    /// a pod, which may start before Redis does.
    ///
    /// Must be called within a Tokio runtime (it spawns the subscription task).
    pub fn connect_lazy(
        url: &str,
        cluster: &str,
        opts: RedisOptions,
    ) -> Result<RedisStore, StoreError> {
        let (client, keys, redacted) = open(url, cluster, &opts)?;
        let store = Self::assemble(client, keys, redacted, opts, None, 0)?;
        info!(url = %store.shared.url, cluster = store.keys().cluster(), "using redis (connecting in the background)");
        Ok(store)
    }

    /// The store around `client`, with the events task started from `first` (or
    /// subscribing on its own) and `round_trips` already spent.
    fn assemble(
        client: Client,
        keys: Keys,
        url: String,
        opts: RedisOptions,
        first: Option<Subscription>,
        round_trips: u64,
    ) -> Result<RedisStore, StoreError> {
        // Only an invalid manager configuration fails here; ours is fixed, so this is a
        // bug or an unsupported URL option, not an outage.
        let manager = lazy_manager(&client, &opts).map_err(|e| {
            StoreError::Config(format!("cannot set up the Redis connection for {url}: {e}"))
        })?;
        let round_trips = Arc::new(AtomicU64::new(round_trips));
        let (tx, rx) = watch::channel(0);
        let events = Events {
            client: client.clone(),
            channel: keys.events(),
            opts: opts.clone(),
            tx,
            round_trips: round_trips.clone(),
        };
        let task = tokio::spawn(events::run(events, first));
        Ok(RedisStore {
            shared: Arc::new(Shared {
                client,
                keys,
                opts,
                scripts: Scripts::new(),
                manager: Mutex::new(manager),
                timeouts_in_row: AtomicU32::new(0),
                rebuilds: AtomicU32::new(0),
                round_trips,
                url,
            }),
            changes: rx,
            _events: Arc::new(AbortOnDrop(task)),
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
        let mut inv = script.prepare_invoke();
        for key in keys {
            inv.key(key);
        }
        for arg in args {
            inv.arg(arg);
        }
        let s = &self.shared;
        let mut conn = s.manager.lock().unwrap_or_else(|p| p.into_inner()).clone();
        s.round_trips.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let result = bounded(
            s.opts.response_timeout,
            inv.invoke_async::<Value>(&mut conn),
        )
        .await;
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
        match lazy_manager(&s.client, &s.opts) {
            Ok(fresh) => {
                *s.manager.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
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
            Err(e) => warn!(error = %e, "could not rebuild redis connection"),
        }
    }

    /// `prefix` followed by the lease key of each shard.
    fn with_leases(&self, mut prefix: Vec<String>, shards: &[ShardId]) -> Vec<String> {
        prefix.extend(shards.iter().map(|&s| self.shared.keys.lease(s)));
        prefix
    }
}
