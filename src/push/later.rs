//! Accepting a push with a TTL (`?ttl_s=`): it is stored first (`crate::store::queue`),
//! then delivered by its owner's drain (`queue`), and the request waits for that until
//! its deadline: `200` when the terminal took it by then, `202` while it waits.
//!
//! The owner stores it and waits ([`PushService::deliver_later_here`]). An entry pod
//! forwards it like any push (`route`), the TTL and collapse key in the signed peer
//! request, and stores it itself ([`PushService::enqueue_at_entry`]) only when no owner
//! can take it: nobody serves the shard (a takeover), or the forward's outcome is
//! unknown. Storing is idempotent by key and body, so a push stored by the owner and
//! again by the entry is one push. Any pod may store; only the owner drains, and a
//! store by a pod that does not hold the shard wakes the owner's drain.
//!
//! A stored push answers what its record says ([`answer_of`]), the first request and
//! every retry with the same key alike, from the store, not a pod's memory.
//!
//! Not for: the drain (`queue`), or the checks of the request (`crate::http::push`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use sha2::{Digest, Sha256};

use super::answer::{Answer, Delivered, ErrorBody, ErrorCode, PushStatus};
use super::owner::{with_key, Owned};
use super::queue::{wall_ms, QUEUE_CAPABILITY};
use super::{PushRequest, PushService};
use crate::clock::now;
use crate::core::shard::shard_of;
use crate::core::ShardId;
use crate::credentials::Tenant;
use crate::store::queue::{
    charge_of, push_id, Enqueue, Enqueued, Found, QueueStore, Record, State,
};

/// What makes a push wait for its terminal: `?ttl_s=` and `?collapse_key=`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Later {
    pub ttl: Duration,
    pub collapse_key: Option<String>,
}

impl PushService {
    /// Whether this pod takes pushes with a TTL now: it keeps them, and so does every
    /// member of its last view. During a rolling upgrade from a release without the
    /// queue a push with a TTL is refused (`503 queue_unavailable`), never queued where
    /// its shard's owner would not drain it.
    pub fn queue_ready(&self) -> Result<(), &'static str> {
        if self.drains.is_none() {
            return Err("this pod keeps no pushes for later (no queue store)");
        }
        let status = self.status.borrow();
        if status.members.is_empty() {
            return Err("this pod has not seen the cluster's members yet");
        }
        if status.members.iter().any(|m| m.queue < QUEUE_CAPABILITY) {
            return Err(
                "not every pod of the cluster keeps pushes for later yet (a rolling upgrade)",
            );
        }
        Ok(())
    }

    /// The owner's part of a push with a TTL: stored, its drain woken, and the outcome
    /// waited for until `deadline`. `NotHere` when this pod does not serve the shard.
    pub(super) async fn deliver_later_here(
        &self,
        push: &PushRequest,
        later: &Later,
        deadline: Instant,
    ) -> Owned {
        let shard = shard_of(&push.terminal, self.shards);
        let Some(drains) = self.drains.as_ref() else {
            return Owned::Answer(queue_unavailable(
                push,
                "this pod keeps no pushes for later",
            ));
        };
        let link = match self.link_of(push, shard, deadline).await {
            Ok(link) => link,
            Err(owned) => return owned,
        };
        let e = self.enqueue_request(push, later, shard, false);
        // Watched before it is stored, so no change the drain makes is missed.
        let mut changes = drains.watch(&e.id, e.record.clone());
        let stored = self.enqueue(push, &e, deadline).await;
        // Whatever the answer: a failed call may still have stored it.
        drains.wake(shard, &push.terminal);
        let (mut latest, generation, position) = match stored {
            Ok(Stored::New {
                position,
                generation,
            }) => (e.record.clone(), generation, Some(position)),
            Ok(Stored::Before { record, generation }) => {
                if record.state.is_final() {
                    return Owned::Answer(answer_of(&record, Some(&generation), None, push, shard));
                }
                (*record, generation, None)
            }
            Err(answer) => return Owned::Answer(answer),
        };
        // The owner knows its terminal has no session coming soon: answer now.
        if !link.backing_off() {
            let final_state = changes.wait_for(|r| r.state.is_final());
            if let Ok(Ok(done)) = tokio::time::timeout_at(deadline.into(), final_state).await {
                latest = done.clone();
            }
        }
        let seen = changes.borrow().clone();
        if seen.rev > latest.rev {
            latest = seen;
        }
        Owned::Answer(answer_of(&latest, Some(&generation), position, push, shard))
    }

    /// An entry pod's part of a push with a TTL when no owner could take it: stored
    /// here (the terminal must be in the directory), answered at once.
    pub(super) async fn enqueue_at_entry(
        &self,
        push: &PushRequest,
        later: &Later,
        deadline: Instant,
    ) -> Answer {
        let shard = shard_of(&push.terminal, self.shards);
        let e = self.enqueue_request(push, later, shard, true);
        let stored = self.enqueue(push, &e, deadline).await;
        // This pod may hold the shard without serving it yet (the store then announces
        // nothing): its drain looks too, if it runs one.
        if let Some(drains) = &self.drains {
            drains.wake(shard, &push.terminal);
        }
        match stored {
            Ok(Stored::New {
                position,
                generation,
            }) => answer_of(&e.record, Some(&generation), Some(position), push, shard),
            Ok(Stored::Before { record, generation }) => {
                answer_of(&record, Some(&generation), None, push, shard)
            }
            Err(answer) => answer,
        }
    }

    fn enqueue_request(
        &self,
        push: &PushRequest,
        later: &Later,
        shard: ShardId,
        check_directory: bool,
    ) -> Enqueue {
        let settings = &self.settings.queue;
        let accepted_ms = wall_ms();
        let record = Record {
            tenant: push.tenant.0.clone(),
            terminal: push.terminal.clone(),
            key: push.key.clone(),
            rev: 1,
            accepted_ms,
            expires_ms: accepted_ms + later.ttl.as_millis() as u64,
            accepted_by: self.pod.to_string(),
            collapse_key: later.collapse_key.clone(),
            digest: hex::encode(Sha256::digest(&push.body)),
            bytes: charge_of(push.body.len() as u64),
            content_type: push
                .content_type
                .as_ref()
                .and_then(|c| c.to_str().ok())
                .map(str::to_string),
            copies: 0,
            state: State::Queued,
        };
        Enqueue {
            shard,
            id: push_id(&record.tenant, &record.terminal, &record.key),
            record,
            body: push.body.clone(),
            limits: settings.limits,
            check_directory,
            pod: self.pod.clone(),
        }
    }

    /// Stores `e`, counting the result; an error answer when it is not stored. Never
    /// once the request's `deadline` has passed: its caller has given up on this
    /// attempt and may have retried already; stored later (a pod frozen with the request
    /// in hand), after the store lost an earlier copy of the key, it would reach the
    /// terminal again when the terminal's window may be over. The deadline bounds that
    /// delay by `timeout_ms`, far inside any window.
    async fn enqueue(
        &self,
        push: &PushRequest,
        e: &Enqueue,
        deadline: Instant,
    ) -> Result<Stored, Answer> {
        let drains = self.drains.as_ref().expect("checked by the caller");
        if now() >= deadline {
            return Err(queue_unavailable(
                push,
                "the request's deadline passed before the push was stored; retry with the same idempotency key",
            ));
        }
        let enqueued = drains.store().enqueue(e).await;
        let result = match &enqueued {
            Ok(Enqueued::Accepted { .. }) => "accepted",
            Ok(Enqueued::Existing { .. }) => "existing",
            Ok(Enqueued::Conflict) => "conflict",
            Ok(Enqueued::Full(_)) => "full",
            Ok(Enqueued::UnknownTerminal) => "unknown_terminal",
            Err(_) => "error",
        };
        self.metrics
            .queue_enqueued
            .get_or_create(&[("result", result)])
            .inc();
        match enqueued {
            Ok(Enqueued::Accepted {
                position,
                replaced,
                generation,
            }) => {
                if let Some(replaced) = replaced {
                    tracing::debug!(terminal = %push.terminal, %replaced, by = %push.key, "queued push replaced by a newer one with its collapse key");
                    drains.counted_final(&State::Replaced {
                        at_ms: e.record.accepted_ms,
                        replaced_by: push.key.clone(),
                    });
                }
                Ok(Stored::New {
                    position,
                    generation,
                })
            }
            Ok(Enqueued::Existing { record, generation }) => {
                Ok(Stored::Before { record, generation })
            }
            Ok(Enqueued::Conflict) => Err(Answer::error_with(
                ErrorCode::IdempotencyConflict,
                with_key(push, "this key was used with another body"),
            )),
            Ok(Enqueued::Full(bound)) => {
                let mut body = with_key(
                    push,
                    &format!("the queue is at its bound on {}", bound.as_str()),
                );
                body.bound = Some(bound.as_str().to_string());
                Err(Answer::error_with(ErrorCode::QueueFull, body))
            }
            Ok(Enqueued::UnknownTerminal) => Err(Answer::error(
                ErrorCode::UnknownTerminal,
                "no such terminal in the directory",
            )),
            Err(e) => {
                tracing::debug!(error = %e, "a push with a TTL could not be stored");
                Err(queue_unavailable(
                    push,
                    "the push store did not answer; retry with the same idempotency key",
                ))
            }
        }
    }
}

/// What storing a push found.
enum Stored {
    New {
        position: u32,
        generation: String,
    },
    /// The key was stored before, with the same body.
    Before {
        record: Box<Record>,
        generation: String,
    },
}

fn queue_unavailable(push: &PushRequest, message: &str) -> Answer {
    Answer::error_with(ErrorCode::QueueUnavailable, with_key(push, message))
}

/// Where `record` stands, as the API says it.
pub fn status_of(record: &Record, generation: Option<&str>, position: Option<u32>) -> PushStatus {
    let mut status = PushStatus {
        accepted_ms: Some(record.accepted_ms),
        expires_ms: Some(record.expires_ms),
        generation: generation.map(str::to_string),
        collapse_key: record.collapse_key.clone(),
        copies: record.copies,
        position,
        ..PushStatus::bare(&record.terminal, &record.key, record.state.name())
    };
    match &record.state {
        State::Queued => {}
        State::Sending {
            since_ms,
            epoch,
            pod,
        } => {
            status.sent_ms = Some(*since_ms);
            status.epoch = Some(*epoch);
            status.pod = Some(pod.clone());
        }
        State::Delivered {
            at_ms,
            pod,
            epoch,
            pos_status,
            duplicate,
        } => {
            status.final_ms = Some(*at_ms);
            status.pod = Some(pod.clone());
            status.epoch = Some(*epoch);
            status.pos_status = Some(*pos_status);
            status.duplicate = Some(*duplicate);
        }
        State::Rejected {
            at_ms,
            pod,
            epoch,
            pos_status,
        } => {
            status.final_ms = Some(*at_ms);
            status.pod = Some(pod.clone());
            status.epoch = Some(*epoch);
            status.pos_status = Some(*pos_status);
        }
        State::Expired { at_ms } | State::Cancelled { at_ms } => status.final_ms = Some(*at_ms),
        State::Replaced { at_ms, replaced_by } => {
            status.final_ms = Some(*at_ms);
            status.replaced_by = Some(replaced_by.clone());
        }
        State::Unknown { at_ms, since_ms } => {
            status.final_ms = Some(*at_ms);
            status.sent_ms = Some(*since_ms);
        }
    }
    status
}

/// The answer a push with a TTL gets from its `record`: `202` while it waits; once
/// final, what a push without a TTL would have got (`200` delivered, `502` rejected,
/// `504` unknown), or `410 push_ended` (expired, replaced, cancelled).
pub fn answer_of(
    record: &Record,
    generation: Option<&str>,
    position: Option<u32>,
    push: &PushRequest,
    shard: ShardId,
) -> Answer {
    match &record.state {
        State::Queued | State::Sending { .. } => Answer::json(
            StatusCode::ACCEPTED,
            &status_of(record, generation, position),
        ),
        State::Delivered {
            pod,
            epoch,
            pos_status,
            duplicate,
            ..
        } => Answer::delivered(&Delivered {
            terminal: record.terminal.clone(),
            idempotency_key: record.key.clone(),
            pod: crate::core::PodId::new(pod.as_str())
                .unwrap_or_else(|_| crate::core::PodId::new("unknown").expect("valid")),
            shard,
            epoch: *epoch,
            pos_status: *pos_status,
            latency_ms: push.received.elapsed().as_millis() as u64,
            duplicate: *duplicate,
        }),
        State::Rejected { pos_status, .. } => {
            let mut body = with_key(push, "the terminal refused the push");
            body.pos_status = Some(*pos_status);
            Answer::error_with(ErrorCode::PosRejected, body)
        }
        State::Unknown { .. } => {
            let mut body = with_key(push, "a copy went out and its answer was lost, and the terminal's dedup window has passed since: it may have received the push");
            body.delivery = Some("unknown".into());
            Answer::error_with(ErrorCode::PosTimeout, body)
        }
        State::Expired { .. } | State::Replaced { .. } | State::Cancelled { .. } => {
            let state = record.state.name();
            let body = ErrorBody {
                message: format!("the push with this key ended {state} without delivery"),
                idempotency_key: Some(record.key.clone()),
                state: Some(state.to_string()),
                ..ErrorBody::default()
            };
            Answer::error_with(ErrorCode::PushEnded, body)
        }
    }
}

/// The body of a purge: what was cancelled and what was left on its way.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Purged {
    pub terminal: String,
    pub cancelled: Vec<String>,
    /// Keys of pushes a copy of which may be on its way (`sending`): not cancelled.
    pub in_flight: Vec<String>,
}

/// A page of the outcome feed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Feedback {
    /// Pushes that reached a final state, in the order they did.
    pub events: Vec<PushStatus>,
    /// Where the next read starts (`?cursor=`); the one asked for when nothing came.
    pub cursor: Option<String>,
    /// Outcomes after the cursor asked for were trimmed before they were read (the
    /// feed keeps the newest per tenant).
    pub gap: bool,
    /// The store lost its data since the cursor asked for: pushes accepted before and
    /// not reported yet are lost (their status lookups say `lost`).
    pub lost: bool,
    pub generation: Option<String>,
}

/// How often a long-polling feed read looks at the store for outcomes other pods
/// recorded (this pod's own wake it at once).
const FEED_POLL: Duration = Duration::from_millis(250);

impl PushService {
    fn queue_store(&self) -> Result<&Arc<dyn QueueStore>, Answer> {
        match &self.drains {
            Some(drains) => Ok(drains.store()),
            None => Err(Answer::error(
                ErrorCode::QueueUnavailable,
                "this pod keeps no pushes for later",
            )),
        }
    }

    /// `GET /v1/terminals/{id}/pushes/{key}`: where the push stands; `lost` when the
    /// caller names the generation it was accepted in and the store has another now.
    pub async fn push_status(
        &self,
        tenant: &Tenant,
        terminal: &str,
        key: &str,
        accepted_in: Option<&str>,
    ) -> Answer {
        let store = match self.queue_store() {
            Ok(store) => store,
            Err(answer) => return answer,
        };
        let found = match store.find(&tenant.0, terminal, key, wall_ms()).await {
            Ok(found) => found,
            Err(e) => return store_failed(&e),
        };
        let current = found.generation.as_deref();
        match found.record {
            Some(record) => Answer::json(StatusCode::OK, &status_of(&record, current, None)),
            None if accepted_in.is_some_and(|g| Some(g) != current) => {
                let lost = PushStatus {
                    generation: current.map(str::to_string),
                    ..PushStatus::bare(terminal, key, "lost")
                };
                Answer::json(StatusCode::OK, &lost)
            }
            None => Answer::error(
                ErrorCode::UnknownPush,
                "no push with this key to this terminal: never accepted with a TTL, or final and past the retention",
            ),
        }
    }

    /// `DELETE /v1/terminals/{id}/pushes/{key}`: cancels a queued push.
    pub async fn cancel(&self, tenant: &Tenant, terminal: &str, key: &str) -> Answer {
        let store = match self.queue_store() {
            Ok(store) => store,
            Err(answer) => return answer,
        };
        let shard = shard_of(terminal, self.shards);
        let retention = self.settings.queue.limits.retention_ms;
        let now = wall_ms();
        let cancelled = match store
            .cancel(shard, &tenant.0, terminal, key, now, retention)
            .await
        {
            Ok(cancelled) => cancelled,
            Err(e) => return store_failed(&e),
        };
        if !cancelled.cancelled.is_empty() {
            self.counted_cancels(cancelled.cancelled.len(), now);
            let status = PushStatus {
                final_ms: Some(now),
                ..PushStatus::bare(terminal, key, "cancelled")
            };
            return Answer::json(StatusCode::OK, &status);
        }
        if let Some(record) = cancelled.in_flight.first() {
            let body = ErrorBody {
                message:
                    "a copy of this push may be on its way to the terminal: it cannot be cancelled"
                        .into(),
                idempotency_key: Some(record.key.clone()),
                state: Some(record.state.name().into()),
                ..ErrorBody::default()
            };
            return Answer::error_with(ErrorCode::PushInFlight, body);
        }
        match store.find(&tenant.0, terminal, key, now).await {
            Ok(Found {
                record: Some(record),
                ..
            }) => {
                let state = record.state.name();
                let body = ErrorBody {
                    message: format!("the push already ended {state}"),
                    idempotency_key: Some(record.key.clone()),
                    state: Some(state.into()),
                    ..ErrorBody::default()
                };
                Answer::error_with(ErrorCode::PushEnded, body)
            }
            Ok(_) => Answer::error(
                ErrorCode::UnknownPush,
                "no push with this key to this terminal",
            ),
            Err(e) => store_failed(&e),
        }
    }

    /// `DELETE /v1/terminals/{id}/pushes`: cancels every queued push of the tenant to
    /// the terminal.
    pub async fn purge(&self, tenant: &Tenant, terminal: &str) -> Answer {
        let store = match self.queue_store() {
            Ok(store) => store,
            Err(answer) => return answer,
        };
        let shard = shard_of(terminal, self.shards);
        let retention = self.settings.queue.limits.retention_ms;
        let now = wall_ms();
        match store
            .purge(shard, &tenant.0, terminal, now, retention)
            .await
        {
            Ok(purged) => {
                self.counted_cancels(purged.cancelled.len(), now);
                Answer::json(
                    StatusCode::OK,
                    &Purged {
                        terminal: terminal.to_string(),
                        cancelled: purged.cancelled,
                        in_flight: purged.in_flight.into_iter().map(|r| r.key).collect(),
                    },
                )
            }
            Err(e) => store_failed(&e),
        }
    }

    fn counted_cancels(&self, n: usize, at_ms: u64) {
        if let Some(drains) = &self.drains {
            for _ in 0..n {
                drains.counted_final(&State::Cancelled { at_ms });
            }
        }
    }

    /// `GET /v1/feedback`: up to `limit` outcomes of `tenant` after `cursor`, waiting up
    /// to `wait` for the first.
    pub async fn feedback(
        &self,
        tenant: &Tenant,
        cursor: Option<&str>,
        limit: usize,
        wait: Duration,
    ) -> Answer {
        let store = match self.queue_store() {
            Ok(store) => store,
            Err(answer) => return answer,
        };
        let drains = self.drains.as_ref().expect("a store means drains");
        let (after, accepted_in) = match cursor.map(|c| c.split_once('.')) {
            None => (None, None),
            Some(Some((after, generation))) => (Some(after), Some(generation)),
            Some(None) => {
                return Answer::error(ErrorCode::InvalidRequest, "not a feed cursor");
            }
        };
        let until = now() + wait;
        let mut finals = drains.finals();
        loop {
            finals.borrow_and_update();
            let feed = match store.feed(&tenant.0, after, limit).await {
                Ok(feed) => feed,
                Err(crate::store::StoreError::Config(_)) => {
                    return Answer::error(ErrorCode::InvalidRequest, "not a feed cursor")
                }
                Err(e) => return store_failed(&e),
            };
            let generation = feed.generation.clone();
            let lost = accepted_in.is_some_and(|g| Some(g) != generation.as_deref());
            if lost {
                // Everything of the old generation is gone: start over in this one.
                return Box::pin(self.feedback(tenant, None, limit, Duration::ZERO))
                    .await
                    .with_lost();
            }
            if !feed.events.is_empty() || now() >= until {
                let gen = generation.as_deref();
                let cursor = feed
                    .events
                    .last()
                    .map(|(c, _)| c.as_str())
                    .or(after)
                    .and_then(|c| gen.map(|g| format!("{c}.{g}")));
                let events = feed
                    .events
                    .iter()
                    .map(|(_, r)| status_of(r, gen, None))
                    .collect();
                return Answer::json(
                    StatusCode::OK,
                    &Feedback {
                        events,
                        cursor,
                        gap: feed.gap,
                        lost: false,
                        generation,
                    },
                );
            }
            let pause = FEED_POLL.min(until.saturating_duration_since(now()));
            let _ = tokio::time::timeout(pause, finals.changed()).await;
        }
    }
}

impl Answer {
    /// A feed page marked `lost`.
    fn with_lost(self) -> Answer {
        match serde_json::from_slice::<Feedback>(&self.body) {
            Ok(feed) => Answer::json(self.status, &Feedback { lost: true, ..feed }),
            Err(_) => self,
        }
    }
}

fn store_failed(e: &crate::store::StoreError) -> Answer {
    tracing::debug!(error = %e, "a queue call failed");
    Answer::error(
        ErrorCode::QueueUnavailable,
        "the push store did not answer; try again",
    )
}
