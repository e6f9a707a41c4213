//! The cluster of `tests/cluster_redis.rs`: whole pods (`Pod::start`, no POS
//! connections) against one real `redis-server`, each behind its own `RedisProxy`, plus
//! the two observers every test asserts with:
//! - a `ServingHook` that records serving transitions with timestamps ([`Events`]), so
//!   orderings (stopped here before started there) can be checked;
//! - a sampler that checks every 20 ms that no shard is served by two pods at once, each
//!   pod's `ServingTable` read with the same `now` (which also applies the deadlines).
//!
//! Not for: assertions about a scenario; those live in the test file.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use posgate::core::membership::Snapshot;
use posgate::core::reconciler::{Stop, StopReason};
use posgate::core::ring::Assignment;
use posgate::core::{CoreConfig, Epoch, PodId, ShardId};
use posgate::pod::{Pod, PodHandle};
use posgate::serving::{ServingHook, ServingTable};
use posgate::store::redis::RedisStore;
use posgate::store::CoordStore;
use tokio::task::JoinHandle;

use super::pod::{self, store_options, CLUSTER, SHARDS};
use super::wait::{secs, wait_for, wait_for_async};
use super::{RedisProxy, RedisServer};

const SAMPLE_EVERY: Duration = Duration::from_millis(20);

pub fn core() -> CoreConfig {
    CoreConfig::fast()
}

pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ----- serving transitions, recorded by the hook -----------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Start,
    Suspend,
    Stop(StopReason),
}

#[derive(Clone, Debug)]
pub struct Event {
    pub at: Instant,
    pub pod: PodId,
    pub shard: ShardId,
    pub epoch: Epoch,
    pub kind: Kind,
}

#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Vec<Event>>>);

impl Events {
    pub fn since(&self, t: Instant) -> Vec<Event> {
        lock(&self.0)
            .iter()
            .filter(|e| e.at >= t)
            .cloned()
            .collect()
    }

    /// The stops (any reason) since `t`.
    pub fn stops_since(&self, t: Instant) -> Vec<Event> {
        let mut events = self.since(t);
        events.retain(|e| matches!(e.kind, Kind::Stop(_)));
        events
    }
}

/// The hook of one pod: records every transition; stops are acknowledged at once.
struct Recorder {
    pod: PodId,
    events: Events,
}

impl Recorder {
    fn record(&self, shard: ShardId, epoch: Epoch, kind: Kind) {
        let event = Event {
            at: Instant::now(),
            pod: self.pod.clone(),
            shard,
            epoch,
            kind,
        };
        lock(&self.events.0).push(event);
    }
}

impl ServingHook for Recorder {
    fn start(&self, shard: ShardId, epoch: Epoch) {
        self.record(shard, epoch, Kind::Start);
    }

    fn suspend(&self, shard: ShardId, epoch: Epoch) {
        self.record(shard, epoch, Kind::Suspend);
    }

    fn stop(&self, stop: Stop) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.record(stop.shard, stop.epoch, Kind::Stop(stop.reason));
        std::future::ready(())
    }
}

// ----- the overlap sampler ------------------------------------------------------------

#[derive(Default)]
struct Samples {
    taken: u64,
    overlaps: Vec<String>,
}

/// Checks every [`SAMPLE_EVERY`] that each shard is served by at most one pod. Pods
/// stay in the table after they die: a dead pod's table still answers by its deadlines,
/// which is exactly what must not overlap with the next owner. Also watches the pods
/// of [`super::gateway`].
pub struct Sampler {
    tables: Arc<Mutex<Vec<(PodId, ServingTable)>>>,
    samples: Arc<Mutex<Samples>>,
    task: JoinHandle<()>,
}

impl Sampler {
    pub fn start() -> Sampler {
        let tables: Arc<Mutex<Vec<(PodId, ServingTable)>>> = Arc::default();
        let samples: Arc<Mutex<Samples>> = Arc::default();
        let (t, s) = (tables.clone(), samples.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tick.tick().await;
                let now = now();
                let tables = lock(&t).clone();
                let mut samples = lock(&s);
                samples.taken += 1;
                for shard in 0..SHARDS {
                    let serving: Vec<String> = tables
                        .iter()
                        .filter_map(|(pod, table)| {
                            table
                                .serving(shard, now)
                                .map(|epoch| format!("{pod}@{epoch}"))
                        })
                        .collect();
                    if serving.len() > 1 {
                        samples.overlaps.push(format!("shard {shard}: {serving:?}"));
                    }
                }
            }
        });
        Sampler {
            tables,
            samples,
            task,
        }
    }

    pub fn watch(&self, pod: PodId, table: ServingTable) {
        lock(&self.tables).push((pod, table));
    }

    pub fn assert_no_overlap(&self, test: &str) {
        let samples = lock(&self.samples);
        eprintln!(
            "[{test}] overlap samples: {} of {} taken",
            samples.overlaps.len(),
            samples.taken
        );
        assert!(
            samples.taken > 50,
            "the sampler barely ran ({} samples)",
            samples.taken
        );
        assert!(
            samples.overlaps.is_empty(),
            "shards served twice: {:?}",
            &samples.overlaps[..samples.overlaps.len().min(10)]
        );
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ----- a cluster of pods ---------------------------------------------------------------

pub struct TestPod {
    pub id: PodId,
    pub proxy: RedisProxy,
    pub handle: PodHandle,
}

impl TestPod {
    pub fn serving(&self, shard: ShardId) -> Option<Epoch> {
        self.handle.serving.serving(shard, now())
    }

    pub fn served(&self) -> BTreeMap<ShardId, Epoch> {
        (0..SHARDS)
            .filter_map(|s| self.serving(s).map(|e| (s, e)))
            .collect()
    }

    pub fn ready(&self) -> bool {
        self.handle.status.borrow().ready
    }
}

pub struct Cluster {
    pub redis: RedisServer,
    pub pods: Vec<TestPod>,
    /// Pods that are still running (not aborted).
    alive: Vec<bool>,
    pub events: Events,
    sampler: Sampler,
    /// An unproxied connection for the harness's own reads.
    direct: RedisStore,
}

impl Cluster {
    pub async fn start(pods: usize) -> Cluster {
        let redis = RedisServer::start();
        let direct = RedisStore::connect(&redis.url(), CLUSTER, store_options())
            .await
            .unwrap();
        let mut cluster = Cluster {
            redis,
            direct,
            pods: Vec::new(),
            alive: Vec::new(),
            events: Events::default(),
            sampler: Sampler::start(),
        };
        for _ in 0..pods {
            cluster.add_pod().await;
        }
        cluster
    }

    /// [`Cluster::start`], then waits until it has converged; also the wait.
    pub async fn converged_start(pods: usize) -> (Cluster, Duration) {
        let cluster = Cluster::start(pods).await;
        let what = format!("{pods} pods to converge");
        let took = cluster.wait_converged(&what, startup_limit()).await;
        (cluster, took)
    }

    pub async fn add_pod(&mut self) -> usize {
        let i = self.pods.len();
        let name = format!("pod-{i}");
        let id = PodId::new(&name).unwrap();
        let proxy = RedisProxy::start(self.redis.addr()).await.unwrap();
        let store = RedisStore::connect(&proxy.url(), CLUSTER, store_options())
            .await
            .unwrap();
        let (listener, url) = pod::listen().await;
        let hook = Recorder {
            pod: id.clone(),
            events: self.events.clone(),
        };
        super::capture_logs();
        let handle = Pod::start(pod::config(&name, &url), store, listener, hook).unwrap();
        self.sampler.watch(id.clone(), handle.serving.clone());
        self.pods.push(TestPod { id, proxy, handle });
        self.alive.push(true);
        i
    }

    pub fn kill(&mut self, i: usize) {
        self.pods[i].handle.abort();
        self.alive[i] = false;
    }

    pub fn live(&self) -> impl Iterator<Item = &TestPod> {
        self.pods
            .iter()
            .zip(&self.alive)
            .filter(|(_, &alive)| alive)
            .map(|(p, _)| p)
    }

    /// The assignment of the placement stored in Redis, if it is a balanced table over
    /// exactly the live pods.
    pub async fn assignment(&self) -> Option<Assignment> {
        let mut ids: Vec<PodId> = self.live().map(|p| p.id.clone()).collect();
        ids.sort();
        // The first call after a Redis restart fails while the client reconnects.
        let mut snapshot = self.direct.snapshot(SHARDS).await;
        for _ in 0..20 {
            if snapshot.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            snapshot = self.direct.snapshot(SHARDS).await;
        }
        let placement = snapshot.ok()?.placement?;
        let a = placement.assignment;
        let (lo, hi) = (
            SHARDS as usize / ids.len(),
            (SHARDS as usize).div_ceil(ids.len()),
        );
        let balanced = ids.iter().all(|p| (lo..=hi).contains(&a.load_of(p)));
        (a.pods() == ids.as_slice() && balanced).then_some(a)
    }

    pub fn pod(&self, id: &PodId) -> &TestPod {
        self.pods.iter().find(|p| &p.id == id).unwrap()
    }

    /// The stored placement covers exactly the live pods, every shard is served by exactly
    /// its assigned live pod, and every live pod is ready.
    pub async fn converged(&self) -> bool {
        let Some(assignment) = self.assignment().await else {
            return false;
        };
        self.live().all(TestPod::ready)
            && (0..SHARDS).all(|s| {
                let serving: Vec<&PodId> = self
                    .live()
                    .filter(|p| p.serving(s).is_some())
                    .map(|p| &p.id)
                    .collect();
                serving.len() == 1 && assignment.owner(s) == Some(serving[0])
            })
    }

    /// Who serves each shard with which epoch (live pods).
    pub fn owners(&self) -> BTreeMap<ShardId, (PodId, Epoch)> {
        self.live()
            .flat_map(|p| p.served().into_iter().map(|(s, e)| (s, (p.id.clone(), e))))
            .collect()
    }

    /// Waits (15 s at most) until every shard of `before` is served by the same pod with
    /// a higher epoch (a re-claim after Redis lost or refused the leases); how long it took.
    pub async fn wait_reclaimed_by_owners(
        &self,
        before: &BTreeMap<ShardId, (PodId, Epoch)>,
    ) -> Duration {
        let what = "every shard re-claimed by its owner with a higher epoch";
        wait_for(what, Duration::from_secs(15), || {
            let now = self.owners();
            now.len() == before.len()
                && now
                    .iter()
                    .all(|(s, (pod, epoch))| before[s].0 == *pod && *epoch > before[s].1)
        })
        .await
    }

    pub async fn wait_converged(&self, what: &str, limit: Duration) -> Duration {
        wait_for_async(what, limit, || self.converged()).await
    }

    /// A direct (unproxied) read of Redis.
    pub async fn redis_snapshot(&self) -> Snapshot {
        let store = RedisStore::connect(&self.redis.url(), CLUSTER, store_options())
            .await
            .unwrap();
        store.snapshot(SHARDS).await.unwrap()
    }

    /// Graceful shutdown of every live pod; afterwards Redis holds no lease and no member.
    pub async fn shutdown(mut self, test: &str) {
        let started = Instant::now();
        for (pod, &alive) in self.pods.iter_mut().zip(&self.alive) {
            if alive {
                pod.handle.shutdown();
            }
        }
        for (pod, &alive) in self.pods.iter_mut().zip(&self.alive) {
            if alive {
                let ended = tokio::time::timeout(Duration::from_secs(10), pod.handle.wait()).await;
                ended.expect("graceful shutdown ends in time").unwrap();
            }
        }
        eprintln!(
            "[{test}] graceful shutdown of all pods took {:.3} s",
            secs(started.elapsed())
        );
        self.sampler.assert_no_overlap(test);
        let snapshot = self.redis_snapshot().await;
        let still_held: Vec<_> = snapshot
            .leases
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_some())
            .collect();
        assert!(
            still_held.is_empty(),
            "leases left after shutdown: {still_held:?}"
        );
        let members: Vec<_> = snapshot.members.iter().map(|m| &m.pod).collect();
        assert!(
            members.is_empty(),
            "members left after shutdown: {members:?}"
        );
    }
}

/// Fresh generation: pods hold claims for one member TTL, then debounce and claim.
pub fn startup_limit() -> Duration {
    let c = core();
    c.member_ttl + c.debounce + c.poll_interval + Duration::from_secs(5)
}
