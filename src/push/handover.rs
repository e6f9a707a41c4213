//! A shard's kept answers move with it: when this pod acquires a shard that another pod
//! held last, it asks that pod (signed, `peer::wire::KEPT_ANSWERS_ROUTE`) for the final answers it
//! keeps for the shard's terminals and takes them into its own idempotency cache, so a
//! caller's retry across a planned move is answered from the cache (`200`, replayed)
//! instead of reaching the terminal a second time.
//!
//! Why a pull by the new owner: it knows when it has the shard, and the old owner has
//! nothing in flight for it by then — a planned move closes the old owner's sessions, or
//! drains them once no push is being sent on them, before it releases the lease, so
//! every push it had for the shard has ended. Pushes for
//! the shard wait here (bounded by [`HANDOVER_TIMEOUT`] and their deadline) until the
//! answers are in, so the first retry after the move already finds them.
//!
//! What happens when it cannot: the old owner dead, unreachable, slow or of the previous
//! release (it answers `404`), or its answer refused as malformed — the shard is served
//! without its answers, and a retry reaches the terminal, which deduplicates it by key
//! (`docs/pos-protocol.md` §5): the answer is then `200` with `"duplicate": true`. The
//! same holds past the transfer's bound (`peer::wire::MAX_HANDED_OVER_BYTES`, the
//! newest keys first) and for a push that completed at the old owner after the answers were taken.
//! Each handover counts in `posgate_kept_answers_handoffs_total{outcome}`.
//!
//! Not for: the cache's rules (`idempotency`), or the transport (`crate::peer`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::answer::Answer;
use super::idempotency::Kept;
use super::PushService;
use crate::clock::now;
use crate::core::membership::Member;
use crate::core::reconciler::Stop;
use crate::core::shard::shard_of;
use crate::core::{Epoch, ShardId};
use crate::credentials::Tenant;
use crate::peer::wire::{HandedOver, KeptAnswer};
use crate::peer::{PeerError, PeerTarget};
use crate::serving::ServingHook;

/// How long the new owner waits for the old owner's answers (and pushes for the shard
/// wait for them).
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a pod that shut down keeps answering peers when it kept answers, so the new
/// owners of its shards can take them over: their fetch's timeout, plus its travel.
pub const HANDOVER_LINGER: Duration = Duration::from_millis(1_500);
/// Most keys one pod hands over for one shard (before the byte bound).
const MAX_HANDED_OVER_KEYS: usize = 20_000;

/// Shards whose kept answers are being fetched now, with how many fetches each.
pub(super) type Fetching = HashMap<ShardId, usize>;

/// A shard acquired from `from`.
#[derive(Debug)]
pub struct Takeover {
    shard: ShardId,
    from: PeerTarget,
}

/// The serving hook that starts a handover for every shard taken over. See the module
/// docs.
pub struct HandoverHook {
    takeovers: mpsc::UnboundedSender<Takeover>,
    fetching: watch::Sender<Fetching>,
}

/// The other end of a [`HandoverHook`], for [`PushService::with_takeovers`] and
/// [`PushService::run_takeovers`].
pub struct Takeovers {
    takeovers: mpsc::UnboundedReceiver<Takeover>,
    fetching: watch::Sender<Fetching>,
}

/// A hook and its other end.
pub fn channel() -> (HandoverHook, Takeovers) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (fetching, _) = watch::channel(Fetching::new());
    let hook = HandoverHook {
        takeovers: tx,
        fetching: fetching.clone(),
    };
    let takeovers = Takeovers {
        takeovers: rx,
        fetching,
    };
    (hook, takeovers)
}

impl ServingHook for HandoverHook {
    fn taken_over(&self, shard: ShardId, _epoch: Epoch, from: &Member) {
        // Marked before the driver's `start` returns, so no push slips past the wait.
        self.fetching
            .send_modify(|f| *f.entry(shard).or_default() += 1);
        let takeover = Takeover {
            shard,
            from: PeerTarget::from(from),
        };
        if self.takeovers.send(takeover).is_err() {
            // The pod is shutting down: nobody will fetch.
            end_fetch(&self.fetching, shard);
        }
    }

    fn stop(&self, _stop: Stop) -> impl std::future::Future<Output = ()> + Send + 'static {
        std::future::ready(())
    }
}

fn end_fetch(fetching: &watch::Sender<Fetching>, shard: ShardId) {
    fetching.send_modify(|f| {
        if let Some(n) = f.get_mut(&shard) {
            *n -= 1;
            if *n == 0 {
                f.remove(&shard);
            }
        }
    });
}

impl PushService {
    /// Pushes wait for the kept answers of shards `takeovers` fetches.
    pub fn with_takeovers(mut self, takeovers: &Takeovers) -> Self {
        self.fetching = takeovers.fetching.subscribe();
        self
    }

    /// Fetches the kept answers of every shard taken over, each in its own task, until
    /// the hook is dropped.
    pub async fn run_takeovers(self: Arc<Self>, mut takeovers: Takeovers) {
        while let Some(Takeover { shard, from }) = takeovers.takeovers.recv().await {
            let service = self.clone();
            let fetching = takeovers.fetching.clone();
            tokio::spawn(async move {
                service.take_over_answers(shard, &from).await;
                end_fetch(&fetching, shard);
            });
        }
    }

    /// Waits, until `until` at the latest, for the answers of `shard` to be in.
    pub(super) async fn kept_answers_in(&self, shard: ShardId, until: Instant) {
        // Every push passes here; almost none finds its shard being taken over.
        if !self.fetching.borrow().contains_key(&shard) {
            return;
        }
        let mut fetching = self.fetching.clone();
        let done = fetching.wait_for(|f| !f.contains_key(&shard));
        let _ = tokio::time::timeout_at(until.into(), done).await;
    }

    async fn take_over_answers(&self, shard: ShardId, from: &PeerTarget) {
        let outcome = match self.fetch_answers(shard, from).await {
            Ok(keys) => {
                let (offered, taken) = (keys.len(), self.cache.import(keys, now()));
                self.metrics.kept_answers_taken.inc_by(taken as u64);
                debug!(shard, from = %from.pod, offered, taken, "kept answers taken over");
                "taken"
            }
            Err(Failed::Unsupported) => {
                debug!(shard, from = %from.pod, "previous owner keeps no answers for others (older release)");
                "unsupported"
            }
            Err(Failed::Unreachable(why)) => {
                info!(shard, from = %from.pod, %why, "kept answers not taken over: retries reach the terminal, which dedupes them");
                "failed"
            }
            Err(Failed::Refused(why)) => {
                warn!(shard, from = %from.pod, %why, "kept answers refused");
                "refused"
            }
        };
        self.metrics
            .kept_answers_handovers
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    async fn fetch_answers(&self, shard: ShardId, from: &PeerTarget) -> Result<Vec<Kept>, Failed> {
        let asked = self
            .forward
            .peers()
            .kept_answers(from, shard, HANDOVER_TIMEOUT);
        let body = match asked.await {
            Ok(body) => body,
            Err(PeerError::Status { status: 404, .. }) => return Err(Failed::Unsupported),
            Err(e) => return Err(Failed::Unreachable(e.to_string())),
        };
        let handed = HandedOver::decode(&body, shard, |t| shard_of(t, self.shards))
            .map_err(Failed::Refused)?;
        if handed.truncated {
            info!(shard, from = %from.pod, kept = handed.keys.len(), "kept answers truncated at the transfer bound; older keys are left to the terminal's dedup");
        }
        Ok(handed.keys.into_iter().filter_map(kept_of).collect())
    }

    /// Whether this pod keeps no answer another pod could take over.
    pub fn kept_nothing(&self) -> bool {
        self.cache.is_empty()
    }

    /// This pod's kept answers for `shard`, newest first, encoded within the transfer's
    /// bounds ([`HandedOver::encode`]).
    pub fn kept_answers(&self, shard: ShardId) -> Vec<u8> {
        let kept = self.cache.export(
            |t| shard_of(t, self.shards) == shard,
            MAX_HANDED_OVER_KEYS,
            now(),
        );
        let capped = kept.len() == MAX_HANDED_OVER_KEYS;
        let keys = kept.into_iter().map(|k| KeptAnswer {
            tenant: k.tenant.0,
            terminal: k.terminal,
            key: k.key,
            digest: hex::encode(k.digest),
            status: k.answer.status.as_u16(),
            body: String::from_utf8_lossy(&k.answer.body).into_owned(),
            ttl_left_ms: k.ttl_left.as_millis() as u64,
        });
        HandedOver::encode(shard, keys, capped)
    }
}

/// Why a handover took nothing.
enum Failed {
    /// The old owner has no such endpoint (`404`: a pod of the previous release).
    Unsupported,
    Unreachable(String),
    /// Its answer did not decode or named keys of another shard.
    Refused(String),
}

/// A checked wire key as a cache entry (`HandedOver::decode` checked every field).
fn kept_of(k: KeptAnswer) -> Option<Kept> {
    let digest: [u8; 32] = hex::decode(&k.digest).ok()?.try_into().ok()?;
    Some(Kept {
        tenant: Tenant(k.tenant),
        terminal: k.terminal,
        key: k.key,
        digest,
        answer: Answer {
            status: StatusCode::from_u16(k.status).ok()?,
            body: Bytes::from(k.body),
        },
        ttl_left: Duration::from_millis(k.ttl_left_ms),
    })
}
