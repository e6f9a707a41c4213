//! The placement algorithm: balance, fewest moves on a join or leave, movement targets
//! over 4 to 32 pods, order independence, and a golden rebalance.

use super::*;
use crate::testing::{loads, random_pods};

/// Balanced: every member holds floor or ceil of its share and every shard has a member.
fn assert_balanced(a: &Assignment, pods: &[PodId], shards: u32) {
    let mut sorted = pods.to_vec();
    sorted.sort();
    sorted.dedup();
    assert_eq!(a.pods(), &sorted[..]);
    let n = sorted.len();
    let (lo, hi) = (shards as usize / n, (shards as usize).div_ceil(n));
    let l = loads(a);
    assert!(l.iter().all(|&x| x == lo || x == hi), "loads {l:?}");
    assert_eq!(l.iter().sum::<usize>(), shards as usize);
}

/// The fewest moves any balanced table for `pods` can make from `prev`, computed
/// independently of `rebalance`: shards of departed pods, plus for each kept pod what it
/// holds beyond the largest quota it can get, with the spare slots given where they save
/// the most.
fn fewest_moves(prev: &Assignment, pods: &[PodId], shards: u32) -> usize {
    let n = pods.len();
    let (base, spare) = (shards as usize / n, shards as usize % n);
    let departed = (0..shards)
        .filter(|&s| prev.owner(s).is_none_or(|p| !pods.contains(p)))
        .count();
    let mut excess_at_base: Vec<usize> = pods
        .iter()
        .map(|p| prev.load_of(p).saturating_sub(base))
        .collect();
    excess_at_base.sort_unstable_by(|a, b| b.cmp(a));
    // A spare slot saves one move on a pod above base.
    let saved = excess_at_base
        .iter()
        .take(spare)
        .filter(|&&e| e > 0)
        .count();
    departed + excess_at_base.iter().sum::<usize>() - saved
}

#[test]
fn a_join_or_leave_moves_the_fewest_shards_a_balanced_table_can() {
    for n in 1..=40usize {
        for seed in 0..20u64 {
            let all = random_pods(1000 * n as u64 + seed, n + 1);
            let (old, joiner) = (&all[..n], &all[n]);
            let before = Placement::initial(old, 64);
            assert_balanced(&before.assignment, old, 64);

            let joined: Vec<PodId> = all.clone();
            let after = before.next(&joined, 64);
            assert_eq!(after.version, before.version + 1);
            assert_balanced(&after.assignment, &joined, 64);
            let moved = after.assignment.moved_from(&before.assignment);
            assert_eq!(
                moved,
                fewest_moves(&before.assignment, &joined, 64),
                "{n}+1"
            );
            // Only the joiner gains shards on a join.
            assert_eq!(moved, after.assignment.load_of(joiner), "{n}+1");

            if n > 1 {
                let leaver = &old[seed as usize % n];
                let rest: Vec<PodId> = old.iter().filter(|p| *p != leaver).cloned().collect();
                let after = before.next(&rest, 64);
                assert_balanced(&after.assignment, &rest, 64);
                let moved = after.assignment.moved_from(&before.assignment);
                assert_eq!(moved, fewest_moves(&before.assignment, &rest, 64), "{n}-1");
                assert!(moved >= before.assignment.load_of(leaver));
            }
        }
    }
}

/// The movement targets, as means over 4..=32 pods of the per-N ratio to the
/// ideal (`64 / (n + 1)` on a join, the leaver's load on a leave). The memoryless
/// `Assignment::compute` misses them (1.81x and 1.77x), which is why the placement exists.
#[test]
fn movement_over_4_to_32_pods_is_within_the_targets() {
    let (mut join_ratios, mut leave_ratios) = (Vec::new(), Vec::new());
    for n in 4..=32usize {
        let (mut join, mut join_ideal, mut leave, mut leave_ideal) = (0, 0.0, 0, 0);
        for seed in 0..40u64 {
            let all = random_pods(7000 * n as u64 + seed, n + 1);
            let old = &all[..n];
            // A cluster that reached n pods by a join from n - 1.
            let before = Placement::initial(&old[1..], 64).next(old, 64);
            join += before
                .next(&all, 64)
                .assignment
                .moved_from(&before.assignment);
            join_ideal += 64.0 / (n + 1) as f64;
            let leaver = &old[seed as usize % n];
            let rest: Vec<PodId> = old.iter().filter(|p| *p != leaver).cloned().collect();
            leave += before
                .next(&rest, 64)
                .assignment
                .moved_from(&before.assignment);
            leave_ideal += before.assignment.load_of(leaver);
        }
        join_ratios.push(join as f64 / join_ideal);
        leave_ratios.push(leave as f64 / leave_ideal as f64);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (j, l) = (mean(&join_ratios), mean(&leave_ratios));
    eprintln!("placement movement over 4..=32 pods: join {j:.3}x, leave {l:.3}x the ideal");
    assert!(
        j <= 1.35 && l <= 1.5,
        "join {j:.3}x, leave {l:.3}x the ideal"
    );
}

#[test]
fn an_unchanged_member_set_moves_nothing() {
    let pods = random_pods(5, 13);
    let p = Placement::initial(&pods, 64);
    let again = p.next(&pods, 64);
    assert_eq!(again.assignment, p.assignment);
    assert_eq!(again.version, 2);
}

#[test]
fn member_order_and_duplicates_do_not_matter() {
    let pods = random_pods(9, 10);
    let p = Placement::initial(&pods[..7], 64);
    let mut shuffled: Vec<PodId> = pods.iter().rev().cloned().collect();
    shuffled.extend(pods[2..4].iter().cloned());
    assert_eq!(p.next(&pods, 64), p.next(&shuffled, 64));
}

#[test]
fn from_nothing_or_to_nothing() {
    let pods = random_pods(11, 6);
    let empty = Assignment::compute(&[], 64);
    let a = rebalance(&empty, &pods, 64);
    assert_balanced(&a, &pods, 64);
    let none = rebalance(&a, &[], 64);
    assert!(none.pods().is_empty());
    assert_eq!(none.owner(0), None);
    // More pods than shards: 64 pods hold one each, the rest none.
    let many = random_pods(12, 80);
    let a = rebalance(&a, &many, 64);
    assert!(loads(&a).iter().all(|&l| l <= 1));
    assert_eq!(loads(&a).iter().sum::<usize>(), 64);
}

/// Pins the rebalance rules. If this fails, pods of a rolling upgrade would compute
/// different tables from the same stored one: bump `RING_VERSION`, then update the string.
#[test]
fn golden_rebalance() {
    let pods: Vec<PodId> = (0..6)
        .map(|i| PodId::new(format!("posgate-{i}")).unwrap())
        .collect();
    let before = Placement::initial(&pods[..5], 64);
    let joined = before.next(&pods, 64);
    let left = joined.next(&[&pods[..2], &pods[3..]].concat(), 64);
    let got = |a: &Assignment| -> String {
        (0..64)
            .map(|s| a.owner(s).unwrap().as_str().chars().last().unwrap())
            .collect()
    };
    assert_eq!(super::super::ring::RING_VERSION, "sticky-placement-v1");
    assert_eq!(
        got(&joined.assignment),
        "1222250055112330331143304042445512221032542340135103345405051441"
    );
    assert_eq!(
        got(&left.assignment),
        "1550050055113330331143304044445513541031541340135103345405051441"
    );
}

/// Shards placed on a live member that does not hold them (another pod does, or
/// nobody).
fn in_motion(placed: &Assignment, holders: &[Option<PodId>]) -> usize {
    (0..holders.len() as ShardId)
        .filter(|&s| holders[s as usize].as_ref() != placed.owner(s))
        .count()
}

/// Drives steps the way the cluster does: after each step one shard in motion is
/// released and claimed by its placed owner (the slowest possible progress), then the
/// next step is computed from the new holders.
fn settle(from: &Assignment, pods: &[PodId], shards: u32, budget: u32) -> (Assignment, usize) {
    let mut placed = from.clone();
    let mut holders: Vec<Option<PodId>> = (0..shards).map(|s| from.owner(s).cloned()).collect();
    for steps in 0..10 * shards as usize {
        let target = rebalance(&placed, pods, shards);
        let next = step(&placed, &target, |s| holders[s as usize].as_ref(), budget);
        placed = next.assignment;
        assert!(
            in_motion(&placed, &holders) <= budget as usize,
            "step {steps}"
        );
        if placed == target && in_motion(&placed, &holders) == 0 {
            return (placed, steps);
        }
        let moving = (0..shards).find(|&s| holders[s as usize].as_ref() != placed.owner(s));
        if let Some(s) = moving {
            holders[s as usize] = placed.owner(s).cloned();
        }
    }
    panic!("no settled placement");
}

#[test]
fn steps_keep_the_budget_and_settle_on_a_balanced_table() {
    for (n, added, shards, budget) in [
        (6, 3, 64, 4),
        (6, 1, 64, 1),
        (20, 5, 1024, 8),
        (3, 10, 64, 64),
    ] {
        let pods = random_pods(n as u64, n + added);
        let from = Assignment::compute(&pods[..n], shards);
        let (placed, steps) = settle(&from, &pods, shards, budget);
        assert_balanced(&placed, &pods, shards);
        // The budget spreads the fewest moves over steps; it adds none.
        let fewest = fewest_moves(&from, &pods, shards);
        assert!(placed.moved_from(&from) <= fewest + 1, "{n}+{added}");
        assert!(
            steps >= fewest / budget as usize,
            "{n}+{added}: {steps} steps"
        );
    }
}

#[test]
fn a_departed_pods_shards_move_at_once_whatever_the_budget() {
    let pods = random_pods(7, 6);
    let shards = 64;
    let from = Assignment::compute(&pods, shards);
    // Budget 1, already used by a shard in motion between two live pods; and pods[0]
    // is gone while still holding its leases (killed: they have not expired yet).
    let mut holders: Vec<Option<PodId>> = (0..shards).map(|s| from.owner(s).cloned()).collect();
    let busy = from.shards_of(&pods[1]).next().unwrap();
    holders[busy as usize] = Some(pods[2].clone());
    let live = &pods[1..];
    let target = rebalance(&from, live, shards);
    let next = step(&from, &target, |s| holders[s as usize].as_ref(), 1);
    for s in from.shards_of(&pods[0]) {
        assert_eq!(next.assignment.owner(s), target.owner(s), "shard {s}");
    }
    assert_eq!(next.admitted, 0);
    // The same for a fresh cluster: nothing is held, nothing is placed, all is placed.
    let none = Placement::none(shards).assignment;
    let first = Assignment::compute(&pods, shards);
    let next = step(&none, &first, |_| None, 1);
    assert_eq!(
        (next.assignment, next.admitted, next.waiting),
        (first, 0, 0)
    );
}

#[test]
fn planned_moves_start_on_every_gaining_pod() {
    let pods = random_pods(11, 9);
    let shards = 64;
    let from = Assignment::compute(&pods[..6], shards);
    let target = rebalance(&from, &pods, shards);
    let next = step(&from, &target, |s| from.owner(s), 3);
    assert_eq!(next.admitted, 3);
    assert!(next.waiting > 0);
    let gained: std::collections::BTreeSet<&PodId> = (0..shards)
        .filter(|&s| next.assignment.owner(s) != from.owner(s))
        .filter_map(|s| next.assignment.owner(s))
        .collect();
    assert_eq!(gained.len(), 3, "one move to each new pod");
}

#[test]
fn a_pod_that_never_claims_holds_up_at_most_the_budget() {
    let pods = random_pods(13, 7);
    let shards = 64;
    let from = Assignment::compute(&pods[..6], shards);
    let mut placed = from.clone();
    // Old owners release what the placement moves away; the new pod claims nothing.
    for _ in 0..20 {
        let holders: Vec<Option<PodId>> = (0..shards)
            .map(|s| {
                from.owner(s)
                    .filter(|&p| placed.owner(s) == Some(p))
                    .cloned()
            })
            .collect();
        let target = rebalance(&placed, &pods, shards);
        placed = step(&placed, &target, |s| holders[s as usize].as_ref(), 3).assignment;
    }
    assert_eq!(placed.moved_from(&from), 3);
}
