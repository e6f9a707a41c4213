//! The reconciler: one pod's ownership state machine.
//!
//! It turns what the pod learns (store snapshots, lease results, peer answers, the
//! passing of time) into [`Action`]s: register, poll, acquire, renew, release, start,
//! suspend or stop serving a shard, ask the peers. It performs no IO and reads no clock;
//! every input carries `now`. The grammar follows quinn-proto: `handle_*(now, ..)` feeds
//! an input, [`Reconciler::poll_action`] drains what to do, [`Reconciler::poll_timeout`]
//! says when to call [`Reconciler::handle_timeout`] next.
//!
//! The rules it enforces (each is argued in `docs/design.md`):
//! 1. A shard is served only while its local deadline (`sent + serve_window`) lies ahead.
//! 2. Shards the placement no longer assigns to this pod are stopped and released **before**
//!    any newly assigned shard is claimed.
//! 3. A lost renewal stops serving at once when the store shows a newer owner (another
//!    pod's lease, or a missing key, with a higher epoch than the one held); so does a
//!    snapshot that shows a held shard leased to another pod with a higher epoch. A
//!    renewal that finds the lease missing or another pod's with an epoch *not above*
//!    ours means nobody acquired since we did and the store lost our lease: the shard
//!    is re-claimed and served until its deadline meanwhile.
//! 4. The pod follows the placement stored in the store; a membership change that is
//!    stable for `debounce` makes the pods write the next placement with a
//!    compare-and-set (`rules.rs`, placing).
//! 5. When the store generation changes (Redis restarted empty) or the store returns after
//!    the local deadlines passed, held shards are re-claimed with `SET NX` and nothing else
//!    is claimed or released until the generation is one member TTL old
//!    (`rules.rs`, recovery). A store that went back in time (a failover that lost acknowledged
//!    writes: a lower placement version or heartbeat count, a renewal that finds this
//!    pod's acquisition gone) is recovered from the same way: the shards it forgot are re-claimed, the
//!    placement is put back, and nothing else moves for one member TTL.
//! 6. When the store is unreachable, peers are asked whether they reach it: only when
//!    some answer and none does (a cluster-wide outage) are expiring shards suspended
//!    instead of given up.
//! 7. Epochs never go back: every claim carries the highest epoch this pod knows for the
//!    shard (its own, other pods' leases, what terminals reported), and the store grants
//!    above it; a terminal that refuses the held epoch as stale makes the pod ask the
//!    store to bump its lease above the terminal's epoch instead of dropping the shard.
//!
//! What it does not do: talk to Redis, dial terminals, or decide *which* pod should own a
//! shard (that is [`crate::placement`] and [`crate::ring`]).

mod inputs;
mod lifecycle;
mod rules;
mod shard;
mod store_view;
#[cfg(test)]
mod tests;
mod timers;
mod witness;

use std::collections::VecDeque;
use std::time::Instant;

pub use shard::{AfterStop, ShardState};
pub use store_view::Outage;

use self::lifecycle::Lifecycle;
use self::shard::Shard;
use self::store_view::StoreView;
use self::timers::{Debounce, Timer};
use self::witness::Witness;
use super::config::CoreConfig;
use super::lease::{Claim, Release, MAX_EPOCH};
use super::membership::{Lease, Member};
use super::placement::Placement;
use super::ring::Assignment;
use super::types::{Epoch, PodId, ShardId};

/// Something the driver must do. Store operations report back through the matching
/// `handle_*` method; serving changes are performed at once (and `StopServing` is
/// acknowledged with [`Reconciler::handle_serving_stopped`] once connections are closed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Register or refresh this pod's membership -> [`Reconciler::handle_heartbeat`].
    Heartbeat { generation: String },
    /// Read members and lease holders -> [`Reconciler::handle_snapshot`].
    Poll,
    /// `SET NX PX` these shards, each above its floor (a held one is bumped above it if
    /// the floor is higher than the store's epoch) -> [`Reconciler::handle_acquire`].
    Acquire {
        generation: String,
        claims: Vec<Claim>,
    },
    /// Owner-checked renewal of these shards -> [`Reconciler::handle_renew`].
    Renew {
        generation: String,
        shards: Vec<ShardId>,
    },
    /// Owner-checked delete of these leases, or handover to the pod each names ->
    /// [`Reconciler::handle_release`].
    Release { releases: Vec<Release> },
    /// Remove this pod's registration -> [`Reconciler::handle_deregister`].
    Deregister,
    /// Begin serving (or resume with a new epoch): dial the shard's terminals with `epoch`.
    StartServing { shard: ShardId, epoch: Epoch },
    /// Stop delivering on the shard but keep its connections (cluster-wide outage).
    SuspendServing { shard: ShardId, epoch: Epoch },
    /// Stop delivering and close the shard's connections (or, with [`Close::Drain`],
    /// keep them open without delivering), then acknowledge.
    StopServing(Stop),
    /// Ask these peers whether they reach the store -> [`Reconciler::handle_peer_report`].
    ProbePeers { peers: Vec<Member> },
    /// Store `placement` if the store's placement still has version `expected` (`None`:
    /// the store has none) -> [`Reconciler::handle_place`].
    Place {
        expected: Option<u64>,
        placement: Placement,
    },
}

/// One shard to stop serving: which, on which epoch, why, and what becomes of its
/// sessions. What [`Action::StopServing`] carries to the connection layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop {
    pub shard: ShardId,
    pub epoch: Epoch,
    pub reason: StopReason,
    pub close: Close,
}

/// Why a shard stops being served. Carried in `Action::StopServing` for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The ring assigns the shard to another pod.
    Rebalance,
    /// The local lease deadline passed without a successful renewal.
    Expired,
    /// A renewal found the lease missing in the store.
    Lost,
    /// Another pod holds the lease (found by a renewal or a reclaim).
    Stolen,
    /// A terminal answered a hello or push with a stale-epoch refusal.
    StaleEpoch,
    /// The store is unreachable from this pod only: it gives the shard up.
    Isolated,
    /// Graceful shutdown.
    Shutdown,
    /// This pod's clock jumped by more than a renew interval (the process was paused or
    /// starved): what happened meanwhile is unknown, so shards past their deadline are
    /// given up rather than held through an outage.
    Paused,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Rebalance => "rebalance",
            StopReason::Expired => "expired",
            StopReason::Lost => "lost",
            StopReason::Stolen => "stolen",
            StopReason::StaleEpoch => "stale_epoch",
            StopReason::Isolated => "isolated",
            StopReason::Shutdown => "shutdown",
            StopReason::Paused => "paused",
        }
    }
}

/// What becomes of a stopped shard's sessions. Either way nothing more is delivered on
/// them from the moment the action is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    /// Close them all before the lease is released or forgotten (the acknowledgement
    /// waits for it): the next owner may dial as soon as it holds the lease.
    Now,
    /// A planned move to pods that drain ([`crate::membership::HANDOVER_DRAIN`]):
    /// keep them open, dial nothing, and close each terminal when the new owner asks,
    /// right before it dials it (or when the drain budget runs out). Acknowledged once
    /// no push is being sent on them, so the lease is released with every answer final.
    Drain,
}

/// A store call failed or timed out; it may or may not have taken effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpFailed;

/// The result of a store operation as seen by the core.
pub type OpResult<T> = Result<T, OpFailed>;

/// What the peers said about the store, after a [`Action::ProbePeers`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerReport {
    /// Peers that answered at all.
    pub answered: usize,
    /// Peers that answered and reach the store.
    pub reaching: usize,
}

/// The planned moves this pod put in placement steps it wrote (see
/// [`crate::placement::step`]), as the seeds' group election reports its slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoveCounts {
    /// Admitted into a step the store accepted: each took a move slot.
    pub elected: u64,
    /// Left waiting for a slot by a step this pod wrote (counted once per step).
    pub skipped: u64,
    /// Admitted into a step whose write failed (another pod wrote first, or the store
    /// failed); the next step counts them again.
    pub failed: u64,
}

/// The store's placement as of the last snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stored {
    /// No snapshot yet.
    Unknown,
    /// The store has no placement (new cluster, or it lost its data).
    Absent,
    Version(u64),
}

/// One pod's ownership state machine. See the module docs.
pub struct Reconciler {
    cfg: CoreConfig,
    me: PodId,
    generation: Option<String>,
    /// While `now < hold_until`, nothing is claimed or released except re-claims.
    hold_until: Option<Instant>,
    /// The placement followed: the store's, or the one this pod wrote, or (after the store
    /// lost its data) the last one seen. Version 0 (no members) until one is known.
    placement: Placement,
    /// What the last snapshot said about the stored placement.
    stored: Stored,
    /// A placement write is out ([`Action::Place`] sent, not answered; one at a time),
    /// with the planned moves it admitted.
    placing: Option<u32>,
    /// The target of the followed placement (its version, and the balanced table for its
    /// members it steps toward under the move budget).
    target: Option<(u64, Assignment)>,
    /// Planned moves admitted, left waiting, and lost with a failed write.
    moves: MoveCounts,
    debounce: Debounce,
    members: Vec<Member>,
    /// What this pod saw the store acknowledge, to prove it went back in time.
    witness: Witness,
    /// Times the store was found to have gone back in time (see [`Reconciler::rollbacks`]).
    rollbacks: u64,
    /// Per shard, one record: its phase and claim history, lease, last holder and floor.
    shards: Vec<Shard>,
    heartbeat: Timer,
    poll: Timer,
    renew: Timer,
    probe: Timer,
    renew_sent: Option<(Instant, Vec<ShardId>)>,
    /// The latest `now` an input carried: a later one more than a renew interval ahead
    /// means this pod did not run meanwhile (see `StopReason::Paused`).
    last_seen: Option<Instant>,
    store: StoreView,
    lifecycle: Lifecycle,
    actions: VecDeque<Action>,
}

impl Reconciler {
    /// A pod that knows nothing yet; its first action is a poll. `cfg` must be valid.
    pub fn new(cfg: CoreConfig, me: PodId, now: Instant) -> Self {
        let shards = (0..cfg.shards).map(|_| Shard::new()).collect();
        Reconciler {
            witness: Witness::default(),
            rollbacks: 0,
            placement: Placement::none(cfg.shards),
            stored: Stored::Unknown,
            placing: None,
            target: None,
            moves: MoveCounts::default(),
            debounce: Debounce::default(),
            heartbeat: Timer::due_at(now),
            poll: Timer::due_at(now),
            renew: Timer::due_at(now),
            probe: Timer::due_at(now),
            cfg,
            me,
            generation: None,
            hold_until: None,
            members: Vec::new(),
            shards,
            renew_sent: None,
            last_seen: None,
            store: StoreView::new(),
            lifecycle: Lifecycle::new(),
            actions: VecDeque::new(),
        }
    }

    // ----- outputs -------------------------------------------------------------------

    /// The timers a pod that serves acts on: polls, heartbeats, renewals (what
    /// `fire_timers` sends), the serving deadlines, and the wake-up that tells a pause
    /// (woken at least every half renew interval, a longer gap means this pod did not
    /// run, never that it had nothing to do).
    fn serving_timers(&self, mut at: impl FnMut(Option<Instant>)) {
        at(self.poll.next());
        at(self.last_seen.map(|t| t + self.cfg.renew_interval / 2));
        if self.generation.is_some() {
            at(self.heartbeat.next());
        }
        if !self.renewable().is_empty() {
            at(self.renew.next());
        }
        for s in &self.shards {
            if let ShardState::Serving { deadline, .. } = s.view() {
                at(Some(deadline));
            }
        }
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Reconciler::handle_timeout`] must be called next (earlier calls are fine).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_finished() {
            return None;
        }
        let mut next: Option<Instant> = None;
        let mut at = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if let Some(started) = self.lifecycle.shutdown_started() {
            // Shutdown progresses on answers; its budget is a timer, and while the pod
            // places itself out (serving meanwhile) so are the ends of that wait and
            // the timers of serving. Only those: nothing else fires until the pod stops
            // (a debounce or hold passed meanwhile would wake it again and again).
            at(Some(started + self.cfg.shutdown_budget));
            if self.lifecycle.placing_out() {
                // Only the ends still ahead: one that passed while the placement write
                // is in flight would wake the pod for nothing, too.
                for end in [started + self.cfg.debounce, started + self.cfg.debounce * 2] {
                    at(Some(end).filter(|&t| self.last_seen.is_none_or(|seen| t > seen)));
                }
                self.serving_timers(at);
            }
            return next;
        }
        self.serving_timers(&mut at);
        if self.store.failing() {
            at(self.probe.next());
        }
        at(self.store.verdict_lapses_at(self.verdict_life()));
        let claims_allowed = self.claims_allowed();
        for (i, s) in self.shards.iter().enumerate() {
            let retry_pending = claims_allowed
                && s.unheld().is_some()
                && self.placement.assignment.owner(i as ShardId) == Some(&self.me);
            if retry_pending {
                at(s.last_claim().map(|t| t + self.cfg.renew_interval));
            }
        }
        if self
            .shards
            .iter()
            .any(|s| matches!(s.view(), ShardState::Suspended { .. }))
        {
            at(self.give_up_suspended_at());
        }
        // A settled membership change waits for the hold (its own timer), an answer, or
        // the store, not for the debounce: waking for it then would spin.
        let can_place = self.hold_until.is_none()
            && self.placing.is_none()
            && !self.store.failing()
            && self.stored != Stored::Unknown;
        if can_place {
            at(self.debounce.due(self.cfg.debounce));
        }
        at(self.hold_until);
        next
    }

    /// The epoch this pod serves `shard` with at `now`, if it serves it.
    pub fn serving(&self, shard: ShardId, now: Instant) -> Option<Epoch> {
        self.serve_until(shard)
            .filter(|&(_, until)| now < until)
            .map(|(epoch, _)| epoch)
    }

    /// The epoch this pod may deliver on `shard` with, and until when: a suspended shard
    /// while the cluster-wide verdict stands (nobody can acquire, so the held lease is
    /// still the newest: static stability); a served one until its lease deadline, or
    /// until the standing verdict lapses if that is later. A deadline passing under the
    /// verdict suspends the shard and holds it until that very lapse (rule 6), so the
    /// hold is announced at once: a reader of the serving table sees no gap between the
    /// deadline and the moment the driver wakes for it.
    pub fn serve_until(&self, shard: ShardId) -> Option<(Epoch, Instant)> {
        let verdict_lapse = self.store.verdict_lapses_at(self.verdict_life());
        match self.shards.get(shard as usize)?.view() {
            ShardState::Serving { epoch, deadline } => {
                Some((epoch, verdict_lapse.map_or(deadline, |t| t.max(deadline))))
            }
            ShardState::Suspended { epoch } => verdict_lapse.map(|until| (epoch, until)),
            _ => None,
        }
    }

    /// How long a cluster-wide verdict stands without a new probe saying so.
    pub(crate) fn verdict_life(&self) -> std::time::Duration {
        self.cfg.renew_interval * store_view::VERDICT_LIFE
    }

    /// Whether graceful shutdown completed (or ran out of budget).
    pub fn is_finished(&self) -> bool {
        self.lifecycle.finished()
    }

    pub fn pod(&self) -> &PodId {
        &self.me
    }
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }
    /// The assignment of the followed placement (see [`crate::placement`]).
    pub fn assignment(&self) -> &Assignment {
        &self.placement.assignment
    }
    /// The placement followed (see [`crate::placement`]), if any yet.
    pub fn placement(&self) -> Option<&Placement> {
        (self.placement.version > 0).then_some(&self.placement)
    }
    /// The pod `shard` goes to once a move slot is free, when the followed placement
    /// keeps it elsewhere for now (see [`crate::placement::step`]).
    pub fn waiting_for(&self, shard: ShardId) -> Option<&PodId> {
        let (version, target) = self.target.as_ref()?;
        let to = target.owner(shard)?;
        (*version == self.placement.version && self.placement.assignment.owner(shard) != Some(to))
            .then_some(to)
    }
    /// Planned moves this pod admitted into placement steps, left waiting, or lost.
    pub fn moves(&self) -> MoveCounts {
        self.moves
    }
    /// Live members from the last snapshot.
    pub fn members(&self) -> &[Member] {
        &self.members
    }
    /// `shard`'s lease as the last snapshot showed it.
    pub fn lease(&self, shard: ShardId) -> Option<&Lease> {
        self.shards.get(shard as usize)?.lease.as_ref()
    }
    /// The last pod other than this one seen holding `shard`'s lease while a member, if
    /// any: the pod a shard acquired now comes from (by then its lease is usually gone,
    /// released, and the pod itself may have left the members).
    pub fn last_holder(&self, shard: ShardId) -> Option<&Member> {
        self.shards.get(shard as usize)?.last_holder.as_ref()
    }
    /// The highest epoch this pod knows `shard` was handed out with (0: none).
    pub fn floor(&self, shard: ShardId) -> Epoch {
        self.shards.get(shard as usize).map_or(0, |s| s.floor)
    }
    /// Raises `shard`'s floor to `epoch` (beyond [`MAX_EPOCH`]: not an epoch a store
    /// handed out, ignored).
    pub(super) fn know_epoch(&mut self, shard: ShardId, epoch: Epoch) {
        if epoch <= MAX_EPOCH {
            let floor = &mut self.shards[shard as usize].floor;
            *floor = (*floor).max(epoch);
        }
    }
    /// How many times this pod found that the store went back in time: it lost writes
    /// it had acknowledged (a failover to a replica that had not received them).
    pub fn rollbacks(&self) -> u64 {
        self.rollbacks
    }
    /// Records the shard's holder `owner`, when it is another pod and a member, as the
    /// shard's last holder.
    pub(super) fn note_holder(&mut self, shard: ShardId, owner: &PodId) {
        if *owner == self.me {
            return;
        }
        if let Some(m) = self.members.iter().find(|m| m.pod == *owner) {
            self.shards[shard as usize].last_holder = Some(m.clone());
        }
    }
    pub fn shard_state(&self, shard: ShardId) -> Option<ShardState> {
        self.shards.get(shard as usize).map(Shard::view)
    }
    pub fn registered(&self) -> bool {
        self.lifecycle.registered()
    }
    /// True once registered with every assigned shard served; never reset.
    pub fn ready(&self) -> bool {
        self.lifecycle.ready()
    }
    /// This pod's judgement of the store failure it experiences, if the store fails.
    pub fn outage(&self) -> Option<Outage> {
        self.store.outage()
    }
    /// Whether the last store call succeeded.
    pub fn store_reachable(&self) -> bool {
        self.store.reachable()
    }
    /// When the store failure this pod experiences began (its first failed call), if
    /// the store fails.
    pub fn store_failing_since(&self) -> Option<Instant> {
        self.store.failing_since()
    }
    pub fn generation(&self) -> Option<&str> {
        self.generation.as_deref()
    }
    /// Whether new claims are on hold after a store generation change or a long outage.
    pub fn holding(&self, now: Instant) -> bool {
        self.hold_until(now).is_some()
    }
    /// When this pod learned the placement version it follows (the last placement
    /// change it saw); `None` before it follows one.
    pub fn placement_since(&self) -> Option<Instant> {
        self.witness.placement_since()
    }

    /// When the recovery hold in force at `now` ends, if one is.
    pub fn hold_until(&self, now: Instant) -> Option<Instant> {
        self.hold_until.filter(|&t| now < t)
    }
}
