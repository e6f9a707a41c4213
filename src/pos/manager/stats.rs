//! The connection manager's counts for readiness, the cluster view and the metrics
//! sampler ([`SessionStats`]): terminals by state, connected and listed per shard, dials
//! queued.

use super::*;

impl<D: Directory> SessionStats for ConnectionManager<D> {
    /// Terminals of served shards not dialed even once yet; `None` while a shard's
    /// terminal list is still loading (so the count is not known).
    fn pending_first_dials(&self) -> Option<usize> {
        let shards = lock(&self.inner.shards);
        let mut pending = 0;
        for entry in shards.values() {
            // Not loaded yet: how many terminals it has is not known.
            if entry.listing == Listing::Unread {
                return None;
            }
            pending += entry.links.values().filter(|l| !l.shared.dialed()).count();
        }
        Some(pending)
    }

    /// Terminals of served shards by connection state.
    fn terminal_counts(&self) -> TerminalCounts {
        let shards = lock(&self.inner.shards);
        let mut counts = TerminalCounts::default();
        for link in shards.values().flat_map(|e| e.links.values()) {
            match link.state.borrow().state {
                LinkState::Disconnected => counts.disconnected += 1,
                LinkState::Dialing => counts.dialing += 1,
                LinkState::Connected { .. } => counts.connected += 1,
                LinkState::Backoff => counts.backoff += 1,
            }
        }
        counts
    }

    /// Connected and listed terminals per served shard.
    fn shard_counts(&self) -> Vec<ShardCount> {
        let shards = lock(&self.inner.shards);
        let mut counts: Vec<ShardCount> = shards
            .iter()
            .map(|(&shard, e)| ShardCount {
                shard,
                connected: e
                    .links
                    .values()
                    .filter(|l| matches!(l.state.borrow().state, LinkState::Connected { .. }))
                    .count(),
                // A link per terminal of the listing, once it is read.
                listed: (e.listing != Listing::Unread).then_some(e.links.len()),
            })
            .collect();
        counts.sort_unstable_by_key(|c| c.shard);
        counts
    }

    /// Dials waiting for the pacer now.
    fn dial_queue_depth(&self) -> usize {
        self.inner.links.pacer.queue_depth()
    }
}
