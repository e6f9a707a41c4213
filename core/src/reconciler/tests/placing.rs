//! Following and writing the stored placement (rule 4, `placing.rs`).

use super::*;

#[test]
fn a_placement_written_by_another_pod_is_followed_at_once() {
    let (mut r, t) = serving_pod("a", &["a"]);
    let mine = r.placement().cloned().unwrap();
    // b wrote the placement for {a, b}; a has not even seen b in a snapshot before.
    let theirs = mine.next(&[pod("a"), pod("b")], 8);
    let mut snap = snapshot(&r, "g", &["a", "b"], vec![None; 8]);
    snap.placement = Some(theirs.clone());
    r.handle_snapshot(t, Ok(snap));
    let actions = drain(&mut r);
    assert!(
        places(&actions).is_empty(),
        "no write of its own: {actions:?}"
    );
    let lost: Vec<ShardId> = (0..8)
        .filter(|&s| theirs.assignment.owner(s) == Some(&pod("b")))
        .collect();
    assert!(!lost.is_empty());
    for s in lost {
        assert_rebalanced_away(&actions, s);
    }
}

#[test]
fn a_lost_placement_race_polls_and_follows_the_winner() {
    let (mut r, t) = serving_pod("a", &["a"]);
    let before = r.placement().cloned().unwrap();
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b"], vec![None; 8])));
    let t = t + cfg().debounce;
    r.handle_timeout(t);
    let actions = drain(&mut r);
    let written = places(&actions);
    assert_eq!(written.len(), 1, "{actions:?}");
    assert_eq!(written[0].0, Some(before.version));
    let attempt = written[0].1.clone();
    // Another pod's write landed first: nothing changes until the store is read again.
    r.handle_place(t, attempt.clone(), Ok(false));
    assert_eq!(r.placement(), Some(&before));
    assert!(drain(&mut r).contains(&Action::Poll));
    let winner = before.next(&[pod("a"), pod("b"), pod("c")], 8);
    let mut snap = snapshot(&r, "g", &["a", "b", "c"], vec![None; 8]);
    snap.placement = Some(winner.clone());
    r.handle_snapshot(t, Ok(snap));
    assert_eq!(r.placement(), Some(&winner));
    assert!(places(&drain(&mut r)).is_empty());
}

/// Leases of all 8 shards, epoch 7: `claimed` held by the pod the placement `r` follows
/// assigns them to, `released` by nobody, the rest by `a`.
fn leases(r: &Reconciler, claimed: &[ShardId], released: &[ShardId]) -> Vec<Option<Lease>> {
    (0..8)
        .map(|s| {
            let owner = if claimed.contains(&s) {
                r.assignment().owner(s).cloned()?
            } else if released.contains(&s) {
                return None;
            } else {
                pod("a")
            };
            Some(Lease { owner, epoch: 7 })
        })
        .collect()
}

#[test]
fn a_move_budget_spreads_a_scale_out_over_steps_written_by_the_stepper() {
    let (mut r, t) = serving_pod("a", &["a"]);
    r.cfg.max_moving_shards = 2;
    let before = r.placement().cloned().unwrap();
    let abc = ["a", "b", "c"];
    // b and c join while a serves all 8 shards.
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &abc, leases(&r, &[], &[]))));
    let t = t + cfg().debounce;
    r.handle_timeout(t);
    let first = places(&settle(&mut r, t))[0].1.clone();
    let moving: Vec<ShardId> = (0..8)
        .filter(|&s| first.assignment.owner(s) != Some(&pod("a")))
        .collect();
    assert_eq!(moving.len(), 2, "two slots: {first:?}");
    let waiting: Vec<ShardId> = (0..8).filter(|&s| r.waiting_for(s).is_some()).collect();
    assert!(!waiting.is_empty());
    assert!(waiting.iter().all(|s| !moving.contains(s)));
    assert_eq!(r.moves().elected, 2);
    // Polls while both are still leased by a, then released and not claimed yet: the
    // moves are not done, nothing more is written.
    for released in [&[][..], &moving] {
        r.handle_snapshot(t, Ok(snapshot(&r, "g", &abc, leases(&r, &[], released))));
        assert!(places(&drain(&mut r)).is_empty());
    }
    // b and c hold them: two slots are free, the stepper writes the next step.
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &abc, leases(&r, &moving, &[]))));
    let second = places(&settle(&mut r, t))[0].1.clone();
    assert_eq!(second.version, first.version + 1);
    assert_eq!(second.assignment.moved_from(&first.assignment), 2);
    // Done once every move completed: the target of the first placement.
    let target = crate::placement::rebalance(&before.assignment, first.assignment.pods(), 8);
    let mut claimed = moving.clone();
    while r.placement().unwrap().assignment != target {
        claimed = (0..8)
            .filter(|&s| r.assignment().owner(s) != Some(&pod("a")))
            .collect();
        r.handle_snapshot(t, Ok(snapshot(&r, "g", &abc, leases(&r, &claimed, &[]))));
        assert!(
            !places(&settle(&mut r, t)).is_empty(),
            "stuck at {:?}",
            r.placement()
        );
    }
    assert!((0..8).all(|s| r.waiting_for(s).is_none()));
    assert!(claimed.len() >= 4);
}

#[test]
fn only_the_stepper_writes_steps_and_a_departed_pods_shards_never_wait() {
    // b follows a's placement for {a, b}, then c joins: a is the stepper, b writes the
    // debounced change only.
    let (mut r, t) = serving_pod("b", &["a", "b"]);
    r.cfg.max_moving_shards = 1;
    let ab = r.placement().cloned().unwrap();
    let leases: Vec<Option<Lease>> = (0..8)
        .map(|s| {
            ab.assignment.owner(s).map(|p| Lease {
                owner: p.clone(),
                epoch: 7,
            })
        })
        .collect();
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b", "c"], leases.clone())));
    let t = t + cfg().debounce;
    r.handle_timeout(t);
    let step = places(&settle(&mut r, t))[0].1.clone();
    assert_eq!(step.assignment.moved_from(&ab.assignment), 1);
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b", "c"], vec![None; 8])));
    assert!(places(&drain(&mut r)).is_empty(), "b is not the stepper");
    // a is gone (killed, its leases not expired): all of its shards move in one write.
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["b", "c"], leases)));
    let t = t + cfg().debounce;
    r.handle_timeout(t);
    let after = places(&settle(&mut r, t))[0].1.clone();
    assert!((0..8).all(|s| after.assignment.owner(s) != Some(&pod("a"))));
}
