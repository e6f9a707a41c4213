//! The connection manager: the [`ServingHook`] that keeps one session to every terminal
//! of every shard this pod serves.
//!
//! `start` loads the shard's terminals from the directory and runs one link task per
//! terminal (see `link`); all dials of the pod share one pacer. `suspend` keeps the
//! connections but marks the shard holding (no pushes, no dials). `start` again (the
//! same epoch resumes delivering) or with a higher epoch
//! re-sends the hello on every live connection. `stop` closes every session of the
//! shard (GOAWAY, bounded by the close budget) and resolves only after, plus a 500 ms
//! settle on a rebalance or shutdown, so the lease is released only when the next owner
//! may dial and the terminals have seen their connections end. The directory's per-shard versions are
//! polled for all served shards in one call every `directory_poll`: new terminals are
//! dialed, removed ones closed. A shard whose directory the store lost (Redis restarted
//! empty) keeps its links, and the manager writes them back as the shard's directory
//! once it holds the shard's lease in the new generation (`Directory::restore`, see
//! `manager/directory_sync.rs`). A terminal's stale-epoch answer goes to the driver
//! through the channel given at construction.
//!
//! Pushes find a terminal's link with [`ConnectionManager::lookup`] and send on its
//! session's request handle directly.
//!
//! Not for: deciding what to serve (the reconciler), or whether a push may go out now
//! (the `ServingTable`, checked per push).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

// The maps below are keyed by shard numbers and directory ids, never by what a caller
// chose, and every push looks one up: a fast hash (foldhash) rather than SipHash.
use foldhash::HashMap;
use futures::FutureExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

mod config;
mod directory_sync;
mod drain;
mod predecessors;
mod stats;

pub use self::config::ManagerConfig;
use self::directory_sync::poll_directory;
use self::drain::Drained;
pub use self::drain::{DrainingSession, Sending};
use super::dialer::Dialer;
use super::handover::{Released, Walk, WalkConfig};
use super::link::{
    Delivery, LinkContext, LinkShared, LinkState, LinkStatus, LinkTask, Mode, WaitingPush,
};
use super::pacer::{Jitter, Pacer};
use super::session::RequestSender;
use crate::core::lease::StaleEpoch;
use crate::core::membership::{Member, HANDOVER_DRAIN, HANDOVER_RELAY};
use crate::core::reconciler::{Close, Stop, StopReason};
use crate::core::{Epoch, ShardId};
use crate::metrics::Metrics;
use crate::serving::ServingHook;
use crate::serving::{SessionStats, ShardCount, TerminalCounts};
use crate::store::directory::{Directory, Terminal};
use crate::store::StoreError;

/// How much longer than the close budget a stopping shard waits for its links: enough
/// for a link to cancel an ungraceful connection and see its task gone. Well inside the
/// lease margin, which is what pays for it.
const CLOSE_SLACK: Duration = Duration::from_millis(250);

/// After a graceful stop closed a shard's sockets, how long it waits before resolving
/// (and so before the lease is released and the next owner may dial). A terminal
/// handles a closed connection asynchronously, as our simulator does: without a pause
/// the next owner's connection could reach it before it noticed the close, which it
/// would count as two connections at once. Only for handovers we choose (rebalance,
/// shutdown); a lost or expired lease is not ours to delay.
const HANDOVER_SETTLE: Duration = Duration::from_millis(500);

/// One served shard as the manager sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardConnections {
    pub epoch: Epoch,
    /// Holding while suspended.
    pub delivery: Delivery,
    /// Every terminal of the shard, by id.
    pub links: BTreeMap<String, LinkState>,
}

/// Connections to the terminals of the shards this pod serves. Cheap to clone; every
/// clone is the same manager. Create it within a tokio runtime.
pub struct ConnectionManager<D: Directory> {
    inner: Arc<Inner<D>>,
}

impl<D: Directory> Clone for ConnectionManager<D> {
    fn clone(&self) -> Self {
        ConnectionManager {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<D> {
    directory: Arc<D>,
    links: Arc<LinkContext>,
    directory_poll: Duration,
    close_budget: Duration,
    /// Seeds each link's own backoff RNG.
    rng: Mutex<StdRng>,
    shards: Mutex<HashMap<ShardId, ShardEntry>>,
    /// Shards handed over whose sessions stay open until the new owner asks (`drain`).
    /// Locked after `shards` when both are.
    draining: Mutex<HashMap<ShardId, Drained>>,
    /// How many shards drain now (the pod's shutdown waits for 0).
    draining_count: watch::Sender<usize>,
    drain_budget: Duration,
    walk: Option<WalkConfig>,
    /// Shards about to start that were taken over from a pod that drains: the pod that
    /// announced it drains them (or, without an announcement, the last holder seen), and
    /// since when. Older than the drain budget means stale.
    predecessors: Mutex<HashMap<ShardId, (Member, Instant)>>,
    metrics: Arc<Metrics>,
    /// Tells a shard's entry from an earlier one of the same shard (stopped, restarted)
    /// when a directory load comes back.
    next_incarnation: AtomicU64,
}

struct ShardEntry {
    incarnation: u64,
    mode: watch::Sender<Mode>,
    links: HashMap<String, LinkHandle>,
    /// Every link task of the shard, including removed ones still closing.
    tasks: JoinSet<()>,
    /// What the links reflect of the shard's directory.
    listing: Listing,
    /// A load (and maybe a write-back) is under way; the poller starts no other.
    loading: bool,
    /// Pushes being sent on the shard's sessions now (see [`Sending`]).
    sends: Arc<watch::Sender<usize>>,
    /// Taken over from a pod that drains: new links wait at its gates.
    walk: Option<Walk>,
}

/// What a shard's links reflect of the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Listing {
    /// Not read yet: the first load is under way (or failed and is retried).
    Unread,
    /// The directory at `version`, read in store generation `generation` (`None`: the
    /// store had none at the time).
    Read {
        generation: Option<String>,
        version: u64,
    },
    /// Read in generation `read_in`, and found missing since (the store lost its data):
    /// the links stay, and every poll tries to write them back as the shard's directory
    /// until that succeeds or the directory shows up again.
    Lost { read_in: Option<String> },
}

/// A running link. Dropping it tells the task to close its session and end.
struct LinkHandle {
    /// Shared with every push's [`TerminalLink`]: a lookup copies no strings.
    terminal: Arc<Terminal>,
    state: watch::Receiver<LinkStatus>,
    shared: Arc<LinkShared>,
    /// Resolves (with an error) once the link task ended, its socket closed.
    ended: tokio::sync::oneshot::Receiver<()>,
}

/// Where a terminal stands for a push, as [`ConnectionManager::lookup`] finds it.
#[derive(Debug)]
pub enum Lookup {
    /// The manager does not serve the terminal's shard (not yet, or no more).
    NotServed,
    /// The shard's terminal list is still being read from the directory.
    Loading,
    /// No link to the terminal, so no session to it: it was not in the shard's directory
    /// when last read. (A shard whose directory the store lost keeps its links, so a
    /// terminal with a live session is always `Found`.)
    Unknown,
    Found(TerminalLink),
}

/// A push's handle on one terminal's link.
#[derive(Clone, Debug)]
pub struct TerminalLink {
    pub terminal: Arc<Terminal>,
    state: watch::Receiver<LinkStatus>,
    shared: Arc<LinkShared>,
    sends: Arc<watch::Sender<usize>>,
    /// The shard's previous owner while this pod walks the shard from it, if it relays
    /// pushes (`handover`).
    predecessor: Option<Arc<Member>>,
}

impl TerminalLink {
    /// Counts a push as waiting for this terminal (its next dial becomes urgent),
    /// unless `cap` pushes already wait. The guard stops counting when dropped.
    pub fn wait(&self, cap: usize) -> Option<WaitingPush> {
        self.shared.wait(cap)
    }

    /// Counts a push as being sent on the shard's sessions until the guard is dropped.
    /// Taken before the push's last check that the shard is served: a shard handed
    /// over waits for these before its lease is released (`drain`).
    pub fn sending(&self) -> Sending {
        Sending::new(self.sends.clone())
    }

    /// Whether the link waits out a backoff after failed dials: no session is coming
    /// soon.
    pub fn backing_off(&self) -> bool {
        self.state.borrow().state == LinkState::Backoff
    }

    /// Whether a session with an accepted hello is up now (any epoch).
    pub fn connected(&self) -> bool {
        matches!(self.state.borrow().state, LinkState::Connected { .. })
    }

    /// The shard's previous owner while it still holds this terminal's session as
    /// draining: this pod took the shard over from a pod that relays pushes, and the
    /// link's first dial waits at its handover gate. Once the gate opened, the
    /// predecessor has closed the session (or the walk fell back: it is not answering).
    pub fn draining_at(&self) -> Option<&Member> {
        self.predecessor
            .as_deref()
            .filter(|_| self.shared.at_gate())
    }

    /// Waits until the link has a session whose hello was accepted for `epoch`, and
    /// returns its request handle; `None` if the link went away (shard stopped,
    /// terminal removed). Not bounded: wrap it in the caller's deadline.
    pub async fn session(&mut self, epoch: Epoch) -> Option<RequestSender> {
        let ready =
            |s: &LinkStatus| s.state == LinkState::Connected { epoch } && s.sender.is_some();
        let status = self.state.wait_for(ready).await.ok()?;
        status.sender.clone()
    }
}

impl<D: Directory> ConnectionManager<D> {
    /// A manager dialing with `dialer`, reading `directory`, and sending every stale
    /// epoch a terminal reports to `stale` (the driver's stale-epoch input). Spawns the
    /// directory poller, which ends when the last clone of the manager is dropped.
    pub fn new(
        directory: Arc<D>,
        dialer: Dialer,
        cfg: ManagerConfig,
        stale: mpsc::UnboundedSender<StaleEpoch>,
    ) -> Self {
        let mut rng = match cfg.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let jitter = Jitter::UpTo {
            max: cfg.dial_jitter,
            rng: Box::new(StdRng::from_rng(&mut rng)),
        };
        let inner = Arc::new(Inner {
            directory,
            links: Arc::new(LinkContext {
                dialer,
                pacer: Pacer::new(cfg.dial_rate, jitter, cfg.max_handshakes),
                hellos: Pacer::new(cfg.hello_rate, Jitter::None, cfg.max_handshakes),
                backoff: cfg.backoff,
                close_budget: cfg.close_budget,
                stale,
                metrics: cfg.metrics.clone(),
            }),
            directory_poll: cfg.directory_poll,
            close_budget: cfg.close_budget,
            rng: Mutex::new(rng),
            shards: Mutex::new(HashMap::default()),
            draining: Mutex::new(HashMap::default()),
            draining_count: watch::channel(0).0,
            drain_budget: cfg.drain_budget,
            walk: cfg.walk,
            predecessors: Mutex::new(HashMap::default()),
            metrics: cfg.metrics.clone(),
            next_incarnation: AtomicU64::new(0),
        });
        tokio::spawn(poll_directory(Arc::downgrade(&inner), cfg.directory_poll));
        ConnectionManager { inner }
    }

    /// The state of `shard`'s connections, if the manager serves it.
    pub fn shard(&self, shard: ShardId) -> Option<ShardConnections> {
        let shards = lock(&self.inner.shards);
        let entry = shards.get(&shard)?;
        let mode = *entry.mode.borrow();
        Some(ShardConnections {
            epoch: mode.epoch,
            delivery: mode.delivery,
            links: entry
                .links
                .iter()
                .map(|(id, link)| (id.clone(), link.state.borrow().state))
                .collect(),
        })
    }

    /// Finds `terminal`'s link in `shard` for a push.
    pub fn lookup(&self, shard: ShardId, terminal: &str) -> Lookup {
        let shards = lock(&self.inner.shards);
        let Some(entry) = shards.get(&shard) else {
            return Lookup::NotServed;
        };
        match entry.links.get(terminal) {
            Some(link) => Lookup::Found(TerminalLink {
                terminal: link.terminal.clone(),
                state: link.state.clone(),
                shared: link.shared.clone(),
                sends: entry.sends.clone(),
                predecessor: entry.walk.as_ref().and_then(Walk::relay),
            }),
            // Not read yet: only the first load can tell.
            None if entry.listing == Listing::Unread => Lookup::Loading,
            None => Lookup::Unknown,
        }
    }

    /// Every link of `shard` (a broadcast's walk); `None` while the manager does not
    /// serve the shard or has not read its terminals yet.
    pub fn links(&self, shard: ShardId) -> Option<Vec<TerminalLink>> {
        let shards = lock(&self.inner.shards);
        let entry = shards.get(&shard)?;
        if entry.listing == Listing::Unread {
            return None;
        }
        Some(
            entry
                .links
                .values()
                .map(|link| TerminalLink {
                    terminal: link.terminal.clone(),
                    state: link.state.clone(),
                    shared: link.shared.clone(),
                    sends: entry.sends.clone(),
                    // A broadcast waits for this pod's own sessions.
                    predecessor: None,
                })
                .collect(),
        )
    }

    /// Tells the driver that a terminal refused an epoch as stale (a push got the
    /// `409`), as after a refused hello.
    pub fn report_stale(&self, refused: StaleEpoch) {
        // The driver may be gone (pod shutting down); then nobody needs to know.
        let _ = self.inner.links.stale.send(refused);
    }
}

impl<D: Directory> ServingHook for ConnectionManager<D> {
    fn taken_over(&self, shard: ShardId, _epoch: Epoch, from: &Member) {
        if self.inner.walk.is_none() || from.handover < HANDOVER_DRAIN {
            return;
        }
        // An announcement names the pod that drains the shard now; the last holder seen
        // may be an earlier one (this pod missed a tenure).
        let fresh = self.inner.fresh_predecessor(shard).is_some();
        if !fresh {
            let entry = (from.clone(), Instant::now());
            lock(&self.inner.predecessors).insert(shard, entry);
        }
    }

    fn start(&self, shard: ShardId, epoch: Epoch) {
        let inner = &self.inner;
        let predecessor = inner.fresh_predecessor(shard);
        lock(&inner.predecessors).remove(&shard);
        let mut shards = lock(&inner.shards);
        if let Some(mut entry) = inner.resume_drained(shard) {
            // Handed over and back before the drain ended: its sessions say hello
            // with the new epoch and deliver again. Terminals it released meanwhile
            // are with the pod it takes the shard back from: read the directory again
            // now, and walk them from that pod like any handover.
            entry.mode.send_replace(Mode {
                epoch,
                delivery: Delivery::Delivering,
            });
            entry.walk = predecessor.and_then(|from| {
                let cfg = inner.walk.clone()?;
                Some(Walk::start(cfg, shard, from, inner.metrics.clone()))
            });
            let reload = !entry.loading;
            entry.loading = true;
            let incarnation = entry.incarnation;
            shards.insert(shard, entry);
            drop(shards);
            if reload {
                tokio::spawn(inner.clone().load(shard, incarnation));
            }
            return;
        }
        if let Some(entry) = shards.get(&shard) {
            // Resumed (same epoch) or re-claimed (new epoch): links re-send the hello
            // when the epoch changed.
            entry.mode.send_replace(Mode {
                epoch,
                delivery: Delivery::Delivering,
            });
            return;
        }
        let incarnation = inner.next_incarnation.fetch_add(1, Ordering::Relaxed);
        let (mode, _) = watch::channel(Mode {
            epoch,
            delivery: Delivery::Delivering,
        });
        shards.insert(
            shard,
            ShardEntry {
                incarnation,
                mode,
                links: HashMap::default(),
                tasks: JoinSet::new(),
                listing: Listing::Unread,
                loading: true,
                sends: Arc::new(watch::channel(0).0),
                walk: predecessor.and_then(|from| {
                    let cfg = inner.walk.clone()?;
                    Some(Walk::start(cfg, shard, from, inner.metrics.clone()))
                }),
            },
        );
        drop(shards);
        tokio::spawn(inner.clone().load(shard, incarnation));
    }

    fn suspend(&self, shard: ShardId, epoch: Epoch) {
        if let Some(entry) = lock(&self.inner.shards).get(&shard) {
            entry.mode.send_replace(Mode {
                epoch,
                delivery: Delivery::Holding,
            });
        }
    }

    fn stop(&self, stop: Stop) -> impl Future<Output = ()> + Send + 'static {
        let Stop {
            shard,
            epoch,
            reason,
            close,
        } = stop;
        if close == Close::Drain && self.inner.walk.is_some() {
            return self.inner.clone().drain(shard, epoch).boxed();
        }
        // Dropping the entry's link handles (now, not when the future is first polled)
        // tells every link to close its session; the future waits for their tasks.
        let entry = lock(&self.inner.shards).remove(&shard);
        let (tasks, terminals) = match entry {
            Some(ShardEntry { tasks, links, .. }) => (Some(tasks), links.len()),
            None => (None, 0),
        };
        let budget = self.inner.close_budget;
        async move {
            let Some(mut tasks) = tasks else {
                return;
            };
            let all_closed = async { while tasks.join_next().await.is_some() {} };
            // Each link closes its own session within `budget` and then waits for the
            // cancelled connection task (socket included) to be gone; the slack lets
            // that finish, so the fallback below (which can only request the
            // cancellation) is for links stuck elsewhere, such as a dial in progress,
            // whose sockets go with their task.
            let graceful = tokio::time::timeout(budget + CLOSE_SLACK, all_closed)
                .await
                .is_ok();
            if !graceful {
                // Aborted tasks drop their sessions, which drops the sockets.
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
            info!(
                shard, epoch, reason = %reason.as_str(), terminals, graceful,
                "shard connections closed"
            );
            if terminals > 0 && matches!(reason, StopReason::Rebalance | StopReason::Shutdown) {
                tokio::time::sleep(HANDOVER_SETTLE).await;
            }
        }
        .boxed()
    }

    /// Drains, relays pushes on draining sessions, and so also takes leases handed over
    /// (the new owner of a handed lease walks the shard like any other it acquires).
    fn handover(&self) -> u32 {
        if self.inner.walk.is_some() {
            HANDOVER_RELAY
        } else {
            0
        }
    }

    fn drain_budget(&self) -> Duration {
        if self.inner.walk.is_some() {
            self.inner.drain_budget
        } else {
            Duration::ZERO
        }
    }
}

/// A panic while holding one of these locks cannot leave a half-written value behind
/// (each critical section is a single insert, remove or read), so poisoning is ignored.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
