//! The hello and push rules of [`super::TerminalState`] and the dark intervals it hands
//! over, without sockets.

use std::{net::SocketAddr, sync::atomic::Ordering::Relaxed, time::Duration};

use posgate_terminal::{DedupWindow, HelloOutcome};

use tokio::sync::watch;

use super::*;

fn peer() -> SocketAddr {
    "127.0.0.1:40000".parse().unwrap()
}

/// Opens connection `id`, returning the receiver of its close commands.
fn open(t: &mut TerminalState, id: ConnId, c: &Counters) -> watch::Receiver<CloseCmd> {
    let (tx, rx) = watch::channel(CloseCmd::Keep);
    t.open(id, peer(), tx, c);
    rx
}

#[test]
fn newer_hello_supersedes_only_sessions() {
    let (mut t, c) = (
        TerminalState::new("pos-1".into(), DedupWindow::default()),
        Counters::default(),
    );
    let a = open(&mut t, 1, &c);
    let bare = open(&mut t, 2, &c);
    let _b = open(&mut t, 3, &c);
    assert_eq!(c.raw_overlaps.load(Relaxed), 2);
    assert_eq!(
        t.hello(1, 5, &c),
        HelloOutcome::Accepted {
            superseded: vec![],
            raised: true
        }
    );
    assert_eq!(
        t.hello(3, 5, &c),
        HelloOutcome::Accepted {
            superseded: vec![1],
            raised: false
        }
    );
    assert_eq!(*a.borrow(), CloseCmd::Graceful);
    assert_eq!(*bare.borrow(), CloseCmd::Keep, "no hello, not a session");
    assert_eq!(t.hello(1, 6, &c), HelloOutcome::Closing);
    assert_eq!(t.hello(2, 4, &c), HelloOutcome::Stale { highest: 5 });
    assert_eq!(
        t.push(1, 5, "p", "k", unix_ms(), &c),
        PushOutcome::NoSession
    );
    assert_eq!(t.push(3, 5, "p", "k", unix_ms(), &c), PushOutcome::Accepted);
    assert_eq!(c.session_overlaps_open.load(Relaxed), 1);
    t.close(1, Duration::from_secs(1), &c);
    assert_eq!(c.session_overlaps_open.load(Relaxed), 0);
    assert_eq!(c.session_overlaps.load(Relaxed), 0);
}

#[test]
fn superseded_connection_open_past_threshold_is_an_overlap() {
    let (mut t, c) = (
        TerminalState::new("pos-1".into(), DedupWindow::default()),
        Counters::default(),
    );
    let _a = open(&mut t, 1, &c);
    let _b = open(&mut t, 2, &c);
    t.hello(1, 1, &c);
    t.hello(2, 2, &c);
    std::thread::sleep(Duration::from_millis(20));
    t.close(1, Duration::from_millis(10), &c);
    assert_eq!(c.session_overlaps.load(Relaxed), 1);
    assert!(c.max_session_overlap_ms.load(Relaxed) >= 20);
    t.close(2, Duration::from_millis(10), &c);
    assert_eq!(c.connections_open.load(Relaxed), 0);
    assert_eq!(c.terminals_connected.load(Relaxed), 0);
}

#[test]
fn pushes_check_epoch_then_session_and_count_repeated_keys() {
    let (mut t, c) = (
        TerminalState::new("pos-1".into(), DedupWindow::default()),
        Counters::default(),
    );
    let _a = open(&mut t, 1, &c);
    assert_eq!(
        t.push(1, 1, "p", "k", unix_ms(), &c),
        PushOutcome::NoSession
    );
    t.hello(1, 7, &c);
    assert_eq!(
        t.push(1, 6, "p", "k", unix_ms(), &c),
        PushOutcome::Stale { highest: 7 }
    );
    assert_eq!(
        t.push(1, 8, "p", "k", unix_ms(), &c),
        PushOutcome::NoSession
    );
    assert_eq!(t.push(1, 7, "a", "k", unix_ms(), &c), PushOutcome::Accepted);
    for (copy, pod, previous) in [(2, "b", "a"), (3, "b", "b")] {
        match t.push(1, 7, pod, "k", unix_ms(), &c) {
            PushOutcome::Repeated {
                copy: n,
                previous: p,
                this,
            } => {
                assert_eq!(n, copy);
                assert_eq!((p.pod.as_str(), this.pod.as_str()), (previous, pod));
                assert_eq!((p.epoch, this.epoch), (7, 7));
                assert!(p.at_unix_ms <= this.at_unix_ms);
            }
            other => panic!("copy {copy}: expected a repeat, got {other:?}"),
        }
    }
    assert_eq!(
        t.push(1, 7, "a", "other", unix_ms(), &c),
        PushOutcome::Accepted
    );
    assert_eq!(c.keys_delivered_twice.load(Relaxed), 1);
    assert_eq!(c.duplicate_deliveries.load(Relaxed), 2);
    assert_eq!(c.stale_pushes_refused.load(Relaxed), 1);
    assert_eq!(c.pushes_without_session.load(Relaxed), 2);
    let report = t.report("pos-1".into(), "pos-1.t".into(), peer(), false);
    assert_eq!(report.stats.pushes_accepted, 4);
    assert_eq!(report.open_connections[0].session_epoch, Some(7));
}

#[test]
fn a_repeat_is_a_duplicate_within_the_window_and_the_fence_comes_first() {
    let window = DedupWindow {
        window: Duration::from_secs(600),
        capacity: 100,
    };
    let (mut t, c) = (
        TerminalState::new("pos-1".into(), window),
        Counters::default(),
    );
    let (_a, _b) = (open(&mut t, 1, &c), open(&mut t, 2, &c));
    let t0 = unix_ms();
    t.hello(1, 7, &c);
    assert_eq!(t.push(1, 7, "a", "k", t0, &c), PushOutcome::Accepted);
    // A newer owner's hello: the old owner's repeat is fenced (409), not a duplicate.
    t.hello(2, 8, &c);
    assert_eq!(
        t.push(1, 7, "a", "k", t0, &c),
        PushOutcome::Stale { highest: 8 }
    );
    // The newer owner's copy within the window is a duplicate of the old owner's.
    let within = t0 + 599_000;
    match t.push(2, 8, "b", "k", within, &c) {
        PushOutcome::Repeated { copy, previous, .. } => {
            assert_eq!((copy, previous.pod.as_str(), previous.epoch), (2, "a", 7));
        }
        other => panic!("expected a duplicate, got {other:?}"),
    }
    // Past the window the key is new again.
    let after = t0 + 600_000;
    assert_eq!(t.push(2, 8, "b", "k", after, &c), PushOutcome::Accepted);
    assert_eq!(c.duplicate_deliveries.load(Relaxed), 1);
}

/// Opens connection `id` and returns the dark interval the open ended (the receiver of
/// its close commands is dropped: these tests only open and close).
fn open_ending(t: &mut TerminalState, id: ConnId, c: &Counters) -> Option<Ended> {
    let (tx, _rx) = watch::channel(CloseCmd::Keep);
    t.open(id, peer(), tx, c)
}

#[test]
fn a_dark_interval_runs_from_the_last_close_to_the_next_open() {
    let (mut t, c) = (
        TerminalState::new("pos-1".into(), DedupWindow::default()),
        Counters::default(),
    );
    assert_eq!(
        open_ending(&mut t, 1, &c),
        None,
        "a first connection ends nothing"
    );
    assert_eq!(
        c.terminals_dark.load(Relaxed),
        0,
        "never connected is not dark"
    );
    t.close(1, Duration::from_secs(1), &c);
    assert_eq!(c.terminals_dark.load(Relaxed), 1);
    let since = t.dark_since_ms.expect("dark after the last close");
    let dark = open_ending(&mut t, 2, &c).expect("the reconnect ends the dark interval");
    assert_eq!(t.dark_since_ms, None);
    assert_eq!(c.terminals_dark.load(Relaxed), 0);
    assert_eq!(c.dark_intervals.load(Relaxed), 1);
    let report = t.report("pos-1".into(), "pos-1.t".into(), peer(), false);
    assert_eq!(report.stats.dark_intervals, 1);
    assert_eq!(report.dark_since_unix_ms, None);
    // The interval is exactly the close of connection 1 to the open of connection 2.
    let at = |conn, event| {
        report
            .recent_connections
            .iter()
            .find(|e| e.conn == conn && e.event == event)
            .map(|e| e.at_unix_ms)
    };
    assert_eq!(Some(dark.start_unix_ms), at(1, "closed"));
    assert_eq!(dark.start_unix_ms, since);
    assert_eq!(Some(dark.end_unix_ms), at(2, "opened"));
}

#[test]
fn overlapping_connections_leave_no_dark_time() {
    let (mut t, c) = (
        TerminalState::new("pos-1".into(), DedupWindow::default()),
        Counters::default(),
    );
    open_ending(&mut t, 1, &c);
    // Make before break: the second opens before the first closes.
    assert_eq!(open_ending(&mut t, 2, &c), None);
    t.close(1, Duration::from_secs(1), &c);
    assert_eq!(t.dark_since_ms, None, "one connection still open");
    assert_eq!(c.terminals_dark.load(Relaxed), 0);
    assert_eq!(
        open_ending(&mut t, 3, &c),
        None,
        "never dark, nothing ended"
    );
    t.close(2, Duration::from_secs(1), &c);
    t.close(3, Duration::from_secs(1), &c);
    assert!(t.dark_since_ms.is_some(), "both closed: dark");
    assert!(open_ending(&mut t, 4, &c).is_some());
    assert_eq!(c.dark_intervals.load(Relaxed), 1);
    assert_eq!(c.raw_overlaps.load(Relaxed), 2);
}
