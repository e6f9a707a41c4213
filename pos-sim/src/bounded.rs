//! A bounded, shared log of records (stale-epoch refusals, duplicate deliveries, dark
//! intervals): the newest [`CAPACITY`] (or another capacity) kept, with a count of the
//! older ones dropped, so a reader knows when what it reads is incomplete.
//!
//! Not a queue to drain: readers take snapshots, the log keeps its records.

use std::{collections::VecDeque, sync::Mutex};

/// Most records kept per log unless it says otherwise; older ones are dropped (and
/// counted).
pub const CAPACITY: usize = 10_000;

/// The kept records, oldest first, and how many older ones were dropped.
#[derive(Debug)]
pub(crate) struct BoundedLog<T> {
    capacity: usize,
    inner: Mutex<(VecDeque<T>, u64)>,
}

impl<T> Default for BoundedLog<T> {
    fn default() -> Self {
        BoundedLog::with_capacity(CAPACITY)
    }
}

impl<T> BoundedLog<T> {
    /// A log keeping the newest `capacity` records (at least 1).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        BoundedLog {
            capacity: capacity.max(1),
            inner: Mutex::new((VecDeque::new(), 0)),
        }
    }
}

impl<T: Clone> BoundedLog<T> {
    pub(crate) fn record(&self, item: T) {
        let mut log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if log.0.len() >= self.capacity {
            // A ring: the oldest goes, O(1), and exactly the newest `capacity` stay.
            log.0.pop_front();
            log.1 += 1;
        }
        log.0.push_back(item);
    }

    /// The kept records, oldest first, and how many were dropped.
    pub(crate) fn snapshot(&self) -> (Vec<T>, u64) {
        let log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (log.0.iter().cloned().collect(), log.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_counts_the_dropped() {
        let log = BoundedLog::default();
        for n in 0..(CAPACITY as u64 + 1) {
            log.record(n);
        }
        let (kept, dropped) = log.snapshot();
        assert_eq!(dropped, 1);
        assert_eq!(kept.len(), CAPACITY);
        assert_eq!(kept.first(), Some(&1));
        assert_eq!(kept.last(), Some(&(CAPACITY as u64)));
    }

    #[test]
    fn another_capacity_is_respected() {
        let log = BoundedLog::with_capacity(4);
        for n in 0..7u64 {
            log.record(n);
        }
        assert_eq!(log.snapshot(), (vec![3, 4, 5, 6], 3));
    }
}
