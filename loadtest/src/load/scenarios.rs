//! The scenarios: what state each needs ([`prepare`], not measured) and the event it
//! injects ([`act`]).

use std::time::Duration;

use super::{
    cluster::Cluster,
    pods::{import_directory, Release},
    procs::Signal,
    unix_ms,
    upgrade::{self, Step, UpgradeTrace},
    LoadError,
};

/// One scenario of the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    ColdStart,
    ScaleOut,
    ScaleIn,
    RollingRestart,
    Kill,
    Pause,
    RedisRestart,
    RedisOutage,
    PodPartition,
    /// Every pod on the previous release, replaced one by one by this one (needs the
    /// previous release's binary, so not part of `all`).
    RollingUpgrade,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    pub const ALL: [Scenario; 9] = [
        Scenario::ColdStart,
        Scenario::ScaleOut,
        Scenario::ScaleIn,
        Scenario::RollingRestart,
        Scenario::Kill,
        Scenario::Pause,
        Scenario::RedisRestart,
        Scenario::RedisOutage,
        Scenario::PodPartition,
    ];

    /// Scenarios run only when named (they need something CI does not have).
    pub const EXPLICIT: [Scenario; 1] = [Scenario::RollingUpgrade];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::ColdStart => "cold-start",
            Scenario::ScaleOut => "scale-out",
            Scenario::ScaleIn => "scale-in",
            Scenario::RollingRestart => "rolling-restart",
            Scenario::Kill => "kill",
            Scenario::Pause => "pause",
            Scenario::RedisRestart => "redis-restart",
            Scenario::RedisOutage => "redis-outage",
            Scenario::PodPartition => "pod-partition",
            Scenario::RollingUpgrade => "rolling-upgrade",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::EXPLICIT)
            .find(|x| x.name() == s)
    }

    /// Graceful scenarios must not produce a single raw overlap.
    pub fn graceful(self) -> bool {
        matches!(
            self,
            Scenario::ColdStart
                | Scenario::ScaleOut
                | Scenario::ScaleIn
                | Scenario::RollingRestart
                | Scenario::RollingUpgrade
        )
    }

    /// The release every pod runs when the scenario's event begins.
    pub fn starting_release(self) -> Release {
        match self {
            Scenario::RollingUpgrade => Release::Previous,
            _ => Release::Current,
        }
    }
}

/// What the event did, for the report.
#[derive(Debug, Default)]
pub struct Action {
    pub event_unix_ms: u64,
    pub ideal_moved: Option<u64>,
    /// `(pod, from, to)`: a pod killed or stopped (pushes sent to it then are excused).
    pub hard_faults: Vec<(String, u64, u64)>,
    /// `(pod, at)`: a pod killed with SIGKILL at `at` (its idempotency cache died with it).
    pub kills: Vec<(String, u64)>,
    /// `(pod, from)`: a pod paused or cut off from Redis at `from`; it must not deliver
    /// anything once its lease deadline (at most one lease TTL later) has passed.
    pub deadline_faults: Vec<(String, u64)>,
    /// Convergence is not checked before this long after the event (views can look
    /// converged before the pods noticed a silent change such as a Redis restart).
    pub settle: Duration,
    pub notes: Vec<String>,
    /// rolling-upgrade: each replacement step and every pod's release.
    pub upgrade: Option<UpgradeTrace>,
}

async fn start_ready(c: &mut Cluster, n: usize, release: Release) -> Result<(), LoadError> {
    let mut started = Vec::new();
    for _ in 0..n {
        started.push(c.start_pod(release).await?);
    }
    let limit = c.profile.converge_limit;
    for i in started {
        c.wait_ready(i, limit).await?;
    }
    Ok(())
}

/// Brings the cluster into the state `scenario` starts from (N pods, N + 1 for
/// scale-in, all on the scenario's starting release, converged).
pub async fn prepare(c: &mut Cluster, scenario: Scenario) -> Result<(), LoadError> {
    let want = match scenario {
        Scenario::ColdStart => return Ok(()),
        Scenario::ScaleIn => c.profile.pods + 1,
        _ => c.profile.pods,
    };
    let release = scenario.starting_release();
    while let Some(i) = c.pods.iter().position(|p| p.release != release) {
        stop_gracefully(c, i).await?;
    }
    while c.pods.len() > want {
        let i = c.pods.len() - 1;
        stop_gracefully(c, i).await?;
    }
    let missing = want - c.pods.len();
    start_ready(c, missing, release).await?;
    if c.wait_converged(c.profile.converge_limit).await.is_none() {
        return Err(LoadError::Timeout {
            what: format!("convergence before {}", scenario.name()),
            limit: c.profile.converge_limit,
        });
    }
    Ok(())
}

/// Out of service, SIGTERM, wait for the exit (shutdown budget + margin), forget.
async fn stop_gracefully(c: &mut Cluster, i: usize) -> Result<(), LoadError> {
    c.out_of_service(i);
    c.pods[i].signal(Signal::Term).await?;
    let mut pod = c.forget(i);
    if pod.proc.wait_exit(Duration::from_secs(20)).await.is_none() {
        pod.proc.kill().await;
        return Err(LoadError::Timeout {
            what: format!("{} exiting after SIGTERM", pod.id),
            limit: Duration::from_secs(20),
        });
    }
    Ok(())
}

/// Replaces every pod, one by one: a new pod of `release` first, ready, then SIGTERM one
/// of the pods there were before. With `trace`, each step is recorded with the new pods'
/// peer counters right after the old pod exited.
async fn replace_each(
    c: &mut Cluster,
    release: Release,
    mut trace: Option<&mut UpgradeTrace>,
) -> Result<(), LoadError> {
    let old: Vec<String> = c.pods.iter().map(|p| p.id.clone()).collect();
    for (k, id) in old.iter().enumerate() {
        let new_started_unix_ms = unix_ms();
        let n = c.start_pod(release).await?;
        let new_pod = c.pods[n].id.clone();
        c.wait_ready(n, c.profile.converge_limit).await?;
        let new_ready_unix_ms = unix_ms();
        let i = c.pods.iter().position(|p| &p.id == id).unwrap_or(0);
        stop_gracefully(c, i).await?;
        let old_gone_unix_ms = unix_ms();
        if let Some(t) = trace.as_deref_mut() {
            t.releases.insert(new_pod.clone(), release);
            let (peer, unscraped) = upgrade::scrape_new_pods(c).await;
            t.steps.push(Step {
                new_pod,
                old_pod: id.clone(),
                new_started_unix_ms,
                new_ready_unix_ms,
                old_gone_unix_ms,
                old_left: old.len() - k - 1,
                peer,
                unscraped,
            });
        }
    }
    Ok(())
}

/// Injects the scenario's event and returns once it is over (not once converged).
pub async fn act(c: &mut Cluster, scenario: Scenario) -> Result<Action, LoadError> {
    let t = c.profile.terminals;
    let n = c.pods.len() as u64;
    let fault_for = c.profile.lease_ttl * 2;
    let mut a = Action {
        event_unix_ms: unix_ms(),
        ..Action::default()
    };
    match scenario {
        Scenario::ColdStart => start_ready(c, c.profile.pods, Release::Current).await?,
        Scenario::ScaleOut => {
            a.ideal_moved = Some(t / (n + 1));
            start_ready(c, 1, Release::Current).await?;
        }
        Scenario::ScaleIn => {
            a.ideal_moved = Some(t / n);
            stop_gracefully(c, c.pods.len() - 1).await?;
        }
        Scenario::RollingRestart => {
            a.ideal_moved = Some(t);
            a.notes
                .push("new pod first, then SIGTERM one old pod, one by one".into());
            replace_each(c, Release::Current, None).await?;
        }
        Scenario::RollingUpgrade => {
            a.ideal_moved = Some(t);
            a.notes.push(
                "every pod on the previous release; a new-release pod first, then SIGTERM \
                 one old pod, one by one"
                    .into(),
            );
            let mut trace = UpgradeTrace {
                releases: upgrade::releases_of(c),
                steps: Vec::new(),
            };
            replace_each(c, Release::Current, Some(&mut trace)).await?;
            a.upgrade = Some(trace);
        }
        Scenario::Kill => {
            a.ideal_moved = Some(t / n);
            c.out_of_service(0);
            c.pods[0].signal(Signal::Kill).await?;
            let killed_at = unix_ms();
            let mut pod = c.forget(0);
            pod.proc.wait_exit(Duration::from_secs(5)).await;
            a.hard_faults
                .push((pod.id.clone(), a.event_unix_ms, unix_ms()));
            a.kills.push((pod.id.clone(), killed_at));
            a.notes.push(format!("killed {} (SIGKILL)", pod.id));
        }
        Scenario::Pause => {
            c.out_of_service(0);
            c.pods[0].signal(Signal::Stop).await?;
            tokio::time::sleep(fault_for).await;
            c.pods[0].signal(Signal::Cont).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            c.pods[0].faulted = false;
            c.sync_targets();
            let id = c.pods[0].id.clone();
            a.hard_faults.push((id.clone(), a.event_unix_ms, unix_ms()));
            a.deadline_faults.push((id.clone(), a.event_unix_ms));
            a.notes.push(format!(
                "{id} stopped (SIGSTOP) for {} s, then SIGCONT",
                fault_for.as_secs()
            ));
        }
        Scenario::RedisRestart => {
            let took = c.redis.restart_empty().await?;
            a.notes.push(format!(
                "redis killed (SIGKILL) and started empty on the same port in {} ms",
                took.as_millis()
            ));
            if c.profile.reimport_directory {
                let addr = c.redis.addr();
                import_directory(&c.plan.posgate, &c.sims.csv, addr).await?;
                a.notes.push(format!(
                    "terminal directory imported again {} ms after the kill",
                    unix_ms() - a.event_unix_ms
                ));
            } else {
                a.notes
                    .push("terminal directory NOT imported again (wiped)".into());
            }
            a.settle = c.profile.lease_ttl + c.profile.member_ttl + Duration::from_secs(1);
        }
        Scenario::RedisOutage => {
            for p in &c.pods {
                p.proxy.cut();
            }
            tokio::time::sleep(fault_for).await;
            for p in &c.pods {
                p.proxy.restore();
            }
            a.notes.push(format!(
                "all pods cut off from Redis for {} s",
                fault_for.as_secs()
            ));
            a.settle = c.profile.lease_ttl;
        }
        Scenario::PodPartition => {
            let i = c.pods.len() - 1;
            c.pods[i].proxy.cut();
            a.deadline_faults.push((c.pods[i].id.clone(), unix_ms()));
            a.settle = c.profile.lease_ttl;
            tokio::time::sleep(fault_for).await;
            c.pods[i].proxy.restore();
            a.notes.push(format!(
                "{} cut off from Redis for {} s (stays in service for pushes)",
                c.pods[i].id,
                fault_for.as_secs()
            ));
        }
    }
    Ok(a)
}
