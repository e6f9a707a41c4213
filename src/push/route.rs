//! Routing on the receiving pod: find the shard's owner from this pod's latest status,
//! deliver here or forward one hop, and retry what provably reached no terminal until
//! the caller's deadline.
//!
//! While a shard has no serving owner (handover, takeover after a crash) the push waits
//! for the next status change (a new lease shows up there), at most [`RESOLVE_PAUSE`]
//! between looks, so it goes out as soon as the new owner serves. A push whose outcome
//! is unknown is never retried here: the caller gets `504` and decides.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use tracing::debug;

use super::answer::{Answer, ErrorCode};
use super::forward::Forwarded;
use super::owner::{unavailable, with_key, Owned};
use super::{PushRequest, PushService};
use crate::clock::now;
use crate::core::route::{self, Miss, Target};
use crate::core::shard::shard_of;
use crate::core::{Epoch, PodId, ShardId};
use crate::metrics::{GaugeUnit, Metrics};
use crate::peer::PeerTarget;
use crate::pos::manager::Lookup;

/// Longest wait between two looks for an owner.
const RESOLVE_PAUSE: Duration = Duration::from_millis(100);

/// `GET /v1/terminals/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalView {
    pub terminal: String,
    pub shard: ShardId,
    pub owner_pod: Option<PodId>,
    pub epoch: Option<Epoch>,
    /// The owner holds a session with an accepted hello to the terminal.
    pub connected: bool,
}

impl PushService {
    /// Delivers `push` through whichever pod serves its shard, answering by `deadline`.
    /// Also says which path the answer took: `local`, `forwarded`, or `none` (no owner
    /// answered in time). A push with a TTL that no owner takes is stored here
    /// (`later`): when nobody serves its shard, when the forward's outcome is unknown
    /// (the owner may have stored it; storing is idempotent), and at the deadline.
    pub async fn push(&self, push: PushRequest, deadline: Instant) -> (Answer, &'static str) {
        let mut waiting = OwnerWait::new(&self.metrics);
        let shard = shard_of(&push.terminal, self.shards);
        let mut status = self.status.clone();
        loop {
            status.borrow_and_update();
            let target = self.target(shard);
            if let (Target::Nobody, Some(later)) = (&target, &push.later) {
                return (self.enqueue_at_entry(&push, later, deadline).await, "none");
            }
            let miss = match target {
                Target::Here => match self.deliver_at_owner(&push, deadline).await {
                    Owned::Answer(answer) => return (answer, "local"),
                    Owned::NotHere => {
                        debug!(shard, "shard left this pod; looking again");
                        Some(Miss::NotHere)
                    }
                },
                // Boxed: only a forward needs its state; inline, it would make every
                // push's future larger, and a local push's is copied whole into its box.
                Target::Peer(owner) => {
                    match Box::pin(self.forward.push(&owner, &push, deadline)).await {
                        Forwarded::Answer(answer) => return (answer, "forwarded"),
                        Forwarded::Moved => {
                            debug!(shard, peer = %owner.pod, "owner moved; looking again");
                            Some(Miss::Moved)
                        }
                        Forwarded::NotSent(why) => {
                            debug!(shard, peer = %owner.pod, %why, "owner unreachable; looking again");
                            Some(Miss::NotSent)
                        }
                        Forwarded::Unknown(why) => {
                            debug!(shard, peer = %owner.pod, %why, "forwarded push outcome unknown");
                            Some(Miss::Unknown)
                        }
                    }
                }
                Target::Nobody => None,
            };
            if miss.is_some_and(|m| !m.may_look_again()) {
                return (self.outcome_unknown(&push, deadline).await, "forwarded");
            }
            waiting.start();
            let until = deadline.min(now() + RESOLVE_PAUSE);
            if until >= deadline {
                if let Some(later) = &push.later {
                    return (self.enqueue_at_entry(&push, later, deadline).await, "none");
                }
                // Not enough time left for another look to help.
                tokio::time::sleep_until(deadline.into()).await;
                let answer =
                    unavailable(&push, "no pod serves the terminal's shard by the deadline");
                return (answer, "none");
            }
            let _ = tokio::time::timeout_at(until.into(), status.changed()).await;
        }
    }

    /// The answer for a push forwarded without an answer: the owner may have delivered
    /// it, so it is not sent again. A push with a TTL is stored here (idempotent by key
    /// and body, so the owner's copy and this one are one push); any other is `504` with
    /// `delivery: unknown`.
    pub(super) async fn outcome_unknown(&self, push: &PushRequest, deadline: Instant) -> Answer {
        if let Some(later) = &push.later {
            return self.enqueue_at_entry(push, later, deadline).await;
        }
        let mut body = with_key(push, "no answer from the owner pod; the terminal may have received the push: retry with the same idempotency key");
        body.delivery = Some("unknown".into());
        Answer::error_with(ErrorCode::PosTimeout, body)
    }

    /// The owner's part: a push now, or one with a TTL stored and waited for.
    pub(crate) async fn deliver_at_owner(&self, push: &PushRequest, deadline: Instant) -> Owned {
        match &push.later {
            None => self.deliver_here(push, deadline).await,
            Some(later) => self.deliver_later_here(push, later, deadline).await,
        }
    }

    /// Where to send a push for `shard` now ([`route::target`] on this pod's status),
    /// with the peer resolved to an address.
    pub(super) fn target(&self, shard: ShardId) -> Target<PeerTarget> {
        let serving_here = self.serving.serving(shard, now()).is_some();
        let status = self.status.borrow();
        let owner = status
            .shards
            .get(shard as usize)
            .and_then(|s| s.owner.as_ref());
        match route::target(&self.pod, serving_here, owner, &status.members) {
            Target::Here => Target::Here,
            Target::Peer(member) => Target::Peer(PeerTarget::from(member)),
            Target::Nobody => Target::Nobody,
        }
    }

    /// `GET /v1/terminals/{id}`: asks the owner when it is another pod.
    pub async fn terminal_view(&self, terminal: &str, timeout: Duration) -> Answer {
        let shard = shard_of(terminal, self.shards);
        match self.target(shard) {
            Target::Here => match self.terminal_here(terminal) {
                Owned::Answer(answer) => answer,
                Owned::NotHere => self.unowned_view(terminal, shard),
            },
            Target::Peer(owner) => match self.forward.terminal(&owner, terminal, timeout).await {
                Ok((status, body)) if status != StatusCode::MISDIRECTED_REQUEST => {
                    Answer { status, body }
                }
                Ok(_) => self.unowned_view(terminal, shard),
                Err(why) => {
                    debug!(shard, peer = %owner.pod, %why, "owner did not answer a terminal lookup");
                    Answer::error(
                        ErrorCode::TerminalUnavailable,
                        "the owner pod did not answer",
                    )
                }
            },
            Target::Nobody => self.unowned_view(terminal, shard),
        }
    }

    /// The terminal as this pod sees it, if it serves the terminal's shard.
    pub fn terminal_here(&self, terminal: &str) -> Owned {
        let shard = shard_of(terminal, self.shards);
        let Some(epoch) = self.serving.serving(shard, now()) else {
            return Owned::NotHere;
        };
        match self.sessions.lookup(shard, terminal) {
            Lookup::Unknown => Owned::Answer(Answer::error(
                ErrorCode::UnknownTerminal,
                "no such terminal in the directory",
            )),
            Lookup::NotServed => Owned::NotHere,
            found => {
                let connected = matches!(&found, Lookup::Found(link) if link.connected());
                Owned::Answer(json_answer(&TerminalView {
                    terminal: terminal.to_string(),
                    shard,
                    owner_pod: Some(self.pod.clone()),
                    epoch: Some(epoch),
                    connected,
                }))
            }
        }
    }

    /// No pod serves the shard right now: say who holds the lease, if anyone.
    fn unowned_view(&self, terminal: &str, shard: ShardId) -> Answer {
        let status = self.status.borrow();
        let entry = status.shards.get(shard as usize);
        json_answer(&TerminalView {
            terminal: terminal.to_string(),
            shard,
            owner_pod: entry.and_then(|s| s.owner.clone()),
            epoch: entry.and_then(|s| s.epoch),
            connected: false,
        })
    }
}

/// Counts a push as waiting for a serving owner from its first unsuccessful look until
/// it is answered (`posgate_pushes_waiting_for_owner`, `posgate_push_owner_wait_seconds`).
struct OwnerWait<'a> {
    metrics: &'a Metrics,
    since: Option<(Instant, GaugeUnit)>,
}

impl<'a> OwnerWait<'a> {
    fn new(metrics: &'a Metrics) -> Self {
        OwnerWait {
            metrics,
            since: None,
        }
    }

    fn start(&mut self) {
        if self.since.is_none() {
            let unit = GaugeUnit::hold(&self.metrics.pushes_waiting_for_owner);
            self.since = Some((Instant::now(), unit));
        }
    }
}

impl Drop for OwnerWait<'_> {
    fn drop(&mut self) {
        if let Some((since, _unit)) = &self.since {
            self.metrics
                .push_owner_wait
                .observe(since.elapsed().as_secs_f64());
        }
    }
}

fn json_answer<T: Serialize>(value: &T) -> Answer {
    Answer {
        status: StatusCode::OK,
        body: Bytes::from(serde_json::to_vec(value).expect("view serialises")),
    }
}
