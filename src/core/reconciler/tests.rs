//! Rule-by-rule tests of the reconciler. Whole-cluster behaviour under faults is covered
//! by the simulation (`crate::sim`); these pin each rule in isolation.

use std::time::{Duration, Instant};

use super::*;
use crate::core::lease::{AcquireOutcome, Checked, RenewOutcome};
use crate::core::membership::{GenerationInfo, Lease, Member, Snapshot};
use crate::core::placement::Placement;

fn pod(name: &str) -> PodId {
    PodId::new(name).unwrap()
}

fn member(name: &str) -> Member {
    Member {
        pod: pod(name),
        url: format!("http://{name}"),
        version: "t".into(),
        ring_version: "t".into(),
        started_ms: 0,
    }
}

fn generation(id: &str, age: Duration) -> GenerationInfo {
    GenerationInfo { id: id.into(), age }
}

/// A snapshot of a store whose placement is the one `r` follows (what it wrote last).
fn snapshot(r: &Reconciler, gen: &str, members: &[&str], leases: Vec<Option<Lease>>) -> Snapshot {
    Snapshot {
        generation: generation(gen, Duration::from_secs(3600)),
        members: members.iter().map(|m| member(m)).collect(),
        leases,
        placement: r.placement().cloned(),
    }
}

fn cfg() -> CoreConfig {
    CoreConfig {
        shards: 8,
        ..CoreConfig::fast()
    }
}

fn drain(r: &mut Reconciler) -> Vec<Action> {
    std::iter::from_fn(|| r.poll_action()).collect()
}

/// Drains the actions, answering every placement write as stored at `now`; returns all
/// actions, the writes included.
fn settle(r: &mut Reconciler, now: Instant) -> Vec<Action> {
    let mut all = Vec::new();
    while let Some(action) = r.poll_action() {
        if let Action::Place { placement, .. } = &action {
            r.handle_place(now, placement.clone(), Ok(true));
        }
        all.push(action);
    }
    all
}

fn places(actions: &[Action]) -> Vec<(Option<u64>, &Placement)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Place {
                expected,
                placement,
            } => Some((*expected, placement)),
            _ => None,
        })
        .collect()
}

fn acquires(actions: &[Action]) -> Vec<ShardId> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Acquire { shards, .. } => shards.clone(),
            _ => vec![],
        })
        .collect()
}

fn releases(actions: &[Action]) -> Vec<ShardId> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Release { shards } => shards.clone(),
            other => panic!("expected only releases, got {other:?}"),
        })
        .collect()
}

/// A pod that has learned generation "g", sees `members`, and serves every shard the ring
/// gives it. Returns the reconciler and the current time.
fn serving_pod(me: &str, members: &[&str]) -> (Reconciler, Instant) {
    let t0 = Instant::now();
    let mut r = Reconciler::new(cfg(), pod(me), t0);
    r.handle_timeout(t0);
    assert_eq!(drain(&mut r), vec![Action::Poll]);
    r.handle_snapshot(t0, Ok(snapshot(&r, "g", members, vec![None; 8])));
    r.handle_heartbeat(t0, Ok(Checked::Ok(())));
    let t1 = t0 + cfg().debounce;
    r.handle_timeout(t1);
    let actions = settle(&mut r, t1);
    let mine = acquires(&actions);
    assert!(!mine.is_empty(), "{actions:?}");
    let outcomes = mine
        .iter()
        .map(|_| AcquireOutcome::Acquired { epoch: 7 })
        .collect();
    r.handle_acquire(t1, &mine, Ok(Checked::Ok(outcomes)));
    for s in &mine {
        assert_eq!(r.serving(*s, t1), Some(7));
    }
    drain(&mut r);
    (r, t1)
}

#[test]
fn releases_lost_shards_before_claiming_gained_ones() {
    let (mut r, t) = serving_pod("a", &["a"]);
    // b joins: the ring moves some shards to b; a keeps the rest. Then a assignment in
    // which a gains nothing would not test ordering, so make a lose and (later) gain.
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b"], vec![None; 8])));
    let t = t + cfg().debounce;
    r.handle_timeout(t);
    let actions = settle(&mut r, t);
    let stops: Vec<ShardId> = actions
        .iter()
        .filter_map(|a| match a {
            Action::StopServing {
                shard,
                reason: StopReason::Rebalance,
                ..
            } => Some(*shard),
            _ => None,
        })
        .collect();
    assert!(!stops.is_empty(), "{actions:?}");
    assert!(acquires(&actions).is_empty());
    for &s in &stops {
        assert_eq!(r.serving(s, t), None, "stopped at once");
    }
    // Connections closed -> release, still no claims.
    for &s in &stops {
        r.handle_serving_stopped(t, s);
    }
    // Each shard is released as soon as its connections are closed.
    assert_eq!(releases(&drain(&mut r)), stops);
    // b leaves again before the release answers: a must not claim until it is answered.
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a"], vec![None; 8])));
    let t = t + cfg().debounce;
    r.handle_timeout(t);
    assert!(
        acquires(&settle(&mut r, t)).is_empty(),
        "claimed before the release answered"
    );
    r.handle_release(t, &stops, Ok(vec![true; stops.len()]));
    let mut claimed = acquires(&drain(&mut r));
    claimed.sort();
    assert_eq!(claimed, stops);
}

#[test]
fn serving_ends_at_the_local_deadline_without_renewal() {
    let (mut r, t) = serving_pod("a", &["a"]);
    let window = cfg().serve_window();
    assert_eq!(r.serving(0, t + window - Duration::from_millis(1)), Some(7));
    assert_eq!(r.serving(0, t + window), None);
    // A renewal sent later extends from its send time, not its answer time.
    let sent = t + Duration::from_secs(1);
    r.handle_timeout(sent);
    let renew = drain(&mut r)
        .into_iter()
        .find_map(|a| match a {
            Action::Renew { shards, .. } => Some(shards),
            _ => None,
        })
        .expect("renewal due");
    let answered = sent + Duration::from_millis(400);
    r.handle_renew(
        answered,
        &renew,
        Ok(Checked::Ok(vec![RenewOutcome::Renewed; renew.len()])),
    );
    assert_eq!(
        r.serving(0, sent + window - Duration::from_millis(1)),
        Some(7)
    );
    assert_eq!(r.serving(0, sent + window), None);
}

#[test]
fn a_lost_renewal_stops_serving_at_once() {
    let (mut r, t) = serving_pod("a", &["a"]);
    let t = t + Duration::from_secs(1);
    r.handle_timeout(t);
    let shards = match drain(&mut r)
        .into_iter()
        .find(|a| matches!(a, Action::Renew { .. }))
    {
        Some(Action::Renew { shards, .. }) => shards,
        other => panic!("{other:?}"),
    };
    let mut outcomes = vec![RenewOutcome::Renewed; shards.len()];
    outcomes[0] = RenewOutcome::Missing;
    outcomes[1] = RenewOutcome::HeldBy { owner: pod("z") };
    r.handle_renew(t, &shards, Ok(Checked::Ok(outcomes)));
    let actions = drain(&mut r);
    assert!(actions.contains(&Action::StopServing {
        shard: shards[0],
        epoch: 7,
        reason: StopReason::Lost
    }));
    assert!(actions.contains(&Action::StopServing {
        shard: shards[1],
        epoch: 7,
        reason: StopReason::Stolen
    }));
    assert_eq!(r.serving(shards[0], t), None);
    assert_eq!(r.serving(shards[2], t), Some(7));
}

#[test]
fn a_new_generation_reclaims_held_shards_and_holds_everything_else() {
    let (mut r, t) = serving_pod("a", &["a"]);
    // Redis restarted empty; b registered first, a's registration is gone.
    let before = r.placement().cloned().expect("a placement");
    let snap = Snapshot {
        generation: generation("g2", Duration::from_millis(200)),
        members: vec![member("b")],
        leases: vec![None; 8],
        placement: None,
    };
    r.handle_snapshot(t, Ok(snap));
    let actions = drain(&mut r);
    // The remembered placement is put back unchanged, not recomputed for b alone.
    let restored = places(&actions);
    assert_eq!(restored.len(), 1, "{actions:?}");
    assert_eq!(restored[0].0, None);
    assert_eq!(restored[0].1.assignment, before.assignment);
    assert_eq!(restored[0].1.version, before.version + 1);
    let restored = restored[0].1.clone();
    let reclaimed = acquires(&actions);
    assert_eq!(
        reclaimed.len(),
        8,
        "re-claims every held shard: {actions:?}"
    );
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Heartbeat { generation } if generation == "g2")));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::StopServing { .. })),
        "no stop: {actions:?}"
    );
    // Re-claims succeed with new epochs: serving continues with them.
    let outcomes = reclaimed
        .iter()
        .map(|_| AcquireOutcome::Acquired { epoch: 9 })
        .collect();
    r.handle_acquire(t, &reclaimed, Ok(Checked::Ok(outcomes)));
    assert_eq!(r.serving(0, t), Some(9));
    r.handle_place(t, restored.clone(), Ok(true));
    // The view without a (only b) is stable past the debounce, but the placement only
    // changes once the hold ends (the generation is one member TTL old).
    let later = t + cfg().debounce * 2;
    let mut snap = snapshot(&r, "g2", &["b"], vec![None; 8]);
    snap.generation = generation("g2", Duration::from_millis(200) + cfg().debounce * 2);
    r.handle_snapshot(later, Ok(snap));
    r.handle_timeout(later);
    assert!(r.holding(later));
    let actions = drain(&mut r);
    assert!(places(&actions).is_empty(), "{actions:?}");
    assert!(!actions
        .iter()
        .any(|a| matches!(a, Action::StopServing { .. })));
    let after = t + cfg().member_ttl;
    r.handle_timeout(after);
    assert!(!r.holding(after));
    let actions = drain(&mut r);
    let next = places(&actions);
    assert_eq!(next.len(), 1, "{actions:?}");
    assert_eq!(next[0].0, Some(restored.version));
    assert_eq!(next[0].1.assignment.pods(), &[pod("b")]);
}

#[test]
fn cluster_wide_outage_suspends_and_isolation_gives_up() {
    for (report, suspended) in [
        (
            PeerReport {
                answered: 2,
                reaching: 0,
            },
            true,
        ),
        (
            PeerReport {
                answered: 2,
                reaching: 1,
            },
            false,
        ),
        (
            PeerReport {
                answered: 0,
                reaching: 0,
            },
            false,
        ),
    ] {
        let (mut r, t) = serving_pod("a", &["a", "b", "c"]);
        let t = t + Duration::from_secs(1);
        r.handle_timeout(t);
        let shards = match drain(&mut r)
            .into_iter()
            .find(|a| matches!(a, Action::Renew { .. }))
        {
            Some(Action::Renew { shards, .. }) => shards,
            other => panic!("{other:?}"),
        };
        r.handle_renew(t, &shards, Err(OpFailed));
        let actions = drain(&mut r);
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::ProbePeers { peers } if peers.len() == 2)));
        r.handle_peer_report(t, report);
        let past = t + cfg().lease_ttl;
        r.handle_timeout(past);
        let actions = drain(&mut r);
        let s = shards[0];
        assert_eq!(r.serving(s, past), None);
        if suspended {
            assert!(
                actions.contains(&Action::SuspendServing { shard: s, epoch: 7 }),
                "{actions:?}"
            );
            assert_eq!(r.shard_state(s), Some(ShardState::Suspended { epoch: 7 }));
            // The store returns; the key expired meanwhile: re-claim, then serve again.
            r.handle_renew(past, &[], Err(OpFailed)); // ignored: not the pending renewal
            r.handle_snapshot(past, Ok(snapshot(&r, "g", &["a", "b", "c"], vec![None; 8])));
            let reclaim = acquires(&drain(&mut r));
            assert!(reclaim.contains(&s), "{reclaim:?}");
            let outcomes = reclaim
                .iter()
                .map(|_| AcquireOutcome::Acquired { epoch: 8 })
                .collect();
            r.handle_acquire(past, &reclaim, Ok(Checked::Ok(outcomes)));
            assert!(drain(&mut r).contains(&Action::StartServing { shard: s, epoch: 8 }));
            assert_eq!(r.serving(s, past), Some(8));
        } else {
            assert!(actions.iter().any(|a| matches!(a, Action::StopServing { shard, reason: StopReason::Expired, .. } if *shard == s)), "{actions:?}");
        }
    }
}

#[test]
fn membership_changes_are_debounced() {
    let (mut r, t) = serving_pod("a", &["a"]);
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b"], vec![None; 8])));
    let half = t + cfg().debounce / 2;
    r.handle_snapshot(half, Ok(snapshot(&r, "g", &["a", "b", "c"], vec![None; 8])));
    r.handle_timeout(t + cfg().debounce);
    assert!(
        !drain(&mut r)
            .iter()
            .any(|a| matches!(a, Action::StopServing { .. })),
        "applied too early"
    );
    let due = half + cfg().debounce;
    r.handle_timeout(due);
    let actions = settle(&mut r, due);
    assert_eq!(places(&actions).len(), 1, "one rebalance for both joins");
    assert_eq!(r.assignment().pods().len(), 3);
}

#[test]
fn shutdown_stops_releases_then_deregisters() {
    let (mut r, t) = serving_pod("a", &["a"]);
    r.begin_shutdown(t);
    let actions = drain(&mut r);
    assert_eq!(
        actions
            .iter()
            .filter(|a| matches!(
                a,
                Action::StopServing {
                    reason: StopReason::Shutdown,
                    ..
                }
            ))
            .count(),
        8
    );
    for s in 0..8 {
        r.handle_serving_stopped(t, s);
    }
    assert_eq!(releases(&drain(&mut r)), (0..8).collect::<Vec<_>>());
    r.handle_release(t, &(0..8).collect::<Vec<_>>(), Ok(vec![true; 8]));
    assert_eq!(drain(&mut r), vec![Action::Deregister]);
    r.handle_deregister(t, Ok(()));
    assert!(r.is_finished());
}

#[test]
fn a_late_acquire_answer_is_not_served_on() {
    let t0 = Instant::now();
    let mut r = Reconciler::new(cfg(), pod("a"), t0);
    r.handle_timeout(t0);
    drain(&mut r);
    r.handle_snapshot(t0, Ok(snapshot(&r, "g", &["a"], vec![None; 8])));
    let t1 = t0 + cfg().debounce;
    r.handle_timeout(t1);
    let claimed = acquires(&settle(&mut r, t1));
    // The pod froze; the answer arrives after the serve window.
    let late = t1 + cfg().serve_window();
    let outcomes = claimed
        .iter()
        .map(|_| AcquireOutcome::Acquired { epoch: 5 })
        .collect();
    r.handle_acquire(late, &claimed, Ok(Checked::Ok(outcomes)));
    let actions = drain(&mut r);
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::StartServing { .. })),
        "{actions:?}"
    );
    // It claims again (AlreadyMine would refresh the deadline).
    assert_eq!(acquires(&actions), claimed);
}

#[test]
fn stale_epoch_from_a_terminal_drops_the_shard() {
    let (mut r, t) = serving_pod("a", &["a"]);
    r.handle_stale_epoch(t, 3, 6); // not our epoch: ignored
    assert_eq!(r.serving(3, t), Some(7));
    r.handle_stale_epoch(t, 3, 7);
    assert_eq!(r.serving(3, t), None);
    assert!(drain(&mut r).contains(&Action::StopServing {
        shard: 3,
        epoch: 7,
        reason: StopReason::StaleEpoch
    }));
}

#[test]
fn a_new_generation_gives_up_suspended_shards() {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let t = t + Duration::from_secs(1);
    r.handle_timeout(t);
    let shards = match drain(&mut r)
        .into_iter()
        .find(|a| matches!(a, Action::Renew { .. }))
    {
        Some(Action::Renew { shards, .. }) => shards,
        other => panic!("{other:?}"),
    };
    r.handle_renew(t, &shards, Err(OpFailed));
    drain(&mut r);
    r.handle_peer_report(
        t,
        PeerReport {
            answered: 1,
            reaching: 0,
        },
    );
    let past = t + cfg().lease_ttl;
    r.handle_timeout(past);
    drain(&mut r);
    assert_eq!(
        r.shard_state(shards[0]),
        Some(ShardState::Suspended { epoch: 7 })
    );
    // Redis comes back wiped: the suspended lease may have been someone else's by now.
    let snap = Snapshot {
        generation: generation("g2", Duration::ZERO),
        members: vec![],
        leases: vec![None; 8],
        placement: None,
    };
    r.handle_snapshot(past, Ok(snap));
    let actions = drain(&mut r);
    assert!(acquires(&actions).is_empty(), "{actions:?}");
    assert!(actions.contains(&Action::StopServing {
        shard: shards[0],
        epoch: 7,
        reason: StopReason::Lost
    }));
}

#[test]
fn suspended_shards_survive_a_brief_isolated_verdict() {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let t = t + Duration::from_secs(1);
    r.handle_timeout(t);
    let shards = match drain(&mut r)
        .into_iter()
        .find(|a| matches!(a, Action::Renew { .. }))
    {
        Some(Action::Renew { shards, .. }) => shards,
        other => panic!("{other:?}"),
    };
    r.handle_renew(t, &shards, Err(OpFailed));
    r.handle_peer_report(
        t,
        PeerReport {
            answered: 1,
            reaching: 0,
        },
    );
    let past = t + cfg().lease_ttl;
    r.handle_timeout(past);
    assert_eq!(
        r.shard_state(shards[0]),
        Some(ShardState::Suspended { epoch: 7 })
    );
    // The outage ends; b is back first while our first call still fails.
    r.handle_peer_report(
        past,
        PeerReport {
            answered: 1,
            reaching: 1,
        },
    );
    r.handle_timeout(past + cfg().renew_interval / 2);
    assert_eq!(
        r.shard_state(shards[0]),
        Some(ShardState::Suspended { epoch: 7 })
    );
    // Still cut off a renew interval later: now we are the isolated one.
    let later = past + cfg().renew_interval;
    assert!(r.poll_timeout().is_some_and(|at| at <= later));
    r.handle_timeout(later);
    assert!(drain(&mut r).contains(&Action::StopServing {
        shard: shards[0],
        epoch: 7,
        reason: StopReason::Isolated
    }));
}

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
        assert!(
            actions.contains(&Action::StopServing {
                shard: s,
                epoch: 7,
                reason: StopReason::Rebalance
            }),
            "shard {s}: {actions:?}"
        );
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
