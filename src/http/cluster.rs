//! The cluster view: `GET /v1/cluster` (JSON), the internal per-shard terminal counts
//! peers answer, and the status page `GET /` that renders the view every second.
//!
//! `/v1/cluster` answers from this pod's latest status, plus connected and listed
//! terminal counts for the shards it serves and its timeline (the last minutes of
//! terminals connected, dials and pushes, `crate::metrics::timeline`) and its pushes
//! waiting for their terminals; with `?include=terminals` it also asks every other member
//! for theirs (signed, 500 ms each, in parallel), so one request shows the whole ring. A
//! member that does not answer leaves its shards' counts and its queue `null` and its
//! timeline out; one of an earlier release answers connected counts only, or no queue
//! (`null`, never 0). The view also says what this pod makes of the store
//! (`store.verdict`, and how long it has failed).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::future::join_all;
use serde::{Deserialize, Serialize};

use super::caller::Caller;
use super::errors::respond;
use super::HttpState;
use crate::clock::now;
use crate::core::{PodId, ShardId};
use crate::metrics::timeline::Point;
use crate::peer::{PeerTarget, QueueDepth, ShardTerminals};
use crate::push::broadcast::BroadcastStatus;
use crate::push::queue::wall_ms;
use crate::status::{ShardStatus, StoreStatus};

/// How long a peer gets to report its counts.
const PEER_COUNTS_TIMEOUT: Duration = Duration::from_millis(500);

#[derive(Serialize)]
struct ClusterView<'a> {
    pod: Option<&'a PodId>,
    store: StoreView,
    /// The placement the answering pod follows; `null` before it follows one.
    placement: Option<PlacementView>,
    members: Vec<MemberView<'a>>,
    shards: Vec<ShardView<'a>>,
    /// This pod's timeline and, with `include=terminals`, each peer's that sent one.
    timelines: Vec<PodTimeline>,
    /// The unexpired broadcasts and their progress, as the store holds them now (empty
    /// when it does not answer).
    broadcasts: Vec<BroadcastStatus>,
}

#[derive(Serialize)]
struct PodTimeline {
    pod: PodId,
    points: Vec<Point>,
}

/// The coordination store as the answering pod sees it.
#[derive(Serialize)]
struct StoreView {
    /// One of `crate::status::VERDICTS`.
    verdict: &'static str,
    /// Since the first failed call of the current failure; `null` while it answers.
    unreachable_ms: Option<u64>,
    /// How much longer the recovery hold lasts (no ownership changes but re-claims);
    /// `null` when there is none.
    recovery_hold_ms: Option<u64>,
}

#[derive(Serialize)]
struct PlacementView {
    version: u64,
    /// How long ago the answering pod learned this version (the last placement change
    /// it saw).
    changed_ms_ago: u64,
}

#[derive(Serialize)]
struct MemberView<'a> {
    pod: &'a PodId,
    url: &'a str,
    /// Pushes with a TTL waiting for the terminals of the shards the member serves;
    /// `null` unknown (it did not answer, keeps no pushes for later, or is of an earlier
    /// release).
    queue: Option<QueueDepth>,
}

#[derive(Serialize)]
struct ShardView<'a> {
    #[serde(flatten)]
    status: &'a ShardStatus,
    /// Connected terminals, as the pod serving the shard counts them; `null` unknown.
    terminals_connected: Option<usize>,
    /// Terminals of the shard's directory listing, as the pod serving the shard read
    /// it; `null` unknown.
    terminals_listed: Option<usize>,
}

/// The query of `GET /v1/cluster`: only `include=terminals`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClusterQuery {
    include: Option<Include>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Include {
    Terminals,
}

/// `GET /v1/cluster[?include=terminals]`.
pub(super) async fn cluster(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<ClusterQuery>,
) -> Response {
    if let Err(answer) = caller.operator() {
        return respond(answer);
    }
    let include_peers = query.include == Some(Include::Terminals);
    let mut answers = vec![own_counts(&state)];
    if include_peers {
        let peers: Vec<PeerTarget> = {
            let status = state.status.borrow();
            status
                .members
                .iter()
                .filter(|m| status.pod.as_ref() != Some(&m.pod))
                .map(PeerTarget::from)
                .collect()
        };
        let asks = peers
            .iter()
            .map(|peer| state.peers.shard_terminals(peer, PEER_COUNTS_TIMEOUT));
        answers.extend(join_all(asks).await.into_iter().flatten());
    }
    let mut connected: BTreeMap<ShardId, usize> = BTreeMap::new();
    let mut listed: BTreeMap<ShardId, usize> = BTreeMap::new();
    let mut timelines = Vec::new();
    let mut queues: BTreeMap<PodId, QueueDepth> = BTreeMap::new();
    for answer in answers {
        connected.extend(answer.shards);
        listed.extend(answer.listed);
        if let (Some(pod), Some(queue)) = (&answer.pod, answer.queue) {
            queues.insert(pod.clone(), queue);
        }
        if let (Some(pod), Some(points)) = (answer.pod, answer.timeline) {
            timelines.push(PodTimeline { pod, points });
        }
    }
    let broadcasts = match state.push.broadcasts() {
        Some(b) => b.running().await,
        None => Vec::new(),
    };
    let status = state.status.borrow();
    let view = ClusterView {
        pod: status.pod.as_ref(),
        store: StoreView {
            verdict: status.store.verdict(),
            unreachable_ms: matches!(status.store, StoreStatus::Unreachable { .. })
                .then(|| status.store.unreachable_for(now()).as_millis() as u64),
            recovery_hold_ms: status
                .recovery_hold
                .map(|until| until.saturating_duration_since(now()).as_millis() as u64),
        },
        placement: status.placement.map(|p| PlacementView {
            version: p.version,
            changed_ms_ago: now().saturating_duration_since(p.since).as_millis() as u64,
        }),
        members: status
            .members
            .iter()
            .map(|m| MemberView {
                pod: &m.pod,
                url: &m.url,
                queue: queues.get(&m.pod).copied(),
            })
            .collect(),
        shards: status
            .shards
            .iter()
            .map(|s| ShardView {
                status: s,
                terminals_connected: connected.get(&s.shard).copied(),
                terminals_listed: listed.get(&s.shard).copied(),
            })
            .collect(),
        timelines,
        broadcasts,
    };
    // Serialised while the borrow is held; nothing here awaits.
    Json(view).into_response()
}

/// `GET /internal/v1/shard-terminals`: connected and listed terminals per shard served
/// here, this pod's timeline and its queue.
pub(super) async fn shard_terminals(State(state): State<Arc<HttpState>>) -> Response {
    Json(own_counts(&state)).into_response()
}

/// What this pod tells about itself: its shards' counts, its timeline and what its
/// drains last read (the queue gauges' source).
fn own_counts(state: &HttpState) -> ShardTerminals {
    let counts = state.stats.shard_counts();
    let queue = state.push.drains().map(|drains| {
        let (seen, _) = drains.seen();
        QueueDepth {
            pushes: seen.pushes,
            oldest_ms_ago: seen.oldest_ms.map(|at| wall_ms().saturating_sub(at)),
        }
    });
    ShardTerminals {
        pod: state.status.borrow().pod.clone(),
        shards: counts.iter().map(|c| (c.shard, c.connected)).collect(),
        listed: counts
            .iter()
            .filter_map(|c| Some((c.shard, c.listed?)))
            .collect(),
        timeline: Some(state.metrics.timeline(now())),
        queue,
    }
}
