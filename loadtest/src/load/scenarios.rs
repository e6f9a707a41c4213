//! The scenarios: what state each needs ([`prepare`], not measured) and the event it
//! injects ([`act`]).

use std::time::Duration;

use super::{cluster::Cluster, pods::import_directory, procs::Signal, unix_ms, LoadError};

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
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.name() == s)
    }

    /// Graceful scenarios must not produce a single raw overlap.
    pub fn graceful(self) -> bool {
        matches!(
            self,
            Scenario::ColdStart | Scenario::ScaleOut | Scenario::ScaleIn | Scenario::RollingRestart
        )
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
}

async fn start_ready(c: &mut Cluster, n: usize) -> Result<(), LoadError> {
    let mut started = Vec::new();
    for _ in 0..n {
        started.push(c.start_pod().await?);
    }
    let limit = c.profile.converge_limit;
    for i in started {
        c.wait_ready(i, limit).await?;
    }
    Ok(())
}

/// Brings the cluster into the state `scenario` starts from (N pods, N + 1 for
/// scale-in, converged).
pub async fn prepare(c: &mut Cluster, scenario: Scenario) -> Result<(), LoadError> {
    let want = match scenario {
        Scenario::ColdStart => return Ok(()),
        Scenario::ScaleIn => c.profile.pods + 1,
        _ => c.profile.pods,
    };
    while c.pods.len() > want {
        let i = c.pods.len() - 1;
        stop_gracefully(c, i).await?;
    }
    let missing = want - c.pods.len();
    start_ready(c, missing).await?;
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
        Scenario::ColdStart => start_ready(c, c.profile.pods).await?,
        Scenario::ScaleOut => {
            a.ideal_moved = Some(t / (n + 1));
            start_ready(c, 1).await?;
        }
        Scenario::ScaleIn => {
            a.ideal_moved = Some(t / n);
            stop_gracefully(c, c.pods.len() - 1).await?;
        }
        Scenario::RollingRestart => {
            a.ideal_moved = Some(t);
            a.notes
                .push("new pod first, then SIGTERM one old pod, one by one".into());
            let old: Vec<String> = c.pods.iter().map(|p| p.id.clone()).collect();
            for id in old {
                start_ready(c, 1).await?;
                let i = c.pods.iter().position(|p| p.id == id).unwrap_or(0);
                stop_gracefully(c, i).await?;
            }
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
