//! In-process pods for the integration tests: a `PodConfig` with the fast timings of
//! `CoreConfig::fast()` (lease TTL 3 s, renew 1 s, close budget 300 ms), a test cluster
//! secret and a store timeout of 300 ms, advertising the loopback listener it was given;
//! started against Redis with the POS connection manager; and what the tests ask of
//! running pods (which shards they serve) and how they stop them.
//!
//! Not for: `posgate serve` processes ([`super::binary`]) or a cluster with observers
//! ([`super::cluster`]).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::{Duration, Instant};

use posgate::config::{PodConfig, PosConfig};
use posgate::core::membership::Member;
use posgate::core::{CoreConfig, Epoch, PodId, ShardId};
use posgate::credentials::{ApiTokens, ClusterSecret};
use posgate::pod::{Pod, PodHandle};
use posgate::pos::tls::TlsFiles;
use posgate::store::redis::{RedisOptions, RedisStore};
use tokio::net::TcpListener;

use super::farm::Farm;

/// The shard count of every test cluster (the default).
pub const SHARDS: u32 = 64;
/// The cluster name of the test pods (each test has a Redis of its own).
pub const CLUSTER: &str = "test";
/// Redis response and connect timeout, and the driver's own bound on store calls. A cut
/// proxy blackholes requests, so this is how long a call takes to fail.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(300);

/// Redis options with [`STORE_TIMEOUT`].
pub fn store_options() -> RedisOptions {
    RedisOptions {
        response_timeout: STORE_TIMEOUT,
        connect_timeout: STORE_TIMEOUT,
        ..Default::default()
    }
}

/// A member record for a test that registers or shows one itself: `id` at
/// `http://<id>.test:8080`, peer protocol 2, no optional capability; change fields with
/// `Member { .., ..member(id) }`.
pub fn member(id: &str) -> Member {
    Member {
        pod: PodId::new(id).unwrap(),
        url: format!("http://{id}.test:8080"),
        version: "test".into(),
        ring_version: posgate::core::ring::RING_VERSION.into(),
        started_ms: 1,
        peer_protocol: 2,
        handover: 0,
        queue: 0,
        batch: 0,
        broadcast: 0,
        moves: 0,
        pod_lease: 0,
    }
}

/// A listener on a free loopback port and its `http://` URL.
pub async fn listen() -> (TcpListener, String) {
    let listener = posgate::http::bind(([127, 0, 0, 1], 0).into()).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// Pod `id` of [`CLUSTER`] advertising `url`: fast timings, the test cluster secret,
/// [`STORE_TIMEOUT`]; no API tokens, default POS and push settings.
pub fn config(id: &str, url: &str) -> PodConfig {
    let secret = ClusterSecret::new(*b"integration-test-cluster-secret").unwrap();
    let mut config = PodConfig::new(
        PodId::new(id).unwrap(),
        url,
        CoreConfig::fast(),
        Some(secret),
    );
    config.cluster = CLUSTER.to_string();
    config.store_timeout = STORE_TIMEOUT;
    config
}

/// POS settings trusting the CA in `ca_file`, dialing at most `dial_rate` terminals per
/// second; the rest default.
pub fn pos(ca_file: &Path, dial_rate: u32) -> PosConfig {
    PosConfig {
        tls: TlsFiles {
            ca_file: Some(ca_file.to_owned()),
            client: None,
        },
        dial_rate: NonZeroU32::new(dial_rate).unwrap(),
        ..PosConfig::default()
    }
}

/// A whole pod (driver, HTTP, POS connections) of `config` on `listener`, against the
/// Redis at `redis_url` (connected lazily: the pod may start before Redis answers).
pub fn start_with_terminals(
    config: PodConfig,
    redis_url: &str,
    listener: TcpListener,
) -> PodHandle {
    start_with_store(config, redis_url, store_options(), listener)
}

/// [`start_with_terminals`] with Redis options of the test's own.
fn start_with_store(
    config: PodConfig,
    redis_url: &str,
    options: RedisOptions,
    listener: TcpListener,
) -> PodHandle {
    super::capture_logs();
    let store = RedisStore::connect_lazy(redis_url, CLUSTER, options).unwrap();
    Pod::start_with_terminals(config, store, listener).unwrap()
}

/// What a test pod runs with besides its name, store URL and terminals: its timings and
/// Redis options ([`CoreConfig::fast`] and [`store_options`] by default).
#[derive(Clone)]
pub struct Setup {
    pub core: CoreConfig,
    pub store: RedisOptions,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            core: CoreConfig::fast(),
            store: store_options(),
        }
    }
}

/// Pod `name` set up as `setup` against the Redis at `redis_url`, dialing the terminals
/// of `farm` at most `dial_rate` per second, with the push API open to `tokens`
/// (`tenant:token,...`): its handle and base URL.
pub async fn start_with_api(
    setup: &Setup,
    name: &str,
    redis_url: &str,
    farm: &Farm,
    dial_rate: u32,
    tokens: &str,
) -> (PodHandle, String) {
    let (listener, url) = listen().await;
    let mut config = config(name, &url);
    config.core = setup.core.clone();
    config.api_tokens = Some(ApiTokens::from_env_value(tokens).unwrap());
    config.pos = pos(&farm.ca_file, dial_rate);
    (
        start_with_store(config, redis_url, setup.store.clone(), listener),
        url,
    )
}

/// Who serves each shard now, with which epoch, of `pods` (each named).
pub fn owners<'a, N: Clone + 'a>(
    pods: impl IntoIterator<Item = (&'a N, &'a PodHandle)>,
) -> BTreeMap<ShardId, (N, Epoch)> {
    let now = Instant::now();
    let mut owners = BTreeMap::new();
    for (name, handle) in pods {
        for shard in 0..SHARDS {
            if let Some(epoch) = handle.serving.serving(shard, now) {
                owners.insert(shard, (name.clone(), epoch));
            }
        }
    }
    owners
}

/// The shards `pod` serves now.
pub fn served(pod: &PodHandle) -> Vec<ShardId> {
    let now = Instant::now();
    (0..SHARDS)
        .filter(|&s| pod.serving.serving(s, now).is_some())
        .collect()
}

/// Every shard is served by exactly one of `pods`, and every pod's status names that
/// pod as the shard's owner (so routing and terminal views agree from any entry pod).
pub fn settled<'a>(pods: impl IntoIterator<Item = &'a PodHandle>) -> bool {
    let pods: Vec<&PodHandle> = pods.into_iter().collect();
    let mut server: Vec<Vec<PodId>> = vec![Vec::new(); SHARDS as usize];
    for pod in &pods {
        let Some(id) = pod.status.borrow().pod.clone() else {
            return false;
        };
        for shard in served(pod) {
            server[shard as usize].push(id.clone());
        }
    }
    server.iter().enumerate().all(|(shard, by)| {
        by.len() == 1
            && pods.iter().all(|p| {
                p.status
                    .borrow()
                    .shards
                    .get(shard)
                    .and_then(|s| s.owner.as_ref())
                    == Some(&by[0])
            })
    })
}

/// Shuts `pods` down gracefully, all at once, each given 10 s to finish.
pub async fn stop(mut pods: Vec<PodHandle>) {
    for pod in &mut pods {
        pod.shutdown();
    }
    for pod in &mut pods {
        let _ = tokio::time::timeout(Duration::from_secs(10), pod.wait()).await;
    }
}
