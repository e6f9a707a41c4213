//! A `PosFarm` of simulated terminals (TLS + HTTP/2 on loopback) for the end-to-end tests:
//! the file with its CA for the pods' POS TLS settings, its terminals as directory
//! entries, imported into a test's Redis; and what the tests ask of the farm (does every
//! terminal hold a current session).
//!
//! Not for: the pods ([`super::pod`]) or faults (the farm's own `set_faults`,
//! `drop_connections`).

use std::ops::Deref;
use std::path::PathBuf;
use std::time::Duration;

use posgate::core::shard::shard_of;
use posgate::core::{CoreConfig, ShardId};
use posgate::pod::PodHandle;
use posgate::store::directory::{DirectoryAdmin, Terminal};
use posgate::store::redis::RedisStore;
use posgate_pos_sim::{FarmConfig, PosFarm};

use super::pod::{store_options, CLUSTER, SHARDS};
use super::RedisServer;

/// A farm of terminals `0..n` on free loopback ports.
pub fn config(n: u64) -> FarmConfig {
    let mut config = FarmConfig::new(0..n);
    config.port = 0;
    config
}

/// A running farm (it derefs to the `PosFarm`), its terminal ids and its CA in
/// `ca_file`, in the temporary directory `dir` (tests may add files there).
pub struct Farm {
    sim: PosFarm,
    pub ids: Vec<String>,
    pub ca_file: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Deref for Farm {
    type Target = PosFarm;

    fn deref(&self) -> &PosFarm {
        &self.sim
    }
}

impl Farm {
    /// Starts the farm and writes its CA file; imports nothing.
    pub async fn start(config: FarmConfig) -> Farm {
        let sim = PosFarm::start(config).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("pos-ca.pem");
        std::fs::write(&ca_file, sim.ca_pem()).unwrap();
        let ids = sim.terminals().into_iter().map(|t| t.id).collect();
        Farm {
            sim,
            ids,
            ca_file,
            dir,
        }
    }

    /// Starts the farm and imports its terminals into `redis`'s directory.
    pub async fn with_directory(redis: &RedisServer, config: FarmConfig) -> Farm {
        let farm = Farm::start(config).await;
        import(redis, &farm.entries()).await;
        farm
    }

    /// The farm's terminals as directory entries.
    pub fn entries(&self) -> Vec<Terminal> {
        self.sim
            .terminals()
            .iter()
            .map(|t| Terminal::new(&t.id, &t.addr.to_string(), Some(&t.server_name)).unwrap())
            .collect()
    }

    /// Every terminal has exactly one open connection, holding a current (not
    /// superseded) session at the highest epoch the terminal has seen. Says nothing
    /// about which pod.
    pub fn all_settled(&self) -> bool {
        self.ids.iter().all(|id| {
            self.sim.terminal_report(id).is_some_and(|r| {
                r.open_connections.len() == 1
                    && !r.open_connections[0].superseded
                    && r.open_connections[0].session_epoch.is_some()
                    && r.open_connections[0].session_epoch == r.highest_epoch
            })
        })
    }

    /// Every terminal has an open, not superseded session whose epoch is the one its
    /// shard is served with by one of `pods` (and every shard is served).
    pub fn all_sessions_current(&self, pods: &[&PodHandle]) -> bool {
        let now = std::time::Instant::now();
        let epoch_of = |shard: ShardId| pods.iter().find_map(|p| p.serving.serving(shard, now));
        self.ids.iter().all(|id| {
            let Some(epoch) = epoch_of(shard_of(id, SHARDS)) else {
                return false;
            };
            self.sim.terminal_report(id).is_some_and(|report| {
                report
                    .open_connections
                    .iter()
                    .any(|c| c.session_epoch == Some(epoch) && !c.superseded)
            })
        })
    }
}

/// Imports `entries` into the terminal directory of [`CLUSTER`] in `redis`.
pub async fn import(redis: &RedisServer, entries: &[Terminal]) {
    let admin = RedisStore::connect(&redis.url(), CLUSTER, store_options())
        .await
        .unwrap();
    admin.upsert(SHARDS, entries).await.unwrap();
}

/// How long a fresh cluster may take until every terminal is connected: claims are held
/// one member TTL, then the debounce and a store poll, then the dialing.
pub fn connect_limit() -> Duration {
    let c = CoreConfig::fast();
    c.member_ttl + c.debounce + c.poll_interval + Duration::from_secs(15)
}
