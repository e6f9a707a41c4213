//! The sampler: every 500 ms during a scenario it records shard ownership (from the
//! `/v1/cluster` of a pod the harness has not faulted) and the simulators' gauges, so
//! ownership changes and "terminals without a session" can be reported over time.

use std::{sync::Arc, time::Duration};

use serde::Serialize;
use tokio::{sync::watch, task::JoinHandle};

use super::{
    http::HttpClient,
    pods::{ClusterView, TOKEN},
    pushgen::Targets,
    sims::SimFarm,
    unix_ms,
};

/// Owner and epoch per shard (index = shard), `None` when unowned.
pub type Owners = Vec<Option<(String, u64)>>;

/// One observation.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub at_unix_ms: u64,
    /// Ownership as one healthy pod saw it (`None` if no pod answered).
    #[serde(skip)]
    pub owners: Option<Owners>,
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

/// Ownership from the first target pod that answers.
pub async fn owners_now(client: &HttpClient, targets: &Targets, shards: usize) -> Option<Owners> {
    let urls: Vec<String> = targets
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(_, u)| u.clone())
        .collect();
    for url in urls {
        let url = format!("{url}/v1/cluster");
        if let Ok(view) = super::http::get_json::<ClusterView>(
            client,
            &url,
            Some(TOKEN),
            Duration::from_millis(800),
        )
        .await
        {
            return Some(owners_of(&view, shards));
        }
    }
    None
}

/// A running sampler.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub fn start(client: HttpClient, targets: Targets, sims: Arc<SimFarm>, shards: usize) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {}
                }
                let at_unix_ms = unix_ms();
                let owners = owners_now(&client, &targets, shards).await;
                let c = sims.counters().await.unwrap_or_default();
                let get = |k: &str| c.get(k).copied().unwrap_or(0);
                out.push(Sample {
                    at_unix_ms,
                    shards_owned: owners
                        .as_ref()
                        .map_or(0, |o| o.iter().filter(|x| x.is_some()).count()),
                    owners,
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
