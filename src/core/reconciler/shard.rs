//! The per-shard state a pod keeps, and every transition of it.
//!
//! A [`Shard`]'s fields are private: they change only through the transition methods
//! here, each of which asserts (in debug builds) the states it may be called in. This
//! module decides nothing: which transition to make, and when, is for the rules in
//! `super` (the reconciler), which see all shards and the cluster at once.

use std::time::Instant;

use crate::core::Epoch;

/// Where one shard stands for this pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardState {
    /// Not held by this pod (as far as it knows).
    Idle,
    /// Held and served until `deadline` (local monotonic time).
    Serving { epoch: Epoch, deadline: Instant },
    /// Held, but the local deadline passed during a cluster-wide store outage: the
    /// connections stay open, nothing is delivered, and the lease is reclaimed when the
    /// store returns.
    Suspended { epoch: Epoch },
    /// `StopServing` was emitted; waiting for the connections to close.
    Stopping { epoch: Epoch, then: AfterStop },
    /// Stopped; an owner-checked release is to be sent (`sent == false`) or in flight.
    Releasing { sent: bool },
}

/// What follows once a shard's connections are closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterStop {
    /// Delete the lease so the next owner can take it at once (rebalance, shutdown).
    Release,
    /// The lease is already lost or unreachable: just forget it.
    Forget,
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
        }
    }
}

/// Whether the store may hold a lease naming this pod that the shard's state does not
/// account for ("maybe ours", rule 6): an acquire was answered too late to serve on, or
/// its call failed while the shard was not held. Such a shard is claimed afresh or
/// released rather than forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stray {
    None,
    MaybeOurs,
}

/// How an acquire ended, as far as a lease it may have left in the store is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimEnd {
    /// Answered in time, and not served on (held by another pod, or the shard stopped
    /// meanwhile): nothing of ours is left.
    Answered,
    /// Answered too late to serve on: the lease may be ours until its TTL.
    Late,
    /// The call failed: it may or may not have taken effect.
    Failed,
    /// The store's generation had changed, so the call wrote nothing.
    Void,
}

/// One shard's local record. Its fields change only through the methods below.
#[derive(Clone, Debug)]
pub struct Shard {
    state: ShardState,
    /// When an acquire for this shard was sent, while it is in flight (a fresh claim when
    /// `Idle`, a reclaim when held).
    claim_sent: Option<Instant>,
    /// A held shard must be re-claimed with `SET NX` (new store generation, or the store
    /// came back after the local deadline passed).
    needs_reclaim: bool,
    /// An acquire's answer was lost, so the store may hold a lease naming us.
    maybe_ours: bool,
    /// The last time a fresh claim was sent, to pace retries against a current holder.
    last_claim: Option<Instant>,
}

impl Shard {
    pub fn new() -> Self {
        Shard {
            state: ShardState::Idle,
            claim_sent: None,
            needs_reclaim: false,
            maybe_ours: false,
            last_claim: None,
        }
    }

    // ----- queries -------------------------------------------------------------------

    /// The coarse public view.
    pub fn view(&self) -> ShardState {
        self.state
    }

    /// The epoch of a lease this pod still holds (serving or suspended).
    pub fn held_epoch(&self) -> Option<Epoch> {
        match self.state {
            ShardState::Serving { epoch, .. } | ShardState::Suspended { epoch } => Some(epoch),
            _ => None,
        }
    }

    /// A release is pending or in flight, or connections are closing before one.
    pub fn releasing(&self) -> bool {
        matches!(
            self.state,
            ShardState::Stopping {
                then: AfterStop::Release,
                ..
            } | ShardState::Releasing { .. }
        )
    }

    /// When the acquire in flight for this shard was sent, if one is.
    pub fn claim_sent(&self) -> Option<Instant> {
        self.claim_sent
    }

    /// Held, and kept by renewals (no re-claim due or in flight).
    pub fn renewable(&self) -> bool {
        self.held_epoch().is_some() && self.claim_sent.is_none() && !self.needs_reclaim
    }

    /// Held, and to be re-claimed now (none in flight).
    pub fn reclaim_due(&self) -> bool {
        self.needs_reclaim && self.held_epoch().is_some() && self.claim_sent.is_none()
    }

    /// Not held and no acquire in flight: whether a lease of ours may be stray.
    pub fn unheld(&self) -> Option<Stray> {
        if self.state != ShardState::Idle || self.claim_sent.is_some() {
            return None;
        }
        Some(if self.maybe_ours {
            Stray::MaybeOurs
        } else {
            Stray::None
        })
    }

    /// Stopped, and the release not sent yet.
    pub fn release_due(&self) -> bool {
        self.state == (ShardState::Releasing { sent: false })
    }

    /// When the last fresh claim was sent.
    pub fn last_claim(&self) -> Option<Instant> {
        self.last_claim
    }

    // ----- transitions ---------------------------------------------------------------

    /// An acquire is sent at `now`: a fresh claim of an unheld shard, or a due re-claim.
    pub fn send_claim(&mut self, now: Instant) {
        debug_assert!(self.unheld().is_some() || self.reclaim_due(), "{self:?}");
        self.claim_sent = Some(now);
        if self.state == ShardState::Idle {
            self.last_claim = Some(now);
        }
    }

    /// The acquire in flight ended without this pod serving on its answer.
    pub fn end_claim(&mut self, end: ClaimEnd) {
        debug_assert!(self.claim_sent.is_some(), "{self:?}");
        self.claim_sent = None;
        match end {
            ClaimEnd::Answered => self.maybe_ours = false,
            ClaimEnd::Late => self.maybe_ours = true,
            ClaimEnd::Failed if self.state == ShardState::Idle => self.maybe_ours = true,
            ClaimEnd::Failed | ClaimEnd::Void => {}
        }
    }

    /// The acquire in flight was answered in time with the lease: serve `epoch` until
    /// `deadline`.
    pub fn move_to_serving(&mut self, epoch: Epoch, deadline: Instant) {
        debug_assert!(self.claim_sent.is_some(), "{self:?}");
        self.claim_sent = None;
        self.maybe_ours = false;
        self.needs_reclaim = false;
        self.state = ShardState::Serving { epoch, deadline };
    }

    /// A renewal sent before `until` succeeded.
    pub fn extend_deadline(&mut self, until: Instant) {
        if let ShardState::Serving { epoch, deadline } = self.state {
            self.state = ShardState::Serving {
                epoch,
                deadline: deadline.max(until),
            };
        } else {
            debug_assert!(false, "{self:?}");
        }
    }

    /// The deadline passed in a cluster-wide outage: keep the connections, re-claim later.
    pub fn move_to_suspended(&mut self) {
        if let ShardState::Serving { epoch, .. } = self.state {
            self.state = ShardState::Suspended { epoch };
            self.needs_reclaim = true;
        } else {
            debug_assert!(false, "{self:?}");
        }
    }

    /// A renewal of a suspended shard succeeded in time: serve again until `deadline`.
    pub fn resume(&mut self, deadline: Instant) {
        if let ShardState::Suspended { epoch } = self.state {
            self.state = ShardState::Serving { epoch, deadline };
            self.needs_reclaim = false;
        } else {
            debug_assert!(false, "{self:?}");
        }
    }

    /// The held lease must be re-claimed with `SET NX`.
    pub fn reclaim_needed(&mut self) {
        debug_assert!(self.held_epoch().is_some(), "{self:?}");
        self.needs_reclaim = true;
    }

    /// Stop serving a held shard; `then` says what follows once its connections are
    /// closed. Returns the epoch it was served with.
    pub fn move_to_stopping(&mut self, then: AfterStop) -> Option<Epoch> {
        let epoch = self.held_epoch();
        debug_assert!(epoch.is_some(), "{self:?}");
        if let Some(epoch) = epoch {
            self.state = ShardState::Stopping { epoch, then };
            self.needs_reclaim = false;
        }
        epoch
    }

    /// The connections of a stopping shard are closed. (Ignored otherwise: the
    /// acknowledgement comes from outside.)
    pub fn serving_stopped(&mut self) {
        if let ShardState::Stopping { then, .. } = self.state {
            self.state = match then {
                AfterStop::Release => ShardState::Releasing { sent: false },
                AfterStop::Forget => ShardState::Idle,
            };
        }
    }

    /// Release a lease that is not served on: one that may be stray, or one answered
    /// in time to a claim the pod no longer wants.
    pub fn move_to_releasing(&mut self) {
        debug_assert!(
            self.unheld() == Some(Stray::MaybeOurs)
                || (self.state == ShardState::Idle && self.claim_sent.is_some()),
            "{self:?}"
        );
        self.claim_sent = None;
        self.maybe_ours = false;
        self.state = ShardState::Releasing { sent: false };
    }

    pub fn release_sent(&mut self) {
        debug_assert!(self.release_due(), "{self:?}");
        self.state = ShardState::Releasing { sent: true };
    }

    /// A release naming this shard was answered (or failed: the lease then expires by
    /// itself). Nothing of ours is left in the store.
    pub fn release_answered(&mut self) {
        self.maybe_ours = false;
        if self.state == (ShardState::Releasing { sent: true }) {
            self.state = ShardState::Idle;
        }
    }

    /// The store lost its data: no lease of ours can be left in it.
    pub fn forget_stray(&mut self) {
        self.maybe_ours = false;
    }
}
