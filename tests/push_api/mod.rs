//! The push API end to end: pods (`Pod::start_with_terminals`) against a real
//! `redis-server` and a `PosFarm` of simulated terminals, pushes sent over HTTP to any
//! pod:
//!
//! - `status_codes`: every documented status code produced through the real server,
//!   one test per answer; `views`: the terminal and cluster views and `/metrics` of the
//!   same cluster;
//! - `delivery`: pushes sent round-robin to all pods reach each terminal exactly once,
//!   from the owner, also across a join and an owner crash; keys belong to a terminal;
//! - `peer_replay`: a forwarded push captured on the pod network cannot be replayed or
//!   altered;
//! - `lifecycle`: readiness waits for the first dials; callers that go away leave no push
//!   in flight;
//! - `terminal_dedup`: a key retried after the owner crashed and restarted (its
//!   idempotency cache gone) reaches the terminal again and is answered and counted as a
//!   duplicate;
//! - `kept_answers`: a key retried after its shard moved in a planned move is answered
//!   from the cache of the new owner, which took the old owner's kept answers over.
//!
//! Timings are `CoreConfig::fast()`; measured figures are printed (`--nocapture`).

mod batch;
mod delivery;
mod kept_answers;
mod lifecycle;
mod peer_replay;
mod queued;
mod scopes;
mod status_codes;
mod terminal_dedup;
mod views;

use std::time::Duration;

use posgate::config::PodConfig;
use posgate::core::shard::shard_of;
use posgate::credentials::ApiTokens;
use posgate::pod::PodHandle;
use posgate::push::PushConfig;
use posgate::store::directory::Terminal;
use posgate_pos_sim::FarmConfig;
use serde_json::Value;

use crate::support::api::Push;
use crate::support::farm::{self, Farm};
use crate::support::peer_tap::PeerTap;
use crate::support::pod::{self, SHARDS};
use crate::support::wait::wait_for;
use crate::support::RedisServer;

const ACME: &str = "acme-token-0123456789";
const BANK: &str = "bank-token-0123456789";
/// A tenant whose token reaches the farm's first ten terminals only.
const SHOP: &str = "shop-token-0123456789";
const SHOP_PATTERN: &str = "pos-0000?";
/// The operator's token: the cluster view, no pushes.
const OPERATOR: &str = "operator-token-0123456789";

/// A cluster of pods over one Redis and one farm.
struct Cluster {
    redis: RedisServer,
    farm: Farm,
    pods: Vec<PodHandle>,
    /// Each pod's own listener.
    urls: Vec<String>,
    /// With `Cluster::start_tapped`, the tap in front of each pod (what peers reach).
    taps: Vec<PeerTap>,
}

/// A pod's config: fast timings, the tenants' and the operator's tokens, `push` limits, dialing at most
/// 2,000 terminals per second.
fn pod_config(name: &str, url: &str, farm: &Farm, push: PushConfig) -> PodConfig {
    let mut config = pod::config(name, url);
    let tokens = format!("acme:{ACME},bank:{BANK},shop:{SHOP}:{SHOP_PATTERN},operator:{OPERATOR}");
    config.api_tokens = Some(ApiTokens::from_env_value(&tokens).unwrap());
    config.push = push;
    config.pos = pod::pos(&farm.ca_file, 2_000);
    config
}

/// A pod of `pod_config` against the Redis at `redis_url`, and its URL.
async fn start_pod(
    name: &str,
    redis_url: &str,
    farm: &Farm,
    push: PushConfig,
) -> (PodHandle, String) {
    let (listener, url) = pod::listen().await;
    let config = pod_config(name, &url, farm, push);
    (pod::start_with_terminals(config, redis_url, listener), url)
}

impl Cluster {
    /// The index of the pod serving `terminal`'s shard now.
    pub fn owner_index(&self, terminal: &str) -> usize {
        let shard = shard_of(terminal, SHARDS);
        self.pods
            .iter()
            .position(|p| pod::served(p).contains(&shard))
            .expect("a settled cluster serves every shard")
    }

    /// `pods` pods over `terminals` farm terminals, plus directory entries for
    /// `extra` (id, addr) terminals outside the farm; waits until every farm terminal
    /// has a session.
    async fn start(pods: usize, terminals: u64, extra: &[(&str, &str)], push: PushConfig) -> Self {
        Cluster::start_with(pods, farm::config(terminals), extra, push, false).await
    }

    /// Like `start`, over a farm of `farm`'s settings.
    async fn start_farm(pods: usize, farm: FarmConfig, push: PushConfig) -> Self {
        Cluster::start_with(pods, farm, &[], push, false).await
    }

    /// Like `start`, with a [`PeerTap`] in front of every pod: each pod advertises its
    /// tap's URL, so every forwarded push crosses a tap and is recorded there.
    async fn start_tapped(pods: usize, terminals: u64) -> Self {
        let farm = farm::config(terminals);
        Cluster::start_with(pods, farm, &[], PushConfig::default(), true).await
    }

    async fn start_with(
        pods: usize,
        farm: FarmConfig,
        extra: &[(&str, &str)],
        push: PushConfig,
        tapped: bool,
    ) -> Self {
        let terminals = farm.range.end - farm.range.start;
        let redis = RedisServer::start();
        let farm = Farm::start(farm).await;
        let mut entries = farm.entries();
        for (id, addr) in extra {
            entries.push(Terminal::new(id, addr, Some("nowhere.test")).unwrap());
        }
        farm::import(&redis, &entries).await;
        let mut handles = Vec::new();
        let mut urls = Vec::new();
        let mut taps = Vec::new();
        for i in 0..pods {
            let name = format!("push-pod-{i}");
            let (listener, url) = pod::listen().await;
            let advertised = if tapped {
                let tap = PeerTap::start(url.clone()).await;
                let tap_url = tap.url.clone();
                taps.push(tap);
                tap_url
            } else {
                url.clone()
            };
            let config = pod_config(&name, &advertised, &farm, push.clone());
            handles.push(pod::start_with_terminals(config, &redis.url(), listener));
            urls.push(url);
        }
        let cluster = Cluster {
            redis,
            farm,
            pods: handles,
            urls,
            taps,
        };
        let took = wait_for("the cluster to settle", Duration::from_secs(30), || {
            cluster.farm.counters().terminals_connected >= terminals && cluster.settled()
        })
        .await;
        eprintln!(
            "[push] {pods} pods, {terminals} terminals connected in {:.2} s",
            took.as_secs_f64()
        );
        cluster
    }

    /// The farm's terminal ids.
    fn ids(&self) -> &[String] {
        &self.farm.ids
    }

    /// Every shard served by exactly one pod.
    fn settled(&self) -> bool {
        pod::settled(&self.pods)
    }

    /// The pod id serving `terminal`'s shard now.
    fn owner_of(&self, terminal: &str) -> Option<String> {
        let now = tokio::time::Instant::now().into_std();
        let shard = shard_of(terminal, SHARDS);
        self.pods
            .iter()
            .find(|p| p.serving.serving(shard, now).is_some())
            .and_then(|p| p.status.borrow().pod.as_ref().map(|id| id.to_string()))
    }
}

/// A push as tenant acme: `{"amount": 1}`, no key, no query.
fn acme() -> Push<'static> {
    Push::new(ACME)
}

/// An `acme` push with idempotency key `key`.
fn acme_keyed(key: &str) -> Push<'_> {
    Push {
        key: Some(key),
        ..acme()
    }
}

fn error_of(body: &Value) -> &str {
    body["error"].as_str().unwrap_or("<none>")
}
