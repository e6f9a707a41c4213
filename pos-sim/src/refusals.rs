//! The farm-wide log of stale-epoch refusals (`409` + `posgate-stale-epoch`): which pod
//! (its `posgate-pod` header), which terminal, which epoch, and when.
//!
//! The counters only say *how many* refusals there were. A load test that wants to check
//! what the refused pod did next (`docs/design.md`: a refused epoch makes the pod drop the
//! shard) needs the time, the pod and the terminal of each one, so they are kept here, in
//! a [`BoundedLog`]: the newest [`CAPACITY`](super::bounded::CAPACITY) refusals, with a
//! count of the older ones that were dropped so a reader knows when the log is incomplete.

use serde::{Deserialize, Serialize};

use super::bounded::BoundedLog;

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

/// The bounded log of refusals.
pub(crate) type RefusalLog = BoundedLog<Refusal>;

impl RefusalLog {
    pub(crate) fn refusals(&self) -> Refusals {
        let (refusals, dropped) = self.snapshot();
        Refusals { refusals, dropped }
    }
}
