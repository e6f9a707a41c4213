//! Helpers shared by the unit tests of the core and of the modules built on it (stores,
//! peer signing): pod ids, members, pseudo-random pod sets. Compiled only for tests.

use super::membership::Member;
use super::ring::Assignment;
use super::types::PodId;

/// The pod id `name` (which must be a valid id).
pub fn pod(name: &str) -> PodId {
    PodId::new(name).unwrap()
}

/// A member `name` reachable at `http://<name>`, of protocol 2, closing whole shards
/// on a planned move (handover 0), writing placement steps under the move budget.
pub fn member(name: &str) -> Member {
    Member {
        pod: pod(name),
        url: format!("http://{name}"),
        version: "t".into(),
        ring_version: "t".into(),
        started_ms: 0,
        peer_protocol: 2,
        handover: 0,
        queue: 0,
        batch: 0,
        broadcast: 0,
        moves: crate::membership::MOVE_BUDGET,
        pod_lease: crate::membership::POD_LEASE,
    }
}

/// Deterministic pseudo-random pod ids (a fixed LCG; no `rand` so the ids never change).
pub fn random_pods(seed: u64, n: usize) -> Vec<PodId> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            PodId::new(format!("posgate-{:09x}-{:05x}", x >> 28, x & 0xfffff)).unwrap()
        })
        .collect()
}

/// Each member's shard count, in member order.
pub fn loads(a: &Assignment) -> Vec<usize> {
    a.pods().iter().map(|p| a.load_of(p)).collect()
}
