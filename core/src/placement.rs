//! The placement: the shard -> pod table the cluster follows, kept in the store and
//! changed in the fewest moves when the membership changes.
//!
//! Why a stored table and not [`Assignment::compute`] of the members alone: a function of
//! the member set cannot know which pod will join or leave next, so at every pod count
//! where `ceil(shards / pods)` drops it must reshuffle far more than the joining pod's
//! share (3-7x at 21 -> 22 or 31 -> 32; 1.8x the ideal on average over 4..=32 pods). A
//! table that remembers the current owners can move exactly what balance requires:
//! [`rebalance`] keeps every shard with its pod up to that pod's quota and moves only the
//! rest.
//!
//! Rules of [`rebalance`] (all deterministic, so every pod computes the same table from
//! the same stored table and member set):
//! 1. Quotas are `floor(shards / pods)` each, and the `shards % pods` spare `+1` slots go
//!    to the pods currently holding the most shards (ties: XXH3 of the pod id, then the
//!    id), which minimises the shards that must leave a pod.
//! 2. A pod above its quota keeps the shards nearest to it on the ring (the clockwise
//!    distance used by [`Assignment::compute`]; ties: lower shard id).
//! 3. Shards of departed pods and shards over quota are placed by the bounded ring rounds
//!    of [`Assignment::compute`] on the pods below quota.
//!
//! So the number of shards that change pod is exactly the shards of departed pods plus the
//! excess over quota, the minimum for a balanced table.
//!
//! [`step`] takes the cluster there under a move budget: a shard is *in motion* while it
//! is assigned to a live member that does not hold its lease yet (another pod holds it,
//! or nobody: its terminals are moving, or waiting for their new owner to claim them),
//! and a step admits *planned* moves, those of a shard its live placed owner holds, only
//! while fewer than `budget` shards are in motion. Every other move is free and never
//! waits: the shards of a departed pod (crashed, or drained after SIGTERM: nobody serves
//! them), and shards already in motion (re-aimed, still one shard in motion). Free moves
//! of departed pods' shards may take the count above the budget; planned moves then
//! wait until their new owners hold them. A slot is free again when the new owner holds
//! the lease, so a pod that joins but never claims holds up at most `budget` shards.
//! Because `rebalance` moves the fewest shards, each step leaves the rest of the way
//! shorter by what it admitted, so repeated steps settle on a balanced table.
//!
//! What it does not do: decide when to change the placement (the reconciler, after its
//! debounce and on later polls while steps remain), or store it (the `CoordStore`, with
//! a version compare-and-set, so a step is counted against the leases read in the same
//! snapshot as the version it replaces).

use std::cmp::Reverse;

use xxhash_rust::xxh3::xxh3_64;

use super::ring::{Assignment, Ring};
use super::types::{PodId, ShardId};

/// The table the cluster follows, with the version the store compares on every change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Grows by one with every change; the store only accepts a change made from the
    /// version it holds.
    pub version: u64,
    pub assignment: Assignment,
}

impl Placement {
    /// Version 0, no members, no owners: what a pod follows before it knows a placement.
    pub fn none(shards: u32) -> Placement {
        Placement {
            version: 0,
            assignment: Assignment::compute(&[], shards),
        }
    }

    /// The first placement of a cluster, when the store has none and no pod remembers one:
    /// the balanced table reached from nothing (every shard placed by the ring rounds).
    pub fn initial(pods: &[PodId], shards: u32) -> Placement {
        Placement::none(shards).next(pods, shards)
    }

    /// The placement for `pods` reached from this one with the fewest moves.
    pub fn next(&self, pods: &[PodId], shards: u32) -> Placement {
        Placement {
            version: self.version + 1,
            assignment: rebalance(&self.assignment, pods, shards),
        }
    }
}

/// One step from a placement toward its target under a move budget (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The table to write: `from`, with the free moves and the admitted planned moves of
    /// `target` applied. Equal to `from` when nothing may move.
    pub assignment: Assignment,
    /// Planned moves admitted into this step (each took a free slot of the budget).
    pub admitted: u32,
    /// Planned moves left waiting for a slot.
    pub waiting: u32,
}

/// The step from `from` toward `target` (its pods are the live members) when `holder`
/// tells who leases each shard (any pod, live or not), admitting planned moves while
/// fewer than `budget` shards are in motion. Planned moves are admitted round-robin over
/// the pods they go to, then by shard, so a scale-out of several pods starts on all of
/// them and every pod computes the same step from the same inputs.
pub fn step<'a>(
    from: &Assignment,
    target: &Assignment,
    holder: impl Fn(ShardId) -> Option<&'a PodId>,
    budget: u32,
) -> Step {
    let shards = target.owner_indices().len() as ShardId;
    let mut in_motion = 0u32;
    let mut owner: Vec<u32> = Vec::with_capacity(shards as usize);
    // Planned moves: (rank among the moves to the same pod, shard).
    let mut planned: Vec<(u32, ShardId)> = Vec::new();
    let mut ranks = vec![0u32; target.pods().len()];
    for s in 0..shards {
        let to = target.owner_indices()[s as usize];
        let placed = from
            .owner(s)
            .and_then(|p| target.pods().binary_search(p).ok())
            .map(|i| i as u32);
        let held_by_placed = placed.is_some() && holder(s) == from.owner(s);
        if placed.is_some() && !held_by_placed {
            in_motion += 1;
        }
        match placed {
            // Its live placed owner holds it: moving it sets it in motion.
            Some(p) if p != to && held_by_placed => {
                planned.push((ranks[to as usize], s));
                ranks[to as usize] += 1;
                owner.push(p);
            }
            _ => owner.push(to),
        }
    }
    planned.sort_unstable();
    let slots = budget.saturating_sub(in_motion) as usize;
    let admitted = planned.len().min(slots);
    for &(_, s) in &planned[..admitted] {
        owner[s as usize] = target.owner_indices()[s as usize];
    }
    Step {
        assignment: Assignment::from_parts(target.pods().to_vec(), owner, shards)
            .expect("every owner is a live member"),
        admitted: admitted as u32,
        waiting: (planned.len() - admitted) as u32,
    }
}

/// The balanced assignment for `pods` (any order, duplicates ignored) that moves the
/// fewest shards away from `prev`. See the module docs for the rules.
pub fn rebalance(prev: &Assignment, pods: &[PodId], shards: u32) -> Assignment {
    let mut pods = pods.to_vec();
    pods.sort();
    pods.dedup();
    let n = pods.len();
    if n == 0 {
        return Assignment::compute(&pods, shards);
    }
    // The current holder of each shard among the new members (`None`: departed or unset).
    let holder: Vec<Option<u32>> = (0..shards)
        .map(|s| {
            prev.owner(s)
                .and_then(|p| pods.binary_search(p).ok())
                .map(|i| i as u32)
        })
        .collect();
    let mut held = vec![0u32; n];
    for &h in holder.iter().flatten() {
        held[h as usize] += 1;
    }
    let (base, spare) = (shards / n as u32, (shards % n as u32) as usize);
    let mut by_holding: Vec<usize> = (0..n).collect();
    by_holding.sort_by_key(|&p| (Reverse(held[p]), xxh3_64(pods[p].as_str().as_bytes()), p));
    let mut quota = vec![base; n];
    for &p in by_holding.iter().take(spare) {
        quota[p] += 1;
    }

    let ring = Ring::new(&pods);
    let mut owner = vec![0u32; shards as usize];
    let mut pending: Vec<ShardId> = Vec::new();
    let mut mine: Vec<Vec<(u64, ShardId)>> = vec![Vec::new(); n];
    for s in 0..shards {
        match holder[s as usize] {
            Some(p) if held[p as usize] <= quota[p as usize] => owner[s as usize] = p,
            Some(p) => {
                let distance = ring
                    .walk(s, shards)
                    .find(|&(_, q)| q == p)
                    .map_or(u64::MAX, |(d, _)| d);
                mine[p as usize].push((distance, s));
            }
            None => pending.push(s),
        }
    }
    // Over-quota pods keep their nearest shards and give up the rest.
    for (p, shards_of_p) in mine.iter_mut().enumerate() {
        shards_of_p.sort_unstable();
        for (i, &(_, s)) in shards_of_p.iter().enumerate() {
            if i < quota[p] as usize {
                owner[s as usize] = p as u32;
            } else {
                pending.push(s);
            }
        }
    }
    let mut room: Vec<u32> = (0..n).map(|p| quota[p].saturating_sub(held[p])).collect();
    pending.sort_unstable();
    ring.fill(pending, shards, &mut room, &mut owner);
    Assignment::from_parts(pods, owner, shards).expect("every shard placed on a member")
}

#[cfg(test)]
mod tests;
