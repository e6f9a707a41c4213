//! Whom a pod asks for the terminals of a shard it takes over: the pod that announced
//! it drains the shard (`POST /internal/v1/draining/{shard}`), or without one the last
//! holder this pod saw (`ServingHook::taken_over`); an entry older than the drain budget
//! is stale (that drain has ended).

use super::*;

impl<D: Directory> ConnectionManager<D> {
    /// A peer announced that it drains `shard`: if this pod acquires it, it asks that
    /// peer before dialing. `false` when this pod does not walk (handover off).
    pub fn expect_predecessor(&self, shard: ShardId, from: Member) -> bool {
        if self.inner.walk.is_none() {
            return false;
        }
        lock(&self.inner.predecessors).insert(shard, (from, Instant::now()));
        true
    }
}

impl<D> Inner<D> {
    /// The predecessor recorded for `shard`, unless older than the drain budget.
    pub(super) fn fresh_predecessor(&self, shard: ShardId) -> Option<Member> {
        let predecessors = lock(&self.predecessors);
        let (member, since) = predecessors.get(&shard)?;
        (since.elapsed() < self.drain_budget).then(|| member.clone())
    }
}
