//! Redis key names of one posgate cluster, and the notification channel.
//!
//! Every name carries the same hash tag `{<cluster>}`, so all keys of a cluster live in
//! one Redis Cluster hash slot and every Lua script may touch any of them. Scripts never
//! build key names themselves: the names computed here are passed as `KEYS`, which is
//! what Redis Cluster requires to route a script.
//!
//! | name | type | content |
//! |---|---|---|
//! | `posgate:{<cluster>}:meta` | string | JSON [`ClusterMeta`](super::ClusterMeta) pinned by the first pod (`shards`, `shard_hash`, `ring`); pods with different settings refuse to join |
//! | `posgate:{<cluster>}:gen` | hash | the store generation: `id` (`<seconds>.<micros>-<random>` from Redis `TIME`) and `created_ms` (Redis `TIME`, ms). Created by the first script that finds it missing; a new id tells pods that Redis lost everything |
//! | `posgate:{<cluster>}:members` | sorted set | pod id -> registration expiry, ms by Redis `TIME`. A member is live while its score is >= now; expired entries are pruned by the snapshot script |
//! | `posgate:{<cluster>}:member-info` | hash | pod id -> JSON [`Member`](crate::core::membership::Member) (url, version, ring version, start time); written and removed together with `members` |
//! | `posgate:{<cluster>}:epochs` | hash | shard -> last fencing epoch handed out. Never deleted by posgate, so epochs stay monotonic while Redis keeps its data; after a data loss `max(last + 1, now_ms)` keeps them increasing |
//! | `posgate:{<cluster>}:lease:<shard>` | string | the shard's lease: value = owner pod id. Its epoch is the `epochs` entry of the shard. Held while the key exists and its owner is a live member, or its owner's `pod-lease` exists, or it has an expiry of its own (`PX` lease TTL by Redis time, renewed per lease while any member is of a release before pod leases); a key that is none of these is an orphan, deleted by the next snapshot and taken over by an acquire |
//! | `posgate:{<cluster>}:pod-lease:<pod>` | string, `PX` ttl | `1` while the pod keeps its leases by one key: extended to the lease TTL by each of its acquire and renew calls, deleted by the pod when a member of an earlier release appears. While it exists, no lease of the pod has an expiry of its own. At most one per pod, gone a lease TTL after the pod stops |
//! | `posgate:{<cluster>}:terminals:<shard>` | hash | the terminal directory of one shard: terminal id -> JSON `{"addr", "server_name"}` ([`Entry`](crate::store::directory::Entry)); written by `posgate terminals`, read by the shard's owner |
//! | `posgate:{<cluster>}:terminal-labels:<shard>` | hash | the labels of the shard's terminals that have any: terminal id -> text form `k=v;k=v` ([`Labels`](crate::api::Labels)), at most 16 pairs of at most 127 bytes each. Written in the same script call as the terminal's entry (`directory_upsert.lua`, `directory_remove.lua`, `directory_restore.lua`) and counted in the shard's version; kept apart from the JSON entry so that a previous release's import, which rewrites that JSON, cannot drop labels. Read by the shard's owner with its terminals; a field whose terminal is absent from `terminals:<shard>` (left by a previous release's `remove`) is ignored. Lost with the directory, and written back with it by the owners (`restore`) |
//! | `posgate:{<cluster>}:terminals-version` | hash | shard -> directory version, set to `max(previous + 1, TIME ms)` by every write that changes the shard's terminals; owners poll it |
//! | `posgate:{<cluster>}:terminals-restored` | hash | shard -> JSON `{"pod", "epoch", "generation", "read_in", "version", "terminals"}`: who wrote the shard's directory back from memory after the store lost it (`directory_restore.lua`), holding the lease with which epoch, into which generation, read in which, at which version, how many terminals. Written only by the write-back, never read by posgate (it is for operators and tests); a later import leaves it, so a version above `version` means the shard changed since. Pods of the previous release never touch it |
//! | `posgate:{<cluster>}:placement` | hash | the placement every pod follows ([`Placement`](crate::core::placement::Placement)): `version` (grows by one per change) and `table` (JSON `{"pods": [sorted ids], "owner": [index into pods, per shard]}`). Replaced only by `place.lua` when the caller names the current version; lost with the rest of the data, and then put back by the pods that remember it |
//! | `posgate:{<cluster>}:events` | pub/sub channel | notifications `join <pod>`, `leave <pod>`, `release <shard>`, `placement <version>`; receivers treat any message as "poll now", except `queue <shard> <terminal>` (a push queued by a pod that does not hold the shard: its owner's drain looks) and `broadcast <id>` (a broadcast created: every pod looks for the unexpired ones) |
//! | `posgate:{<cluster>}:queue:<terminal>` | hash | pushes with a TTL to the terminal that are not final: id ([`push_id`](super::queue::push_id)) -> JSON [`Record`](super::queue::Record) |
//! | `posgate:{<cluster>}:queue-bodies:<terminal>` | hash | their bodies: id -> bytes |
//! | `posgate:{<cluster>}:queue-order:<terminal>` | sorted set | their order: id -> acceptance sequence |
//! | `posgate:{<cluster>}:queue-collapse:<terminal>` | hash | `<tenant>\n<collapse key>` -> id of the queued push with it |
//! | `posgate:{<cluster>}:queue-waiting:<shard>` | hash | terminal -> its pushes not final: where an owner's drain starts |
//! | `posgate:{<cluster>}:queue-done:<tenant>` | hash | the tenant's final records kept for the retention window: id -> JSON |
//! | `posgate:{<cluster>}:queue-drops:<tenant>` | sorted set | id -> when its final record is dropped (ms) |
//! | `posgate:{<cluster>}:queue-feed:<tenant>` | stream | the tenant's final records in the order they became final (field `r`), at most `queue::FEED_MAX` |
//! | `posgate:{<cluster>}:queue-seq` | string | the acceptance sequence (`INCR`) |
//! | `posgate:{<cluster>}:broadcast:<id>` | hash | one broadcast ([`broadcast_id`](super::broadcast::broadcast_id)): `meta` (JSON [`Broadcast`](super::broadcast::Broadcast)) and `body`; expires (`PEXPIREAT`) at its expiry plus the retention, like every key of the broadcast |
//! | `posgate:{<cluster>}:broadcasts` | sorted set | id -> expiry ms: the unexpired ones (at most `--broadcast-max-active`), which owners walk |
//! | `posgate:{<cluster>}:broadcast-progress:<id>` | hash | shard -> JSON [`ShardProgress`](super::broadcast::ShardProgress), written by the shard's holder |
//! | `posgate:{<cluster>}:broadcast-marks:<id>:<shard>` | hash | terminal -> [`Mark`](super::broadcast::Mark) text, written by the shard's holder |
//! | `posgate:{<cluster>}:queue-usage` | hash | bytes charged: `bytes` (cluster), `t:<tenant>`; `n` pushes not final |
//!
//! What this module does not do: talk to Redis or decide key lifetimes (the scripts in
//! `store/lua/` do that).

use std::fmt;

use crate::core::ShardId;

/// Why a string cannot name a cluster.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("cluster name must be 1-64 characters of [A-Za-z0-9._-], got {0:?}")]
pub struct InvalidCluster(pub String);

/// The key names of one cluster. Cheap to clone; computing a name allocates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    cluster: String,
    /// `posgate:{<cluster>}:`, shared by every name.
    prefix: String,
}

impl Keys {
    /// Key names for `cluster`. The name becomes a hash tag, so it must not contain
    /// braces; the allowed set is also safe in logs and metrics labels.
    pub fn new(cluster: &str) -> Result<Keys, InvalidCluster> {
        let ok = !cluster.is_empty()
            && cluster.len() <= 64
            && cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !ok {
            return Err(InvalidCluster(cluster.to_string()));
        }
        Ok(Keys {
            cluster: cluster.to_string(),
            prefix: format!("posgate:{{{cluster}}}:"),
        })
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    fn name(&self, suffix: impl fmt::Display) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// Pinned cluster metadata (JSON string).
    pub fn meta(&self) -> String {
        self.name("meta")
    }

    /// Store generation (hash `id`, `created_ms`).
    pub fn generation(&self) -> String {
        self.name("gen")
    }

    /// Registrations: sorted set pod -> expiry ms.
    pub fn members(&self) -> String {
        self.name("members")
    }

    /// Registration details: hash pod -> JSON member.
    pub fn member_info(&self) -> String {
        self.name("member-info")
    }

    /// Last epoch per shard: hash shard -> epoch.
    pub fn epochs(&self) -> String {
        self.name("epochs")
    }

    /// The lease of `shard`: string owner pod id, with a `PX` expiry or kept by the
    /// owner's [`Keys::pod_lease`].
    pub fn lease(&self, shard: ShardId) -> String {
        self.name(format_args!("lease:{shard}"))
    }

    /// The pod lease of `pod`: string `1` with a `PX` expiry, extended by each of its
    /// lease calls, while none of its leases has an expiry of its own.
    pub fn pod_lease(&self, pod: &crate::core::PodId) -> String {
        self.name(format_args!("pod-lease:{pod}"))
    }

    /// What every key name of the cluster starts with: the scripts that touch many
    /// leases or look up their owners' pod leases (`acquire.lua`, `renew.lua`,
    /// `snapshot.lua`) name them from it, as `<prefix>lease:<shard>` and
    /// `<prefix>pod-lease:<pod>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// What the last drained release of `shard` left for its next holder: string, the
    /// releasing pod's member record (JSON) with a `PX` expiry (the drain budget).
    pub fn release_note(&self, shard: ShardId) -> String {
        self.name(format_args!("release-note:{shard}"))
    }

    /// The terminal directory of `shard`: hash terminal id -> JSON entry.
    pub fn terminals(&self, shard: ShardId) -> String {
        self.name(format_args!("terminals:{shard}"))
    }

    /// The labels of `shard`'s terminals: hash terminal id -> labels text.
    pub fn terminal_labels(&self, shard: ShardId) -> String {
        self.name(format_args!("terminal-labels:{shard}"))
    }

    /// Directory versions: hash shard -> version.
    pub fn terminals_version(&self) -> String {
        self.name("terminals-version")
    }

    /// Write-back records: hash shard -> JSON (who wrote the shard's directory back).
    pub fn terminals_restored(&self) -> String {
        self.name("terminals-restored")
    }

    /// The stored placement: hash `version`, `table` (JSON).
    pub fn placement(&self) -> String {
        self.name("placement")
    }

    /// The pub/sub channel for join, leave and release notifications.
    pub fn events(&self) -> String {
        self.name("events")
    }

    /// A terminal's pushes not final: hash id -> record JSON.
    pub fn queue(&self, terminal: &str) -> String {
        self.name(format_args!("queue:{terminal}"))
    }

    /// Their bodies: hash id -> bytes.
    pub fn queue_bodies(&self, terminal: &str) -> String {
        self.name(format_args!("queue-bodies:{terminal}"))
    }

    /// Their order: sorted set id -> acceptance sequence.
    pub fn queue_order(&self, terminal: &str) -> String {
        self.name(format_args!("queue-order:{terminal}"))
    }

    /// Queued pushes by collapse key: hash `tenant\ncollapse key` -> id.
    pub fn queue_collapse(&self, terminal: &str) -> String {
        self.name(format_args!("queue-collapse:{terminal}"))
    }

    /// A shard's terminals with pushes not final: hash terminal -> count.
    pub fn queue_waiting(&self, shard: ShardId) -> String {
        self.name(format_args!("queue-waiting:{shard}"))
    }

    /// A tenant's final records: hash id -> record JSON.
    pub fn queue_done(&self, tenant: &str) -> String {
        self.name(format_args!("queue-done:{tenant}"))
    }

    /// When each of a tenant's final records is dropped: sorted set id -> ms.
    pub fn queue_drops(&self, tenant: &str) -> String {
        self.name(format_args!("queue-drops:{tenant}"))
    }

    /// A tenant's outcome feed: stream of final records.
    pub fn queue_feed(&self, tenant: &str) -> String {
        self.name(format_args!("queue-feed:{tenant}"))
    }

    /// The acceptance sequence: string counter.
    pub fn queue_seq(&self) -> String {
        self.name("queue-seq")
    }

    /// One broadcast: hash `meta`, `body`.
    pub fn broadcast(&self, id: &str) -> String {
        self.name(format_args!("broadcast:{id}"))
    }

    /// The unexpired broadcasts: sorted set id -> expiry ms.
    pub fn broadcasts(&self) -> String {
        self.name("broadcasts")
    }

    /// What each shard's owner recorded of broadcast `id`: hash shard -> JSON.
    pub fn broadcast_progress(&self, id: &str) -> String {
        self.name(format_args!("broadcast-progress:{id}"))
    }

    /// The marks of `shard`'s terminals for broadcast `id`: hash terminal -> mark.
    pub fn broadcast_marks(&self, id: &str, shard: ShardId) -> String {
        self.name(format_args!("broadcast-marks:{id}:{shard}"))
    }

    /// Bytes charged to the queue: hash `bytes`, `n`, `t:<tenant>`.
    pub fn queue_usage(&self) -> String {
        self.name("queue-usage")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_one_hash_tag() {
        let k = Keys::new("prod-eu.1").unwrap();
        assert_eq!(k.cluster(), "prod-eu.1");
        let all = [
            k.meta(),
            k.generation(),
            k.members(),
            k.member_info(),
            k.epochs(),
            k.lease(0),
            k.lease(63),
            k.events(),
            k.terminals(5),
            k.terminals_version(),
            k.terminals_restored(),
            k.queue("pos-1"),
            k.queue_bodies("pos-1"),
            k.queue_order("pos-1"),
            k.queue_collapse("pos-1"),
            k.queue_waiting(3),
            k.queue_done("acme"),
            k.queue_drops("acme"),
            k.queue_feed("acme"),
            k.queue_seq(),
            k.queue_usage(),
        ];
        for name in &all {
            assert!(name.starts_with("posgate:{prod-eu.1}:"), "{name}");
        }
        assert_eq!(k.lease(7), "posgate:{prod-eu.1}:lease:7");
        assert_eq!(format!("{}lease:7", k.prefix()), k.lease(7));
        assert_eq!(
            format!("{}pod-lease:p-1", k.prefix()),
            k.pod_lease(&crate::core::PodId::new("p-1").unwrap())
        );
        assert_eq!(k.generation(), "posgate:{prod-eu.1}:gen");
        assert_eq!(k.terminals(9), "posgate:{prod-eu.1}:terminals:9");
        assert_eq!(
            k.terminals_version(),
            "posgate:{prod-eu.1}:terminals-version"
        );
    }

    #[test]
    fn cluster_name_validation() {
        assert!(Keys::new("default").is_ok());
        assert!(Keys::new(&"a".repeat(64)).is_ok());
        assert!(Keys::new("").is_err());
        assert!(Keys::new(&"a".repeat(65)).is_err());
        assert!(Keys::new("a}b").is_err());
        assert!(Keys::new("a b").is_err());
        assert!(Keys::new("a:b").is_err());
    }
}
