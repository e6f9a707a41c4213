//! Many pushes in one request: on the pod that received the batch, its pushes grouped
//! by the pod that serves their terminals, each group forwarded in **one** signed peer
//! request ([`PushService::push_batch`]); on an owner, the pushes of such a request
//! delivered at once, each as a single forward is ([`PushService::deliver_forwarded`]).
//! Every push of a batch is a push as one sent alone: its own idempotency key, deadline,
//! slot of `--max-inflight` and answer, so a batch fails or succeeds per push, and one slow terminal holds only
//! its own push.
//!
//! What a terminal sees is what it sees of single pushes: each push with its key and
//! the owner's epoch. When two pods disagree about a shard, the one the terminal fences
//! gets `409` for that push, which comes back as `421` and is routed again like a single
//! push; a group whose request got no answer is not sent again (its pushes may have
//! been delivered), each ending as a forwarded push without an answer does.
//!
//! Pods of the release before batches do not know the peer route; a member that does not
//! advertise it (`Member::batch`, `BATCH_PEER_ROUTE`) is sent the group's pushes one by
//! one.
//!
//! Not for: parsing a sender's batch (`crate::http::batch`) or the wire format
//! (`crate::peer::wire`).

use std::collections::HashMap;
use std::time::Instant;

use futures::future::join_all;

use super::answer::{Answer, ErrorCode};
use super::owner::Owned;
use super::{Forwarded, PushRequest, PushService};
use crate::core::route::Target;
use crate::core::shard::shard_of;
use crate::core::PodId;
use crate::peer::PeerTarget;

impl PushService {
    /// Delivers `pushes`, answering each by `deadline` (with the path it took, as
    /// [`PushService::push`] says). In the order given.
    pub async fn push_batch(
        &self,
        pushes: Vec<PushRequest>,
        deadline: Instant,
    ) -> Vec<(Answer, &'static str)> {
        // Grouped by the owner this pod sees now. Pushes for this pod's shards, for a
        // shard nobody serves, or for an owner without the batch route go alone: the
        // single push's path serves, waits or forwards them.
        let mut groups: HashMap<PodId, (PeerTarget, Vec<usize>)> = HashMap::new();
        let mut alone = Vec::new();
        for (i, push) in pushes.iter().enumerate() {
            match self.target(shard_of(&push.terminal, self.shards)) {
                Target::Peer(owner) if owner.batches => {
                    let group = groups
                        .entry(owner.pod.clone())
                        .or_insert((owner, Vec::new()));
                    group.1.push(i);
                }
                _ => alone.push(i),
            }
        }
        let pushes = &pushes;
        let alone = join_all(
            alone
                .into_iter()
                .map(|i| async move { vec![(i, self.push(pushes[i].clone(), deadline).await)] }),
        );
        let grouped = join_all(
            groups
                .into_values()
                .map(|(owner, group)| self.forward_group(owner, group, pushes, deadline)),
        );
        let (alone, grouped) = futures::join!(alone, grouped);
        let mut answers: Vec<Option<(Answer, &'static str)>> =
            (0..pushes.len()).map(|_| None).collect();
        for (i, answer) in alone.into_iter().chain(grouped).flatten() {
            answers[i] = Some(answer);
        }
        answers
            .into_iter()
            .map(|a| a.expect("every push of a batch is answered"))
            .collect()
    }

    /// One owner's group (`group`: indices into `pushes`) in one request. A push the
    /// owner no longer serves, or that never reached it, goes the single push's way; one
    /// without an answer ends as a forwarded push without one does.
    async fn forward_group(
        &self,
        owner: PeerTarget,
        group: Vec<usize>,
        pushes: &[PushRequest],
        deadline: Instant,
    ) -> Vec<(usize, (Answer, &'static str))> {
        let mine: Vec<&PushRequest> = group.iter().map(|&i| &pushes[i]).collect();
        let outcomes = self.forward.push_batch(&owner, &mine, deadline).await;
        let owner = &owner;
        let each = group
            .into_iter()
            .zip(outcomes)
            .map(|(i, outcome)| async move {
                let push = &pushes[i];
                let answer = match outcome {
                    Forwarded::Answer(answer) => (answer, "forwarded"),
                    Forwarded::Moved | Forwarded::NotSent(_) => {
                        self.push(push.clone(), deadline).await
                    }
                    Forwarded::Unknown(why) => {
                        tracing::debug!(peer = %owner.pod, %why, "batched push outcome unknown");
                        (self.outcome_unknown(push, deadline).await, "forwarded")
                    }
                };
                (i, answer)
            });
        join_all(each).await
    }

    /// The owner's part of a push forwarded by another pod, alone or in a batch:
    /// delivered (or stored) here with its own slot of `--max-inflight`, or `421` when
    /// this pod does not serve its shard.
    pub async fn deliver_forwarded(&self, push: &PushRequest, deadline: Instant) -> Answer {
        let _slot = match self.admit(&push.tenant) {
            Ok(slot) => slot,
            Err(full) => {
                let message = format!("the owner pod: {}", full.message());
                return Answer::error(ErrorCode::Overloaded, message);
            }
        };
        match self.deliver_at_owner(push, deadline).await {
            Owned::Answer(answer) => answer,
            Owned::NotHere => Answer::error(
                ErrorCode::ShardMoved,
                "this pod does not serve the terminal's shard",
            ),
        }
    }
}
