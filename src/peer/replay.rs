//! The receiver's memory of signed requests it accepted, so an exact copy is refused.
//!
//! A signature is accepted while its timestamp is within [`MAX_CLOCK_SKEW`] of this
//! pod's clock, so a request id must be remembered exactly that long:
//! until `timestamp + MAX_CLOCK_SKEW` (+1 s for the whole-second timestamp). After that
//! the timestamp check refuses the copy by itself. Ids are kept in per-second buckets of
//! their expiry, so forgetting costs only what expires.
//!
//! The window is bounded ([`MAX_REMEMBERED`]); when it is full a new request is refused
//! (`WindowFull`) rather than an id forgotten early: forgetting would reopen the replay.
//! Only requests with a valid MAC get here, so only the cluster's own traffic fills it.
//!
//! Not for: checking signatures (`signing`).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, PoisonError};

use super::signing::{AuthError, MAX_CLOCK_SKEW};

/// Most request ids remembered at once: 61 s of ~16,000 peer requests per second.
pub const MAX_REMEMBERED: usize = 1_000_000;

/// What identifies one accepted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestKey {
    /// A protocol-2 request id.
    Id([u8; 16]),
    /// A protocol-1 request, by its signature (unique per method, path, time and body).
    Legacy([u8; 32]),
}

#[derive(Debug, Default)]
struct Window {
    seen: HashSet<RequestKey>,
    /// Expiry (Unix seconds) -> the keys that expire then.
    by_expiry: BTreeMap<u64, Vec<RequestKey>>,
}

/// See the module docs. Shared by a pod's peer endpoints.
#[derive(Debug)]
pub struct ReplayWindow {
    inner: Mutex<Window>,
    capacity: usize,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow::with_capacity(MAX_REMEMBERED)
    }
}

impl ReplayWindow {
    pub fn with_capacity(capacity: usize) -> Self {
        ReplayWindow {
            inner: Mutex::new(Window::default()),
            capacity,
        }
    }

    /// Records `key`, signed at `timestamp`, as used at `now` (both Unix seconds);
    /// `Err(Replayed)` if it was used before.
    pub fn first_use(&self, key: RequestKey, timestamp: u64, now: u64) -> Result<(), AuthError> {
        let mut window = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        window.forget_expired(now);
        if window.seen.contains(&key) {
            return Err(AuthError::Replayed);
        }
        if window.seen.len() >= self.capacity {
            return Err(AuthError::WindowFull);
        }
        let expiry = timestamp + MAX_CLOCK_SKEW.as_secs() + 1;
        window.seen.insert(key);
        window.by_expiry.entry(expiry).or_default().push(key);
        Ok(())
    }

    /// Request ids remembered now.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .seen
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Window {
    fn forget_expired(&mut self, now: u64) {
        while let Some(entry) = self.by_expiry.first_entry() {
            if *entry.key() > now {
                return;
            }
            for key in entry.remove() {
                self.seen.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SKEW: u64 = MAX_CLOCK_SKEW.as_secs();

    #[test]
    fn a_key_is_refused_while_its_timestamp_is_acceptable_and_forgotten_after() {
        let window = ReplayWindow::default();
        let t = 1_000_000;
        let key = RequestKey::Id([7; 16]);
        assert_eq!(window.first_use(key, t, t), Ok(()));
        assert_eq!(window.first_use(key, t, t), Err(AuthError::Replayed));
        // Still refused at the last second the timestamp check would let it through.
        assert_eq!(window.first_use(key, t, t + SKEW), Err(AuthError::Replayed));
        // Another request is not affected.
        assert_eq!(window.first_use(RequestKey::Id([8; 16]), t, t), Ok(()));
        // Past the skew window the timestamp refuses it; the id is gone from memory.
        assert_eq!(
            window.first_use(RequestKey::Legacy([0; 32]), t, t + SKEW + 2),
            Ok(())
        );
        assert_eq!(window.len(), 1);
    }

    #[test]
    fn a_future_timestamp_is_remembered_until_it_is_stale() {
        let window = ReplayWindow::default();
        let (now, ahead) = (1_000_000, 1_000_000 + SKEW);
        let key = RequestKey::Id([1; 16]);
        window.first_use(key, ahead, now).unwrap();
        assert_eq!(
            window.first_use(key, ahead, ahead + SKEW),
            Err(AuthError::Replayed)
        );
    }

    #[test]
    fn a_full_window_refuses_instead_of_forgetting() {
        let window = ReplayWindow::with_capacity(2);
        let t = 5;
        window.first_use(RequestKey::Id([1; 16]), t, t).unwrap();
        window.first_use(RequestKey::Id([2; 16]), t, t).unwrap();
        assert_eq!(
            window.first_use(RequestKey::Id([3; 16]), t, t),
            Err(AuthError::WindowFull)
        );
        assert_eq!(
            window.first_use(RequestKey::Id([1; 16]), t, t),
            Err(AuthError::Replayed)
        );
        // Room again once the first ones expire.
        window
            .first_use(RequestKey::Id([3; 16]), t + SKEW + 1, t + SKEW + 1)
            .unwrap();
    }
}
