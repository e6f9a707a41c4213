//! Rule-by-rule tests of the reconciler. Whole-cluster behaviour under faults is covered
//! by the simulation (`posgate::sim`); these pin each rule in isolation.

use std::time::{Duration, Instant};

mod failover;
mod handover;
mod placing;
mod recovery;

use super::*;
use crate::lease::{AcquireOutcome, Checked, Released, RenewOutcome, StaleEpoch};
use crate::membership::{GenerationInfo, Lease, Snapshot};
use crate::placement::Placement;
use crate::testing::{member, pod};

fn generation(id: &str, age: Duration) -> GenerationInfo {
    GenerationInfo { id: id.into(), age }
}

/// The heartbeat count of every test store: it answers heartbeats with it and shows it
/// in snapshots, so only a test that lowers it makes the store go back.
const BEATS: u64 = 1;

/// A snapshot of a store whose placement is the one `r` follows (what it wrote last).
fn snapshot(r: &Reconciler, gen: &str, members: &[&str], leases: Vec<Option<Lease>>) -> Snapshot {
    Snapshot {
        generation: generation(gen, Duration::from_secs(3600)),
        members: members.iter().map(|m| member(m)).collect(),
        leases,
        placement: r.placement().cloned(),
        heartbeats: BEATS,
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

/// Asserts that `actions` stop serving `shard` (held with epoch 7) for a rebalance.
fn assert_rebalanced_away(actions: &[Action], shard: ShardId) {
    let stop = Action::StopServing(Stop {
        shard,
        epoch: 7,
        reason: StopReason::Rebalance,
        close: Close::Now,
    });
    assert!(actions.contains(&stop), "shard {shard}: {actions:?}");
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

/// Fires the timers at `t` and returns the shards of the renewal that is due then.
fn renewal_due(r: &mut Reconciler, t: Instant) -> Vec<ShardId> {
    r.handle_timeout(t);
    match drain(r)
        .into_iter()
        .find(|a| matches!(a, Action::Renew { .. }))
    {
        Some(Action::Renew { shards, .. }) => shards,
        other => panic!("no renewal due: {other:?}"),
    }
}

/// Answers an acquisition of `shards`: every one acquired with `epoch`, from nobody.
fn acquired(r: &mut Reconciler, t: Instant, shards: &[ShardId], epoch: Epoch) {
    let outcomes = shards
        .iter()
        .map(|_| AcquireOutcome::Acquired {
            epoch,
            released_by: None,
        })
        .collect();
    r.handle_acquire(t, shards, Ok(Checked::Ok(outcomes)));
}

fn acquires(actions: &[Action]) -> Vec<ShardId> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Acquire { claims, .. } => claims.iter().map(|c| c.shard).collect(),
            _ => vec![],
        })
        .collect()
}

fn releases(actions: &[Action]) -> Vec<ShardId> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Release { releases } => releases.iter().map(|r| r.shard).collect::<Vec<_>>(),
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
    r.handle_heartbeat(t0, Ok(Checked::Ok(BEATS)));
    let t1 = t0 + cfg().debounce;
    r.handle_timeout(t1);
    let actions = settle(&mut r, t1);
    let mine = acquires(&actions);
    assert!(!mine.is_empty(), "{actions:?}");
    acquired(&mut r, t1, &mine, 7);
    for s in &mine {
        assert_eq!(r.serving(*s, t1), Some(7));
    }
    drain(&mut r);
    (r, t1)
}

/// A pod alone in generation "g", past the debounce: its claim of every shard is sent and
/// not answered yet. Returns the reconciler, the current time and the claimed shards.
fn claiming_alone(me: &str) -> (Reconciler, Instant, Vec<ShardId>) {
    let t0 = Instant::now();
    let mut r = Reconciler::new(cfg(), pod(me), t0);
    r.handle_timeout(t0);
    drain(&mut r);
    r.handle_snapshot(t0, Ok(snapshot(&r, "g", &[me], vec![None; 8])));
    let t1 = t0 + cfg().debounce;
    r.handle_timeout(t1);
    let claimed = acquires(&settle(&mut r, t1));
    (r, t1, claimed)
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
            Action::StopServing(Stop {
                shard,
                reason: StopReason::Rebalance,
                ..
            }) => Some(*shard),
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
    r.handle_release(t, &stops, Ok(vec![Released::Deleted; stops.len()]));
    let mut claimed = acquires(&drain(&mut r));
    claimed.sort();
    assert_eq!(claimed, stops);
}

/// Rule 2 across shards: a pod that loses shard X and gains shard Y in one placement change
/// sends no acquire for Y until the release of X is answered. Y is free and `Idle`, so
/// only the pod-wide `claims_allowed` guard holds it back (the test above regains the
/// very shards it released, which their own `Releasing` state already blocks).
#[test]
fn a_gained_shard_is_not_claimed_until_a_lost_one_is_released() {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let current = r.placement().cloned().unwrap();
    let (a, b) = (pod("a"), pod("b"));
    let lost = current.assignment.shards_of(&a).next().unwrap();
    let gained = current.assignment.shards_of(&b).next().unwrap();
    // Another pod wrote a placement that swaps one shard of a's with one of b's.
    let mut owner = current.assignment.owner_indices().to_vec();
    owner.swap(lost as usize, gained as usize);
    let swapped = Placement {
        version: current.version + 1,
        assignment: Assignment::from_parts(current.assignment.pods().to_vec(), owner, 8).unwrap(),
    };
    let mut snap = snapshot(&r, "g", &["a", "b"], vec![None; 8]);
    snap.placement = Some(swapped);
    r.handle_snapshot(t, Ok(snap));
    let actions = drain(&mut r);
    assert_rebalanced_away(&actions, lost);
    assert!(
        acquires(&actions).is_empty(),
        "claimed shard {gained} while shard {lost} was still served: {actions:?}"
    );
    r.handle_serving_stopped(t, lost);
    assert_eq!(releases(&drain(&mut r)), vec![lost]);
    // Time passing (renewals, polls, claim retries) does not let the claim out either.
    let later = t + cfg().renew_interval * 3 / 2;
    r.handle_timeout(later);
    assert!(
        acquires(&drain(&mut r)).is_empty(),
        "claimed shard {gained} before the release of shard {lost} answered"
    );
    r.handle_release(later, &[lost], Ok(vec![Released::Deleted]));
    assert_eq!(acquires(&drain(&mut r)), vec![gained]);
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
    let shards = renewal_due(&mut r, t);
    let mut outcomes = vec![RenewOutcome::Renewed; shards.len()];
    // The store's epoch is above ours: a newer owner came (and went, for the first).
    outcomes[0] = RenewOutcome::Missing { epoch: 8 };
    outcomes[1] = RenewOutcome::HeldBy {
        owner: pod("z"),
        epoch: 8,
    };
    r.handle_renew(t, &shards, Ok(Checked::Ok(outcomes)));
    let actions = drain(&mut r);
    assert!(actions.contains(&Action::StopServing(Stop {
        shard: shards[0],
        epoch: 7,
        reason: StopReason::Lost,
        close: Close::Now,
    })));
    assert!(actions.contains(&Action::StopServing(Stop {
        shard: shards[1],
        epoch: 7,
        reason: StopReason::Stolen,
        close: Close::Now,
    })));
    assert_eq!(r.serving(shards[0], t), None);
    assert_eq!(r.serving(shards[2], t), Some(7));
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
            .any(|a| matches!(a, Action::StopServing(..))),
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
                Action::StopServing(Stop {
                    reason: StopReason::Shutdown,
                    ..
                })
            ))
            .count(),
        8
    );
    for s in 0..8 {
        r.handle_serving_stopped(t, s);
    }
    assert_eq!(releases(&drain(&mut r)), (0..8).collect::<Vec<_>>());
    r.handle_release(
        t,
        &(0..8).collect::<Vec<_>>(),
        Ok(vec![Released::Deleted; 8]),
    );
    assert_eq!(drain(&mut r), vec![Action::Deregister]);
    r.handle_deregister(t, Ok(()));
    assert!(r.is_finished());
}

#[test]
fn a_late_acquire_answer_is_not_served_on() {
    let (mut r, t1, claimed) = claiming_alone("a");
    // The pod froze; the answer arrives after the serve window.
    let late = t1 + cfg().serve_window();
    acquired(&mut r, late, &claimed, 5);
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

/// Rule 6 for lost answers: a failed acquire may have taken the lease, so a shard the pod
/// no longer wants is released, not forgotten (the next owner would wait out the TTL).
#[test]
fn a_lost_acquire_answer_is_released_when_no_longer_wanted() {
    let (mut r, t1, claimed) = claiming_alone("a");
    assert_eq!(claimed.len(), 8);
    r.handle_acquire(t1, &claimed, Err(OpFailed));
    drain(&mut r);
    // The store answers again, with a placement b wrote that gives b every shard.
    let theirs = r.placement().unwrap().next(&[pod("b")], 8);
    let mut snap = snapshot(&r, "g", &["a", "b"], vec![None; 8]);
    snap.placement = Some(theirs);
    let t2 = t1 + Duration::from_millis(100);
    r.handle_snapshot(t2, Ok(snap));
    let released: Vec<ShardId> = drain(&mut r)
        .into_iter()
        .flat_map(|a| match a {
            Action::Release { releases } => releases.iter().map(|r| r.shard).collect(),
            _ => vec![],
        })
        .collect();
    assert_eq!(released, claimed);
}

#[test]
fn stale_epoch_from_a_terminal_drops_the_shard() {
    let (mut r, t) = serving_pod("a", &["a"]);
    let refused = |epoch, highest| StaleEpoch {
        shard: 3,
        epoch,
        highest,
    };
    r.handle_stale_epoch(t, refused(6, Some(9))); // not our epoch: ignored
    assert_eq!(r.serving(3, t), Some(7));
    // Without the terminal's epoch the store cannot be asked about it.
    r.handle_stale_epoch(t, refused(7, None));
    assert_eq!(r.serving(3, t), None);
    assert!(drain(&mut r).contains(&Action::StopServing(Stop {
        shard: 3,
        epoch: 7,
        reason: StopReason::StaleEpoch,
        close: Close::Now,
    })));
}

#[test]
fn a_shard_acquired_names_the_member_that_held_it_last() {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let theirs = (0..8).find(|&s| r.serving(s, t).is_none()).unwrap();
    let mine = (0..8).find(|&s| r.serving(s, t).is_some()).unwrap();
    let mut leases = vec![None; 8];
    let held_by = |owner: &str| {
        Some(Lease {
            owner: pod(owner),
            epoch: 9,
        })
    };
    leases[theirs as usize] = held_by("b");
    leases[mine as usize] = held_by("a");
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a", "b"], leases)));
    assert_eq!(r.last_holder(theirs), Some(&member("b")));
    // This pod's own lease is not where a shard comes from.
    assert_eq!(r.last_holder(mine), None);
    // b releases and leaves the members: it is still where the shard came from.
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a"], vec![None; 8])));
    assert_eq!(r.last_holder(theirs), Some(&member("b")));
    // A holder that is not a member (its record expired) names nobody new.
    let mut leases = vec![None; 8];
    leases[theirs as usize] = held_by("c");
    r.handle_snapshot(t, Ok(snapshot(&r, "g", &["a"], leases)));
    assert_eq!(r.last_holder(theirs), Some(&member("b")));
}

#[test]
fn a_change_notified_during_a_poll_is_polled_for_after_it() {
    let (mut r, t1) = serving_pod("pod-a", &["pod-a", "pod-b"]);
    let t2 = t1 + Duration::from_millis(10);
    r.handle_change_notification(t2);
    assert!(drain(&mut r).contains(&Action::Poll));
    // A release is published while that poll is out: its answer may predate it.
    r.handle_change_notification(t2 + Duration::from_millis(1));
    assert!(!drain(&mut r).contains(&Action::Poll), "one poll at a time");
    let t3 = t2 + Duration::from_millis(2);
    r.handle_snapshot(
        t3,
        Ok(snapshot(&r, "g", &["pod-a", "pod-b"], vec![None; 8])),
    );
    r.handle_timeout(t3);
    assert!(
        drain(&mut r).contains(&Action::Poll),
        "the notification is not left for the next poll interval"
    );
}

#[test]
fn an_acquire_names_the_pod_whose_release_note_it_found() {
    // A pod that never saw the shard held (it joined after the holder released it and
    // left the members): the note the release left is where the shard comes from.
    let (mut r, t, claimed) = claiming_alone("a");
    let (noted, plain) = (claimed[0], claimed[1]);
    let outcomes = claimed
        .iter()
        .map(|&s| AcquireOutcome::Acquired {
            epoch: 9,
            released_by: (s == noted).then(|| member("b")),
        })
        .collect();
    r.handle_acquire(t, &claimed, Ok(Checked::Ok(outcomes)));
    assert_eq!(r.serving(noted, t), Some(9));
    assert_eq!(r.last_holder(noted), Some(&member("b")));
    assert_eq!(r.last_holder(plain), None);
    // Its own note (released and taken back) names nobody.
    let (mut r, t, claimed) = claiming_alone("a");
    let outcomes = claimed
        .iter()
        .map(|_| AcquireOutcome::Acquired {
            epoch: 9,
            released_by: Some(member("a")),
        })
        .collect();
    r.handle_acquire(t, &claimed, Ok(Checked::Ok(outcomes)));
    assert_eq!(r.last_holder(claimed[0]), None);
}
