//! One terminal's state and bookkeeping: the protocol's state (its fence, sessions and
//! taken keys, kept by `posgate-terminal`'s [`Terminal`], which makes every hello and
//! push decision), its open connections with their close channels, since when it has
//! been dark (no open connection, after it had one), its totals and a short history.
//!
//! Pure functions of the state, called with the terminal's lock held, with no I/O and no
//! waiting. Closing a connection is only *requested* here, through its control channel;
//! the connection task carries it out.

use std::{
    collections::{BTreeMap, VecDeque},
    net::SocketAddr,
    time::{Duration, Instant},
};

use posgate_terminal::{DedupWindow, HelloOutcome, PushOutcome as Decided, Terminal};
use serde::Serialize;
use tokio::sync::watch;

pub(crate) use posgate_terminal::unix_ms;

use super::{counters::Counters, dark::Ended, duplicates::Delivery};

/// Identifies one accepted connection within the farm.
pub(crate) type ConnId = u64;

/// How many connection events and pushes a terminal keeps for its report.
const HISTORY: usize = 32;

/// What a connection task is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseCmd {
    Keep,
    /// Send GOAWAY, let in-flight requests finish, then close (hard after a grace period).
    Graceful,
    /// Close now.
    Abort,
}

#[derive(Debug)]
struct OpenConn {
    peer: SocketAddr,
    opened_ms: u64,
    /// The epoch of its accepted hello, and since when a newer session superseded it.
    session: Option<(u64, Option<Instant>)>,
    ctl: watch::Sender<CloseCmd>,
}

/// Result of a push, with who delivered what for the duplicate log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PushOutcome {
    /// 200: taken.
    Accepted,
    /// 200 with the duplicate marker: the key was taken within the window, so this copy
    /// (number `copy`) is not taken again.
    Repeated {
        copy: u32,
        previous: Delivery,
        this: Delivery,
    },
    /// 409 with the highest epoch seen.
    Stale { highest: u64 },
    /// 428: no current session with this epoch on this connection.
    NoSession,
}

/// A connection's open or close, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct ConnEvent {
    pub conn: ConnId,
    pub peer: SocketAddr,
    /// `opened` or `closed`.
    pub event: &'static str,
    pub at_unix_ms: u64,
}

/// An accepted push, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct PushRecord {
    pub conn: ConnId,
    pub idempotency_key: String,
    pub epoch: u64,
    /// The `posgate-pod` header of the push.
    pub pod: String,
    pub at_unix_ms: u64,
}

/// A connection open now, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct OpenConnReport {
    pub conn: ConnId,
    pub peer: SocketAddr,
    pub opened_unix_ms: u64,
    /// Epoch of the accepted hello on this connection, if any.
    pub session_epoch: Option<u64>,
    /// Whether a newer session superseded this one (the connection is closing).
    pub superseded: bool,
}

/// Per-terminal totals, same meanings as the farm counters of the same names.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TerminalStats {
    pub connections_opened: u64,
    pub raw_overlaps: u64,
    pub dark_intervals: u64,
    pub sessions_accepted: u64,
    pub session_overlaps: u64,
    pub max_session_overlap_ms: u64,
    pub stale_hellos_refused: u64,
    pub stale_pushes_refused: u64,
    pub pushes_without_session: u64,
    pub pushes_accepted: u64,
    pub keys_delivered_twice: u64,
    pub duplicate_deliveries: u64,
}

/// Everything recorded about one terminal (`GET /terminals/{id}`).
#[derive(Debug, Clone, Serialize)]
pub struct TerminalReport {
    pub id: String,
    pub server_name: String,
    pub addr: SocketAddr,
    pub offline: bool,
    pub highest_epoch: Option<u64>,
    /// When its last open connection closed, if it has none open now but had one.
    pub dark_since_unix_ms: Option<u64>,
    pub open_connections: Vec<OpenConnReport>,
    pub stats: TerminalStats,
    /// Last connection events, oldest first.
    pub recent_connections: Vec<ConnEvent>,
    /// Last accepted pushes, oldest first.
    pub recent_pushes: Vec<PushRecord>,
}

/// One terminal's mutable state.
#[derive(Debug)]
pub(crate) struct TerminalState {
    core: Terminal,
    open: BTreeMap<ConnId, OpenConn>,
    /// When the last open connection closed; `None` while one is open and before the
    /// first (a terminal never connected is not dark, it is not yet dialed).
    dark_since_ms: Option<u64>,
    history: VecDeque<ConnEvent>,
    pushes: VecDeque<PushRecord>,
    stats: TerminalStats,
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T) {
    if queue.len() == HISTORY {
        queue.pop_front();
    }
    queue.push_back(item);
}

impl TerminalState {
    /// Terminal `id`, which has seen nothing yet and remembers keys as `dedup` says.
    pub(crate) fn new(id: String, dedup: DedupWindow) -> Self {
        TerminalState {
            core: Terminal::new(id, dedup),
            open: BTreeMap::new(),
            dark_since_ms: None,
            history: VecDeque::new(),
            pushes: VecDeque::new(),
            stats: TerminalStats::default(),
        }
    }

    /// Records a new TLS connection; counts a raw overlap if another one is open. Returns
    /// the dark interval this open ended, if the terminal had been connected before and
    /// had no connection open until now (for the farm's [`super::dark`] log).
    pub(crate) fn open(
        &mut self,
        conn: ConnId,
        peer: SocketAddr,
        ctl: watch::Sender<CloseCmd>,
        c: &Counters,
    ) -> Option<Ended> {
        Counters::bump(&c.connections_opened);
        Counters::bump(&c.connections_open);
        self.stats.connections_opened += 1;
        let opened_ms = unix_ms();
        if self.open.is_empty() {
            Counters::bump(&c.terminals_connected);
        } else {
            Counters::bump(&c.raw_overlaps);
            self.stats.raw_overlaps += 1;
        }
        let ended = self.dark_since_ms.take().map(|since| {
            Counters::drop_one(&c.terminals_dark);
            Counters::bump(&c.dark_intervals);
            self.stats.dark_intervals += 1;
            Ended {
                start_unix_ms: since,
                // The wall clock may step back; an interval is never negative.
                end_unix_ms: opened_ms.max(since),
            }
        });
        self.core.open(conn);
        self.open.insert(
            conn,
            OpenConn {
                peer,
                opened_ms,
                session: None,
                ctl,
            },
        );
        let event = ConnEvent {
            conn,
            peer,
            event: "opened",
            at_unix_ms: opened_ms,
        };
        push_bounded(&mut self.history, event);
        ended
    }

    /// Records the end of a connection; measures the session overlap if it was superseded.
    pub(crate) fn close(&mut self, conn: ConnId, overlap_threshold: Duration, c: &Counters) {
        let Some(entry) = self.open.remove(&conn) else {
            return;
        };
        self.core.close(conn);
        Counters::bump(&c.connections_closed);
        Counters::drop_one(&c.connections_open);
        let closed_ms = unix_ms();
        if self.open.is_empty() {
            // The last open connection: dark from now until the next one opens.
            Counters::drop_one(&c.terminals_connected);
            Counters::bump(&c.terminals_dark);
            self.dark_since_ms = Some(closed_ms);
        }
        if let Some((_, Some(since))) = entry.session {
            Counters::drop_one(&c.session_overlaps_open);
            let overlap = since.elapsed();
            let ms = overlap.as_millis() as u64;
            self.stats.max_session_overlap_ms = self.stats.max_session_overlap_ms.max(ms);
            Counters::raise_to(&c.max_session_overlap_ms, ms);
            if overlap > overlap_threshold {
                self.stats.session_overlaps += 1;
                Counters::bump(&c.session_overlaps);
            }
        }
        let event = ConnEvent {
            conn,
            peer: entry.peer,
            event: "closed",
            at_unix_ms: closed_ms,
        };
        push_bounded(&mut self.history, event);
    }

    /// Applies a hello (the rules are `posgate-terminal`'s) and asks every other
    /// connection whose session it superseded to close.
    pub(crate) fn hello(&mut self, conn: ConnId, epoch: u64, c: &Counters) -> HelloOutcome {
        let outcome = self.core.handle_hello(conn, epoch);
        match &outcome {
            HelloOutcome::Stale { .. } => {
                Counters::bump(&c.stale_hellos_refused);
                self.stats.stale_hellos_refused += 1;
            }
            HelloOutcome::Closing => {}
            HelloOutcome::Accepted { superseded, .. } => {
                if let Some(entry) = self.open.get_mut(&conn) {
                    entry.session = Some((epoch, None));
                }
                let now = Instant::now();
                for old in superseded {
                    if let Some(entry) = self.open.get_mut(old) {
                        if let Some((_, since)) = &mut entry.session {
                            *since = Some(now);
                        }
                        // The connection may already be gone (task ended); close() still runs.
                        let _ = entry.ctl.send(CloseCmd::Graceful);
                    }
                }
                let n = superseded.len() as u64;
                Counters::bump(&c.sessions_accepted);
                Counters::add(&c.sessions_superseded, n);
                Counters::add(&c.session_overlaps_open, n);
                self.stats.sessions_accepted += 1;
            }
        }
        outcome
    }

    /// Applies a push from `pod` with dedup `key` at `now_unix_ms` (the rules are
    /// `posgate-terminal`'s: stale epoch, then session, then key) and takes it at once.
    pub(crate) fn push(
        &mut self,
        conn: ConnId,
        epoch: u64,
        pod: &str,
        key: &str,
        now_unix_ms: u64,
        c: &Counters,
    ) -> PushOutcome {
        let this = Delivery {
            pod: pod.to_owned(),
            epoch,
            at_unix_ms: now_unix_ms,
        };
        let (remembered, forgotten) = (
            self.core.keys_remembered(),
            self.core.keys_forgotten_early(),
        );
        let decided = self
            .core
            .handle_push(conn, epoch, key, this.clone().into(), now_unix_ms);
        if decided == Decided::Take {
            self.core.finish_push(key, true, now_unix_ms);
        }
        // The key memory's gauges move by what this push did to it (expiry, eviction).
        let now_remembered = self.core.keys_remembered() as u64;
        Counters::set_share(&c.keys_remembered, remembered as u64, now_remembered);
        Counters::add(
            &c.keys_forgotten_early,
            self.core.keys_forgotten_early() - forgotten,
        );
        match decided {
            Decided::Stale { highest } => {
                Counters::bump(&c.stale_pushes_refused);
                self.stats.stale_pushes_refused += 1;
                return PushOutcome::Stale { highest };
            }
            // InFlight cannot happen: every key is finished in the same call.
            Decided::NoSession | Decided::InFlight => {
                Counters::bump(&c.pushes_without_session);
                self.stats.pushes_without_session += 1;
                return PushOutcome::NoSession;
            }
            Decided::Take | Decided::Duplicate { .. } => {}
        }
        Counters::bump(&c.pushes_accepted);
        self.stats.pushes_accepted += 1;
        let record = PushRecord {
            conn,
            idempotency_key: key.to_owned(),
            epoch,
            pod: pod.to_owned(),
            at_unix_ms: now_unix_ms,
        };
        push_bounded(&mut self.pushes, record);
        let Decided::Duplicate { copy, previous } = decided else {
            return PushOutcome::Accepted;
        };
        Counters::bump(&c.duplicate_deliveries);
        self.stats.duplicate_deliveries += 1;
        if copy == 2 {
            Counters::bump(&c.keys_delivered_twice);
            self.stats.keys_delivered_twice += 1;
        }
        PushOutcome::Repeated {
            copy,
            // The farm never restores a terminal, so every remembered key has a delivery.
            previous: previous.map(Delivery::from).unwrap_or_default(),
            this,
        }
    }

    /// Asks the selected open connections to close now; returns how many were asked.
    pub(crate) fn abort_where(&self, mut pick: impl FnMut(ConnId) -> bool) -> usize {
        let mut n = 0;
        for (&id, entry) in &self.open {
            if pick(id) {
                let _ = entry.ctl.send(CloseCmd::Abort);
                n += 1;
            }
        }
        n
    }

    pub(crate) fn report(
        &self,
        id: String,
        server_name: String,
        addr: SocketAddr,
        offline: bool,
    ) -> TerminalReport {
        let open_connections = self
            .open
            .iter()
            .map(|(&conn, e)| OpenConnReport {
                conn,
                peer: e.peer,
                opened_unix_ms: e.opened_ms,
                session_epoch: e.session.map(|(epoch, _)| epoch),
                superseded: matches!(e.session, Some((_, Some(_)))),
            })
            .collect();
        TerminalReport {
            id,
            server_name,
            addr,
            offline,
            highest_epoch: self.core.highest_epoch(),
            dark_since_unix_ms: self.dark_since_ms,
            open_connections,
            stats: self.stats.clone(),
            recent_connections: self.history.iter().cloned().collect(),
            recent_pushes: self.pushes.iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
