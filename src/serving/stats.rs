//! What the connection layer reports about its sessions, for metrics, readiness and the
//! cluster view: counts only. Pushes find sessions through `crate::pos` itself.
//!
//! Not for: delivering (`crate::push`) or deciding anything.

use crate::core::ShardId;

/// Terminals of served shards by connection state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TerminalCounts {
    pub disconnected: usize,
    pub dialing: usize,
    pub connected: usize,
    pub backoff: usize,
}

/// One served shard's terminals: connected now, and in its directory listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardCount {
    pub shard: ShardId,
    pub connected: usize,
    /// Terminals of the shard's directory listing; `None` while it is still loading.
    pub listed: Option<usize>,
}

/// Counts the connection layer keeps about its sessions.
pub trait SessionStats: Send + Sync + 'static {
    /// Terminals of served shards not dialed once yet (`None`: not known yet).
    fn pending_first_dials(&self) -> Option<usize>;
    /// Terminals of served shards by connection state.
    fn terminal_counts(&self) -> TerminalCounts;
    /// Dials waiting for the pacer.
    fn dial_queue_depth(&self) -> usize;
    /// Connected and listed terminals per served shard, by shard.
    fn shard_counts(&self) -> Vec<ShardCount>;
}

/// A pod without a connection layer (coordination-only tests): no terminals at all.
#[derive(Debug, Default)]
pub struct NoSessions;

impl SessionStats for NoSessions {
    fn pending_first_dials(&self) -> Option<usize> {
        Some(0)
    }

    fn terminal_counts(&self) -> TerminalCounts {
        TerminalCounts::default()
    }

    fn dial_queue_depth(&self) -> usize {
        0
    }

    fn shard_counts(&self) -> Vec<ShardCount> {
        Vec::new()
    }
}
