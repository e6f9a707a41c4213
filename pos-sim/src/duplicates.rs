//! The farm-wide log of duplicate deliveries: a push whose idempotency key the terminal
//! had accepted within its dedup window, with who delivered this copy and the one before
//! it (`posgate-pod`, epoch, time).
//!
//! The counters only say *how many* keys came twice. Whether a duplicate is a defect or
//! the known gap of a crash (the owner killed after delivering, its idempotency cache gone
//! with it, the caller's retry delivered by the next owner) depends on which pods
//! delivered and when, so a load test needs these records. The terminal answers each
//! repeat with the duplicate marker and does not take it again (`dedup`); the gateway
//! sending it is still what a load test looks at.

use serde::{Deserialize, Serialize};

use super::bounded::BoundedLog;

/// One accepted delivery of a key (`posgate_terminal::Delivery`, serializable).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The `posgate-pod` header of the push.
    pub pod: String,
    pub epoch: u64,
    pub at_unix_ms: u64,
}

impl From<posgate_terminal::Delivery> for Delivery {
    fn from(d: posgate_terminal::Delivery) -> Self {
        Delivery {
            pod: d.pod,
            epoch: d.epoch,
            at_unix_ms: d.at_unix_ms,
        }
    }
}

impl From<Delivery> for posgate_terminal::Delivery {
    fn from(d: Delivery) -> Self {
        posgate_terminal::Delivery {
            pod: d.pod,
            epoch: d.epoch,
            at_unix_ms: d.at_unix_ms,
        }
    }
}

/// A key accepted again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Duplicate {
    pub terminal: String,
    /// `tenant:key` (keys are unique per tenant), or the key without a tenant header.
    pub key: String,
    /// Which copy this was: 2 for the first repeat.
    pub copy: u32,
    /// The delivery of the copy before this one.
    pub previous: Delivery,
    pub this: Delivery,
}

/// `GET /duplicates`: the kept duplicates, oldest first, and how many were dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Duplicates {
    pub duplicates: Vec<Duplicate>,
    pub dropped: u64,
}

/// The bounded log of duplicates.
pub(crate) type DuplicateLog = BoundedLog<Duplicate>;

impl DuplicateLog {
    pub(crate) fn duplicates(&self) -> Duplicates {
        let (duplicates, dropped) = self.snapshot();
        Duplicates {
            duplicates,
            dropped,
        }
    }
}
