//! The scenarios: what state each needs ([`prepare`], not measured) and the event it
//! injects ([`act`]).
//!
//! Not for: measuring them (`measure`) or judging them (`checks`).

use crate::load::pushgen::Targets;
use std::time::{Duration, Instant};

use super::{
    broadcast,
    cluster::Cluster,
    later::{self, How, Sent},
    pods::{import_directory, PodProc, Release},
    procs::Signal,
    sentinels, unix_ms,
    upgrade::{self, Step, UpgradeTrace},
    LoadError,
};
use posgate_pos_sim::FaultConfig;

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
    /// Half the pods (rounded down) cut off from Redis for the profile's outage length;
    /// they keep their terminals and peers.
    PartialPartition,
    /// A cluster of one pod cut off from Redis for the profile's outage length.
    SinglePodOutage,
    /// A fifth of the terminals offline while pushes with a TTL go to every terminal;
    /// the offline ones come back during a scale-out, then every pod is replaced.
    OfflineLater,
    /// Every terminal offline while one push with a TTL goes to each; every pod stopped;
    /// the terminals back and every pod started at once: the queue drained by a cold
    /// start (how long to the last push, beside the same start's convergence).
    ColdStartQueued,
    /// Every pod on the previous release, replaced one by one by this one (needs the
    /// previous release's binary, so not part of `all`).
    RollingUpgrade,
    /// The master of a Sentinel deployment killed (SIGKILL); the pods reach Redis
    /// through the sentinels (a run of its own, so not part of `all`).
    RedisFailover,
    /// Every terminal labeled, then one broadcast to all of them while live pushes flow:
    /// its time to complete and the live pushes' p99 during it against an idle window
    /// (a benchmark, so not part of `all`).
    Broadcast,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    pub const ALL: [Scenario; 13] = [
        Scenario::ColdStart,
        Scenario::ScaleOut,
        Scenario::ScaleIn,
        Scenario::RollingRestart,
        Scenario::Kill,
        Scenario::Pause,
        Scenario::RedisRestart,
        Scenario::RedisOutage,
        Scenario::PodPartition,
        Scenario::PartialPartition,
        // It ends with one pod more, which single-pod-outage stops anyway.
        Scenario::OfflineLater,
        Scenario::ColdStartQueued,
        // Last: the one-pod cluster costs a rebalance onto one pod (its dial rate), and a
        // scenario after it would pay another one back to N pods.
        Scenario::SinglePodOutage,
    ];

    /// Scenarios run only when named: rolling-upgrade needs the previous release's binary,
    /// redis-failover a cluster of its own (pods on sentinels, no proxies to cut).
    pub const EXPLICIT: [Scenario; 3] = [
        Scenario::RollingUpgrade,
        Scenario::RedisFailover,
        Scenario::Broadcast,
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
            Scenario::PartialPartition => "partial-partition",
            Scenario::SinglePodOutage => "single-pod-outage",
            Scenario::OfflineLater => "offline-later",
            Scenario::ColdStartQueued => "cold-start-queued",
            Scenario::RollingUpgrade => "rolling-upgrade",
            Scenario::RedisFailover => "redis-failover",
            Scenario::Broadcast => "broadcast",
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
                | Scenario::OfflineLater
                | Scenario::ColdStartQueued
                | Scenario::Broadcast
        )
    }

    /// The terminals the scenario takes offline while plain pushes flow (pos-sim's
    /// fault): offline-later's fifth, chosen by terminal number, the same ones every time.
    /// cold-start-queued takes all of them offline only before its event, so plain pushes
    /// go to every terminal.
    pub fn offline(self) -> FaultConfig {
        FaultConfig {
            offline_fraction: match self {
                Scenario::OfflineLater => later::OFFLINE_FRACTION,
                _ => 0.0,
            },
            ..FaultConfig::default()
        }
    }

    /// How many pods the scenario starts from in a profile of `pods`.
    pub fn starting_pods(self, pods: usize) -> usize {
        match self {
            Scenario::ColdStart => 0,
            Scenario::ScaleIn => pods + 1,
            Scenario::SinglePodOutage => 1,
            _ => pods,
        }
    }

    /// The fewest pods that hold every terminal at some point of the scenario, in a
    /// profile of `pods` (what one pod's connection count is sized by).
    pub fn fewest_holding(self, pods: usize) -> usize {
        let fewest = match self {
            Scenario::SinglePodOutage => 1,
            // The cut-off half gives its shards to the rest.
            Scenario::PartialPartition => pods - pods / 2,
            // One pod killed, stopped, cut off or being replaced.
            _ => pods.saturating_sub(1),
        };
        fewest.max(1)
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
    /// The pods cut off from Redis and when (redis-outage, single-pod-outage,
    /// partial-partition, pod-partition).
    pub cut: Option<Cut>,
    /// offline-later: its pushes with a TTL.
    pub later: Option<Sent>,
    /// broadcast: what it sent and when.
    pub broadcast: Option<broadcast::Run>,
}

/// Pods cut off from Redis (not from their terminals or peers) and when.
#[derive(Debug, Clone, Default)]
pub struct Cut {
    pub pods: Vec<String>,
    /// Every listed pod's proxy cut by then, unix ms.
    pub from_unix_ms: u64,
    /// Every listed pod's proxy forwarding again by then, unix ms.
    pub to_unix_ms: u64,
}

/// Cuts the pods at `which` off from Redis for `span`, then restores them. They stay in
/// service: connected to their terminals and peers, and push targets.
async fn cut_off(c: &Cluster, which: &[usize], span: Duration) -> Cut {
    for &i in which {
        c.pods[i].proxy().cut();
    }
    let from_unix_ms = unix_ms();
    tokio::time::sleep(span).await;
    for &i in which {
        c.pods[i].proxy().restore();
    }
    Cut {
        pods: which.iter().map(|&i| c.pods[i].id.clone()).collect(),
        from_unix_ms,
        to_unix_ms: unix_ms(),
    }
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
/// scale-in, 1 for single-pod-outage, all on the scenario's starting release,
/// converged). Pods beyond that are stopped gracefully; missing ones are started, so the
/// scenario after single-pod-outage gets its N pods back here.
pub async fn prepare(c: &mut Cluster, scenario: Scenario) -> Result<(), LoadError> {
    if scenario == Scenario::ColdStart {
        return Ok(());
    }
    let want = scenario.starting_pods(c.profile.pods);
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
    terminate(c, i).await?.exited().await
}

/// How long a pod may take to exit after SIGTERM: the drain budget (15 s) plus the
/// release and deregistration, under the Deployment's 30 s grace period.
const EXIT_LIMIT: Duration = Duration::from_secs(20);

/// A pod sent SIGTERM and taken out of the cluster's lists, kept (with its Redis proxy)
/// until it exits on its own. Until then the sampler still asks it what it serves: it
/// serves its shards until it hands them over.
struct Leaving {
    pod: PodProc,
    signalled: Instant,
    leaving: Targets,
    observers: Targets,
}

/// Takes pod `i` out of service and sends it SIGTERM, without waiting for it to exit.
async fn terminate(c: &mut Cluster, i: usize) -> Result<Leaving, LoadError> {
    let entry = (c.pods[i].id.clone(), c.pods[i].url.clone());
    c.leaving
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .push(entry);
    c.out_of_service(i);
    c.pods[i].signal(Signal::Term).await?;
    Ok(Leaving {
        pod: c.forget(i),
        signalled: Instant::now(),
        leaving: c.leaving.clone(),
        observers: c.observers.clone(),
    })
}

impl Leaving {
    /// Waits for the exit, at most [`EXIT_LIMIT`] after the signal (then SIGKILL and an
    /// error: a pod that outstays its grace period is a failure, as in Kubernetes), and
    /// stops observing it.
    async fn exited(mut self) -> Result<(), LoadError> {
        let left = EXIT_LIMIT.saturating_sub(self.signalled.elapsed());
        let exited = self.pod.proc.wait_exit(left).await;
        for list in [&self.leaving, &self.observers] {
            list.write()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(id, _)| *id != self.pod.id);
        }
        if exited.is_none() {
            self.pod.proc.kill().await;
            return Err(LoadError::Timeout {
                what: format!("{} exiting after SIGTERM", self.pod.id),
                limit: EXIT_LIMIT,
            });
        }
        Ok(())
    }
}

/// Replaces every pod, one by one, the way a Deployment with `maxSurge: 1,
/// maxUnavailable: 0` does: a new pod of `release` first, ready, then SIGTERM one of the
/// pods there were before, and the next new pod right away. Like the Deployment
/// controller (which does not count terminating pods), it does not wait for the old pod
/// to exit before the next step: an old pod stays up until the new owners of its shards
/// asked it for every terminal (the drain), and that overlaps the next pod's start. The
/// old pods are waited for at the end, each within [`EXIT_LIMIT`] of its signal. With
/// `trace`, each step is recorded with the new pods' peer counters right after the
/// signal, and the end of the mixed window once the last old pod exited.
async fn replace_each(
    c: &mut Cluster,
    release: Release,
    mut trace: Option<&mut UpgradeTrace>,
) -> Result<(), LoadError> {
    let old: Vec<String> = c.pods.iter().map(|p| p.id.clone()).collect();
    let mut leaving = Vec::new();
    for (k, id) in old.iter().enumerate() {
        let new_started_unix_ms = unix_ms();
        let n = c.start_pod(release).await?;
        let new_pod = c.pods[n].id.clone();
        c.wait_ready(n, c.profile.converge_limit).await?;
        let new_ready_unix_ms = unix_ms();
        let i = c.pods.iter().position(|p| &p.id == id).unwrap_or(0);
        leaving.push(terminate(c, i).await?);
        let old_signalled_unix_ms = unix_ms();
        if let Some(t) = trace.as_deref_mut() {
            t.releases.insert(new_pod.clone(), release);
            let (peer, unscraped) = upgrade::scrape_new_pods(c).await;
            t.steps.push(Step {
                new_pod,
                old_pod: id.clone(),
                new_started_unix_ms,
                new_ready_unix_ms,
                old_signalled_unix_ms,
                old_left: old.len() - k - 1,
                peer,
                unscraped,
            });
        }
    }
    for pod in leaving {
        pod.exited().await?;
    }
    if let Some(t) = trace {
        t.old_gone_unix_ms = unix_ms();
        t.mixed_end = upgrade::scrape_new_pods(c).await.0;
    }
    Ok(())
}

/// Injects the scenario's event and returns once it is over (not once converged).
pub async fn act(c: &mut Cluster, scenario: Scenario) -> Result<Action, LoadError> {
    let t = c.profile.terminals;
    let n = c.pods.len() as u64;
    let fault_for = c.profile.lease_ttl * 2;
    let outage = c.profile.outage;
    let mut a = Action {
        event_unix_ms: unix_ms(),
        ..Action::default()
    };
    match scenario {
        Scenario::ColdStart => {
            a.notes.push(format!(
                "the store was made ready by `posgate init` before the first pod ({:.1} s, \
                 once per cluster, not counted): pods claim at once",
                c.init_took.as_secs_f64()
            ));
            start_ready(c, c.profile.pods, Release::Current).await?
        }
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
            a.notes.push(
                "new pod first, then SIGTERM one old pod and the next new pod at once \
                 (like a Deployment)"
                    .into(),
            );
            replace_each(c, Release::Current, None).await?;
        }
        Scenario::OfflineLater => {
            // The scale-out moves a sixth, the rolling restart every terminal.
            a.ideal_moved = Some(t);
            let offline = scenario.offline();
            c.sims.set_faults(&offline).await?;
            let ids: Vec<String> = (0..t).map(|n| c.sims.id(n)).collect();
            let tag = format!("r{}-{}", a.event_unix_ms, scenario.name());
            let pushes = later::rounds(&c.client, &c.targets, &ids, &tag, later::ROUNDS).await;
            let sent_s = (unix_ms() - a.event_unix_ms) as f64 / 1000.0;
            // The scale-out: the offline terminals come back while the new pod joins.
            let n = c.start_pod(Release::Current).await?;
            c.sims.set_faults(&FaultConfig::default()).await?;
            let back_unix_ms = unix_ms();
            c.wait_ready(n, c.profile.converge_limit).await?;
            let ready_s = (unix_ms() - back_unix_ms) as f64 / 1000.0;
            replace_each(c, Release::Current, None).await?;
            a.notes.push(format!(
                "{:.0}% of the terminals offline (pos-sim's offline_fraction); {} rounds of a \
                 push with ttl_s={} to every terminal in {sent_s:.1} s; a pod started and the \
                 offline terminals back at once ({ready_s:.1} s before it was ready); then \
                 every pod replaced (new pod first, then SIGTERM one old pod, like a \
                 Deployment); plain pushes leave the offline terminals out",
                later::OFFLINE_FRACTION * 100.0,
                later::ROUNDS,
                later::TTL_S
            ));
            a.later = Some(Sent {
                pushes,
                how: How::Rounds {
                    offline,
                    back_unix_ms,
                },
            });
        }
        Scenario::ColdStartQueued => {
            let offline = FaultConfig {
                offline_fraction: 1.0,
                ..FaultConfig::default()
            };
            c.sims.set_faults(&offline).await?;
            let ids: Vec<String> = (0..t).map(|n| c.sims.id(n)).collect();
            let tag = format!("r{}-{}", a.event_unix_ms, scenario.name());
            let pushes = later::rounds(&c.client, &c.targets, &ids, &tag, 1).await;
            let sent_s = (unix_ms() - a.event_unix_ms) as f64 / 1000.0;
            // Like a Deployment scaled to 0: every pod signalled at once, then waited for.
            let mut leaving = Vec::new();
            while !c.pods.is_empty() {
                leaving.push(terminate(c, 0).await?);
            }
            for pod in leaving {
                pod.exited().await?;
            }
            c.sims.set_faults(&FaultConfig::default()).await?;
            // The event is the cold start: convergence and the drain count from here.
            a.event_unix_ms = unix_ms();
            start_ready(c, c.profile.pods, Release::Current).await?;
            a.notes.push(format!(
                "every terminal offline; one push with ttl_s={} to each in {sent_s:.1} s; \
                 every pod stopped (SIGTERM at once); the terminals back and {} pods \
                 started at once (the event)",
                later::TTL_S,
                c.profile.pods
            ));
            a.later = Some(Sent {
                pushes,
                how: How::Rounds {
                    offline,
                    back_unix_ms: a.event_unix_ms,
                },
            });
        }
        Scenario::RollingUpgrade => {
            a.ideal_moved = Some(t);
            a.notes.push(
                "every pod on the previous release; a new-release pod first, then SIGTERM \
                 one old pod and the next new pod at once (like a Deployment)"
                    .into(),
            );
            let mut trace = UpgradeTrace {
                releases: upgrade::releases_of(c),
                ..UpgradeTrace::default()
            };
            replace_each(c, Release::Current, Some(&mut trace)).await?;
            a.upgrade = Some(trace);
        }
        Scenario::Broadcast => {
            let idle = c.profile.outage;
            let run = broadcast::run(c, idle).await?;
            a.notes.push(format!(
                "every terminal labeled fleet=all (a relabel: nothing redials); live \
                 pushes for {:.0} s (the second half the baseline), then one broadcast to every terminal \
                 (--broadcast-rate default, 200 copies/s per pod), followed to its end",
                idle.as_secs_f64()
            ));
            a.event_unix_ms = run.during.0;
            a.broadcast = Some(run);
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
        Scenario::RedisOutage | Scenario::SinglePodOutage => {
            let every: Vec<usize> = (0..c.pods.len()).collect();
            let cut = cut_off(c, &every, outage).await;
            a.notes.push(format!(
                "all {} pods cut off from Redis for {} s ({:.1}x the lease TTL)",
                cut.pods.len(),
                outage.as_secs(),
                outage.as_secs_f64() / c.profile.lease_ttl.as_secs_f64()
            ));
            a.cut = Some(cut);
            a.settle = c.profile.lease_ttl;
        }
        Scenario::PartialPartition => {
            let n = c.pods.len();
            if n < 2 {
                return Err(LoadError::Plan(
                    "partial-partition needs at least 2 pods".into(),
                ));
            }
            let half: Vec<usize> = (n - n / 2..n).collect();
            let cut = cut_off(c, &half, outage).await;
            for pod in &cut.pods {
                a.deadline_faults.push((pod.clone(), cut.from_unix_ms));
            }
            a.notes.push(format!(
                "{} of {n} pods ({}) cut off from Redis for {} s, still connected to their \
                 terminals and peers and push targets",
                cut.pods.len(),
                cut.pods.join(", "),
                outage.as_secs()
            ));
            a.cut = Some(cut);
            a.settle = c.profile.lease_ttl;
        }
        Scenario::RedisFailover => {
            let cut = sentinels::fail_over(c, &mut a).await?;
            a.cut = Some(cut);
            a.settle = c.profile.lease_ttl;
        }
        Scenario::PodPartition => {
            let cut = cut_off(c, &[c.pods.len() - 1], fault_for).await;
            a.deadline_faults
                .extend(cut.pods.iter().map(|p| (p.clone(), cut.from_unix_ms)));
            a.settle = c.profile.lease_ttl;
            a.notes.push(format!(
                "{} cut off from Redis for {} s (stays in service for pushes)",
                cut.pods.join(", "),
                fault_for.as_secs()
            ));
            a.cut = Some(cut);
        }
    }
    Ok(a)
}
