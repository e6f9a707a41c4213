//! One terminal's memory of the idempotency keys it accepted, for the deduplication that
//! `docs/pos-protocol.md` makes a MUST: a `(tenant, key)` is remembered for the window
//! after its first acceptance, and a repeat within it is a duplicate (answered with the
//! marker, not taken again).
//!
//! Memory is bounded twice: by time (keys leave when their window ends, so a steady push
//! rate `r` per terminal holds about `r × window` keys) and by count (at most
//! `capacity` keys per terminal). A key pushed out by the count before its window ended
//! breaks the protocol's promise for that key, so it is counted
//! (`keys_forgotten_early`) rather than silently lost.
//!
//! Not for: the epoch and session checks that come before deduplication (`record`), or
//! the farm-wide log of duplicates (`duplicates`).

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{counters::Counters, duplicates::Delivery};

/// How long and how many accepted keys a terminal remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupWindow {
    /// A key is a duplicate for this long after its first acceptance (the protocol's
    /// window: at least the gateway's `--idempotency-ttl`, 10 min by default).
    pub window: Duration,
    /// Most keys one terminal remembers; beyond it the oldest is forgotten early.
    pub capacity: usize,
}

impl Default for DedupWindow {
    /// 10 minutes (posgate's default `--idempotency-ttl`) and 1,000 keys per terminal:
    /// the count only bites above one push per 0.6 s to one terminal for 10 minutes, far
    /// beyond a till's rate (a load profile's 100 pushes/s over the whole farm holds
    /// 60,000 keys in all).
    fn default() -> Self {
        DedupWindow {
            window: Duration::from_secs(600),
            capacity: 1_000,
        }
    }
}

/// What the memory says about a key being accepted now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not accepted within the window: take it (it is remembered from now on).
    New,
    /// Accepted within the window: this is copy number `copy`, and `previous` is the
    /// copy before it.
    Repeat { copy: u32, previous: Delivery },
}

/// A remembered key: how many copies arrived, and the latest one.
#[derive(Debug)]
struct KeySeen {
    copies: u32,
    last: Delivery,
}

/// The accepted keys of one terminal within the window.
#[derive(Debug, Default)]
pub(crate) struct KeyMemory {
    seen: HashMap<Arc<str>, KeySeen>,
    /// First acceptances, oldest first: each remembered key once, so the front is always
    /// the next to leave (by time or by count).
    order: VecDeque<(Instant, Arc<str>)>,
}

impl KeyMemory {
    /// Looks `key` up at `now` as delivered by `this`, remembering it when new.
    pub(crate) fn check(
        &mut self,
        key: &str,
        this: &Delivery,
        now: Instant,
        limits: DedupWindow,
        c: &Counters,
    ) -> Seen {
        self.expire(now, limits.window, c);
        if let Some(seen) = self.seen.get_mut(key) {
            seen.copies += 1;
            let previous = std::mem::replace(&mut seen.last, this.clone());
            return Seen::Repeat {
                copy: seen.copies,
                previous,
            };
        }
        while self.order.len() >= limits.capacity.max(1) {
            let Some((_, oldest)) = self.order.pop_front() else {
                break;
            };
            self.seen.remove(&oldest);
            Counters::drop_one(&c.keys_remembered);
            Counters::bump(&c.keys_forgotten_early);
        }
        let key: Arc<str> = Arc::from(key);
        self.order.push_back((now, key.clone()));
        let first = KeySeen {
            copies: 1,
            last: this.clone(),
        };
        self.seen.insert(key, first);
        Counters::bump(&c.keys_remembered);
        Seen::New
    }

    /// Forgets the keys whose window has ended at `now`.
    fn expire(&mut self, now: Instant, window: Duration, c: &Counters) {
        while let Some((accepted, key)) = self.order.front() {
            if now.saturating_duration_since(*accepted) < window {
                return;
            }
            self.seen.remove(key);
            self.order.pop_front();
            Counters::drop_one(&c.keys_remembered);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    fn by(pod: &str, at_unix_ms: u64) -> Delivery {
        Delivery {
            pod: pod.into(),
            epoch: 1,
            at_unix_ms,
        }
    }

    #[test]
    fn a_key_is_a_duplicate_within_the_window_and_new_after_it() {
        let (mut m, c) = (KeyMemory::default(), Counters::default());
        let limits = DedupWindow {
            window: Duration::from_secs(600),
            capacity: 10,
        };
        let t0 = Instant::now();
        assert_eq!(m.check("k", &by("a", 1), t0, limits, &c), Seen::New);
        // The last instant of the window still remembers the key.
        let last = t0 + limits.window - Duration::from_millis(1);
        assert_eq!(
            m.check("k", &by("b", 2), last, limits, &c),
            Seen::Repeat {
                copy: 2,
                previous: by("a", 1)
            }
        );
        // The window runs from the first acceptance, not from the last repeat.
        assert_eq!(
            m.check("k", &by("c", 3), t0 + limits.window, limits, &c),
            Seen::New
        );
        assert_eq!(c.keys_remembered.load(Relaxed), 1);
        assert_eq!(c.keys_forgotten_early.load(Relaxed), 0);
    }

    #[test]
    fn the_count_bound_forgets_the_oldest_and_says_so() {
        let (mut m, c) = (KeyMemory::default(), Counters::default());
        let limits = DedupWindow {
            window: Duration::from_secs(600),
            capacity: 2,
        };
        let t0 = Instant::now();
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            let at = t0 + Duration::from_secs(i as u64);
            assert_eq!(m.check(key, &by("p", 0), at, limits, &c), Seen::New);
        }
        assert_eq!(c.keys_remembered.load(Relaxed), 2);
        assert_eq!(c.keys_forgotten_early.load(Relaxed), 1);
        let at = t0 + Duration::from_secs(3);
        assert!(matches!(
            m.check("c", &by("p", 0), at, limits, &c),
            Seen::Repeat { copy: 2, .. }
        ));
        // "a" was forgotten inside its window: taken again, as the count allowed.
        assert_eq!(m.check("a", &by("p", 0), at, limits, &c), Seen::New);
        // Expiry by time empties the memory and keeps the gauge true.
        let later = t0 + Duration::from_secs(700);
        assert_eq!(m.check("z", &by("p", 0), later, limits, &c), Seen::New);
        assert_eq!(c.keys_remembered.load(Relaxed), 1);
    }
}
