//! Delivery on the owner: the pod that serves the terminal's shard sends the push over
//! its session, fenced by the shard's epoch, and turns the outcome into an answer.
//!
//! Order of checks, each one for a reason: the shard must be served here now (else the
//! caller must find the new owner: [`Owned::NotHere`]); the terminal must have a link
//! here (`404` otherwise) — every terminal of the shard's directory has one, and a shard
//! whose directory the store lost keeps its links, so a terminal this pod holds a live
//! session to is never answered `404`; the idempotency key is reserved (replay or
//! `409`); the push then waits, bounded by the deadline and a per-terminal cap, for a
//! session whose hello was accepted with the shard's current epoch; right before
//! sending, the delivery rule (`crate::core::delivery::check`, which the queue's drain
//! and the simulation call too) looks at the lease, the session's epoch and the time
//! left again, so nothing goes out past the lease deadline (for a shard held past it
//! through a cluster-wide store outage: past the verdict; such deliveries are counted
//! in `posgate_pushes_on_suspended_shards_total`). A refused
//! epoch drops the shard and sends the caller to the new owner (the push was not
//! processed); a connection that closed before the request left is waited out; a
//! request that may have left without an answer is `504` with `"delivery": "unknown"`
//! and is never re-sent here. A terminal's duplicate marker is a `200` with
//! `"duplicate": true` (and counted): the terminal has the push from an earlier copy of
//! the key.
//!
//! During a planned move, a terminal the new owner has not asked its predecessor for
//! yet has only the predecessor's (draining) session: once the key is reserved, the
//! push is relayed there (`relay`; the predecessor's side is `relay_here`), and waits
//! for this pod's own session only if nothing went out.
//!
//! Not for: finding the owner or forwarding (`route`), or parsing HTTP (`crate::http`).

use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;

use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use super::answer::{Answer, Delivered, ErrorBody, ErrorCode};
use super::idempotency::Reserve;
use super::{Forwarded, PushRequest, PushService};
use crate::clock::now;
use crate::core::delivery::{self, Moment, Verdict, MIN_SEND_BUDGET};
use crate::core::lease::StaleEpoch;
use crate::core::membership::Member;
use crate::core::shard::shard_of;
use crate::core::Epoch;
use crate::core::ShardId;
use crate::peer::PeerTarget;
use crate::pos::handover::RELEASE_TIMEOUT;
use crate::pos::manager::{Lookup, TerminalLink};
use crate::pos::push::{self as pos_push, Answered, PushFailure};
use crate::pos::session::RequestSender;
use crate::pos::wire::{PosPush, Receipt};
use crate::serving::Grant;
use crate::store::directory::Terminal;

/// How often a push re-checks while the shard's terminal list loads.
const LOADING_POLL: Duration = Duration::from_millis(10);

/// The owner's outcome.
#[derive(Debug)]
pub enum Owned {
    /// The final answer for the caller.
    Answer(Answer),
    /// This pod does not serve the shard (any more): nothing was sent to the terminal.
    NotHere,
}

impl PushService {
    /// The link to `push`'s terminal once this pod serves its `shard` and knows the
    /// shard's terminals; `NotHere`, `unknown_terminal`, or `503` when the terminal list
    /// is still loading at `deadline`.
    pub(super) async fn link_of(
        &self,
        push: &PushRequest,
        shard: ShardId,
        deadline: Instant,
    ) -> Result<TerminalLink, Owned> {
        loop {
            if self.serving.serving(shard, now()).is_none() {
                return Err(Owned::NotHere);
            }
            match self.sessions.lookup(shard, &push.terminal) {
                Lookup::Found(link) => return Ok(link),
                Lookup::Unknown => {
                    return Err(Owned::Answer(Answer::error(
                        ErrorCode::UnknownTerminal,
                        "no such terminal in the directory",
                    )))
                }
                // `NotServed` while the table says served: the connection layer is
                // being told right now. Either way, wait a moment and look again.
                Lookup::Loading | Lookup::NotServed => {
                    if now() + LOADING_POLL >= deadline {
                        return Err(Owned::Answer(unavailable(push, "terminal list is loading")));
                    }
                    tokio::time::sleep(LOADING_POLL).await;
                }
            }
        }
    }

    /// Delivers `push` if this pod serves its shard, answering by `deadline`.
    pub async fn deliver_here(&self, push: &PushRequest, deadline: Instant) -> Owned {
        let shard = shard_of(&push.terminal, self.shards);
        let mut link = match self.link_of(push, shard, deadline).await {
            Ok(link) => link,
            Err(owned) => return owned,
        };
        // A shard just taken over: its kept answers may be on their way (`handover`).
        let until = deadline.checked_sub(MIN_SEND_BUDGET).unwrap_or(deadline);
        self.kept_answers_in(shard, until).await;
        let digest: [u8; 32] = Sha256::digest(&push.body).into();
        let reservation =
            match self
                .cache
                .reserve(&push.tenant, &push.terminal, &push.key, digest, now())
            {
                Reserve::Reserved(r) => r,
                Reserve::Replay(answer) => {
                    self.metrics.push_replays.inc();
                    return Owned::Answer(answer);
                }
                Reserve::Conflict(why) => {
                    return Owned::Answer(Answer::error_with(
                        ErrorCode::IdempotencyConflict,
                        with_key(push, why),
                    ))
                }
            };
        // A shard being taken over whose walk has not reached the terminal: its session
        // is still the predecessor's, and the push goes out there rather than wait for
        // the close and our dial.
        if let Some(from) = link.draining_at() {
            let from = from.clone();
            if let Some(relayed) = self.relay(push, &from, deadline).await {
                if relayed.status != StatusCode::GATEWAY_TIMEOUT {
                    reservation.complete(&relayed);
                }
                return Owned::Answer(relayed);
            }
        }
        loop {
            let Some(epoch) = self.serving.serving(shard, now()) else {
                return Owned::NotHere;
            };
            // Counted as waiting (which makes the terminal's next dial urgent) only until a
            // session is there: a push being sent no longer waits.
            let Some(waiting) = link.wait(self.settings.max_waiting_per_terminal) else {
                return Owned::Answer(Answer::error_with(
                    ErrorCode::Overloaded,
                    with_key(push, "too many pushes waiting for this terminal"),
                ));
            };
            let session = tokio::time::timeout_at(deadline.into(), link.session(epoch)).await;
            drop(waiting);
            let mut sender = match session {
                Ok(Some(sender)) => sender,
                // The link is gone: shard stopped or terminal removed; look again.
                Ok(None) => return Owned::NotHere,
                Err(_) => {
                    return Owned::Answer(unavailable(
                        push,
                        "no session to the terminal by the deadline",
                    ))
                }
            };
            // Counted as being sent before the last check: a shard handed over releases
            // its lease only once no push passed that check (`pos::manager` drain).
            let _sending = link.sending();
            let grant = self.serving.grant(shard, now());
            let remaining = deadline.saturating_duration_since(now());
            let moment = Moment {
                serving: grant.map(Grant::epoch),
                session: epoch,
                left: remaining,
                queued: None,
            };
            match delivery::check(&moment) {
                Verdict::Send => {}
                Verdict::NotServed => return Owned::NotHere,
                // A new epoch: wait for the session to say hello with it.
                Verdict::StaleSession | Verdict::Queued(_) => continue,
                // Sent now, the terminal could take the push and its answer come back
                // too late: an unknown outcome, after which the caller's retry is
                // delivered again. Not sent, the answer is certain and the key free.
                Verdict::TooLate => {
                    return Owned::Answer(unavailable(
                        push,
                        "too little of the deadline left to send the push and hear the answer",
                    ))
                }
            }
            let grant = grant.expect("checked: served");
            let sent = self
                .send(push, (&link.terminal, &mut sender), epoch, remaining)
                .await;
            match sent {
                Ok(answered) => {
                    if let (Grant::Held(_), Answered::Accepted { .. }) = (grant, &answered) {
                        self.metrics.pushes_on_suspended.inc();
                    }
                    let answer = self.answer(push, shard, epoch, answered);
                    reservation.complete(&answer);
                    return Owned::Answer(answer);
                }
                Err(PushFailure::NotSent(why)) => {
                    debug!(shard, epoch, %why, "push not sent: connection closed; waiting for a new session");
                    // The link publishes the dead session until it notices; do not spin.
                    tokio::time::sleep(LOADING_POLL).await;
                }
                Err(PushFailure::StaleEpoch { highest }) => {
                    warn!(
                        shard,
                        epoch,
                        ?highest,
                        "terminal refused our epoch on a push: a newer epoch exists"
                    );
                    self.sessions.report_stale(StaleEpoch {
                        shard,
                        epoch,
                        highest,
                    });
                    return Owned::NotHere;
                }
                Err(PushFailure::Unknown(why)) => {
                    debug!(shard, epoch, %why, "push outcome unknown");
                    return Owned::Answer(unknown(push));
                }
            }
        }
    }

    /// Relays `push` through `from`, the shard's previous owner, which still holds the
    /// terminal's session as draining (`HANDOVER_RELAY`): its answer if the push may
    /// have reached the terminal there; `None` if it provably did not (the session is
    /// gone, the terminal fenced it, the predecessor is unreachable), and the push
    /// then waits for this pod's own session as any other. A predecessor that does not
    /// answer holds the push at most as long as the walk's own ask would wait for it.
    async fn relay(&self, push: &PushRequest, from: &Member, deadline: Instant) -> Option<Answer> {
        let bound = deadline.min(now() + RELEASE_TIMEOUT);
        let relayed = self
            .forward
            .relay(&PeerTarget::from(from), push, bound)
            .await;
        let (outcome, answer) = match relayed {
            // Delivered, refused by the terminal, or sent without an answer there.
            Forwarded::Answer(answer)
                if [
                    StatusCode::OK,
                    StatusCode::BAD_GATEWAY,
                    StatusCode::GATEWAY_TIMEOUT,
                ]
                .contains(&answer.status) =>
            {
                ("relayed", Some(answer))
            }
            Forwarded::Answer(_) | Forwarded::Moved | Forwarded::NotSent(_) => {
                ("not_relayed", None)
            }
            Forwarded::Unknown(why) => {
                debug!(from = %from.pod, %why, "relayed push: no answer from the predecessor");
                ("unknown", Some(unknown(push)))
            }
        };
        self.metrics
            .handover_relays
            .get_or_create(&[("outcome", outcome)])
            .inc();
        answer
    }

    /// Sends a push the shard's new owner relays on this pod's draining session of its
    /// terminal, if there still is one (the new owner has not asked for the terminal).
    /// [`Owned::NotHere`] (`421`) whenever nothing went out: no such session, too little
    /// of the deadline left, or the terminal fenced the session (it has seen the new
    /// owner's epoch). Nothing is reserved or kept here: the key is the new owner's.
    pub async fn relay_here(&self, push: &PushRequest, deadline: Instant) -> Owned {
        let shard = shard_of(&push.terminal, self.shards);
        let Some(mut session) = self.sessions.draining(shard, &push.terminal) else {
            return Owned::NotHere;
        };
        let remaining = deadline.saturating_duration_since(now());
        if remaining < MIN_SEND_BUDGET {
            return Owned::NotHere;
        }
        let epoch = session.epoch;
        let sent = self
            .send(
                push,
                (&session.terminal, &mut session.sender),
                epoch,
                remaining,
            )
            .await;
        match sent {
            Ok(answered) => Owned::Answer(self.answer(push, shard, epoch, answered)),
            Err(PushFailure::NotSent(_) | PushFailure::StaleEpoch { .. }) => Owned::NotHere,
            Err(PushFailure::Unknown(why)) => {
                debug!(shard, epoch, %why, "relayed push outcome unknown");
                Owned::Answer(unknown(push))
            }
        }
    }

    /// Sends `push` on `sender`, a session to `terminal` whose hello was accepted for
    /// `epoch`, waiting `remaining` for the answer; the span is the terminal hop.
    async fn send(
        &self,
        push: &PushRequest,
        (terminal, sender): (&Terminal, &mut RequestSender),
        epoch: Epoch,
        remaining: Duration,
    ) -> Result<Answered, PushFailure> {
        let hop = push.trace.context.as_ref().map(|c| c.child());
        let started = SystemTime::now();
        let wire = PosPush {
            terminal: &push.terminal,
            server_name: &terminal.server_name,
            path: &self.settings.push_path,
            tenant: &push.tenant.0,
            key: &push.key,
            epoch,
            pod: &self.pod,
            content_type: push.content_type.as_ref(),
            body: push.body.clone(),
            queued: None,
            trace: hop.as_ref(),
        };
        let sent = pos_push::send(sender, wire, remaining).await;
        self.telemetry()
            .record("terminal", SpanKind::Client, hop.as_ref(), started, || {
                let status = match &sent {
                    Ok(Answered::Accepted { status, .. } | Answered::Refused { status }) => {
                        i64::from(status.as_u16())
                    }
                    Err(_) => 0,
                };
                vec![
                    KeyValue::new("posgate.terminal", push.terminal.clone()),
                    KeyValue::new("posgate.epoch", epoch as i64),
                    KeyValue::new("http.response.status_code", status),
                ]
            });
        sent
    }

    /// The caller's answer for the terminal's `answered`, sent by this pod with `epoch`.
    fn answer(
        &self,
        push: &PushRequest,
        shard: ShardId,
        epoch: Epoch,
        answered: Answered,
    ) -> Answer {
        match answered {
            Answered::Accepted { status, receipt } => {
                let duplicate = receipt == Receipt::Duplicate;
                if duplicate {
                    // The terminal's dedup caught what no idempotency cache here did
                    // (another owner, a restart, an evicted entry).
                    self.metrics.push_duplicates.inc();
                }
                Answer::delivered(&Delivered {
                    terminal: push.terminal.clone(),
                    idempotency_key: push.key.clone(),
                    pod: self.pod.clone(),
                    shard,
                    epoch,
                    pos_status: status.as_u16(),
                    latency_ms: push.received.elapsed().as_millis() as u64,
                    duplicate,
                })
            }
            Answered::Refused { status } => {
                let mut body = with_key(push, "the terminal refused the push");
                body.pos_status = Some(status.as_u16());
                Answer::error_with(ErrorCode::PosRejected, body)
            }
        }
    }
}

/// The answer to a push that may have reached the terminal without its answer.
fn unknown(push: &PushRequest) -> Answer {
    let mut body = with_key(
        push,
        "no answer from the terminal; it may have received the push: retry with the same idempotency key",
    );
    body.delivery = Some("unknown".into());
    Answer::error_with(ErrorCode::PosTimeout, body)
}

/// An error body that tells the caller the key to retry with.
pub(super) fn with_key(push: &PushRequest, message: &str) -> ErrorBody {
    ErrorBody {
        message: message.to_string(),
        idempotency_key: Some(push.key.clone()),
        ..ErrorBody::default()
    }
}

pub(super) fn unavailable(push: &PushRequest, message: &str) -> Answer {
    Answer::error_with(ErrorCode::TerminalUnavailable, with_key(push, message))
}
