//! One terminal's protocol state and the decisions of `docs/pos-protocol.md` §3-§5 over
//! it: the epoch fence (`highest_epoch`), each connection's session, and the
//! (tenant, key) pairs taken within the dedup window.
//!
//! Sans-IO: plain values in, outcomes out, the time a parameter (Unix milliseconds, so a
//! key's window survives a reboot when it is saved). Nothing here reads a socket, sleeps,
//! or closes a connection: an outcome names the connections to close and the caller
//! closes them. Not for: parsing requests and building answers ([`crate::wire`]), or
//! serving connections ([`crate::server`]).

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

/// Identifies one connection to this terminal, chosen by the caller (unique while open).
pub type ConnId = u64;

/// How long and how many taken keys a terminal remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupWindow {
    /// A key is a duplicate for this long after it was first taken: the protocol's `W`,
    /// at least the pods' `--idempotency-ttl` (10 minutes by default).
    pub window: Duration,
    /// Most keys remembered; beyond it the oldest is forgotten before its window ends
    /// (counted in [`Terminal::keys_forgotten_early`]).
    pub capacity: usize,
}

impl Default for DedupWindow {
    /// 10 minutes (posgate's default `--idempotency-ttl`) and 1,000 keys: the count only
    /// bites above one push every 0.6 s for 10 minutes, far beyond a till's rate.
    fn default() -> Self {
        DedupWindow {
            window: Duration::from_secs(600),
            capacity: 1_000,
        }
    }
}

/// Who delivered a copy of a push, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The `posgate-pod` header.
    pub pod: String,
    pub epoch: u64,
    pub at_unix_ms: u64,
}

/// What a terminal keeps across a reboot (RECOMMENDED by the protocol, §3): its fence
/// and the keys it took, each with when it first took it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
    pub highest_epoch: Option<u64>,
    /// (dedup key, first taken at, Unix ms), oldest first.
    pub keys: Vec<(String, u64)>,
}

/// The answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloOutcome {
    /// `200`: the session is current. `superseded`: the other connections whose session
    /// was current; close each (GOAWAY, then drop after a grace period). `raised`: the
    /// fence went up (save it, when saving).
    Accepted {
        superseded: Vec<ConnId>,
        raised: bool,
    },
    /// `409` with `posgate-stale-epoch: highest`. Nothing changed.
    Stale { highest: u64 },
    /// `421`: this connection's session was superseded (or it is not open).
    Closing,
}

/// The answer to a push, decided before its payload is acted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOutcome {
    /// Act on the payload, then call [`Terminal::finish_push`] with whether it was taken.
    /// Until then a copy of the same key is [`PushOutcome::InFlight`].
    Take,
    /// `200` with `posgate-duplicate: 1`: taken within the window; this is copy number
    /// `copy`, and `previous` delivered the copy before it (`None` for a key restored
    /// from [`Saved`]).
    Duplicate {
        copy: u32,
        previous: Option<Delivery>,
    },
    /// Another copy of this key is being acted on now: not taken yet, so not a duplicate
    /// either. Answered `503` (the pod reports the refusal and the sender retries).
    InFlight,
    /// `409` with `posgate-stale-epoch: highest`.
    Stale { highest: u64 },
    /// `428`: this connection holds no current session of this epoch.
    NoSession,
}

/// A connection's session (§3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Session {
    None,
    Current { epoch: u64 },
    Superseded,
}

/// A remembered key.
#[derive(Debug)]
enum Key {
    /// A copy is being acted on (between [`PushOutcome::Take`] and `finish_push`).
    InFlight { this: Delivery },
    /// Taken: how many copies arrived, and the latest.
    Taken { copies: u32, last: Option<Delivery> },
}

/// One terminal's state: the fence, the sessions of its open connections and its taken
/// keys. Every method is a pure decision over this state.
#[derive(Debug)]
pub struct Terminal {
    id: String,
    highest_epoch: Option<u64>,
    sessions: BTreeMap<ConnId, Session>,
    dedup: DedupWindow,
    keys: HashMap<Arc<str>, Key>,
    /// Taken keys by when they were first taken, oldest first: the front is the next to
    /// leave (by time or by count). In-flight keys are not in it.
    order: VecDeque<(u64, Arc<str>)>,
    forgotten_early: u64,
}

impl Terminal {
    /// A terminal that has seen nothing.
    pub fn new(id: impl Into<String>, dedup: DedupWindow) -> Self {
        Terminal {
            id: id.into(),
            highest_epoch: None,
            sessions: BTreeMap::new(),
            dedup,
            keys: HashMap::new(),
            order: VecDeque::new(),
            forgotten_early: 0,
        }
    }

    /// A terminal that was saved (before a reboot) at some earlier time; keys whose
    /// window ended by `now_unix_ms` are left out.
    pub fn restore(
        id: impl Into<String>,
        dedup: DedupWindow,
        saved: Saved,
        now_unix_ms: u64,
    ) -> Self {
        let mut t = Terminal::new(id, dedup);
        t.highest_epoch = saved.highest_epoch;
        for (key, at) in saved.keys {
            t.remember(key.as_str(), at, None);
        }
        t.expire(now_unix_ms);
        t
    }

    /// The terminal id `posgate-terminal` must name.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn highest_epoch(&self) -> Option<u64> {
        self.highest_epoch
    }

    /// What to keep across a reboot.
    pub fn saved(&self) -> Saved {
        Saved {
            highest_epoch: self.highest_epoch,
            keys: self
                .order
                .iter()
                .map(|(at, k)| (k.to_string(), *at))
                .collect(),
        }
    }

    /// Keys remembered now (taken within the window).
    pub fn keys_remembered(&self) -> usize {
        self.order.len()
    }

    /// Keys forgotten by the count bound before their window ended, since the start: each
    /// is a key whose repeat would be taken again.
    pub fn keys_forgotten_early(&self) -> u64 {
        self.forgotten_early
    }

    /// A connection was accepted (TLS and HTTP/2 up): it has no session yet.
    pub fn open(&mut self, conn: ConnId) {
        self.sessions.insert(conn, Session::None);
    }

    /// A connection ended; `true` if its session had been superseded.
    pub fn close(&mut self, conn: ConnId) -> bool {
        self.sessions.remove(&conn) == Some(Session::Superseded)
    }

    /// §4: a hello with `epoch` on `conn`.
    pub fn handle_hello(&mut self, conn: ConnId, epoch: u64) -> HelloOutcome {
        if let Some(highest) = self.highest_epoch.filter(|&h| epoch < h) {
            return HelloOutcome::Stale { highest };
        }
        match self.sessions.get(&conn) {
            Some(Session::None | Session::Current { .. }) => {}
            Some(Session::Superseded) | None => return HelloOutcome::Closing,
        }
        let raised = self.highest_epoch != Some(epoch);
        self.highest_epoch = Some(epoch);
        let mut superseded = Vec::new();
        for (&id, session) in &mut self.sessions {
            if id == conn {
                *session = Session::Current { epoch };
            } else if let Session::Current { .. } = session {
                *session = Session::Superseded;
                superseded.push(id);
            }
        }
        HelloOutcome::Accepted { superseded, raised }
    }

    /// §5, checks 2-4: a push with `epoch` and dedup `key` on `conn`, delivered as
    /// `this`, at `now_unix_ms`. The stale epoch first (the most useful answer for the
    /// pod), then the session, then the key.
    pub fn handle_push(
        &mut self,
        conn: ConnId,
        epoch: u64,
        key: &str,
        this: Delivery,
        now_unix_ms: u64,
    ) -> PushOutcome {
        if let Some(highest) = self.highest_epoch.filter(|&h| epoch < h) {
            return PushOutcome::Stale { highest };
        }
        if self.sessions.get(&conn) != Some(&Session::Current { epoch }) {
            return PushOutcome::NoSession;
        }
        self.expire(now_unix_ms);
        match self.keys.get_mut(key) {
            Some(Key::InFlight { .. }) => PushOutcome::InFlight,
            Some(Key::Taken { copies, last }) => {
                *copies += 1;
                let previous = last.replace(this);
                PushOutcome::Duplicate {
                    copy: *copies,
                    previous,
                }
            }
            None => {
                self.keys.insert(Arc::from(key), Key::InFlight { this });
                PushOutcome::Take
            }
        }
    }

    /// The end of acting on a push [`PushOutcome::Take`] allowed: `taken` remembers its
    /// key from `now_unix_ms` for the window (save it, when saving); otherwise the key is
    /// free again, and a retry is a new push.
    pub fn finish_push(&mut self, key: &str, taken: bool, now_unix_ms: u64) {
        let Some(Key::InFlight { .. }) = self.keys.get(key) else {
            return;
        };
        let Some(Key::InFlight { this }) = self.keys.remove(key) else {
            return;
        };
        if taken {
            self.remember(key, now_unix_ms, Some(this));
        }
    }

    /// §3, "Resetting the fence": forgets `highest_epoch` and keeps the keys. Returns the
    /// connections whose session was current: close each, so only a hello after the reset
    /// makes a session current again.
    pub fn reset_fence(&mut self) -> Vec<ConnId> {
        self.highest_epoch = None;
        let mut current = Vec::new();
        for (&id, session) in &mut self.sessions {
            if let Session::Current { .. } = session {
                *session = Session::Superseded;
                current.push(id);
            }
        }
        current
    }

    fn remember(&mut self, key: &str, at: u64, last: Option<Delivery>) {
        while self.order.len() >= self.dedup.capacity.max(1) {
            let Some((_, oldest)) = self.order.pop_front() else {
                break;
            };
            self.keys.remove(&oldest);
            self.forgotten_early += 1;
        }
        let key: Arc<str> = Arc::from(key);
        self.order.push_back((at, key.clone()));
        self.keys.insert(key, Key::Taken { copies: 1, last });
    }

    /// Forgets the taken keys whose window ended at `now`. The window runs from the first
    /// taking; a wall clock that stepped back keeps keys longer, never shorter.
    fn expire(&mut self, now: u64) {
        let window = self.dedup.window.as_millis() as u64;
        while let Some((at, key)) = self.order.front() {
            if now.saturating_sub(*at) < window {
                return;
            }
            self.keys.remove(key);
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by(pod: &str, epoch: u64) -> Delivery {
        Delivery {
            pod: pod.into(),
            epoch,
            at_unix_ms: 0,
        }
    }

    /// Terminal `pos-1` with connection 1 holding a session of `epoch`.
    fn session(dedup: DedupWindow, epoch: u64) -> Terminal {
        let mut t = Terminal::new("pos-1", dedup);
        t.open(1);
        t.handle_hello(1, epoch);
        t
    }

    fn take(t: &mut Terminal, conn: ConnId, epoch: u64, key: &str, now: u64) -> PushOutcome {
        let outcome = t.handle_push(conn, epoch, key, by("p", epoch), now);
        if outcome == PushOutcome::Take {
            t.finish_push(key, true, now);
        }
        outcome
    }

    #[test]
    fn a_newer_hello_supersedes_and_fences_the_older_owner() {
        let mut t = Terminal::new("pos-1", DedupWindow::default());
        t.open(1);
        t.open(2);
        assert_eq!(
            t.handle_hello(1, 5),
            HelloOutcome::Accepted {
                superseded: vec![],
                raised: true
            }
        );
        assert_eq!(
            t.handle_hello(2, 7),
            HelloOutcome::Accepted {
                superseded: vec![1],
                raised: true
            }
        );
        // The old owner is fenced on every path: hello, push, and its old connection.
        assert_eq!(t.handle_hello(1, 5), HelloOutcome::Stale { highest: 7 });
        assert_eq!(
            take(&mut t, 1, 5, "k", 0),
            PushOutcome::Stale { highest: 7 }
        );
        assert_eq!(t.handle_hello(1, 7), HelloOutcome::Closing);
        assert_eq!(take(&mut t, 1, 7, "k", 0), PushOutcome::NoSession);
        assert_eq!(take(&mut t, 2, 7, "k", 0), PushOutcome::Take);
        assert!(t.close(1));
        assert!(!t.close(2));
    }

    #[test]
    fn an_equal_epoch_is_accepted_and_a_push_needs_its_sessions_epoch() {
        let mut t = Terminal::new("pos-1", DedupWindow::default());
        t.open(1);
        assert_eq!(take(&mut t, 1, 3, "k", 0), PushOutcome::NoSession);
        t.handle_hello(1, 3);
        t.open(2);
        assert_eq!(
            t.handle_hello(2, 3),
            HelloOutcome::Accepted {
                superseded: vec![1],
                raised: false
            }
        );
        assert_eq!(take(&mut t, 2, 4, "k", 0), PushOutcome::NoSession);
    }

    #[test]
    fn a_key_is_a_duplicate_within_the_window_from_its_first_taking() {
        let window = DedupWindow {
            window: Duration::from_secs(600),
            capacity: 10,
        };
        let mut t = session(window, 1);
        assert_eq!(take(&mut t, 1, 1, "acme:k", 1_000), PushOutcome::Take);
        assert_eq!(
            take(&mut t, 1, 1, "acme:k", 600_999),
            PushOutcome::Duplicate {
                copy: 2,
                previous: Some(by("p", 1))
            }
        );
        // Another tenant's same key is another push.
        assert_eq!(take(&mut t, 1, 1, "other:k", 2_000), PushOutcome::Take);
        // A repeat does not extend the window.
        assert_eq!(take(&mut t, 1, 1, "acme:k", 601_000), PushOutcome::Take);
    }

    #[test]
    fn a_copy_while_another_is_acted_on_is_in_flight_and_a_refusal_frees_the_key() {
        let mut t = session(DedupWindow::default(), 1);
        assert_eq!(t.handle_push(1, 1, "k", by("a", 1), 0), PushOutcome::Take);
        assert_eq!(
            t.handle_push(1, 1, "k", by("b", 1), 0),
            PushOutcome::InFlight
        );
        t.finish_push("k", false, 0);
        assert_eq!(take(&mut t, 1, 1, "k", 0), PushOutcome::Take);
        assert!(matches!(
            take(&mut t, 1, 1, "k", 0),
            PushOutcome::Duplicate { copy: 2, .. }
        ));
    }

    #[test]
    fn the_count_bound_forgets_the_oldest_and_says_so() {
        let window = DedupWindow {
            window: Duration::from_secs(600),
            capacity: 2,
        };
        let mut t = session(window, 1);
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(take(&mut t, 1, 1, key, i as u64), PushOutcome::Take);
        }
        assert_eq!((t.keys_remembered(), t.keys_forgotten_early()), (2, 1));
        assert!(matches!(
            take(&mut t, 1, 1, "c", 3),
            PushOutcome::Duplicate { .. }
        ));
        assert_eq!(take(&mut t, 1, 1, "a", 3), PushOutcome::Take);
    }

    #[test]
    fn a_saved_terminal_keeps_its_fence_and_keys_across_a_restore() {
        let mut t = session(DedupWindow::default(), 9);
        take(&mut t, 1, 9, "old", 0);
        take(&mut t, 1, 9, "new", 500_000);
        let mut r = Terminal::restore("pos-1", DedupWindow::default(), t.saved(), 650_000);
        assert_eq!(r.highest_epoch(), Some(9));
        r.open(2);
        assert_eq!(r.handle_hello(2, 8), HelloOutcome::Stale { highest: 9 });
        r.handle_hello(2, 9);
        // "old" left with its window; "new" is still a duplicate, its previous unknown.
        assert_eq!(take(&mut r, 2, 9, "old", 650_000), PushOutcome::Take);
        assert_eq!(
            take(&mut r, 2, 9, "new", 650_000),
            PushOutcome::Duplicate {
                copy: 2,
                previous: None
            }
        );
    }

    #[test]
    fn a_fence_reset_keeps_the_keys_and_closes_current_sessions() {
        let mut t = session(DedupWindow::default(), 1 << 60);
        take(&mut t, 1, 1 << 60, "k", 0);
        assert_eq!(t.reset_fence(), vec![1]);
        assert_eq!(t.highest_epoch(), None);
        t.open(2);
        assert!(matches!(
            t.handle_hello(2, 5),
            HelloOutcome::Accepted { .. }
        ));
        assert!(matches!(
            take(&mut t, 2, 5, "k", 1),
            PushOutcome::Duplicate { .. }
        ));
    }
}
