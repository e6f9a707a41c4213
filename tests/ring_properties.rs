//! Properties of `Assignment::compute` and of the stored placement over many member sets
//! and shard counts, through the public API only (what the reconciler and the simulation
//! rely on).

use posgate::core::placement::Placement;
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
/// times) through the stored placement. Each step is compared with its ideal:
/// shards/(N+1) on the surge, the old pod's load on its removal. The placement moves only
/// what balance requires, so the whole update moves no more than the ideal.
#[test]
fn rolling_update_moves_at_most_the_ideal() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut members = distinct_pods(&mut rng, 20);
    let (mut moved, mut ideal) = (0usize, 0.0f64);
    let mut current = Placement::initial(&members, 64);
    for _ in 0..20 {
        let mut new = pod(&mut rng);
        while members.contains(&new) {
            new = pod(&mut rng);
        }
        members.push(new);
        let surged = current.next(&members, 64);
        moved += current.assignment.moved_from(&surged.assignment);
        ideal += 64.0 / members.len() as f64;
        let old = members.remove(0);
        ideal += surged.assignment.load_of(&old) as f64;
        current = surged.next(&members, 64);
        moved += surged.assignment.moved_from(&current.assignment);
        assert_eq!(current.assignment.max_load(), 4);
    }
    let ratio = moved as f64 / ideal;
    eprintln!("rolling update: moved {moved} shards, {ratio:.2}x the ideal {ideal:.0}");
    assert!(
        ratio <= 1.0,
        "moved {moved} shards, {ratio:.2}x the ideal {ideal:.0}"
    );
}

/// Random histories of joins, leaves and crashes of several pods at once: after every
/// step the placement is balanced (floor or ceil of the fair share), covers exactly the
/// members, and moved nothing a balanced table could have kept where it was.
#[test]
fn placement_stays_balanced_and_sticky_over_random_histories() {
    let mut rng = StdRng::seed_from_u64(99);
    for history in 0..40 {
        let shards = [64, 7, 100][history % 3];
        let start = rng.random_range(1..=12);
        let mut members = distinct_pods(&mut rng, start);
        let mut current = Placement::initial(&members, shards);
        for _ in 0..30 {
            let before = members.clone();
            for _ in 0..rng.random_range(1..=3) {
                if members.len() > 1 && rng.random_bool(0.5) {
                    members.remove(rng.random_range(0..members.len()));
                } else {
                    let p = pod(&mut rng);
                    if !members.contains(&p) {
                        members.push(p);
                    }
                }
            }
            let next = current.next(&members, shards);
            let a = &next.assignment;
            let n = members.len();
            let (lo, hi) = (shards as usize / n, (shards as usize).div_ceil(n));
            for p in &members {
                assert!(
                    (lo..=hi).contains(&a.load_of(p)),
                    "{p} holds {}",
                    a.load_of(p)
                );
            }
            let mut sorted = members.clone();
            sorted.sort();
            assert_eq!(a.pods(), sorted.as_slice());
            // A shard moved only if its pod left or is above the largest quota it can have.
            for s in 0..shards {
                let (old, new) = (current.assignment.owner(s), a.owner(s));
                if old != new {
                    if let Some(old) = old.filter(|o| members.contains(o)) {
                        assert!(
                            current.assignment.load_of(old) > lo,
                            "shard {s} left {old} at {} (floor {lo}) after {before:?}",
                            current.assignment.load_of(old)
                        );
                    }
                }
            }
            current = next;
        }
    }
}
