//! Properties of `Assignment::compute` over many member sets and shard counts, through the
//! public API only (what the reconciler and the simulation rely on).

use posgate::core::ring::Assignment;
use posgate::core::PodId;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn pod(rng: &mut StdRng) -> PodId {
    let suffix: String = (0..5)
        .map(|_| rng.random_range(b'a'..=b'z') as char)
        .collect();
    PodId::new(format!("posgate-5b7c9d8f4-{suffix}")).unwrap()
}

fn distinct_pods(rng: &mut StdRng, n: usize) -> Vec<PodId> {
    let mut pods: Vec<PodId> = Vec::with_capacity(n);
    while pods.len() < n {
        let p = pod(rng);
        if !pods.contains(&p) {
            pods.push(p);
        }
    }
    pods
}

#[test]
fn every_shard_once_cap_respected_and_order_free() {
    let mut rng = StdRng::seed_from_u64(42);
    for round in 0..300 {
        let n = rng.random_range(1..=100);
        let shards = [1, 7, 64, 100][round % 4];
        let pods = distinct_pods(&mut rng, n);
        let a = Assignment::compute(&pods, shards);

        let cap = (shards as usize).div_ceil(n);
        assert_eq!(a.max_load(), cap, "{n} pods, {shards} shards");
        let total: usize = pods.iter().map(|p| a.load_of(p)).sum();
        assert_eq!(total, shards as usize);
        for s in 0..shards {
            let owner = a.owner(s).expect("every shard has an owner");
            assert!(a.shards_of(owner).any(|x| x == s));
        }
        assert_eq!(a.owner(shards), None, "no owner beyond the shard count");

        let mut shuffled = pods.clone();
        shuffled.shuffle(&mut rng);
        shuffled.push(pods[rng.random_range(0..n)].clone());
        let b = Assignment::compute(&shuffled, shards);
        assert_eq!(a, b, "same member set, other order and a duplicate");
        assert_eq!(a.moved_from(&b), 0);
    }
}

/// A rolling update of a 20-pod Deployment (surge one new pod, then drop one old pod, 20
/// times). Each step is compared with its ideal: shards/(N+1) on the surge, the old pod's
/// load on its removal.
#[test]
fn rolling_update_moves_near_the_ideal() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut members = distinct_pods(&mut rng, 20);
    let (mut moved, mut ideal) = (0usize, 0.0f64);
    let mut current = Assignment::compute(&members, 64);
    for _ in 0..20 {
        let mut new = pod(&mut rng);
        while members.contains(&new) {
            new = pod(&mut rng);
        }
        members.push(new);
        let surged = Assignment::compute(&members, 64);
        moved += current.moved_from(&surged);
        ideal += 64.0 / members.len() as f64;
        let old = members.remove(0);
        ideal += surged.load_of(&old) as f64;
        current = Assignment::compute(&members, 64);
        moved += surged.moved_from(&current);
        assert_eq!(current.max_load(), 4);
    }
    let ratio = moved as f64 / ideal;
    assert!(
        ratio <= 1.5,
        "moved {moved} shards, {ratio:.2}x the ideal {ideal:.0}"
    );
}
