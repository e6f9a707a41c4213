//! The farm-wide log of stale-epoch refusals (`409` + `posgate-stale-epoch`): which pod
//! (its `posgate-pod` header), which terminal, which epoch, and when.
//!
//! The counters only say *how many* refusals there were. A load test that wants to check
//! what the refused pod did next (`docs/design.md`: a refused epoch makes the pod drop the
//! shard) needs the time, the pod and the terminal of each one, so they are kept here, in
//! a bounded queue: the newest [`CAPACITY`] refusals, with a count of the older ones
//! that were dropped so a reader knows when the log is incomplete.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Most refusals kept; older ones are dropped (and counted).
pub const CAPACITY: usize = 10_000;

/// One stale-epoch refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub terminal: String,
    /// The `posgate-pod` header of the refused request.
    pub pod: String,
    /// `hello` or `push`.
    pub kind: String,
    /// The refused epoch.
    pub epoch: u64,
    /// The highest epoch the terminal had seen (sent back in `posgate-stale-epoch`).
    pub highest: u64,
    pub at_unix_ms: u64,
}

/// `GET /refusals`: the kept refusals, oldest first, and how many older ones were dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusals {
    pub refusals: Vec<Refusal>,
    pub dropped: u64,
}

/// The bounded log.
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    inner: Mutex<Refusals>,
}

impl RefusalLog {
    pub(crate) fn record(&self, refusal: Refusal) {
        let mut log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if log.refusals.len() >= CAPACITY {
            // Draining the oldest half at once keeps the cost amortised O(1) per refusal
            // while the snapshot stays a plain Vec (refusals are rare: none in a healthy
            // handover).
            let drop = CAPACITY / 2;
            log.refusals.drain(..drop);
            log.dropped += drop as u64;
        }
        log.refusals.push(refusal);
    }

    pub(crate) fn snapshot(&self) -> Refusals {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(n: u64) -> Refusal {
        Refusal {
            terminal: format!("pos-{n:05}"),
            pod: "p".into(),
            kind: "hello".into(),
            epoch: n,
            highest: n + 1,
            at_unix_ms: n,
        }
    }

    #[test]
    fn keeps_the_newest_and_counts_the_dropped() {
        let log = RefusalLog::default();
        for n in 0..(CAPACITY as u64 + 1) {
            log.record(refusal(n));
        }
        let s = log.snapshot();
        assert_eq!(s.dropped, (CAPACITY / 2) as u64);
        assert_eq!(s.refusals.len() + s.dropped as usize, CAPACITY + 1);
        assert_eq!(s.refusals.first().unwrap().epoch, (CAPACITY / 2) as u64);
        assert_eq!(s.refusals.last().unwrap().epoch, CAPACITY as u64);
    }
}
