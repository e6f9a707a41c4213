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
