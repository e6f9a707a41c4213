//! Helpers shared by the core's unit tests (compiled only for tests).

use super::ring::Assignment;
use super::types::PodId;

/// Deterministic pseudo-random pod ids (a fixed LCG; no `rand` so the ids never change).
pub(crate) fn random_pods(seed: u64, n: usize) -> Vec<PodId> {
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
pub(crate) fn loads(a: &Assignment) -> Vec<usize> {
    a.pods().iter().map(|p| a.load_of(p)).collect()
}
