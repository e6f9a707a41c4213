//! Planned moves: how a stopped shard leaves its sessions (`Close`: drained on a move to
//! pods that all drain, closed otherwise), and its lease (handed to the next owner when
//! that pod takes handovers, deleted otherwise), and how a pod under SIGTERM places itself
//! out of the placement first.

use super::*;
use crate::membership::{HANDOVER_DRAIN, HANDOVER_LEASE};

/// `snapshot` with each member's handover protocol given.
fn with_handover(r: &Reconciler, members: &[(&str, u32)]) -> Snapshot {
    let names: Vec<&str> = members.iter().map(|(m, _)| *m).collect();
    let mut snap = snapshot(r, "g", &names, vec![None; 8]);
    for (m, (_, handover)) in snap.members.iter_mut().zip(members) {
        m.handover = *handover;
    }
    snap
}

/// The `close` of every rebalance stop once `members` settled.
fn rebalance_closes(members: &[(&str, u32)]) -> Vec<Close> {
    let (mut r, t) = serving_pod("a", &["a"]);
    r.handle_snapshot(t, Ok(with_handover(&r, members)));
    let t = t + cfg().debounce;
    r.handle_timeout(t);
    let closes: Vec<Close> = settle(&mut r, t)
        .iter()
        .filter_map(|a| match a {
            Action::StopServing(Stop {
                reason: StopReason::Rebalance,
                close,
                ..
            }) => Some(*close),
            _ => None,
        })
        .collect();
    assert!(!closes.is_empty(), "the join moved shards away");
    closes
}

#[test]
fn a_planned_move_drains_only_when_every_other_member_drains() {
    let d = HANDOVER_DRAIN;
    assert!(rebalance_closes(&[("a", d), ("b", d)])
        .iter()
        .all(|c| *c == Close::Drain));
    // One pod of an earlier release would dial at once: close whole shards.
    assert!(rebalance_closes(&[("a", d), ("b", d), ("c", 0)])
        .iter()
        .all(|c| *c == Close::Now));
    // Our own record does not matter (it may be stale); the others' do.
    assert!(rebalance_closes(&[("a", 0), ("b", d)])
        .iter()
        .all(|c| *c == Close::Drain));
}

#[test]
fn a_shutdown_drains_and_a_lost_lease_closes() {
    let d = HANDOVER_DRAIN;
    let (mut r, t) = serving_pod("a", &["a"]);
    // Alone: nobody to hand over to.
    r.begin_shutdown(t);
    let closes: Vec<Close> = drain(&mut r)
        .iter()
        .filter_map(|a| match a {
            Action::StopServing(Stop { close, .. }) => Some(*close),
            _ => None,
        })
        .collect();
    assert!(!closes.is_empty() && closes.iter().all(|c| *c == Close::Now));

    // A lease found gone is not ours to hand over: close now, drain or not.
    let (mut r, t) = serving_pod("a", &["a"]);
    r.handle_snapshot(t, Ok(with_handover(&r, &[("a", d), ("b", d)])));
    drain(&mut r);
    let due = renewal_due(&mut r, t + cfg().renew_interval);
    let shard = due[0];
    let lost = due
        .iter()
        .map(|&s| {
            if s == shard {
                RenewOutcome::Missing { epoch: 8 }
            } else {
                RenewOutcome::Renewed
            }
        })
        .collect();
    r.handle_renew(t + cfg().renew_interval, &due, Ok(Checked::Ok(lost)));
    let closes: Vec<Close> = drain(&mut r)
        .iter()
        .filter_map(|a| match a {
            Action::StopServing(Stop {
                reason: StopReason::Lost,
                close,
                ..
            }) => Some(*close),
            _ => None,
        })
        .collect();
    assert_eq!(closes, [Close::Now]);
}

/// `a` serving all 8 shards with `b` a member of handover protocol `b_handover` that
/// just registered (the placement still all `a`'s, as when a rollout starts the
/// replacement pod); then SIGTERM. Returns the pod and the first actions.
fn shutdown_beside(b_handover: u32) -> (Reconciler, Instant, Vec<Action>) {
    let (mut r, t) = serving_pod("a", &["a"]);
    let mut snap = with_handover(&r, &[("a", HANDOVER_LEASE), ("b", b_handover)]);
    snap.placement = r.placement().cloned();
    r.handle_snapshot(t, Ok(snap));
    drain(&mut r);
    r.begin_shutdown(t);
    let actions = drain(&mut r);
    (r, t, actions)
}

fn release_targets(actions: &[Action]) -> Vec<(ShardId, Option<PodId>)> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Release { releases } => releases
                .iter()
                .map(|r| (r.shard, r.to.clone()))
                .collect::<Vec<_>>(),
            _ => vec![],
        })
        .collect()
}

/// Acknowledges every stop among `actions`: the stops, and the release targets that follow.
fn stopped(
    r: &mut Reconciler,
    t: Instant,
    actions: &[Action],
) -> (Vec<Stop>, Vec<(ShardId, Option<PodId>)>) {
    let stops: Vec<Stop> = actions
        .iter()
        .filter_map(|a| match a {
            Action::StopServing(stop) => Some(*stop),
            _ => None,
        })
        .collect();
    for stop in &stops {
        r.handle_serving_stopped(t, stop.shard);
    }
    (stops, release_targets(&drain(r)))
}

/// `a` serving all 8 shards, then `members` (handover protocol 2) settled: the shards
/// the rebalance moved away stopped and acknowledged. Returns the pod, the time, and
/// the release targets that followed.
fn rebalanced_beside(members: &[&str]) -> (Reconciler, Instant, Vec<(ShardId, Option<PodId>)>) {
    let (mut r, t) = serving_pod("a", &["a"]);
    let members: Vec<(&str, u32)> = members.iter().map(|m| (*m, HANDOVER_LEASE)).collect();
    r.handle_snapshot(t, Ok(with_handover(&r, &members)));
    let t = t + cfg().debounce;
    r.handle_timeout(t);
    let actions = settle(&mut r, t);
    let (_, targets) = stopped(&mut r, t, &actions);
    (r, t, targets)
}

/// Acknowledges the stops among a shutdown's `actions`: all 8 shards drained, and each
/// lease released to `to` (`None`: deleted). Returns the shards.
fn all_drained_to(
    r: &mut Reconciler,
    t: Instant,
    actions: &[Action],
    to: Option<PodId>,
) -> Vec<ShardId> {
    let (stops, targets) = stopped(r, t, actions);
    assert_eq!(stops.len(), 8);
    assert!(stops
        .iter()
        .all(|s| (s.reason, s.close) == (StopReason::Shutdown, Close::Drain)));
    assert_eq!(targets.len(), 8);
    assert!(targets.iter().all(|(_, t)| *t == to), "{targets:?}");
    stops.iter().map(|s| s.shard).collect()
}

#[test]
fn a_shutdown_places_itself_out_first_and_hands_each_lease_to_its_next_owner() {
    let (mut r, t, actions) = shutdown_beside(HANDOVER_LEASE);
    // It keeps serving: the first thing it does is the placement without itself.
    let written = places(&actions);
    assert_eq!(written.len(), 1, "{actions:?}");
    let (expected, next) = (written[0].0, written[0].1.clone());
    assert_eq!(expected, Some(r.placement().unwrap().version));
    assert_eq!(next.assignment.pods(), [pod("b")]);
    assert!(
        !actions.iter().any(|a| matches!(a, Action::StopServing(_))),
        "{actions:?}"
    );
    // Stored: every shard stops (drained), then each lease goes to b in its release.
    r.handle_place(t, next, Ok(true));
    let actions = drain(&mut r);
    let shards = all_drained_to(&mut r, t, &actions, Some(pod("b")));
    r.handle_release(t, &shards, Ok(vec![Released::HandedOver { epoch: 9 }; 8]));
    assert_eq!(drain(&mut r), [Action::Deregister]);
}

#[test]
fn a_shutdown_beside_an_earlier_release_drains_at_once_and_deletes() {
    // b drains but takes no handover: every shard stops at once, drained, and its lease
    // is deleted, as before handovers.
    let (mut r, t, actions) = shutdown_beside(HANDOVER_DRAIN);
    assert!(places(&actions).is_empty(), "{actions:?}");
    all_drained_to(&mut r, t, &actions, None);
}

#[test]
fn a_placement_write_that_keeps_losing_falls_back_after_two_debounce_periods() {
    let (mut r, t, actions) = shutdown_beside(HANDOVER_LEASE);
    let (_, next) = places(&actions)[0];
    let next = next.clone();
    r.handle_place(t, next, Ok(false));
    // A lost compare-and-set polls again, serving meanwhile.
    let after = drain(&mut r);
    assert!(after.contains(&Action::Poll), "{after:?}");
    assert!(!after.iter().any(|a| matches!(a, Action::StopServing(_))));
    // Woken at the end of the wait, and past two debounce periods without a placement:
    // stop and delete, as before.
    assert!(r.poll_timeout().unwrap() <= t + cfg().debounce * 2);
    r.handle_timeout(t + cfg().debounce * 2);
    let later = drain(&mut r);
    let stops = later
        .iter()
        .filter(|a| matches!(a, Action::StopServing(_)))
        .count();
    assert_eq!(stops, 8, "{later:?}");
}

#[test]
fn a_planned_move_hands_the_lease_to_the_assigned_pod() {
    let (r, _, targets) = rebalanced_beside(&["a", "b"]);
    assert!(!targets.is_empty());
    let placement = r.placement().unwrap();
    for (s, to) in targets {
        assert_eq!(to.as_ref(), placement.assignment.owner(s));
        assert_eq!(to, Some(pod("b")));
    }
}

#[test]
fn without_a_new_member_a_shutdown_serves_one_debounce_before_it_places_itself_out() {
    // a and b both placed: nobody new to give a's shards to yet.
    let (mut r, t, _) = rebalanced_beside(&["a", "b"]);
    let mine = |r: &Reconciler| {
        (0..8)
            .filter(|&s| matches!(r.shard_state(s), Some(ShardState::Serving { .. })))
            .count()
    };
    let serving = mine(&r);
    assert!(serving > 0);
    r.begin_shutdown(t);
    let first = drain(&mut r);
    assert!(places(&first).is_empty(), "{first:?}");
    assert!(!first.iter().any(|a| matches!(a, Action::StopServing(_))));
    assert_eq!(mine(&r), serving, "served while it waits");
    // Woken when the wait ends: the placement without a, all to b.
    assert!(r.poll_timeout().unwrap() <= t + cfg().debounce);
    r.handle_timeout(t + cfg().debounce);
    let later = drain(&mut r);
    let written = places(&later);
    assert_eq!(written.len(), 1, "{later:?}");
    assert_eq!(written[0].1.assignment.pods(), [pod("b")]);
    // While that write is in flight, the end of the wait (passed) wakes nobody.
    assert!(r.poll_timeout().unwrap() > t + cfg().debounce);
}

#[test]
fn a_pod_placing_itself_out_is_not_woken_by_timers_it_does_not_act_on() {
    // a, b and c placed; c vanishes (a debounce starts), then a gets SIGTERM.
    let (mut r, t, _) = rebalanced_beside(&["a", "b", "c"]);
    let ab = [("a", HANDOVER_LEASE), ("b", HANDOVER_LEASE)];
    r.handle_snapshot(t, Ok(with_handover(&r, &ab)));
    drain(&mut r);
    r.begin_shutdown(t + cfg().debounce / 2);
    drain(&mut r);
    // The debounce of c's departure is due before a's wait ends: nothing to do then.
    let due = t + cfg().debounce;
    r.handle_timeout(due);
    drain(&mut r);
    assert!(r.poll_timeout().unwrap() > due, "woken again at once");
}
