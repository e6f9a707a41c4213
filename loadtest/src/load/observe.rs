//! The sampler: every [`SAMPLE_EVERY`] during a scenario it asks every pod the harness has
//! not faulted for its `/v1/cluster` (all at once) and the simulators for their gauges.
//!
//! From each pod's own answer it keeps the shards that pod serves and the sessions it has
//! connected, so per-shard handovers (old owner stops serving -> new owner serves) and
//! sessions per pod can be reported over time; ownership as a whole is taken from the first
//! pod that answered (all pods share the lease table, so one view is enough for that).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use serde::Serialize;
use tokio::{sync::watch, task::JoinHandle, task::JoinSet};

use super::{
    http::HttpClient,
    pods::{ClusterView, OPERATOR_TOKEN},
    pushgen::Targets,
    sims::SimFarm,
    unix_ms,
};

/// How often the sampler looks. 250 ms: the handover gap and the stale-epoch check are
/// only as precise as this, and 64 shards x N pods of JSON four times a second is cheap
/// next to the pods' own work.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// How long one pod gets to answer; the round waits for the slowest pod.
const POD_TIMEOUT: Duration = Duration::from_millis(800);

/// Owner and epoch per shard (index = shard), `None` when unowned.
pub type Owners = Vec<Option<(String, u64)>>;

/// What one pod said about itself in one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct PodObs {
    pub pod: String,
    /// When its answer arrived: the state it shows held at some instant between the
    /// sample's `at_unix_ms` and this.
    pub answered_unix_ms: u64,
    /// Shards it serves, each with the lease epoch its own view gives when it names
    /// itself the holder (that view lags a fresh acquire until its next poll).
    pub serving: Vec<(u32, Option<u64>)>,
    /// Connected sessions, summed over its shards.
    pub sessions: u64,
}

impl PodObs {
    /// This pod's observation from its own cluster view.
    pub fn of(view: &ClusterView, answered_unix_ms: u64) -> Self {
        let serving = view
            .shards
            .iter()
            .filter(|s| s.serving)
            .map(|s| {
                let own = s.owner.as_deref() == Some(view.pod.as_str());
                (s.shard, if own { s.epoch } else { None })
            })
            .collect();
        PodObs {
            pod: view.pod.clone(),
            answered_unix_ms,
            serving,
            sessions: view
                .shards
                .iter()
                .filter_map(|s| s.terminals_connected)
                .sum(),
        }
    }

    /// Whether this pod served `shard` when it answered.
    pub fn serves(&self, shard: u32) -> Option<Option<u64>> {
        self.serving.iter().find(|(s, _)| *s == shard).map(|x| x.1)
    }
}

/// One observation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// When the round began (every request of the round was sent after this).
    pub at_unix_ms: u64,
    /// Ownership as one healthy pod saw it (`None` if no pod answered).
    #[serde(skip)]
    pub owners: Option<Owners>,
    /// Every pod that answered, in the order they were asked.
    #[serde(skip)]
    pub pods: Vec<PodObs>,
    /// Connected sessions per pod that answered, as each pod counts its own.
    pub pod_sessions: BTreeMap<String, u64>,
    /// Terminals with at least one open connection.
    pub terminals_connected: u64,
    pub connections_open: u64,
    pub session_overlaps_open: u64,
    /// Shards with an owner, per that pod's view.
    pub shards_owned: usize,
}

/// Ownership from a cluster view.
pub fn owners_of(view: &ClusterView, shards: usize) -> Owners {
    let mut owners = vec![None; shards];
    for s in &view.shards {
        if let (Some(o), Some(slot)) = (&s.owner, owners.get_mut(s.shard as usize)) {
            *slot = Some((o.clone(), s.epoch.unwrap_or(0)));
        }
    }
    owners
}

/// Every listed pod's view, asked at once; `None` for a pod that did not answer in time.
async fn views_now(client: &HttpClient, targets: &Targets) -> Vec<Option<(ClusterView, u64)>> {
    let urls: Vec<String> = targets
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(_, u)| format!("{u}/v1/cluster"))
        .collect();
    let mut asks = JoinSet::new();
    for (i, url) in urls.iter().cloned().enumerate() {
        let client = client.clone();
        asks.spawn(async move {
            let got = super::http::get_json::<ClusterView>(
                &client,
                &url,
                Some(OPERATOR_TOKEN),
                POD_TIMEOUT,
            )
            .await;
            (i, got.ok().map(|v| (v, unix_ms())))
        });
    }
    let mut out = vec![None; urls.len()];
    while let Some(done) = asks.join_next().await {
        if let Ok((i, got)) = done {
            out[i] = got;
        }
    }
    out
}

/// A running sampler.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Samples the pods listed in `targets` (the harness keeps faulted pods out of it).
    pub fn start(client: HttpClient, targets: Targets, sims: Arc<SimFarm>, shards: usize) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {}
                }
                let at_unix_ms = unix_ms();
                let (views, counters) = tokio::join!(views_now(&client, &targets), sims.counters());
                let views: Vec<(ClusterView, u64)> = views.into_iter().flatten().collect();
                let owners = views.first().map(|(v, _)| owners_of(v, shards));
                let pods: Vec<PodObs> = views.iter().map(|(v, at)| PodObs::of(v, *at)).collect();
                let c = counters.unwrap_or_default();
                let get = |k: &str| c.get(k).copied().unwrap_or(0);
                out.push(Sample {
                    at_unix_ms,
                    shards_owned: owners
                        .as_ref()
                        .map_or(0, |o| o.iter().filter(|x| x.is_some()).count()),
                    owners,
                    pod_sessions: pods.iter().map(|p| (p.pod.clone(), p.sessions)).collect(),
                    pods,
                    terminals_connected: get("terminals_connected"),
                    connections_open: get("connections_open"),
                    session_overlaps_open: get("session_overlaps_open"),
                });
            }
            out
        });
        Sampler { stop, task }
    }

    pub async fn stop(self) -> Vec<Sample> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}
