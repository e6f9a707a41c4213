//! The gateway as a push caller sees it: whole in-process pods with their POS
//! connections (`Pod::start_with_terminals`) over one real `redis-server`, each pod
//! behind its own [`RedisProxy`] (so a test can cut one off), or all at one URL (a
//! Sentinel deployment's, [`Gateway::start_at`]), its push API open to the
//! load harness's token, over a farm of simulated terminals; the overlap sampler of
//! [`super::cluster`] watching every pod's serving table; and the load harness's
//! open-loop push generator ([`open_loop`]: a fixed rate, a key of its own per push,
//! retries with the same key through another entry pod) pointed at the pods. Pods can be
//! added (a join) and stopped gracefully (a leave) after the start.
//!
//! Not for: `posgate serve` processes ([`super::binary`]), pods without terminals
//! ([`super::cluster`]), or judging a scenario (the test files do; the farm counts).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use posgate::core::{Epoch, PodId, ShardId};
use posgate::pod::PodHandle;

use posgate_loadtest::load::push_summary::{summarize, PushSummary};
use posgate_loadtest::load::pushgen::{PushGen, PushPlan, PushRecord, Targets};
use posgate_loadtest::load::{http, unix_ms};
use posgate_pos_sim::FarmConfig;

use super::cluster::Sampler;
use super::farm::{connect_limit, Farm};
use super::pod::{self, Setup, SHARDS};
use super::wait::{secs, wait_for};
use super::{RedisProxy, RedisServer};

/// The caller's deadline of every push (`?timeout_ms=`), as in the measurements of
/// issue 14.
pub const PUSH_TIMEOUT_MS: u64 = 3_000;
/// The pods' `--dial-rate`.
const DIAL_RATE: u32 = 2_000;

/// One pod of a [`Gateway`].
/// A pod shutting down, kept (with its Redis proxy) until it is gone.
pub struct Leaving(GatewayPod);

impl Leaving {
    pub fn id(&self) -> &PodId {
        &self.0.id
    }

    /// Waits for the shutdown to end (10 s at most: the shutdown budget and the drain).
    pub async fn gone(mut self) -> PodId {
        tokio::time::timeout(Duration::from_secs(10), self.0.handle.wait())
            .await
            .expect("graceful shutdown ends in time")
            .unwrap();
        self.0.id
    }
}

pub struct GatewayPod {
    pub id: PodId,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Between this pod and Redis, unless the pods reach it at one URL.
    proxy: Option<RedisProxy>,
    pub handle: PodHandle,
}

impl GatewayPod {
    /// The proxy between this pod and Redis (a gateway of [`Gateway::start`]).
    pub fn proxy(&self) -> &RedisProxy {
        self.proxy
            .as_ref()
            .expect("a pod behind a proxy of its own")
    }
}

/// See the module docs.
pub struct Gateway {
    /// The Redis the terminal directory was written to (the first master of a Sentinel
    /// deployment).
    pub redis: RedisServer,
    pub farm: Farm,
    pub pods: Vec<GatewayPod>,
    sampler: Sampler,
    /// Pods started so far: names stay unique after a pod is stopped.
    started: usize,
    /// Where every pod reaches the store; `None`: each through a proxy of its own to
    /// `redis`.
    store_url: Option<String>,
    /// What the pods run with.
    setup: Setup,
}

impl Gateway {
    /// `pods` pods over a farm of `farm` (its terminals imported into the directory);
    /// returns once every shard is served by exactly one pod and every terminal holds a
    /// current session with it. `test` labels the printed start-up time.
    pub async fn start(pods: usize, farm: FarmConfig, test: &str) -> Gateway {
        let redis = RedisServer::start();
        Self::start_over(redis, None, Setup::default(), pods, farm, test).await
    }

    /// Like [`Gateway::start`], the directory written to `redis` and the pods reaching
    /// the store at `store_url` (a `redis+sentinel://` URL of a deployment whose master
    /// `redis` is), without proxies, with `setup`.
    pub async fn start_at(
        redis: RedisServer,
        store_url: &str,
        setup: Setup,
        pods: usize,
        farm: FarmConfig,
        test: &str,
    ) -> Gateway {
        let url = Some(store_url.to_string());
        Self::start_over(redis, url, setup, pods, farm, test).await
    }

    async fn start_over(
        redis: RedisServer,
        store_url: Option<String>,
        setup: Setup,
        pods: usize,
        farm: FarmConfig,
        test: &str,
    ) -> Gateway {
        let farm = Farm::with_directory(&redis, farm).await;
        let mut gateway = Gateway {
            redis,
            farm,
            pods: Vec::new(),
            sampler: Sampler::start(),
            started: 0,
            store_url,
            setup,
        };
        for _ in 0..pods {
            gateway.add_pod().await;
        }
        let took = wait_for(
            "every shard served once and every terminal current",
            connect_limit(),
            || gateway.current(),
        )
        .await;
        eprintln!(
            "[{test}] {pods} pods, {} terminals: every terminal current after {:.3} s",
            gateway.farm.ids.len(),
            secs(took)
        );
        gateway
    }

    /// Starts one more pod (`gw-pod-<n>`, n counting every pod started) and watches its
    /// serving table; returns at once, before it joined. Its index in `pods`.
    pub async fn add_pod(&mut self) -> usize {
        let (proxy, store_url) = match &self.store_url {
            Some(url) => (None, url.clone()),
            None => {
                let proxy = RedisProxy::start(self.redis.addr()).await.unwrap();
                let url = proxy.url();
                (Some(proxy), url)
            }
        };
        self.add_pod_with(proxy, &store_url).await
    }

    /// [`Gateway::add_pod`] for a pod that reaches the store at `store_url` (say, one
    /// Redis node directly, where the others follow the sentinels).
    pub async fn add_pod_at(&mut self, store_url: &str) -> usize {
        self.add_pod_with(None, store_url).await
    }

    async fn add_pod_with(&mut self, proxy: Option<RedisProxy>, store_url: &str) -> usize {
        let name = format!("gw-pod-{}", self.started);
        self.started += 1;
        let tokens = posgate_loadtest::load::pods::api_tokens();
        let (handle, url) = pod::start_with_api(
            &self.setup,
            &name,
            store_url,
            &self.farm,
            DIAL_RATE,
            &tokens,
        )
        .await;
        let id = PodId::new(&name).unwrap();
        self.sampler.watch(id.clone(), handle.serving.clone());
        self.pods.push(GatewayPod {
            id,
            url,
            proxy,
            handle,
        });
        self.pods.len() - 1
    }

    /// Shuts pod `i` down gracefully (10 s at most) and takes it out of `pods`; the
    /// overlap sampler keeps watching its serving table.
    pub async fn stop_pod(&mut self, i: usize) -> PodId {
        self.begin_stop(i).gone().await
    }

    /// Starts pod `i`'s graceful shutdown (SIGTERM) and takes it out of `pods` without
    /// waiting for it, as a Deployment goes on to its next pod; [`Leaving::gone`] waits.
    pub fn begin_stop(&mut self, i: usize) -> Leaving {
        let mut pod = self.pods.remove(i);
        pod.handle.shutdown();
        Leaving(pod)
    }

    /// Every shard is served by exactly one pod, each pod serves its even share
    /// (`floor` or `ceil` of shards / pods), and every terminal is current: a join or a
    /// leave has been rebalanced.
    pub fn balanced(&self) -> bool {
        let n = self.pods.len().max(1);
        let (lo, hi) = (SHARDS as usize / n, (SHARDS as usize).div_ceil(n));
        self.pods
            .iter()
            .all(|p| (lo..=hi).contains(&pod::served(&p.handle).len()))
            && self.current()
    }

    pub fn handles(&self) -> Vec<&PodHandle> {
        self.pods.iter().map(|p| &p.handle).collect()
    }

    /// Every shard is served by exactly one pod and every terminal holds a current
    /// session with its shard's epoch, on its only open connection: a connection of an
    /// earlier owner still closing (a superseded session, a dial that lost a race) would
    /// otherwise close after a test took its baseline and count as a disconnect.
    pub fn current(&self) -> bool {
        let handles = self.handles();
        pod::settled(handles.iter().copied())
            && self.farm.all_sessions_current(&handles)
            && self.farm.all_settled()
    }

    /// Who serves each shard now, with which epoch.
    pub fn owners(&self) -> BTreeMap<ShardId, (PodId, Epoch)> {
        pod::owners(self.pods.iter().map(|p| (&p.id, &p.handle)))
    }

    /// The pods of `indices` as push entry points.
    pub fn targets(&self, indices: impl IntoIterator<Item = usize>) -> Targets {
        let targets = indices
            .into_iter()
            .map(|i| (self.pods[i].id.to_string(), self.pods[i].url.clone()))
            .collect();
        Arc::new(RwLock::new(targets))
    }

    /// Every pod as a push entry point.
    pub fn all_targets(&self) -> Targets {
        self.targets(0..self.pods.len())
    }

    /// Fails the test if a shard was ever served by two pods at once.
    pub fn assert_no_overlap(&self, test: &str) {
        self.sampler.assert_no_overlap(test);
    }
}

/// Pushes at `rate_per_s` to random terminals of `0..terminals` through random pods of
/// `targets`, each with a key of its own (tagged `test`), a deadline of
/// [`PUSH_TIMEOUT_MS`], and the load harness's retries (a push not answered 200 is sent
/// again with the same key through another pod, at most three attempts).
pub fn open_loop(targets: Targets, rate_per_s: f64, terminals: u64, test: &str) -> PushGen {
    let plan = PushPlan {
        rate_per_s,
        timeout_ms: PUSH_TIMEOUT_MS,
        terminals,
        run_tag: format!("{test}-{}", unix_ms()),
        ttl_s: None,
        offline: Default::default(),
    };
    PushGen::start(plan, http::client(), targets, test)
}

/// The pushes first sent within `from..to` (Unix ms).
pub fn sent_between(pushes: &[PushRecord], from: u64, to: u64) -> Vec<PushRecord> {
    pushes
        .iter()
        .filter(|p| (from..to).contains(&p.first.sent_unix_ms))
        .cloned()
        .collect()
}

/// Summarises `pushes` and prints the figures the issue note quotes: pushes sent, the
/// share answered 200 (first attempt and in the end), retries and final outcomes.
pub fn summary(test: &str, what: &str, pushes: &[PushRecord]) -> PushSummary {
    let s = summarize(pushes, &[], PUSH_TIMEOUT_MS);
    eprintln!(
        "[{test}] pushes {what}: {} sent, {:.2}% answered 200 first time, {:.2}% in the end; \
         {} retried ({} attempts: {:?}); unanswered attempts {}; final outcomes {:?}",
        s.sent,
        100.0 * s.ok_ratio,
        100.0 * s.final_ok_ratio,
        s.retried,
        s.attempts,
        s.by_outcome,
        s.unanswered,
        s.by_final_outcome
    );
    s
}

/// The shards served by another pod (or by none) in `after` than in `before`; epochs
/// aside.
pub fn moved(
    before: &BTreeMap<ShardId, (PodId, Epoch)>,
    after: &BTreeMap<ShardId, (PodId, Epoch)>,
) -> Vec<ShardId> {
    (0..SHARDS)
        .filter(|s| before.get(s).map(|o| &o.0) != after.get(s).map(|o| &o.0))
        .collect()
}
