//! The client connections the listener holds, as plain data: which are in a request and
//! which are not, when each that is not must close, and which one makes room when the
//! listener is full. `now` is a parameter; the accept loop (`serve.rs`) drives it.
//!
//! Why a table and not just timeouts: every client connection costs a file descriptor,
//! and the pod's descriptors are mostly for its terminal sessions. Timeouts alone let
//! a client that opens connections faster than they expire take every descriptor, so
//! the listener holds at most [`ConnectionLimits::max_connections`]. When full, a new
//! connection takes the place of the one that has been waiting longest without a
//! request in flight (a slowloris holds connections exactly like that), so a probe or a
//! push still gets in while a flood is shed. Closing takes a moment (the connection's
//! task drops it); while [`MAX_CLOSING`] are closing, nothing more is accepted, so at
//! most that many descriptors over the cap are held, and the accept loop still keeps
//! pace with a flood instead of leaving it in the kernel's queue, where a probe's
//! connection would wait behind it or be dropped. Only when every connection is in a request is a newcomer refused. A
//! connection in a request is never closed here: its body has `--body-read-timeout` and
//! its answer the push deadline.
//!
//! Not for: the HTTP protocol itself (hyper), or how a connection is closed (the loop).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Connections chosen to make room that may still be held while more are accepted.
pub const MAX_CLOSING: usize = 64;

/// How long and how many client connections the listener keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `--header-read-timeout`: how long a new connection may take to bring its first
    /// request head.
    pub header_read_timeout: Duration,
    /// `--idle-timeout`: how long a connection that answered a request may stay without
    /// one in flight, HTTP/1.1 keep-alive and HTTP/2 alike. Peers keep one connection
    /// per pod and their pool forgets an idle one after 90 s, and load balancers keep
    /// theirs for about a minute: the pod must not close first.
    pub idle_timeout: Duration,
    /// `--max-connections`: client connections held at once.
    pub max_connections: usize,
    /// `--max-streams-per-connection`: concurrent HTTP/2 requests on one connection.
    pub max_streams: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 4_096,
            max_streams: 200,
        }
    }
}

/// One connection's name in the table, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(u64);

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conn {
    /// Accepted, no request seen yet.
    Fresh { since: Instant },
    /// Between requests.
    Idle { since: Instant },
    /// With this many requests in flight (HTTP/2 multiplexes; HTTP/1.1 has one).
    Busy { requests: usize },
    /// Chosen to make room; its descriptor is held until its task drops it.
    Closing,
}

impl Conn {
    /// Since when the connection waits without a request, if it does.
    fn waiting_since(self) -> Option<Instant> {
        match self {
            Conn::Fresh { since } | Conn::Idle { since } => Some(since),
            Conn::Busy { .. } | Conn::Closing => None,
        }
    }
}

/// How long a connection may wait for its next request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// It has not brought a request yet: close it at this instant (nothing to lose).
    FirstRequest(Instant),
    /// It answered requests and has none now: close it at this instant, telling the
    /// client (HTTP/2 GOAWAY), which may be about to send one.
    NextRequest(Instant),
    /// A request is in flight: no deadline here.
    InRequest,
    /// Chosen to make room, or closed: drop it now.
    Closed,
}

/// What to do with a connection just accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Serve it.
    Admitted(ConnId),
    /// Serve it; `evict`, waiting longest without a request, is to be dropped to make
    /// room (see [`Connections::may_accept`]).
    Evicting { admitted: ConnId, evict: ConnId },
    /// The table is full of connections in a request: close the new one.
    Refused,
}

/// See the module docs.
#[derive(Debug)]
pub struct Connections {
    limits: ConnectionLimits,
    next: u64,
    /// Keyed by ids this module hands out: a fast hash, not SipHash (every request
    /// looks its connection up twice).
    open: foldhash::HashMap<ConnId, Conn>,
    /// The connections without a request in flight, oldest first.
    waiting: BTreeSet<(Instant, ConnId)>,
    /// How many are [`Conn::Closing`].
    closing: usize,
}

impl Connections {
    pub fn new(limits: ConnectionLimits) -> Self {
        Connections {
            limits,
            next: 0,
            open: foldhash::HashMap::default(),
            waiting: BTreeSet::new(),
            closing: 0,
        }
    }

    /// Connections held.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether the next connection may be accepted: not while [`MAX_CLOSING`] chosen
    /// to make room are still held.
    pub fn may_accept(&self) -> bool {
        self.closing < MAX_CLOSING
    }

    /// A connection was accepted at `now`.
    pub fn handle_accept(&mut self, now: Instant) -> Admission {
        let evict = if self.open.len() < self.limits.max_connections {
            None
        } else {
            let &(_, oldest) = match self.waiting.first() {
                Some(oldest) => oldest,
                None => return Admission::Refused,
            };
            self.move_to(oldest, Conn::Closing);
            Some(oldest)
        };
        let id = ConnId(self.next);
        self.next += 1;
        self.move_to(id, Conn::Fresh { since: now });
        match evict {
            None => Admission::Admitted(id),
            Some(evict) => Admission::Evicting {
                admitted: id,
                evict,
            },
        }
    }

    /// A request arrived on `id`.
    pub fn handle_request_start(&mut self, id: ConnId) {
        let requests = match self.open.get(&id) {
            Some(Conn::Busy { requests }) => requests + 1,
            Some(Conn::Fresh { .. } | Conn::Idle { .. }) => 1,
            // Chosen to close, or closed, while the request arrived: it is dropped.
            Some(Conn::Closing) | None => return,
        };
        self.move_to(id, Conn::Busy { requests });
    }

    /// A request on `id` was answered (or abandoned) at `now`.
    pub fn handle_request_end(&mut self, id: ConnId, now: Instant) {
        let next = match self.open.get(&id) {
            Some(Conn::Busy { requests }) if *requests > 1 => Conn::Busy {
                requests: requests - 1,
            },
            Some(Conn::Busy { .. }) => Conn::Idle { since: now },
            Some(state @ (Conn::Fresh { .. } | Conn::Idle { .. })) => {
                unreachable!("a request ended on a connection in {state:?}")
            }
            Some(Conn::Closing) | None => return,
        };
        self.move_to(id, next);
    }

    /// `id`'s descriptor was dropped.
    pub fn handle_close(&mut self, id: ConnId) {
        if let Some(state) = self.open.remove(&id) {
            if let Some(since) = state.waiting_since() {
                self.waiting.remove(&(since, id));
            }
            if state == Conn::Closing {
                self.closing -= 1;
            }
        }
    }

    /// Until when `id` may wait for its next request.
    pub fn poll_deadline(&self, id: ConnId) -> Deadline {
        match self.open.get(&id) {
            None => Deadline::Closed,
            Some(Conn::Fresh { since }) => {
                Deadline::FirstRequest(*since + self.limits.header_read_timeout)
            }
            Some(Conn::Idle { since }) => Deadline::NextRequest(*since + self.limits.idle_timeout),
            Some(Conn::Busy { .. }) => Deadline::InRequest,
            Some(Conn::Closing) => Deadline::Closed,
        }
    }

    /// The one place a connection's state changes, keeping `waiting` in step.
    fn move_to(&mut self, id: ConnId, next: Conn) {
        let prior = self.open.get(&id).copied();
        if let Some(since) = prior.and_then(Conn::waiting_since) {
            self.waiting.remove(&(since, id));
        }
        if prior == Some(Conn::Closing) {
            self.closing -= 1;
        }
        if next == Conn::Closing {
            self.closing += 1;
        }
        if let Some(since) = next.waiting_since() {
            self.waiting.insert((since, id));
        }
        self.open.insert(id, next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max_connections: usize) -> Connections {
        Connections::new(ConnectionLimits {
            max_connections,
            ..ConnectionLimits::default()
        })
    }

    fn admitted(admission: Admission) -> ConnId {
        match admission {
            Admission::Admitted(id) => id,
            other => panic!("expected Admitted, got {other:?}"),
        }
    }

    #[test]
    fn a_full_table_makes_room_by_closing_the_connection_waiting_longest() {
        let t0 = Instant::now();
        let mut t = table(3);
        t.closing = MAX_CLOSING - 1;
        let a = admitted(t.handle_accept(t0));
        let b = admitted(t.handle_accept(t0 + Duration::from_secs(1)));
        let c = admitted(t.handle_accept(t0 + Duration::from_secs(2)));
        // `a` is in a request, so `b` has waited longest.
        t.handle_request_start(a);
        assert!(t.may_accept());
        let Admission::Evicting { admitted: d, evict } =
            t.handle_accept(t0 + Duration::from_secs(3))
        else {
            panic!("a full table makes room");
        };
        assert_eq!(evict, b);
        assert_eq!(t.poll_deadline(b), Deadline::Closed, "its task drops it");
        // Until it is gone it is held, over the cap; with MAX_CLOSING held, nothing more
        // is accepted.
        assert_eq!(t.len(), 4);
        assert!(!t.may_accept());
        // A request arriving on it meanwhile changes nothing.
        t.handle_request_start(b);
        assert_eq!(t.poll_deadline(b), Deadline::Closed);
        t.handle_close(b);
        assert!(t.may_accept());
        t.closing = 0;
        // `a` answered after `c` and `d` arrived: `c` still waits longest, then `d`.
        t.handle_request_end(a, t0 + Duration::from_secs(4));
        let Admission::Evicting { evict, .. } = t.handle_accept(t0 + Duration::from_secs(5)) else {
            panic!("a full table makes room");
        };
        assert_eq!(evict, c);
        t.handle_close(c);
        let Admission::Evicting { evict, .. } = t.handle_accept(t0 + Duration::from_secs(6)) else {
            panic!("a full table makes room");
        };
        assert_eq!(evict, d);
    }

    #[test]
    fn a_table_full_of_requests_refuses_newcomers() {
        let t0 = Instant::now();
        let mut t = table(2);
        for _ in 0..2 {
            let id = admitted(t.handle_accept(t0));
            t.handle_request_start(id);
        }
        assert_eq!(t.handle_accept(t0), Admission::Refused);
        assert_eq!(t.len(), 2);
        assert!(t.may_accept());
    }

    #[test]
    fn deadlines_follow_the_state() {
        let t0 = Instant::now();
        let limits = ConnectionLimits::default();
        let mut t = Connections::new(limits);
        let id = admitted(t.handle_accept(t0));
        assert_eq!(
            t.poll_deadline(id),
            Deadline::FirstRequest(t0 + limits.header_read_timeout)
        );
        // Two HTTP/2 streams: idle only once both ended.
        t.handle_request_start(id);
        t.handle_request_start(id);
        assert_eq!(t.poll_deadline(id), Deadline::InRequest);
        t.handle_request_end(id, t0 + Duration::from_secs(1));
        assert_eq!(t.poll_deadline(id), Deadline::InRequest);
        let t2 = t0 + Duration::from_secs(2);
        t.handle_request_end(id, t2);
        assert_eq!(
            t.poll_deadline(id),
            Deadline::NextRequest(t2 + limits.idle_timeout)
        );
        t.handle_close(id);
        assert_eq!(t.poll_deadline(id), Deadline::Closed);
        assert_eq!(t.len(), 0);
        // Events for a connection closed meanwhile change nothing.
        t.handle_request_start(id);
        t.handle_request_end(id, t2);
        assert_eq!(t.len(), 0);
    }
}
