//! A store that lost writes or whose clock went back (a Redis failover, rules 3, 5 and 7):
//! epochs above every one known, a held lease bumped above a terminal's epoch, leases the
//! store forgot re-claimed instead of dropped, a placement it forgot put back.

use super::*;

/// The claims of the acquires among `actions`: (shard, floor).
fn claims(actions: &[Action]) -> Vec<(ShardId, Epoch)> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Acquire { claims, .. } => claims.iter().map(|c| (c.shard, c.floor)).collect(),
            _ => vec![],
        })
        .collect()
}

fn stops(actions: &[Action]) -> Vec<ShardId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::StopServing(stop) => Some(stop.shard),
            _ => None,
        })
        .collect()
}

/// `shards` renewed at `t` with `outcome` for `shard` and `Renewed` for the others.
fn renewed_but(
    r: &mut Reconciler,
    t: Instant,
    shards: &[ShardId],
    shard: ShardId,
    outcome: RenewOutcome,
) {
    let outcomes = shards
        .iter()
        .map(|&s| {
            if s == shard {
                outcome.clone()
            } else {
                RenewOutcome::Renewed
            }
        })
        .collect();
    r.handle_renew(t, shards, Ok(Checked::Ok(outcomes)));
}

#[test]
fn a_claim_carries_the_highest_epoch_the_pod_knows_for_the_shard() {
    let (mut r, t) = serving_pod("a", &["a"]);
    // b holds shard 2 with epoch 40 (seen in a snapshot); a terminal reported 90 for 5.
    let mut leases = vec![None; 8];
    leases[2] = Some(Lease {
        owner: pod("b"),
        epoch: 40,
    });
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b"], leases)));
    r.handle_stale_epoch(
        t,
        StaleEpoch {
            shard: 5,
            epoch: 7,
            highest: Some(90),
        },
    );
    assert_eq!((r.floor(2), r.floor(5), r.floor(0)), (40, 90, 7));
    // An absurd epoch (beyond what a store hands out exactly) is not a floor.
    r.handle_stale_epoch(
        t,
        StaleEpoch {
            shard: 0,
            epoch: 7,
            highest: Some(u64::MAX),
        },
    );
    assert_eq!(r.floor(0), 7);
    assert_eq!(claims(&drain(&mut r)), [(5, 90)]);
}

#[test]
fn a_stale_refusal_bumps_the_held_lease_above_the_terminals_epoch() {
    let (mut r, t) = serving_pod("a", &["a"]);
    let refused = StaleEpoch {
        shard: 3,
        epoch: 7,
        highest: Some(20),
    };
    r.handle_stale_epoch(t, refused);
    let actions = drain(&mut r);
    assert_eq!(claims(&actions), [(3, 20)], "{actions:?}");
    assert!(stops(&actions).is_empty(), "{actions:?}");
    // Delivery goes on meanwhile on the other terminals of the shard.
    assert_eq!(r.serving(3, t), Some(7));
    // The store still names a: it bumps the lease above the floor.
    r.handle_acquire(
        t,
        &[3],
        Ok(Checked::Ok(vec![AcquireOutcome::AlreadyMine { epoch: 21 }])),
    );
    assert_eq!(
        drain(&mut r),
        [Action::StartServing {
            shard: 3,
            epoch: 21
        }]
    );
    assert_eq!(r.serving(3, t), Some(21));
    // A refusal of the old epoch that arrives late changes nothing.
    r.handle_stale_epoch(t, refused);
    assert!(drain(&mut r).is_empty());
}

#[test]
fn a_stale_refusal_the_store_confirms_stops_the_shard() {
    let (mut r, t) = serving_pod("a", &["a"]);
    r.handle_stale_epoch(
        t,
        StaleEpoch {
            shard: 3,
            epoch: 7,
            highest: Some(20),
        },
    );
    drain(&mut r);
    r.handle_acquire(
        t,
        &[3],
        Ok(Checked::Ok(vec![AcquireOutcome::HeldBy {
            owner: pod("b"),
            epoch: 20,
        }])),
    );
    assert_eq!(stops(&drain(&mut r)), [3]);
    assert_eq!(r.serving(3, t), None);
}

#[test]
fn a_stale_refusal_while_the_store_fails_stops_the_shard() {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let t = t + Duration::from_secs(1);
    let shards = renewal_due(&mut r, t);
    r.handle_renew(t, &shards, Err(OpFailed));
    drain(&mut r);
    r.handle_stale_epoch(
        t,
        StaleEpoch {
            shard: shards[0],
            epoch: 7,
            highest: Some(20),
        },
    );
    let actions = drain(&mut r);
    assert_eq!(stops(&actions), [shards[0]], "{actions:?}");
    assert!(claims(&actions).is_empty());
}

#[test]
fn a_lease_the_store_lost_is_reclaimed_not_dropped() {
    for (store_epoch, went_back) in [(7, false), (3, true)] {
        let (mut r, t) = serving_pod("a", &["a"]);
        let t = t + Duration::from_secs(1);
        let shards = renewal_due(&mut r, t);
        let shard = shards[0];
        // Missing, and nobody acquired since a did: the key expired early or the store
        // lost it (with a's acquisition itself when its epoch is below a's).
        renewed_but(
            &mut r,
            t,
            &shards,
            shard,
            RenewOutcome::Missing { epoch: store_epoch },
        );
        let actions = drain(&mut r);
        assert!(stops(&actions).is_empty(), "{actions:?}");
        assert_eq!(claims(&actions), [(shard, 7)], "{actions:?}");
        assert_eq!(r.serving(shard, t), Some(7), "served until its deadline");
        assert_eq!(r.holding(t), went_back);
        assert_eq!(r.rollbacks(), u64::from(went_back));
        acquired(&mut r, t, &[shard], 8);
        assert_eq!(drain(&mut r), [Action::StartServing { shard, epoch: 8 }]);
    }
}

#[test]
fn an_older_lease_of_another_pod_blocks_the_reclaim_until_it_is_gone() {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let t = t + Duration::from_secs(1);
    let shards = renewal_due(&mut r, t);
    let shard = shards[0];
    // b's lease from before a acquired, kept by a store that lost a's acquisition.
    let ghost = || RenewOutcome::HeldBy {
        owner: pod("b"),
        epoch: 3,
    };
    renewed_but(&mut r, t, &shards, shard, ghost());
    let actions = drain(&mut r);
    assert!(stops(&actions).is_empty(), "{actions:?}");
    assert!(claims(&actions).is_empty(), "no claim that must fail");
    assert_eq!(r.serving(shard, t), Some(7));
    assert!(r.holding(t), "the store went back");
    // The next snapshot still shows it: claimed once more, blocked again.
    let mut leases = vec![None; 8];
    leases[shard as usize] = Some(Lease {
        owner: pod("b"),
        epoch: 3,
    });
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b"], leases)));
    assert_eq!(claims(&drain(&mut r)), [(shard, 7)]);
    let held = AcquireOutcome::HeldBy {
        owner: pod("b"),
        epoch: 3,
    };
    r.handle_acquire(t, &[shard], Ok(Checked::Ok(vec![held])));
    let actions = drain(&mut r);
    assert!(
        stops(&actions).is_empty() && claims(&actions).is_empty(),
        "{actions:?}"
    );
    // b released it: the re-claim wins, with an epoch above a's.
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b"], vec![None; 8])));
    assert_eq!(claims(&drain(&mut r)), [(shard, 7)]);
    acquired(&mut r, t, &[shard], 8);
    assert_eq!(drain(&mut r), [Action::StartServing { shard, epoch: 8 }]);
    // A newer owner, though, stops it as before (rule 3).
    let t = t + cfg().renew_interval;
    let shards = renewal_due(&mut r, t);
    renewed_but(
        &mut r,
        t,
        &shards,
        shard,
        RenewOutcome::HeldBy {
            owner: pod("b"),
            epoch: 9,
        },
    );
    assert_eq!(stops(&drain(&mut r)), [shard]);
}

#[test]
fn a_lease_of_ours_found_on_a_shard_given_to_another_pod_is_released_even_while_holding() {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let theirs = (0..8)
        .find(|&s| r.assignment().owner(s) != Some(&pod("a")))
        .expect("b has shards");
    // The store kept a lease of a's that a released (the release was lost with a
    // failover), and a holds new claims meanwhile.
    let t = t + Duration::from_secs(1);
    let shards = renewal_due(&mut r, t);
    renewed_but(
        &mut r,
        t,
        &shards,
        shards[0],
        RenewOutcome::Missing { epoch: 3 },
    );
    drain(&mut r);
    assert!(r.holding(t));
    let mut leases = vec![None; 8];
    leases[theirs as usize] = Some(Lease {
        owner: pod("a"),
        epoch: 5,
    });
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b"], leases)));
    let released: Vec<ShardId> = drain(&mut r)
        .iter()
        .flat_map(|a| match a {
            Action::Release { releases } => releases.iter().map(|r| r.shard).collect(),
            _ => vec![],
        })
        .collect();
    assert_eq!(released, [theirs]);
}

#[test]
fn a_placement_the_store_lost_is_put_back_unchanged() {
    let (mut r, t) = serving_pod("a", &["a"]);
    // The pod wrote version 5 (a few membership changes later).
    let ours = Placement {
        version: 5,
        ..r.placement().cloned().expect("a placement")
    };
    r.handle_place(t, ours.clone(), Ok(true));
    drain(&mut r);
    let older = Placement {
        version: ours.version - 1,
        assignment: Placement::initial(&[pod("a"), pod("b")], 8).assignment,
    };
    let stale = |r: &Reconciler| Snapshot {
        placement: Some(older.clone()),
        ..snapshot(r, "g", &["a", "b"], vec![None; 8])
    };
    // A snapshot sent before this pod learned its version proves nothing: adopted.
    let mut early = Reconciler::new(cfg(), pod("a"), t);
    early.handle_timeout(t);
    drain(&mut early);
    early.handle_snapshot(t, Ok(stale(&early)));
    assert_eq!(early.placement(), Some(&older));
    // One sent after: the store went back. Keep ours, write it back, move nothing.
    let t = t + cfg().poll_interval;
    r.handle_timeout(t);
    assert!(drain(&mut r).contains(&Action::Poll));
    r.handle_snapshot(t, Ok(stale(&r)));
    assert_eq!(r.placement(), Some(&ours));
    assert!(r.holding(t));
    let actions = drain(&mut r);
    assert_eq!(
        places(&actions),
        [(Some(older.version), &ours)],
        "{actions:?}"
    );
    assert!(stops(&actions).is_empty(), "{actions:?}");
}

/// A pod of `members` whose last heartbeat was answered with the count [`BEATS`] + 10;
/// then a poll one interval later, whose snapshot is `snap`: the actions taken on that
/// answer, and those of the debounce period after it.
fn after_a_failover_snapshot(
    members: &[&str],
    snap: impl Fn(&Reconciler) -> Snapshot,
) -> (Reconciler, Vec<Action>, Vec<Action>) {
    let (mut r, t) = serving_pod("a", members);
    drain(&mut r);
    r.handle_heartbeat(t, Ok(Checked::Ok(BEATS + 10)));
    let t = t + cfg().poll_interval;
    r.handle_timeout(t);
    assert!(drain(&mut r).contains(&Action::Poll));
    let snap = snap(&r);
    r.handle_snapshot(t, Ok(snap));
    let at_once = drain(&mut r);
    let later = t + cfg().debounce * 2;
    r.handle_timeout(later);
    let mut actions = at_once.clone();
    actions.extend(drain(&mut r));
    (r, at_once, actions)
}

fn heartbeats(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Heartbeat { .. }))
        .count()
}

#[test]
fn registrations_a_failover_lost_move_no_shard() {
    // The promoted replica lacks b's last heartbeats (its registration expired there)
    // and some of a's: its count is below the one a was answered with.
    let (r, at_once, actions) = after_a_failover_snapshot(&["a", "b"], |r| Snapshot {
        heartbeats: BEATS + 7,
        ..snapshot(r, "g", &["a"], vec![None; 8])
    });
    assert_eq!(r.rollbacks(), 1);
    assert!(places(&actions).is_empty(), "{actions:?}");
    assert!(stops(&actions).is_empty(), "{actions:?}");
    assert_eq!(
        heartbeats(&at_once),
        1,
        "a registers again at once: {at_once:?}"
    );
    // The same member list from a store that lost nothing: b left, its shards move.
    let (r, _, actions) = after_a_failover_snapshot(&["a", "b"], |r| Snapshot {
        heartbeats: BEATS + 10,
        ..snapshot(r, "g", &["a"], vec![None; 8])
    });
    assert_eq!(r.rollbacks(), 0);
    assert_eq!(places(&actions).len(), 1, "{actions:?}");
}

#[test]
fn a_pod_whose_registration_vanished_registers_again_at_once() {
    // The count did not go back (no proof of a loss), but a is missing from the list.
    let (r, at_once, _) = after_a_failover_snapshot(&["a", "b"], |r| Snapshot {
        heartbeats: BEATS + 10,
        ..snapshot(r, "g", &["b"], vec![None; 8])
    });
    assert!(!r.registered());
    assert!(r.ready(), "readiness is never withdrawn");
    assert_eq!(heartbeats(&at_once), 1, "{at_once:?}");
}
