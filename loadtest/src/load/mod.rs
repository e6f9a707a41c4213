//! The load and fault harness behind `posgate-load`: it starts a private `redis-server`,
//! `pos-sim` processes, the terminal directory import and N `posgate serve` processes (each
//! behind its own cuttable TCP proxy to Redis), sends pushes at a set rate, injects one
//! event per scenario (scale, SIGTERM, kill -9, SIGSTOP, Redis restart, every pod cut off
//! from Redis, one pod or half of them cut off, a one-pod cluster cut off; or, for
//! `rolling-upgrade`, every pod replaced from the previous release's binary by this one) and reports what the terminals and the push callers saw. Pushes that were not
//! answered 200 are retried with the same key, as a real sender would, so keys delivered
//! twice are counted for real (and classified by cause). A private Prometheus scrapes
//! the pods with the project's alert rules; each scenario reports and gates the alerts it
//! raised and checks every dashboard query ([`alerts`], [`panels`]).
//!
//! Everything runs as real processes on loopback; this crate never links posgate.
//! Children are killed when their guards drop, so an error, a panic or Ctrl-C in the
//! runner leaves nothing behind.

pub mod alerts;
pub mod analysis;
pub mod broadcast;
pub mod calibrate;
pub mod charts;
pub mod checks;
pub mod cluster;
pub mod dark;
pub mod duplicates;
mod error;
pub mod floor;
pub mod handover;
pub mod host;
pub mod http;
pub mod later;
pub mod measure;
pub mod observe;
pub mod outage;
pub mod panels;
pub mod pods;
pub mod procs;
pub mod prometheus;
pub mod proxy;
pub mod push_summary;
pub mod pushgen;
pub mod redis;
pub mod report;
pub mod rules;
pub mod scenarios;
pub mod sentinels;
pub mod sims;
pub mod upgrade;

pub use error::LoadError;

/// Milliseconds since the Unix epoch (the clock pos-sim stamps its events with).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The terminal -> shard rule of `docs/design.md`: `xxh3_64(id) % shards`.
pub fn shard_of(id: &str, shards: u32) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(id.as_bytes()) % u64::from(shards)) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn shard_vectors_match_the_design_doc() {
        assert_eq!(super::shard_of("pos-00000", 64), 62);
        assert_eq!(super::shard_of("pos-00001", 64), 30);
        assert_eq!(super::shard_of("store-17:till-3", 64), 41);
    }
}
