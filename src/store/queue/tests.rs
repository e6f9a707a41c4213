//! The model's rules that the differential test (`tests/queue_store.rs`) does not
//! reach: a record's transitions, and the feed's trimming.

use super::*;

fn queued(key: &str, at: WallMs) -> Record {
    Record {
        tenant: "acme".into(),
        terminal: "pos-1".into(),
        key: key.into(),
        rev: 1,
        accepted_ms: at,
        expires_ms: at + 60_000,
        accepted_by: "a".into(),
        collapse_key: None,
        digest: "00".repeat(32),
        bytes: RECORD_CHARGE,
        content_type: None,
        copies: 0,
        state: State::Queued,
    }
}

#[test]
fn a_mark_keeps_the_time_of_the_first_unanswered_copy() {
    let pod = PodId::new("a").unwrap();
    let r = queued("k", 100);
    let first = r.marked(&pod, 7, 1_000);
    assert_eq!(first.pending().unanswered_since_ms, Some(1_000));
    assert_eq!((first.rev, first.copies), (2, 1));
    // Its answer was lost; the next copy keeps 1_000: the window runs from there.
    let second = first.marked(&pod, 8, 5_000);
    assert_eq!(second.pending().unanswered_since_ms, Some(1_000));
    // That copy was refused (not taken): back to the state before it, the lost one's.
    let back = second.unsent(&first);
    assert_eq!(back.state, first.state);
    assert_eq!((back.rev, back.copies), (4, 2));
    // A first copy refused: queued again, nothing can have been taken.
    assert_eq!(first.unsent(&r).pending().unanswered_since_ms, None);
    // The wire names of every state.
    let json = serde_json::to_value(&first).unwrap();
    assert_eq!(json["state"], "sending");
    assert_eq!(json["since_ms"], 1_000);
    assert_eq!(
        parse_record(&serde_json::to_vec(&first).unwrap()).unwrap(),
        first
    );
}

#[test]
fn the_feed_keeps_the_newest_and_says_when_a_reader_missed_some() {
    let mut q = QueueState::default();
    let limits = Limits {
        per_terminal: 10,
        tenant_bytes: u64::MAX,
        cluster_bytes: u64::MAX,
        retention_ms: 1,
    };
    let pod = PodId::new("a").unwrap();
    for i in 0..(FEED_MAX + 2) {
        let at = 10 * i as WallMs;
        let r = queued(&format!("k{i}"), at);
        let id = push_id("acme", "pos-1", &r.key);
        let e = Enqueue {
            shard: 0,
            id: id.clone(),
            record: r.clone(),
            body: Bytes::new(),
            limits,
            check_directory: false,
            pod: pod.clone(),
        };
        assert!(matches!(
            q.enqueue(&e, "g", None, true).0,
            Enqueued::Accepted { .. }
        ));
        let w = Write {
            shard: 0,
            id,
            expect: 1,
            record: r.moved_to(State::Cancelled { at_ms: at + 1 }),
            change: Change::Final { retention_ms: 1 },
            now: at + 1,
        };
        assert_eq!(q.write(&w, None), Written::Done { body: None });
    }
    let (all, gap) = q.feed("acme", None, usize::MAX);
    assert_eq!((all.len(), gap), (FEED_MAX, false));
    assert_eq!(all[0].1.key, "k2", "the two oldest were trimmed");
    // A reader whose cursor is before the trimmed ones is told; one after them is not.
    assert!(q.feed("acme", Some(1), 1).1);
    assert!(!q.feed("acme", Some(2), 1).1);
    // Final records past their retention were dropped as the tenant went on, a few per
    // call: what is left is bounded, not the whole history.
    assert!(q.usage("acme").1 < 100 * RECORD_CHARGE);
}
