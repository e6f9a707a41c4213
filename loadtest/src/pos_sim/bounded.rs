//! A bounded, shared log of records (stale-epoch refusals, duplicate deliveries): the
//! newest [`CAPACITY`] kept, with a count of the older ones dropped, so a reader knows
//! when what it reads is incomplete.
//!
//! Not a queue to drain: readers take snapshots, the log keeps its records.

use std::sync::Mutex;

/// Most records kept per log; older ones are dropped (and counted).
pub const CAPACITY: usize = 10_000;

/// The kept records, oldest first, and how many older ones were dropped.
#[derive(Debug)]
pub(crate) struct BoundedLog<T> {
    inner: Mutex<(Vec<T>, u64)>,
}

impl<T> Default for BoundedLog<T> {
    fn default() -> Self {
        BoundedLog {
            inner: Mutex::new((Vec::new(), 0)),
        }
    }
}

impl<T: Clone> BoundedLog<T> {
    pub(crate) fn record(&self, item: T) {
        let mut log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if log.0.len() >= CAPACITY {
            // Draining the oldest half at once keeps the cost amortised O(1) per record
            // while the snapshot stays a plain Vec (these records are rare: none in a
            // healthy handover).
            let drop = CAPACITY / 2;
            log.0.drain(..drop);
            log.1 += drop as u64;
        }
        log.0.push(item);
    }

    /// The kept records, oldest first, and how many were dropped.
    pub(crate) fn snapshot(&self) -> (Vec<T>, u64) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
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
        assert_eq!(dropped, (CAPACITY / 2) as u64);
        assert_eq!(kept.len() + dropped as usize, CAPACITY + 1);
        assert_eq!(kept.first(), Some(&((CAPACITY / 2) as u64)));
        assert_eq!(kept.last(), Some(&(CAPACITY as u64)));
    }
}
