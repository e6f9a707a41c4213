//! Broadcasts: one push to every terminal a label selector picks, within the sending
//! token's patterns. Any pod creates one in the store (`crate::store::broadcast`), body
//! once, answered `202` with its id; every pod then walks the shards it serves.
//!
//! **The walk.** A creation is announced to every pod (the store's news; without it,
//! a look every 30 s). Each second, for every unexpired broadcast and every shard served
//! here, the owner selects from its own links (the shard's directory as last read, labels
//! included): the selection is evaluated as each shard is walked, so a terminal listed
//! or labeled while a broadcast runs gets it, and one removed does not. The token's
//! patterns, stored with the broadcast, are applied again to every terminal. No list of
//! terminals crosses the network.
//!
//! **A copy** goes only to a terminal with a session, paced by `--broadcast-rate` (its
//! own budget, apart from the live pushes' in-flight slots), after the delivery rule
//! (`crate::core::delivery`) and a `sending` mark in the store, checked against the
//! shard's lease and epoch. Every terminal gets the broadcast under one key,
//! [`terminal_key`]. Outcomes are recorded per terminal in the same checked way, with a
//! progress summary per shard for `GET /v1/broadcasts/{id}`.
//!
//! **When two pods disagree** (a move, a crash): only the lease holder with its current
//! epoch writes marks, so a pod that lost the shard sends nothing new; a copy of its
//! that arrives after the new owner's hello is refused by epoch. A new owner reads the
//! marks and sends only to terminals without an outcome; where a `sending` mark says a
//! copy may have been taken, it sends again only while the terminal still remembers the
//! key (the first copy's time plus its dedup window), so a repeat is answered as a
//! duplicate, not acted on. After that the outcome is `unknown`. A terminal that lost its
//! key memory (a reboot without it: only RECOMMENDED by the protocol) may act twice.
//!
//! Not for: the HTTP checks (`crate::http::broadcast`) or what the store keeps.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::HeaderValue;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::answer::{Answer, ErrorCode};
use super::queue::{lock, not_taken, try_later, wall_ms, CLOCK_SKEW, COPY_TIMEOUT};
use super::Sessions;
use crate::api::Labels;
use crate::clock::now;
use crate::core::delivery::{self, Moment, Pending, QueueRules, Step, Verdict, WallMs};
use crate::core::lease::StaleEpoch;
use crate::core::membership::BROADCAST_WALK;
use crate::core::{Epoch, PodId, ShardId};
use crate::credentials::{Scope, Tenant};
use crate::metrics::Metrics;
use crate::pos::manager::TerminalLink;
use crate::pos::push::{self as pos_push, Answered, PushFailure};
use crate::pos::wire::{PosPush, Queued, Receipt};
use crate::serving::ServingTable;
use crate::status::PodStatus;
use crate::store::broadcast::{
    broadcast_id, terminal_key, Broadcast, BroadcastStore, Create, Created, Found, Mark, MarkWrite,
    MarksWritten, ShardProgress,
};
use crate::store::queue::Wakeup;

/// How often a pod walks its shards for each unexpired broadcast.
const WALK_EVERY: Duration = Duration::from_secs(1);
/// How often a pod looks for unexpired broadcasts without news of one (a creation is
/// announced to every pod; this covers an announcement lost with its subscription).
const LOOK_EVERY: Duration = Duration::from_secs(30);
/// Terminals marked in one store call, then sent to.
const CHUNK: usize = 64;
/// Copies of one broadcast on their way from this pod at once.
const CONCURRENCY: usize = 32;
/// How long a copy waits for a session with the serving epoch (the link has one:
/// only connected terminals are picked).
const SESSION_WAIT: Duration = Duration::from_secs(1);
/// A shard's progress is written again after this long even when unchanged, so a
/// reader sees which owner walks it now.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The broadcast flags (`posgate serve --broadcast-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BroadcastConfig {
    /// `--broadcast-rate`: broadcast copies this pod sends per second, at most.
    pub rate: NonZeroU32,
    /// `--broadcast-max-active`: unexpired broadcasts in the cluster, at most.
    pub max_active: usize,
    /// `--broadcast-tenants`: the tenants whose tokens may broadcast.
    pub tenants: BTreeSet<String>,
}

impl Default for BroadcastConfig {
    fn default() -> Self {
        BroadcastConfig {
            rate: NonZeroU32::new(200).expect("non-zero"),
            max_active: crate::store::broadcast::MAX_ACTIVE,
            tenants: BTreeSet::new(),
        }
    }
}

/// A broadcast as a sender asked for it, checked by the HTTP layer.
#[derive(Clone, Debug)]
pub struct NewBroadcast {
    pub tenant: Tenant,
    pub key: String,
    pub selector: Labels,
    /// The token's patterns.
    pub scope: Scope,
    pub content_type: Option<String>,
    pub body: Bytes,
    pub ttl: Duration,
}

/// What `GET /v1/broadcasts/{id}` answers (and `POST` with the created one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BroadcastStatus {
    pub id: String,
    pub tenant: String,
    pub idempotency_key: String,
    pub selector: String,
    /// `running`, `complete` (every shard walked and no terminal left) or `expired`.
    pub state: &'static str,
    pub created_ms: WallMs,
    pub expires_ms: WallMs,
    pub counts: Counts,
    /// Shards whose owner recorded a walk, of all.
    pub shards_walked: usize,
    pub shards: u32,
    pub pods: Vec<PodProgress>,
}

/// Terminals of a broadcast by where they stand.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Selected in the shards walked so far.
    pub matched: u64,
    pub delivered: u64,
    /// Of `delivered`: answered as duplicates (the terminal had the key already).
    pub duplicates: u64,
    /// Refused for good by the terminal.
    pub failed: u64,
    /// A copy may have been taken, and no answer says so (lost answers past the
    /// terminal's dedup window, or the expiry).
    pub unknown: u64,
    /// Waiting for their terminal to connect (while running).
    pub queued: u64,
    /// Without an outcome, waiting or being sent (while running).
    pub remaining: u64,
    /// Without an outcome at the expiry.
    pub expired: u64,
}

/// What one pod's shards recorded of a broadcast.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodProgress {
    pub pod: String,
    pub shards: usize,
    pub matched: u64,
    pub delivered: u64,
    pub remaining: u64,
    /// The newest record of its shards, its own clock.
    pub at_ms: WallMs,
}

/// The answer of a dry run: how many terminals a broadcast would select now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DryRun {
    pub selector: String,
    pub matched: u64,
}

/// One walk of a broadcast over one shard: what this pod knows of its marks.
struct ShardWalk {
    epoch: Epoch,
    marks: HashMap<String, Mark>,
    written: Option<(ShardProgress, WallMs)>,
}

/// What one copy came to.
enum Copy {
    Final(Mark),
    /// Provably not taken: its mark is removed.
    NotSent,
    /// May have been taken: the mark stays and bounds the next copy.
    Unanswered,
}

/// See the module docs. Cheap to share behind an `Arc`.
pub struct Broadcasts {
    pod: PodId,
    store: Arc<dyn BroadcastStore>,
    serving: ServingTable,
    sessions: Arc<dyn Sessions>,
    status: watch::Receiver<PodStatus>,
    settings: BroadcastConfig,
    rules: QueueRules,
    /// How long a broadcast's keys are kept after its expiry (`--queue-retention`).
    retention_ms: u64,
    max_ttl: Duration,
    push_path: String,
    pace: DefaultDirectRateLimiter,
    walking: Mutex<HashSet<String>>,
    metrics: Arc<Metrics>,
}

impl Broadcasts {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pod: PodId,
        store: Arc<dyn BroadcastStore>,
        serving: ServingTable,
        sessions: Arc<dyn Sessions>,
        status: watch::Receiver<PodStatus>,
        settings: BroadcastConfig,
        rules: QueueRules,
        queue: &super::queue::QueueConfig,
        push_path: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        let quota = Quota::per_second(settings.rate).allow_burst(settings.rate);
        Broadcasts {
            pod,
            store,
            serving,
            sessions,
            status,
            pace: RateLimiter::direct(quota),
            settings,
            rules,
            retention_ms: queue.limits.retention_ms,
            max_ttl: queue.max_ttl,
            push_path,
            walking: Mutex::new(HashSet::new()),
            metrics,
        }
    }

    /// Whether `tenant` may broadcast (`--broadcast-tenants`; without tokens anyone).
    pub fn granted(&self, tenant: &Tenant, insecure: bool) -> Result<(), Answer> {
        if insecure || self.settings.tenants.contains(&tenant.0) {
            return Ok(());
        }
        Err(Answer::error(
            ErrorCode::Forbidden,
            format!(
                "tenant {:?} may not broadcast (--broadcast-tenants)",
                tenant.0
            ),
        ))
    }

    /// Every member walks broadcasts: during a rolling upgrade from a release without
    /// them a broadcast would stall on the shards of the pods that do not.
    fn ready(&self) -> Result<(), Answer> {
        let status = self.status.borrow();
        let why = if status.members.is_empty() {
            "this pod has not seen the cluster's members yet"
        } else if status.members.iter().any(|m| m.broadcast < BROADCAST_WALK) {
            "not every pod of the cluster sends broadcasts yet (a rolling upgrade)"
        } else {
            return Ok(());
        };
        Err(Answer::error(ErrorCode::QueueUnavailable, why))
    }

    /// The longest `ttl_s` a broadcast may ask for (`--queue-max-ttl`).
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// Creates `new` (or finds it, the same request again): its status, and whether it
    /// is new.
    pub async fn create(&self, new: NewBroadcast) -> Result<(BroadcastStatus, bool), Answer> {
        self.ready()?;
        let patterns = new.scope.patterns();
        let digest = digest(&new.body, &new.selector, &patterns, &new.content_type);
        let now_ms = wall_ms();
        let expires_ms = now_ms.saturating_add(new.ttl.as_millis() as u64);
        let broadcast = Broadcast {
            id: broadcast_id(&new.tenant.0, &new.key),
            tenant: new.tenant.0.clone(),
            key: new.key,
            digest,
            selector: new.selector.to_string(),
            patterns,
            content_type: new.content_type,
            created_ms: now_ms,
            expires_ms,
            created_by: self.pod.to_string(),
            bytes: new.body.len() as u64,
        };
        let create = Create {
            broadcast: broadcast.clone(),
            body: new.body,
            keep_until_ms: expires_ms.saturating_add(self.retention_ms),
            now_ms,
            max_active: self.settings.max_active,
        };
        let created = self.store.create(&create).await.map_err(unavailable)?;
        let (broadcast, fresh) = match created {
            Created::New => (broadcast, true),
            Created::Existing(old) if old.digest == broadcast.digest => (*old, false),
            Created::Existing(_) => {
                return Err(Answer::error(
                    ErrorCode::IdempotencyConflict,
                    "this Idempotency-Key was used for another broadcast (body, selector, \
                     content type or token patterns differ)",
                ))
            }
            Created::Full { active } => {
                return Err(Answer::error(
                    ErrorCode::QueueFull,
                    format!(
                        "{active} broadcasts are running, the most this cluster runs at once \
                         (--broadcast-max-active)"
                    ),
                ))
            }
        };
        if fresh {
            info!(id = %broadcast.id, tenant = %broadcast.tenant, selector = %broadcast.selector, "broadcast created");
        }
        let found = Found {
            broadcast,
            shards: Default::default(),
        };
        Ok((self.status_of(&found), fresh))
    }

    /// The broadcast `id` of `tenant`.
    pub async fn find(&self, tenant: &Tenant, id: &str) -> Result<BroadcastStatus, Answer> {
        match self.store.find(id).await.map_err(unavailable)? {
            Some(found) if found.broadcast.tenant == tenant.0 => Ok(self.status_of(&found)),
            _ => Err(Answer::error(
                ErrorCode::UnknownBroadcast,
                format!("no broadcast {id:?} of this tenant"),
            )),
        }
    }

    fn status_of(&self, found: &Found) -> BroadcastStatus {
        let b = &found.broadcast;
        let shards = self.serving.shards();
        let expired = wall_ms() >= b.expires_ms;
        let mut counts = Counts::default();
        let mut pods: Vec<PodProgress> = Vec::new();
        for p in found.shards.values() {
            counts.matched += p.matched;
            counts.delivered += p.delivered;
            counts.duplicates += p.duplicates;
            counts.failed += p.failed;
            counts.unknown += p.unknown;
            let remaining = p.remaining();
            if expired {
                counts.expired += remaining;
            } else {
                counts.remaining += remaining;
                counts.queued += p.offline;
            }
            let pod = match pods.iter_mut().find(|q| q.pod == p.pod) {
                Some(pod) => pod,
                None => {
                    pods.push(PodProgress {
                        pod: p.pod.clone(),
                        ..PodProgress::default()
                    });
                    pods.last_mut().expect("just pushed")
                }
            };
            pod.shards += 1;
            pod.matched += p.matched;
            pod.delivered += p.delivered;
            pod.remaining += remaining;
            pod.at_ms = pod.at_ms.max(p.at_ms);
        }
        pods.sort_by(|a, b| a.pod.cmp(&b.pod));
        let walked = found.shards.len();
        let state = if expired {
            "expired"
        } else if walked as u32 == shards && counts.remaining == 0 {
            "complete"
        } else {
            "running"
        };
        BroadcastStatus {
            id: b.id.clone(),
            tenant: b.tenant.clone(),
            idempotency_key: b.key.clone(),
            selector: b.selector.clone(),
            state,
            created_ms: b.created_ms,
            expires_ms: b.expires_ms,
            counts,
            shards_walked: walked,
            shards,
            pods,
        }
    }

    /// The unexpired broadcasts with their progress, for operators (the cluster view):
    /// one store call each, at most `--broadcast-max-active`; none when the store does
    /// not answer.
    pub async fn running(&self) -> Vec<BroadcastStatus> {
        let Ok(active) = self.store.active(wall_ms()).await else {
            return Vec::new();
        };
        let mut running = Vec::with_capacity(active.len());
        for id in active {
            if let Ok(Some(found)) = self.store.find(&id).await {
                running.push(self.status_of(&found));
            }
        }
        running
    }

    /// Looks for unexpired broadcasts at start, when one is announced and every
    /// [`LOOK_EVERY`], and walks each one this pod is not walking yet. Ends, with every walk, once the push service is dropped (the
    /// tasks hold no reference to it between rounds).
    pub async fn run(self: Arc<Self>) {
        let mut news = self.store.news();
        let me = Arc::downgrade(&self);
        drop(self);
        let mut tick = tokio::time::interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The first tick is at once: a pod that starts looks for running broadcasts.
            tokio::select! {
                _ = tick.tick() => {}
                heard = news.recv() => match heard {
                    Ok(Wakeup::Broadcast | Wakeup::All) | Err(RecvError::Lagged(_)) => {}
                    Ok(Wakeup::Terminal(..)) => continue,
                    Err(RecvError::Closed) => {
                        let Some(this) = me.upgrade() else {
                            return;
                        };
                        news = this.store.news();
                        continue;
                    }
                },
            }
            let Some(this) = me.upgrade() else {
                return;
            };
            let active = match this.store.active(wall_ms()).await {
                Ok(active) => active,
                Err(e) => {
                    debug!(error = %e, "broadcasts: reading the running ones failed; retrying");
                    continue;
                }
            };
            this.metrics.broadcasts_active.set(active.len() as i64);
            for id in active {
                if lock(&this.walking).insert(id.clone()) {
                    tokio::spawn(walk(me.clone(), id));
                }
            }
        }
    }

    /// What every copy of `b` shares: `None` (logged) when it cannot be sent from here
    /// now; the next look at the running broadcasts tries again.
    async fn job<'b>(&self, b: &'b Broadcast) -> Option<Job<'b>> {
        let selector = Labels::parse(&b.selector);
        let scope = Scope::from_patterns(&b.patterns);
        let (Ok(selector), Ok(scope)) = (selector, scope) else {
            warn!(id = %b.id, "broadcast: its stored selector or patterns cannot be read; not sent from this pod");
            return None;
        };
        let body = match self.store.body(&b.id).await {
            Ok(Some(body)) => body,
            Ok(None) => return None,
            Err(e) => {
                debug!(id = %b.id, error = %e, "broadcast: reading its body failed");
                return None;
            }
        };
        let content_type = b
            .content_type
            .as_deref()
            .and_then(|c| HeaderValue::from_str(c).ok());
        Some(Job {
            b,
            selector,
            scope,
            body,
            content_type,
        })
    }

    /// One round over the shards served here.
    async fn round(&self, job: &Job<'_>, walks: &mut HashMap<ShardId, ShardWalk>) {
        let id = &job.b.id;
        for shard in 0..self.serving.shards() {
            let Some(epoch) = self.serving.serving(shard, now()) else {
                walks.remove(&shard);
                continue;
            };
            if walks.get(&shard).is_none_or(|w| w.epoch != epoch) {
                match self.store.marks(id, shard).await {
                    Ok(marks) => {
                        let walk = ShardWalk {
                            epoch,
                            marks,
                            written: None,
                        };
                        walks.insert(shard, walk);
                    }
                    Err(e) => {
                        debug!(%id, shard, error = %e, "broadcast: reading marks failed");
                        continue;
                    }
                }
            }
            let walk = walks.get_mut(&shard).expect("inserted above");
            if let Err(why) = self.pass(job, shard, walk).await {
                debug!(%id, shard, %why, "broadcast: the shard's pass ended early");
                walks.remove(&shard);
            }
        }
    }

    /// One pass over `shard`'s selected terminals: counts, sends to the connected ones
    /// without an outcome, records. `Err` when the store says this pod does not hold
    /// the shard, or a write failed (the marks are read again next time).
    async fn pass(
        &self,
        job: &Job<'_>,
        shard: ShardId,
        walk: &mut ShardWalk,
    ) -> Result<(), String> {
        let Some(links) = self.sessions.links(shard) else {
            return Ok(());
        };
        let b = job.b;
        let selected: Vec<TerminalLink> = links
            .into_iter()
            .filter(|l| {
                job.selector.selects(&l.terminal.labels) && job.scope.allows(&l.terminal.id)
            })
            .collect();
        let wall = wall_ms();
        let mut due = Vec::new();
        let mut given_up = Vec::new();
        for link in &selected {
            let since = match walk.marks.get(&link.terminal.id) {
                Some(Mark::Sending { since_ms }) => Some(*since_ms),
                Some(_) => continue,
                None => None,
            };
            let pending = Pending {
                expires_ms: b.expires_ms,
                unanswered_since_ms: since,
            };
            match delivery::step(&pending, wall, &self.rules) {
                Step::Send if link.connected() => due.push(link.clone()),
                Step::GiveUp => given_up.push((link.terminal.id.clone(), Mark::Unknown)),
                Step::Send | Step::Expire | Step::WaitUntil(_) => {}
            }
        }
        if !given_up.is_empty() {
            self.write(b, shard, walk, given_up, Vec::new(), None)
                .await?;
        }
        // A chunk is paced as a whole before it is marked, so its copies leave right
        // after their marks and the `sending` guards below are held only while they are
        // answered: a planned move waits for them (bounded by its drain), and a new owner
        // then finds outcomes, not marks of copies still to leave.
        let size = CHUNK.min(self.settings.rate.get() as usize);
        for chunk in due.chunks(size) {
            let n = NonZeroU32::new(chunk.len() as u32).expect("chunks are not empty");
            if self.pace.until_n_ready(n).await.is_err() {
                return Err("a chunk larger than the pace's burst".into());
            }
            // From here to the recorded outcomes the chunk counts as being sent: a shard
            // handed over releases its lease only after (`pos::manager` drain), so the
            // next owner reads final marks, not `sending` ones it would send again.
            let _sending: Vec<_> = chunk.iter().map(TerminalLink::sending).collect();
            if self.serving.serving(shard, now()) != Some(walk.epoch) {
                return Err("the shard is no longer served with this epoch".into());
            }
            let since_ms = wall_ms();
            let marks = chunk
                .iter()
                .map(|l| (l.terminal.id.clone(), Mark::Sending { since_ms }))
                .collect();
            let kept = self.write(b, shard, walk, marks, Vec::new(), None).await?;
            let mut sends = Vec::with_capacity(chunk.len());
            for (link, kept) in chunk.iter().zip(kept) {
                match kept {
                    // Another copy's mark: its time bounds this one (the rule decides).
                    Some(Mark::Sending { since_ms }) => sends.push((link.clone(), since_ms, false)),
                    Some(_) => {}
                    None => sends.push((link.clone(), since_ms, true)),
                }
            }
            let epoch = walk.epoch;
            let copies: Vec<(String, WallMs, bool, Copy)> = futures::stream::iter(sends)
                .map(|(link, since, ours)| async move {
                    let id = link.terminal.id.clone();
                    let copy = self.copy(job, shard, epoch, link, since).await;
                    (id, since, ours, copy)
                })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            let mut finals = Vec::new();
            let mut unsent = Vec::new();
            for (terminal, since, ours, copy) in copies {
                match copy {
                    Copy::Final(mark) => finals.push((terminal, mark)),
                    Copy::NotSent if ours => unsent.push((terminal, since)),
                    Copy::NotSent | Copy::Unanswered => {
                        walk.marks
                            .insert(terminal, Mark::Sending { since_ms: since });
                    }
                }
            }
            self.write(b, shard, walk, finals, unsent, None).await?;
        }
        let progress = self.progress(walk, &selected);
        let stale = walk.written.as_ref().is_none_or(|(p, at)| {
            !same_counts(p, &progress)
                || wall_ms().saturating_sub(*at) >= PROGRESS_EVERY.as_millis() as u64
        });
        if stale {
            self.write(
                b,
                shard,
                walk,
                Vec::new(),
                Vec::new(),
                Some(progress.clone()),
            )
            .await?;
            walk.written = Some((progress, wall_ms()));
        }
        Ok(())
    }

    /// Writes marks (and progress) of `shard` under this pod's epoch; what it wrote is
    /// in `walk.marks` after. The kept marks of `Sending` requests are returned.
    async fn write(
        &self,
        b: &Broadcast,
        shard: ShardId,
        walk: &mut ShardWalk,
        marks: Vec<(String, Mark)>,
        unsent: Vec<(String, WallMs)>,
        progress: Option<ShardProgress>,
    ) -> Result<Vec<Option<Mark>>, String> {
        let w = MarkWrite {
            id: b.id.clone(),
            shard,
            pod: self.pod.clone(),
            epoch: walk.epoch,
            keep_until_ms: b.expires_ms.saturating_add(self.retention_ms),
            marks,
            unsent,
            progress,
        };
        match self.store.write_marks(&w).await {
            Ok(MarksWritten::Done { kept }) => {
                for ((terminal, mark), kept) in w.marks.into_iter().zip(&kept) {
                    walk.marks.insert(terminal, kept.unwrap_or(mark));
                }
                for (terminal, _) in w.unsent {
                    walk.marks.remove(&terminal);
                }
                Ok(kept)
            }
            Ok(MarksWritten::NotHolder) => Err("the store says another pod holds the shard".into()),
            Err(e) => Err(format!("writing marks failed: {e}")),
        }
    }

    fn progress(&self, walk: &ShardWalk, selected: &[TerminalLink]) -> ShardProgress {
        let mut p = ShardProgress {
            pod: self.pod.to_string(),
            epoch: walk.epoch,
            at_ms: wall_ms(),
            matched: selected.len() as u64,
            ..ShardProgress::default()
        };
        for link in selected {
            match walk.marks.get(&link.terminal.id) {
                Some(Mark::Delivered { duplicate }) => {
                    p.delivered += 1;
                    p.duplicates += u64::from(*duplicate);
                }
                Some(Mark::Rejected { .. }) => p.failed += 1,
                Some(Mark::Unknown) => p.unknown += 1,
                Some(Mark::Sending { .. }) | None => {
                    p.offline += u64::from(!link.connected());
                }
            }
        }
        p
    }

    /// One copy of the broadcast to `link`'s terminal, whose first unanswered copy (this
    /// one, if none before) left at `since`.
    async fn copy(
        &self,
        job: &Job<'_>,
        shard: ShardId,
        epoch: Epoch,
        mut link: TerminalLink,
        since: WallMs,
    ) -> Copy {
        let b = job.b;
        let count = |result: &'static str| {
            self.metrics
                .broadcast_copies
                .get_or_create(&[("result", result)])
                .inc()
        };
        let Ok(Some(mut sender)) = tokio::time::timeout(SESSION_WAIT, link.session(epoch)).await
        else {
            count("not_sent");
            return Copy::NotSent;
        };
        let pending = Pending {
            expires_ms: b.expires_ms,
            unanswered_since_ms: Some(since),
        };
        let wall = wall_ms();
        let bound = delivery::send_bound(&pending, wall, &self.rules);
        let verdict = delivery::check(&Moment {
            serving: self.serving.serving(shard, now()),
            session: epoch,
            left: bound,
            queued: Some((&pending, wall, &self.rules)),
        });
        if verdict != Verdict::Send {
            count("not_sent");
            return Copy::NotSent;
        }
        let key = terminal_key(&b.id);
        let wire = PosPush {
            terminal: &link.terminal.id,
            server_name: &link.terminal.server_name,
            path: &self.push_path,
            tenant: &b.tenant,
            key: &key,
            epoch,
            pod: &self.pod,
            content_type: job.content_type.as_ref(),
            body: job.body.clone(),
            queued: Some(Queued {
                accepted_ms: b.created_ms,
                expires_ms: b.expires_ms,
            }),
            trace: None,
        };
        match pos_push::send(&mut sender, wire, bound).await {
            Ok(Answered::Accepted { receipt, .. }) => {
                let duplicate = receipt == Receipt::Duplicate;
                count(if duplicate { "duplicate" } else { "taken" });
                Copy::Final(Mark::Delivered { duplicate })
            }
            Ok(Answered::Refused { status }) if not_taken(status) => {
                count("try_again");
                Copy::NotSent
            }
            Ok(Answered::Refused { status }) if try_later(status) => {
                count("try_again");
                Copy::Unanswered
            }
            Ok(Answered::Refused { status }) => {
                count("rejected");
                Copy::Final(Mark::Rejected {
                    status: status.as_u16(),
                })
            }
            Err(PushFailure::NotSent(_)) => {
                count("not_sent");
                Copy::NotSent
            }
            Err(PushFailure::StaleEpoch { highest }) => {
                count("stale_epoch");
                self.sessions.report_stale(StaleEpoch {
                    shard,
                    epoch,
                    highest,
                });
                Copy::NotSent
            }
            Err(PushFailure::Unknown(_)) => {
                count("unknown");
                Copy::Unanswered
            }
        }
    }
}

/// Walks this pod's shards for `b` each [`WALK_EVERY`] until it expired (and its copies
/// whose answers are missing are settled), or the push service is gone.
async fn walk(me: Weak<Broadcasts>, id: String) {
    let Some(this) = me.upgrade() else {
        return;
    };
    let b = match this.store.find(&id).await {
        Ok(Some(found)) => found.broadcast,
        // Gone (its keys expired), or unread: the next look tries again while it is listed.
        Ok(None) => {
            lock(&this.walking).remove(&id);
            return;
        }
        Err(e) => {
            debug!(%id, error = %e, "broadcast: reading it failed");
            lock(&this.walking).remove(&id);
            return;
        }
    };
    let job = this.job(&b).await;
    drop(this);
    if let Some(job) = job {
        let mut walks = HashMap::new();
        let settled = CLOCK_SKEW + COPY_TIMEOUT;
        // Past the expiry by the skew and a copy's timeout, every copy is settled.
        while wall_ms() < b.expires_ms.saturating_add(settled.as_millis() as u64) {
            let Some(this) = me.upgrade() else {
                return;
            };
            this.round(&job, &mut walks).await;
            drop(this);
            tokio::time::sleep(WALK_EVERY).await;
        }
    }
    if let Some(this) = me.upgrade() {
        lock(&this.walking).remove(&b.id);
    }
}

/// What every copy of one broadcast shares, read once per walk.
struct Job<'a> {
    b: &'a Broadcast,
    selector: Labels,
    scope: Scope,
    body: Bytes,
    content_type: Option<HeaderValue>,
}

/// Progress worth writing again: any count changed, or the owner.
fn same_counts(a: &ShardProgress, b: &ShardProgress) -> bool {
    ShardProgress {
        at_ms: 0,
        ..a.clone()
    } == ShardProgress {
        at_ms: 0,
        ..b.clone()
    }
}

/// What a retry with the same key must repeat: body, selector, patterns, content type.
fn digest(
    body: &[u8],
    selector: &Labels,
    patterns: &[String],
    content_type: &Option<String>,
) -> String {
    let mut hash = Sha256::new();
    hash.update(body);
    hash.update([0]);
    hash.update(selector.to_string().as_bytes());
    for part in patterns.iter().chain(content_type) {
        hash.update([0]);
        hash.update(part.as_bytes());
    }
    hex::encode(hash.finalize())
}

fn unavailable(e: crate::store::StoreError) -> Answer {
    Answer::error(
        ErrorCode::QueueUnavailable,
        format!("the broadcast could not be read or written now: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testing::member;
    use crate::store::memory::MemoryStore;

    fn new_broadcast(key: &str) -> NewBroadcast {
        NewBroadcast {
            tenant: Tenant("acme".into()),
            key: key.into(),
            selector: Labels::parse("store=17").unwrap(),
            scope: Scope::All,
            content_type: None,
            body: Bytes::from_static(b"menu"),
            ttl: Duration::from_secs(60),
        }
    }

    /// Created only while every member walks broadcasts: during a rolling upgrade from a
    /// release without them it is refused, never left for a pod that would not send it.
    #[tokio::test]
    async fn created_only_once_every_member_walks_them() {
        let old = member("pod-old");
        let mut new = member("pod-new");
        new.broadcast = BROADCAST_WALK;
        let (status, rx) = watch::channel(PodStatus {
            members: vec![old.clone(), new.clone()],
            ..PodStatus::default()
        });
        let broadcasts = Broadcasts::new(
            PodId::new("pod-new").unwrap(),
            Arc::new(MemoryStore::new()),
            ServingTable::new(8),
            Arc::new(super::super::NoTerminals),
            rx,
            BroadcastConfig::default(),
            QueueRules {
                window: Duration::from_secs(600),
                skew: CLOCK_SKEW,
                copy_timeout: COPY_TIMEOUT,
            },
            &super::super::queue::QueueConfig::default(),
            "/push".into(),
            Arc::new(Metrics::new()),
        );
        let refused = broadcasts.create(new_broadcast("k")).await.unwrap_err();
        assert_eq!(refused.error_code().as_deref(), Some("queue_unavailable"));
        status.send_modify(|s| s.members = vec![new.clone()]);
        let (created, fresh) = broadcasts.create(new_broadcast("k")).await.unwrap();
        assert!(fresh);
        let (again, fresh) = broadcasts.create(new_broadcast("k")).await.unwrap();
        assert_eq!((again.id, fresh), (created.id, false));
        let mut other = new_broadcast("k");
        other.body = Bytes::from_static(b"another menu");
        let refused = broadcasts.create(other).await.unwrap_err();
        assert_eq!(
            refused.error_code().as_deref(),
            Some("idempotency_conflict")
        );
    }
}
