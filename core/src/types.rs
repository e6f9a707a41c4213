//! Small value types shared by the core, the stores and the adapters.
//!
//! They carry no behaviour beyond validation and formatting; the rules live in
//! `ring`, `lease` and `reconciler`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A shard number in `0..shards` (64 by default).
pub type ShardId = u32;

/// A fencing epoch. Every successful lease acquisition of a shard yields a strictly larger
/// epoch than any earlier acquisition of that shard, even across a Redis that restarted
/// empty (see `docs/design.md`, "Epochs").
pub type Epoch = u64;

/// A pod's identity in membership and leases. Unique per process lifetime
/// (`<hostname>-<pid>-<random>` by default), never reused after a restart.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PodId(String);

/// Why a string cannot be a [`PodId`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("pod id must be 1-128 characters of [A-Za-z0-9._:-], got {0:?}")]
pub struct InvalidPodId(pub String);

impl PodId {
    /// Accepts ids of 1-128 characters from `[A-Za-z0-9._:-]`: the characters are safe in
    /// Redis values, log lines, URLs and HTTP headers without escaping.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidPodId> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= 128
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
        if ok {
            Ok(PodId(id))
        } else {
            Err(InvalidPodId(id))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_id_validation() {
        assert!(PodId::new("web-7f9c-1234-abcdef").is_ok());
        assert!(PodId::new("a.b_c:d-e").is_ok());
        assert!(PodId::new("").is_err());
        assert!(PodId::new("has space").is_err());
        assert!(PodId::new("x".repeat(129)).is_err());
        assert!(PodId::new("é").is_err());
    }
}
