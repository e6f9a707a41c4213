//! The receiver's memory of signed requests it accepted, so an exact copy is refused.
//!
//! A signature is accepted while its timestamp is within [`MAX_CLOCK_SKEW`] of this
//! pod's clock, so a request id must be remembered exactly that long:
//! until `timestamp + MAX_CLOCK_SKEW` (+1 s for the whole-second timestamp). After that
//! the timestamp check refuses the copy by itself. Ids are kept in per-second buckets of
//! their expiry, so forgetting costs only what expires.
//!
//! An id is reserved while its request is checked ([`ReplayWindow::reserve`]) and kept
//! only once the whole request proved authentic ([`Reserved::keep`]): a copy whose body
//! was altered on the way must not use up the id of the request it was copied from,
//! while a second copy arriving during the check is refused like any other.
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

    /// Reserves `key`, signed at `timestamp`, at `now` (both Unix seconds); `Err(Replayed)`
    /// if it was used or is being checked. Dropping the reservation without
    /// [`Reserved::keep`] frees the id again.
    pub fn reserve(
        &self,
        key: RequestKey,
        timestamp: u64,
        now: u64,
    ) -> Result<Reserved<'_>, AuthError> {
        let mut window = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        window.forget_expired(now);
        if window.seen.contains(&key) {
            return Err(AuthError::Replayed);
        }
        if window.seen.len() >= self.capacity {
            return Err(AuthError::WindowFull);
        }
        // The expiry is a function of the key (its timestamp is signed), so a key freed
        // and reserved again lands in the same bucket: a stale bucket entry can only
        // ever forget the key at the time it was due anyway.
        let expiry = timestamp + MAX_CLOCK_SKEW.as_secs() + 1;
        window.seen.insert(key);
        window.by_expiry.entry(expiry).or_default().push(key);
        Ok(Reserved {
            window: self,
            key: Some(key),
        })
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

/// A reserved request id; see [`ReplayWindow::reserve`].
#[derive(Debug)]
pub struct Reserved<'a> {
    window: &'a ReplayWindow,
    key: Option<RequestKey>,
}

impl Reserved<'_> {
    /// The request proved authentic: its id stays used until it expires.
    pub fn keep(mut self) {
        self.key = None;
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut window = self
                .window
                .inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            window.seen.remove(&key);
        }
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

    fn use_once(
        window: &ReplayWindow,
        key: RequestKey,
        ts: u64,
        now: u64,
    ) -> Result<(), AuthError> {
        window.reserve(key, ts, now).map(Reserved::keep)
    }

    #[test]
    fn a_reservation_dropped_unkept_frees_the_id_and_blocks_copies_meanwhile() {
        let window = ReplayWindow::default();
        let key = RequestKey::Id([3; 16]);
        let checking = window.reserve(key, 10, 10).unwrap();
        assert_eq!(use_once(&window, key, 10, 10), Err(AuthError::Replayed));
        drop(checking);
        assert_eq!(use_once(&window, key, 10, 10), Ok(()));
        assert_eq!(use_once(&window, key, 10, 10), Err(AuthError::Replayed));
    }

    #[test]
    fn a_key_is_refused_while_its_timestamp_is_acceptable_and_forgotten_after() {
        let window = ReplayWindow::default();
        let t = 1_000_000;
        let key = RequestKey::Id([7; 16]);
        assert_eq!(use_once(&window, key, t, t), Ok(()));
        assert_eq!(use_once(&window, key, t, t), Err(AuthError::Replayed));
        // Still refused at the last second the timestamp check would let it through.
        assert_eq!(
            use_once(&window, key, t, t + SKEW),
            Err(AuthError::Replayed)
        );
        // Another request is not affected.
        assert_eq!(use_once(&window, RequestKey::Id([8; 16]), t, t), Ok(()));
        // Past the skew window the timestamp refuses it; the id is gone from memory.
        assert_eq!(
            use_once(&window, RequestKey::Legacy([0; 32]), t, t + SKEW + 2),
            Ok(())
        );
        assert_eq!(window.len(), 1);
    }

    #[test]
    fn a_future_timestamp_is_remembered_until_it_is_stale() {
        let window = ReplayWindow::default();
        let (now, ahead) = (1_000_000, 1_000_000 + SKEW);
        let key = RequestKey::Id([1; 16]);
        use_once(&window, key, ahead, now).unwrap();
        assert_eq!(
            use_once(&window, key, ahead, ahead + SKEW),
            Err(AuthError::Replayed)
        );
    }

    #[test]
    fn a_full_window_refuses_instead_of_forgetting() {
        let window = ReplayWindow::with_capacity(2);
        let t = 5;
        use_once(&window, RequestKey::Id([1; 16]), t, t).unwrap();
        use_once(&window, RequestKey::Id([2; 16]), t, t).unwrap();
        assert_eq!(
            use_once(&window, RequestKey::Id([3; 16]), t, t),
            Err(AuthError::WindowFull)
        );
        assert_eq!(
            use_once(&window, RequestKey::Id([1; 16]), t, t),
            Err(AuthError::Replayed)
        );
        // Room again once the first ones expire.
        use_once(&window, RequestKey::Id([3; 16]), t + SKEW + 1, t + SKEW + 1).unwrap();
    }
}
