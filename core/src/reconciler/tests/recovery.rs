//! Store loss and outages (rules 5 and 6, `recovery.rs`): re-claims, holds, suspension.

use super::*;

/// Runs `r` from `from` to `to` as a driver would: woken every half renew interval, every
/// store call failing, every peer probe answered with `report`. Returns the actions.
fn outage(r: &mut Reconciler, from: Instant, to: Instant, report: PeerReport) -> Vec<Action> {
    let mut all = Vec::new();
    let mut t = from;
    while t < to {
        t = (t + cfg().renew_interval / 2).min(to);
        r.handle_timeout(t);
        while let Some(action) = r.poll_action() {
            match &action {
                Action::ProbePeers { .. } => r.handle_peer_report(t, report),
                Action::Poll => r.handle_snapshot(t, Err(OpFailed)),
                Action::Heartbeat { .. } => r.handle_heartbeat(t, Err(OpFailed)),
                Action::Renew { shards, .. } => r.handle_renew(t, &shards.clone(), Err(OpFailed)),
                _ => {}
            }
            all.push(action);
        }
    }
    all
}

/// A pod of {a, b} whose renewal failed while b answered without reaching the store (a
/// cluster-wide outage), past its deadline: its shards are held and keep delivering.
/// Returns the pod, the time and the shards of the failed renewal.
fn suspended_in_a_cluster_wide_outage() -> (Reconciler, Instant, Vec<ShardId>) {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let t = t + Duration::from_secs(1);
    let shards = renewal_due(&mut r, t);
    assert_eq!(r.store_failing_since(), None);
    r.handle_renew(t, &shards, Err(OpFailed));
    assert_eq!(
        r.store_failing_since(),
        Some(t),
        "the failure began with this call"
    );
    let unreachable = PeerReport {
        answered: 1,
        reaching: 0,
    };
    r.handle_peer_report(t, unreachable);
    let past = t + cfg().lease_ttl;
    let actions = outage(&mut r, t, past, unreachable);
    assert_eq!(
        r.shard_state(shards[0]),
        Some(ShardState::Suspended { epoch: 7 })
    );
    assert_eq!(r.serving(shards[0], past), Some(7), "held shards deliver");
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::SuspendServing { .. } | Action::StopServing(..))),
        "{actions:?}"
    );
    (r, past, shards)
}

#[test]
fn a_deadline_passing_under_the_verdict_leaves_no_gap_in_delivery() {
    let (mut r, t) = serving_pod("a", &["a", "b"]);
    let t = t + Duration::from_secs(1);
    let shards = renewal_due(&mut r, t);
    let Some(ShardState::Serving { deadline, .. }) = r.shard_state(shards[0]) else {
        panic!("served");
    };
    r.handle_renew(t, &shards, Err(OpFailed));
    let unreachable = PeerReport {
        answered: 1,
        reaching: 0,
    };
    // Driven up to just before the deadline, the verdict confirmed last there: it stands
    // past the deadline.
    let confirmed = deadline - Duration::from_millis(10);
    outage(&mut r, t, confirmed, unreachable);
    r.handle_peer_report(confirmed, unreachable);
    let lapse = confirmed + r.verdict_life();
    // Not woken yet for the deadline (a driver is a little late): the shard is still
    // `Serving`, and delivering at and after its deadline already.
    assert!(matches!(
        r.shard_state(shards[0]),
        Some(ShardState::Serving { .. })
    ));
    assert_eq!(r.serve_until(shards[0]), Some((7, lapse)));
    assert_eq!(r.serving(shards[0], deadline), Some(7));
    // Woken: suspended, held until the same lapse.
    r.handle_timeout(deadline + Duration::from_millis(1));
    assert_eq!(
        r.shard_state(shards[0]),
        Some(ShardState::Suspended { epoch: 7 })
    );
    assert_eq!(r.serve_until(shards[0]), Some((7, lapse)));
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
        heartbeats: 0,
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
        !actions.iter().any(|a| matches!(a, Action::StopServing(..))),
        "no stop: {actions:?}"
    );
    // Re-claims succeed with new epochs: serving continues with them.
    acquired(&mut r, t, &reclaimed, 9);
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
    assert!(!actions.iter().any(|a| matches!(a, Action::StopServing(..))));
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
        let shards = renewal_due(&mut r, t);
        r.handle_renew(t, &shards, Err(OpFailed));
        let actions = drain(&mut r);
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::ProbePeers { peers } if peers.len() == 2)));
        r.handle_peer_report(t, report);
        let past = t + cfg().lease_ttl;
        let actions = outage(&mut r, t, past, report);
        let s = shards[0];
        if suspended {
            // Held past the deadline, still delivering with the epoch it holds.
            assert_eq!(r.serving(s, past), Some(7), "{actions:?}");
            assert!(
                !actions.contains(&Action::SuspendServing { shard: s, epoch: 7 }),
                "{actions:?}"
            );
            assert_eq!(r.shard_state(s), Some(ShardState::Suspended { epoch: 7 }));
            // The store returns; the key expired meanwhile: re-claim, then serve again.
            r.handle_renew(past, &[], Err(OpFailed)); // ignored: not the pending renewal
            r.handle_snapshot(past, Ok(snapshot(&r, "g", &["a", "b", "c"], vec![None; 8])));
            let reclaim = acquires(&drain(&mut r));
            assert!(reclaim.contains(&s), "{reclaim:?}");
            acquired(&mut r, past, &reclaim, 8);
            assert!(drain(&mut r).contains(&Action::StartServing { shard: s, epoch: 8 }));
            assert_eq!(r.serving(s, past), Some(8));
        } else {
            assert_eq!(r.serving(s, past), None);
            assert!(actions.iter().any(|a| matches!(a, Action::StopServing(Stop { shard, reason: StopReason::Expired, .. }) if *shard == s)), "{actions:?}");
        }
    }
}

#[test]
fn a_new_generation_reclaims_suspended_shards() {
    let (mut r, past, shards) = suspended_in_a_cluster_wide_outage();
    // Redis comes back wiped after the outage: the held shards are re-claimed in the new
    // generation (`SET NX` decides if another pod re-claims too), not given up.
    let snap = Snapshot {
        generation: generation("g2", Duration::ZERO),
        members: vec![],
        leases: vec![None; 8],
        placement: None,
        heartbeats: 0,
    };
    r.handle_snapshot(past, Ok(snap));
    let actions = drain(&mut r);
    let reclaimed = acquires(&actions);
    assert!(reclaimed.contains(&shards[0]), "{actions:?}");
    assert!(
        !actions.iter().any(|a| matches!(a, Action::StopServing(..))),
        "{actions:?}"
    );
    // While the re-claim is in flight the shard waits for the store's word.
    assert_eq!(r.serving(shards[0], past), None);
    acquired(&mut r, past, &reclaimed, 8);
    assert_eq!(r.serving(shards[0], past), Some(8));
}

#[test]
fn suspended_shards_survive_a_brief_isolated_verdict() {
    let (mut r, past, shards) = suspended_in_a_cluster_wide_outage();
    // The outage ends; b is back first while our first call still fails.
    r.handle_peer_report(
        past,
        PeerReport {
            answered: 1,
            reaching: 1,
        },
    );
    let parked = drain(&mut r);
    assert!(
        parked.contains(&Action::SuspendServing {
            shard: shards[0],
            epoch: 7
        }),
        "no longer cluster-wide: held shards stop delivering: {parked:?}"
    );
    assert_eq!(r.serving(shards[0], past), None);
    r.handle_timeout(past + cfg().renew_interval / 2);
    assert_eq!(
        r.shard_state(shards[0]),
        Some(ShardState::Suspended { epoch: 7 })
    );
    // Still cut off a renew interval later: now we are the isolated one.
    let later = past + cfg().renew_interval;
    assert!(r.poll_timeout().is_some_and(|at| at <= later));
    r.handle_timeout(later);
    assert!(drain(&mut r).contains(&Action::StopServing(Stop {
        shard: shards[0],
        epoch: 7,
        reason: StopReason::Isolated,
        close: Close::Now,
    })));
}

#[test]
fn the_verdict_is_cluster_wide_only_by_a_majority_and_a_lone_pod_is_its_own() {
    let unreachable = |answered| PeerReport {
        answered,
        reaching: 0,
    };
    // (members, report, held?): this pod plus the peers that answered "unreachable" must
    // be more than half of the members, and no peer may reach the store.
    for (members, report, held) in [
        (&["a"][..], unreachable(0), true),
        (&["a", "b"][..], unreachable(0), false),
        (&["a", "b"][..], unreachable(1), true),
        (&["a", "b", "c", "d"][..], unreachable(1), false),
        (&["a", "b", "c", "d"][..], unreachable(2), true),
        (
            &["a", "b", "c"][..],
            PeerReport {
                answered: 2,
                reaching: 1,
            },
            false,
        ),
    ] {
        let (mut r, t) = serving_pod("a", members);
        let t = t + Duration::from_secs(1);
        let shards = renewal_due(&mut r, t);
        r.handle_renew(t, &shards, Err(OpFailed));
        let past = t + cfg().lease_ttl;
        outage(&mut r, t, past, report);
        let s = shards[0];
        assert_eq!(
            r.serving(s, past).is_some(),
            held,
            "{members:?} {report:?}: {:?}",
            r.shard_state(s)
        );
    }
}

#[test]
fn a_pod_paused_past_its_deadline_gives_up_instead_of_holding() {
    let (mut r, past, shards) = suspended_in_a_cluster_wide_outage();
    // The process was stopped for longer than a renew interval: its lease may have been
    // taken and a new outage begun meanwhile, so it holds nothing on waking.
    let woken = past + cfg().renew_interval * 3;
    r.handle_timeout(woken);
    let actions = drain(&mut r);
    assert!(
        actions.contains(&Action::StopServing(Stop {
            shard: shards[0],
            epoch: 7,
            reason: StopReason::Paused,
            close: Close::Now,
        })),
        "{actions:?}"
    );
    assert_eq!(r.serving(shards[0], woken), None);
    // Even if the peers say at once that nobody reaches the store.
    r.handle_peer_report(
        woken,
        PeerReport {
            answered: 1,
            reaching: 0,
        },
    );
    assert_eq!(r.serving(shards[0], woken), None);
    // A served shard whose deadline passed during the pause is given up the same way.
    let (mut r, t) = serving_pod("a", &["a"]);
    let woken = t + cfg().lease_ttl * 2;
    r.handle_timeout(woken);
    assert!(drain(&mut r).iter().any(|a| matches!(
        a,
        Action::StopServing(Stop {
            reason: StopReason::Paused,
            ..
        })
    )));
}

#[test]
fn an_unconfirmed_verdict_lapses_and_held_shards_stop_delivering() {
    let (mut r, past, shards) = suspended_in_a_cluster_wide_outage();
    // Probes go unanswered from now on (still in flight): nobody confirms the verdict.
    let mut t = past;
    let mut all = Vec::new();
    while t < past + cfg().renew_interval * 3 {
        t += cfg().renew_interval / 2;
        r.handle_timeout(t);
        all.extend(drain(&mut r));
    }
    assert!(
        all.contains(&Action::SuspendServing {
            shard: shards[0],
            epoch: 7
        }),
        "{all:?}"
    );
    assert_eq!(r.serving(shards[0], t), None);
    assert_eq!(
        r.shard_state(shards[0]),
        Some(ShardState::Suspended { epoch: 7 }),
        "connections kept while the verdict is asked again"
    );
    // Confirmed again: delivering again, with the same epoch.
    r.handle_peer_report(
        t,
        PeerReport {
            answered: 1,
            reaching: 0,
        },
    );
    assert!(drain(&mut r).contains(&Action::StartServing {
        shard: shards[0],
        epoch: 7
    }));
    assert_eq!(r.serving(shards[0], t), Some(7));
}

#[test]
fn a_snapshot_showing_a_newer_owner_stops_a_held_shard() {
    let (mut r, past, shards) = suspended_in_a_cluster_wide_outage();
    let (taken, kept) = (shards[0], shards[1]);
    // The store answers again: b took `taken` with a higher epoch (it reached Redis while
    // a held on a verdict b was not part of); `kept` shows an older lease of b's, a read
    // from before a's own acquisition, which proves nothing.
    let mut leases = vec![None; 8];
    for &s in &shards {
        leases[s as usize] = Some(Lease {
            owner: pod("a"),
            epoch: 7,
        });
    }
    leases[taken as usize] = Some(Lease {
        owner: pod("b"),
        epoch: 9,
    });
    leases[kept as usize] = Some(Lease {
        owner: pod("b"),
        epoch: 5,
    });
    r.handle_snapshot(past, Ok(snapshot(&r, "g", &["a", "b"], leases)));
    let actions = drain(&mut r);
    let stop = Action::StopServing(Stop {
        shard: taken,
        epoch: 7,
        reason: StopReason::Stolen,
        close: Close::Now,
    });
    assert!(actions.contains(&stop), "{actions:?}");
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::StopServing(Stop { shard, .. }) if *shard == kept)),
        "{actions:?}"
    );
    // The store fails again before any re-claim is answered and the peers agree it is
    // cluster-wide: the superseded shard is not resumed on its old epoch.
    let unreachable = PeerReport {
        answered: 1,
        reaching: 0,
    };
    r.handle_snapshot(past, Err(OpFailed));
    r.handle_peer_report(past, unreachable);
    let later = outage(&mut r, past, past + cfg().lease_ttl, unreachable);
    assert!(
        !later
            .iter()
            .any(|a| matches!(a, Action::StartServing { shard, .. } if *shard == taken)),
        "{later:?}"
    );
    assert_eq!(r.serving(taken, past + cfg().lease_ttl), None);
}
