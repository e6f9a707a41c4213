//! `shard_of`: the one function every process must agree on.
//!
//! A terminal belongs to shard `xxh3_64(utf8(terminal_id)) % shards`, where xxh3_64 is
//! XXH3 64-bit with seed 0 (the reference `XXH3_64bits`). It is specified by its output,
//! not by this crate, so other tools (the simulator, a Python script, a SQL query) can
//! reproduce it; `docs/design.md` has test vectors that the test below pins.
//!
//! Never replace this with `std::hash::DefaultHasher`: its output may change between Rust
//! releases, and two pods built by different compilers would then disagree.

use super::types::ShardId;

/// The name recorded in the cluster metadata pinned in Redis; a pod using another hash
/// refuses to start.
pub const SHARD_HASH: &str = "xxh3-64-mod";

/// The shard of a terminal id. `shards` must be at least 1.
pub fn shard_of(terminal_id: &str, shards: u32) -> ShardId {
    assert!(shards > 0, "shard count must be positive");
    (xxhash_rust::xxh3::xxh3_64(terminal_id.as_bytes()) % u64::from(shards)) as ShardId
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test vectors also listed in docs/design.md. If this test fails, the hash changed and
    /// every deployed cluster would re-shard: do not "fix" the vectors.
    #[test]
    fn vectors_are_stable() {
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2d06800538d394c2);
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b"pos-00000"), 0x3da314011d491c7e);
        for (id, shard) in SHARD_VECTORS {
            assert_eq!(shard_of(id, 64), shard, "{id}");
        }
    }

    /// Cross-checked with Python's `xxhash.xxh3_64_intdigest(id.encode()) % 64`.
    const SHARD_VECTORS: [(&str, ShardId); 3] = [
        ("pos-00000", 62),
        ("pos-00001", 30),
        ("store-17:till-3", 41),
    ];

    #[test]
    fn spreads_terminals_evenly() {
        let mut counts = [0u32; 64];
        for i in 0..64_000 {
            counts[shard_of(&format!("pos-{i:05}"), 64) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        // 1,000 expected per shard; a binomial spread stays well within +-15%.
        assert!(*min > 850 && *max < 1150, "min {min} max {max}");
    }
}
