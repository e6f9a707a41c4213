//! How a stopped shard leaves its sessions (`Close`): drained on a planned move to pods
//! that all drain, closed otherwise.

use super::*;
use crate::membership::HANDOVER_DRAIN;

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

    // With a peer that drains, every shard of a shutdown drains.
    let (mut r, t) = serving_pod("a", &["a"]);
    let mut snap = with_handover(&r, &[("a", d), ("b", d)]);
    // b is a member, but the placement still gives a everything (not yet debounced).
    snap.placement = r.placement().cloned();
    r.handle_snapshot(t, Ok(snap));
    drain(&mut r);
    r.begin_shutdown(t);
    let stops: Vec<(StopReason, Close)> = drain(&mut r)
        .iter()
        .filter_map(|a| match a {
            Action::StopServing(Stop { reason, close, .. }) => Some((*reason, *close)),
            _ => None,
        })
        .collect();
    assert_eq!(stops.len(), 8, "{stops:?}");
    assert!(stops
        .iter()
        .all(|s| *s == (StopReason::Shutdown, Close::Drain)));

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
