//! The system under test as one value: Redis, the simulators, the directory and the pods,
//! with the operations scenarios are built from (start a pod, take one out of service,
//! wait for convergence).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use super::{
    calibrate::HandshakeRate,
    floor::Floor,
    http::{self, HttpClient},
    observe::{owners_of, Owners},
    pods::{import_directory, init_store, PodPlan, PodProc, PodStore, Release},
    prometheus::{self, Prometheus},
    pushgen::Targets,
    redis::RedisServer,
    sentinels::Sentinels,
    shard_of,
    sims::SimFarm,
    LoadError,
};

/// Shards per cluster (posgate's default, pinned in Redis).
pub const SHARDS: usize = 64;

/// Sizes and timings of a run.
#[derive(Debug, Clone)]
pub struct Profile {
    pub name: String,
    pub pods: usize,
    pub terminals: u64,
    /// `serve` flags for timings and dial rate.
    pub flags: Vec<String>,
    /// Environment of every pod beyond the harness's own (`--pod-env`): allocator or
    /// runtime settings under test.
    pub pod_env: Vec<(String, String)>,
    pub lease_ttl: Duration,
    pub member_ttl: Duration,
    pub dial_rate: u64,
    /// Dials in flight per pod (`--dial-concurrency`), which the floor's dialers copy.
    pub dial_concurrency: usize,
    pub push_rate: f64,
    pub push_timeout_ms: u64,
    /// How long redis-outage, single-pod-outage and partial-partition cut pods off from
    /// Redis: 4x the lease TTL in both profiles, so every lease runs out during the cut
    /// (deliveries past the lease are the point of those scenarios).
    pub outage: Duration,
    /// Limit for a scenario to converge after its event.
    pub converge_limit: Duration,
    /// redis-restart: import the terminal directory again right after Redis restarts
    /// empty (the directory lives in Redis and is wiped with it).
    pub reimport_directory: bool,
    /// The run's Prometheus loads the alert rules with every `for` and range window
    /// divided by this (`loadtest/src/load/rules.rs`): how many times faster than the
    /// defaults the profile's timings are (quick: lease TTL 3 s vs 15 s, outages 12 s vs
    /// 60 s).
    pub alert_scale: u32,
}

impl Profile {
    /// 5 pods, 5,000 terminals, TTL 3 s, outages of 12 s.
    pub fn quick() -> Self {
        let flags = [
            "--lease-ttl",
            "3s",
            "--renew-interval",
            "1s",
            "--member-ttl",
            "3s",
            "--heartbeat-interval",
            "1s",
            "--close-budget",
            "300ms",
            "--store-timeout",
            "300ms",
            "--shutdown-budget",
            "5s",
            "--dial-rate",
            "200",
            "--dial-concurrency",
            "64",
        ];
        Profile {
            name: "quick".into(),
            pods: 5,
            terminals: 5_000,
            flags: flags.iter().map(|s| s.to_string()).collect(),
            pod_env: Vec::new(),
            lease_ttl: Duration::from_secs(3),
            member_ttl: Duration::from_secs(3),
            dial_rate: 200,
            dial_concurrency: 64,
            push_rate: 50.0,
            push_timeout_ms: 5_000,
            outage: Duration::from_secs(12),
            converge_limit: Duration::from_secs(90),
            reimport_directory: true,
            alert_scale: 5,
        }
    }

    /// 20 pods, 50,000 terminals, default timings (TTL 15 s), dial rate 200, outages of
    /// 60 s.
    pub fn full() -> Self {
        Profile {
            name: "full".into(),
            pods: 20,
            terminals: 50_000,
            flags: ["--dial-rate", "200", "--dial-concurrency", "64"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            pod_env: Vec::new(),
            lease_ttl: Duration::from_secs(15),
            member_ttl: Duration::from_secs(15),
            dial_rate: 200,
            dial_concurrency: 64,
            push_rate: 100.0,
            push_timeout_ms: 5_000,
            outage: Duration::from_secs(60),
            converge_limit: Duration::from_secs(420),
            reimport_directory: true,
            alert_scale: 1,
        }
    }
}

/// Redis, simulators and pods of one run.
pub struct Cluster {
    pub profile: Profile,
    pub plan: PodPlan,
    pub redis: RedisServer,
    /// Replicas and sentinels of `redis`, when the run is `redis-failover`: the pods then
    /// reach the store through the sentinels, without proxies.
    pub sentinels: Option<Sentinels>,
    pub sims: Arc<SimFarm>,
    pub pods: Vec<PodProc>,
    /// Scrapes every pod in `pods` and evaluates the alert rules; `None` when
    /// `prometheus` is not installed (outside CI).
    pub prometheus: Option<Prometheus>,
    pub client: HttpClient,
    /// Pods in service: ready and not faulted (pushes go there).
    pub targets: Targets,
    /// Pods not faulted, ready or not, and pods that got SIGTERM until they exit (they
    /// serve their shards until they hand them over): ownership is read from them.
    pub observers: Targets,
    /// Pods that got SIGTERM and have not exited yet (out of `pods`, still observed).
    pub leaving: Targets,
    /// Terminal numbers per shard.
    pub shard_terminals: Vec<Vec<u64>>,
    /// How long `posgate init` took before the first pod (once per cluster).
    pub init_took: Duration,
    /// H for the cold-start bound, measured before the pods (`calibrate`); set by the
    /// runner when the run has a cold start.
    pub handshake_rate: Option<HandshakeRate>,
    /// The same dials without posgate, measured after H and before the pods (`floor`);
    /// set by the runner when the run has a cold start.
    pub floor: Option<Floor>,
    next_index: usize,
}

impl Cluster {
    /// Starts Redis (with replicas and sentinels when `sentinels`) and the simulators and
    /// imports the directory (with `posgate`); no pods yet. `previous`: the previous
    /// release's binary, for `rolling-upgrade`.
    pub async fn setup(
        profile: Profile,
        posgate: &Path,
        previous: Option<&Path>,
        pos_sim: &Path,
        dir: &Path,
        sentinels: bool,
    ) -> Result<Self, LoadError> {
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| LoadError::io(format!("creating {}", logs.display()), e))?;
        let redis = RedisServer::start(&logs).await?;
        let prometheus =
            prometheus::for_run(profile.alert_scale, &dir.join("prometheus"), &logs).await?;
        let sentinels = match sentinels {
            true => Some(Sentinels::start(&redis, &logs).await?),
            false => None,
        };
        let sims = SimFarm::start(pos_sim, profile.terminals, &dir.join("sims")).await?;
        import_directory(posgate, &sims.csv, redis.addr()).await?;
        // A new cluster, made ready the way an operator does (docs/operations.md), so the
        // cold start measures the pods, not the recovery hold of a fresh store.
        let init = Instant::now();
        init_store(posgate, redis.addr(), profile.member_ttl).await?;
        let init_took = init.elapsed();
        let mut shard_terminals = vec![Vec::new(); SHARDS];
        for n in 0..profile.terminals {
            shard_terminals[shard_of(&sims.id(n), SHARDS as u32) as usize].push(n);
        }
        let plan = PodPlan {
            posgate: posgate.to_path_buf(),
            previous: previous.map(Path::to_path_buf),
            pos_ca: sims.ca.clone(),
            flags: profile.flags.clone(),
            env: profile.pod_env.clone(),
            log_dir: logs,
        };
        Ok(Cluster {
            profile,
            plan,
            redis,
            sentinels,
            sims: Arc::new(sims),
            pods: Vec::new(),
            prometheus,
            client: http::client(),
            targets: Arc::new(RwLock::new(Vec::new())),
            observers: Arc::new(RwLock::new(Vec::new())),
            leaving: Arc::new(RwLock::new(Vec::new())),
            shard_terminals,
            init_took,
            handshake_rate: None,
            floor: None,
            next_index: 0,
        })
    }

    /// Starts a new pod of `release` (not yet in service); returns its position in `pods`.
    pub async fn start_pod(&mut self, release: Release) -> Result<usize, LoadError> {
        let store = match &self.sentinels {
            Some(s) => PodStore::At(s.url()),
            None => PodStore::Proxied(self.redis.addr()),
        };
        let pod = PodProc::start(&self.plan, release, self.next_index, &store).await?;
        self.next_index += 1;
        self.pods.push(pod);
        // Observed from the start (not only once ready): the sampler must see a new pod
        // begin serving, or handover gaps would run until its `/readyz`.
        self.sync_targets();
        Ok(self.pods.len() - 1)
    }

    /// Waits until the pod at `i` is ready, then puts it in service.
    pub async fn wait_ready(&mut self, i: usize, limit: Duration) -> Result<Duration, LoadError> {
        let started = Instant::now();
        loop {
            if self.pods[i].ready(&self.client).await {
                self.pods[i].ready = true;
                self.sync_targets();
                return Ok(started.elapsed());
            }
            if let Some(status) = self.pods[i].proc.try_exited() {
                return Err(LoadError::Exited {
                    what: self.pods[i].id.clone(),
                    status: status.to_string(),
                });
            }
            if started.elapsed() > limit {
                return Err(LoadError::Timeout {
                    what: format!("{} ready", self.pods[i].id),
                    limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Takes the pod at `i` out of service (no new pushes, not read for ownership).
    pub fn out_of_service(&mut self, i: usize) {
        self.pods[i].faulted = true;
        self.sync_targets();
    }

    /// Takes the pod at `i` out of `pods` (after it was stopped or killed).
    pub fn forget(&mut self, i: usize) -> PodProc {
        let pod = self.pods.remove(i);
        self.sync_targets();
        pod
    }

    /// Recomputes `targets` and `observers` from the pods' flags, and Prometheus's
    /// scrape targets: every pod whose process runs, faulted or not, as in Kubernetes
    /// (a stopped pod is still a target whose scrapes time out; a killed one is gone).
    pub fn sync_targets(&self) {
        let list = |keep: &dyn Fn(&PodProc) -> bool| {
            self.pods
                .iter()
                .filter(|p| keep(p))
                .map(|p| (p.id.clone(), p.url.clone()))
                .collect()
        };
        *self.targets.write().unwrap_or_else(|p| p.into_inner()) = list(&|p| p.ready && !p.faulted);
        let mut observers = list(&|p| !p.faulted);
        observers.extend(
            self.leaving
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        );
        *self.observers.write().unwrap_or_else(|p| p.into_inner()) = observers;
        if let Some(prom) = &self.prometheus {
            if let Err(e) = prom.set_targets(&list(&|_| true)) {
                eprintln!("prometheus targets not updated: {e}");
            }
        }
    }

    /// Converged: every in-service pod sees every shard owned by its assigned pod, and
    /// every terminal has a connection with no superseded session still open.
    pub async fn converged(&self) -> bool {
        let mut seen = 0;
        for pod in self.pods.iter().filter(|p| !p.faulted) {
            let Ok(view) = pod.cluster(&self.client).await else {
                return false;
            };
            let settled = view.shards.len() == SHARDS
                && view
                    .shards
                    .iter()
                    .all(|s| s.owner.is_some() && s.owner == s.assigned);
            let members = view.members.len() == self.pods.len();
            if !settled || !members {
                return false;
            }
            seen += 1;
        }
        if seen == 0 {
            return false;
        }
        let Ok(c) = self.sims.counters().await else {
            return false;
        };
        c.get("terminals_connected").copied() == Some(self.profile.terminals)
            && c.get("session_overlaps_open").copied() == Some(0)
            && c.get("connections_open").copied() == Some(self.profile.terminals)
    }

    /// Waits for [`Cluster::converged`]; returns the time it took, `None` past `limit`.
    pub async fn wait_converged(&self, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.converged().await {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        None
    }

    /// Ownership as the first in-service pod sees it.
    pub async fn owners(&self) -> Option<Owners> {
        for pod in self.pods.iter().filter(|p| !p.faulted) {
            if let Ok(view) = pod.cluster(&self.client).await {
                return Some(owners_of(&view, SHARDS));
            }
        }
        None
    }

    /// Where results and logs go.
    pub fn log_dir(&self) -> PathBuf {
        self.plan.log_dir.clone()
    }
}
