//! `posgate-load`: the load and fault harness. Starts Redis, `pos-sim` processes, the
//! directory import and `posgate serve` pods on loopback, runs the chosen scenarios under a
//! steady push load, and writes a JSON report per scenario, PNG charts per scenario (with
//! the default `charts` feature) and `summary.md` into the results directory. Exit code 1
//! if a gate failed (a raw overlap in a graceful scenario, any session overlap, any key
//! delivered twice except by a killed owner's successor, a push attempt unanswered by its
//! deadline + 1 s; for rolling-upgrade also no protocol-1 request accepted by a new pod;
//! for offline-later, cold-start-queued and rolling-upgrade no push with a TTL answered
//! 200/202 and left undelivered, refused without a clear answer or taken after its
//! expiry, and for the first two each terminal's taken in acceptance order;
//! with Prometheus installed, an alert the scenario must raise that did not fire, one it
//! does not allow that fired, or a dashboard query without data), 2 if the harness itself
//! failed (so is a missing `prometheus` under `CI=true`). Pushes not answered 200 are retried
//! with the same key through another pod, as a real sender would. Every child process is
//! killed on exit and on Ctrl-C.
#![forbid(unsafe_code)]

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Instant,
};

use anyhow::{bail, Context, Result};
use clap::Parser;
use posgate_loadtest::load::{
    alerts, analysis, calibrate, charts,
    cluster::{Cluster, Profile},
    floor,
    measure::run_scenario,
    pods::Release,
    procs,
    report::{markdown, ScenarioReport},
    scenarios::Scenario,
    upgrade::check_serve_flags,
};

/// Load and fault harness for posgate (real processes on loopback).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Scenarios to run in order: cold-start, scale-out, scale-in, rolling-restart, kill,
    /// pause, redis-restart, redis-outage, pod-partition, partial-partition,
    /// offline-later, cold-start-queued, single-pod-outage, or all (those thirteen); and,
    /// only when named, rolling-upgrade (needs --old-posgate), redis-failover and broadcast
    /// (a benchmark: a broadcast to every terminal beside live pushes).
    #[arg(required = true)]
    scenarios: Vec<String>,
    /// 5 pods, 5,000 terminals, TTL 3 s (CI).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// 20 pods, 50,000 terminals, default timings.
    #[arg(long)]
    full: bool,
    /// The posgate binary.
    #[arg(long)]
    posgate: PathBuf,
    /// rolling-upgrade: the previous release's posgate binary, which every pod runs
    /// before the upgrade.
    #[arg(long)]
    old_posgate: Option<PathBuf>,
    /// The pos-sim binary (default: next to this binary).
    #[arg(long)]
    pos_sim: Option<PathBuf>,
    /// Results directory (JSON per scenario, summary.md, logs).
    #[arg(long, default_value = "loadtest-results")]
    results: PathBuf,
    /// Override the profile's pod count.
    #[arg(long)]
    pods: Option<usize>,
    /// Override the profile's terminal count.
    #[arg(long)]
    terminals: Option<u64>,
    /// Override the profile's push rate (pushes per second).
    #[arg(long)]
    push_rate: Option<f64>,
    /// An environment variable for every pod, NAME=VALUE (repeatable): e.g.
    /// `_RJEM_MALLOC_CONF=...` or `TOKIO_WORKER_THREADS=1` to measure a setting. The
    /// summary's command line shows it.
    #[arg(long, value_parser = name_value)]
    pod_env: Vec<(String, String)>,
    /// redis-restart: leave the terminal directory wiped instead of importing it again
    /// right after Redis restarts empty.
    #[arg(long)]
    no_reimport: bool,
}

/// `NAME=VALUE` of `--pod-env`.
fn name_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.into(), value.into())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

/// Most connections one pod may hold: one process can open at most ~19,000 sockets here.
const MAX_CONNECTIONS_PER_POD: u64 = 17_000;

/// Why `sc` cannot run with `profile` here, if it cannot: a pod holds one socket per
/// terminal of its shards, and the terminals are spread over the fewest pods the
/// scenario leaves holding them (N - 1 while one is down, one in single-pod-outage).
fn misfit(profile: &Profile, sc: Scenario) -> Option<String> {
    let fewest = sc.fewest_holding(profile.pods);
    let worst = profile.terminals.div_ceil(fewest as u64);
    (worst > MAX_CONNECTIONS_PER_POD).then(|| {
        format!(
            "{}: {} terminals over {fewest} of {} pods means up to {worst} connections in one \
             pod; one process can hold at most ~19,000 sockets here (--terminals {} or fewer)",
            sc.name(),
            profile.terminals,
            profile.pods,
            MAX_CONNECTIONS_PER_POD * fewest as u64
        )
    })
}

/// The scenarios to run, and those `all` left out with why.
#[derive(Debug, PartialEq)]
struct Plan {
    list: Vec<Scenario>,
    left_out: Vec<String>,
}

/// The scenarios named on the command line, checked: cold-start only first,
/// rolling-upgrade only with the previous release's binary, and every pod able to hold
/// its terminals ([`misfit`]). `all` leaves out a scenario that does not fit (the summary
/// says so: single-pod-outage in the full profile); a named one that does not fit, or an
/// `all` that leaves nothing, stops the run.
fn scenarios(names: &[String], old_posgate: Option<&Path>, profile: &Profile) -> Result<Plan> {
    let mut plan = Plan {
        list: Vec::new(),
        left_out: Vec::new(),
    };
    for n in names {
        if n == "all" {
            for sc in Scenario::ALL {
                match misfit(profile, sc) {
                    None => plan.list.push(sc),
                    Some(why) => plan.left_out.push(format!("left out of all: {why}")),
                }
            }
            continue;
        }
        let sc = Scenario::parse(n).with_context(|| format!("unknown scenario {n:?}"))?;
        if let Some(why) = misfit(profile, sc) {
            bail!("{why}");
        }
        plan.list.push(sc);
    }
    if plan.list.is_empty() {
        bail!("no scenario fits: {}", plan.left_out.join("; "));
    }
    if plan.list.iter().skip(1).any(|s| *s == Scenario::ColdStart) {
        bail!("cold-start can only be the first scenario");
    }
    // Its pods reach Redis through sentinels, without the proxies the others cut.
    if plan.list.contains(&Scenario::RedisFailover)
        && plan
            .list
            .iter()
            .any(|s| !matches!(s, Scenario::RedisFailover | Scenario::ColdStart))
    {
        bail!("redis-failover runs on its own (or after cold-start): its pods reach Redis through sentinels");
    }
    if plan.list.contains(&Scenario::RollingUpgrade) && old_posgate.is_none() {
        bail!(
            "rolling-upgrade needs --old-posgate PATH: the previous release's posgate binary \
             (e.g. built from the previous main)"
        );
    }
    Ok(plan)
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    format!("{cpus} cores ({model})")
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Runs the plan; `reports` and `left_out` (scenarios `all` left out, with why) are
/// filled as it goes, so a failed run still reports what it did.
async fn run(
    args: &Args,
    dir: &Path,
    reports: &mut Vec<ScenarioReport>,
    left_out: &mut Vec<String>,
) -> Result<()> {
    let mut profile = if args.full {
        Profile::full()
    } else {
        Profile::quick()
    };
    if let Some(p) = args.pods {
        profile.pods = p;
    }
    if let Some(t) = args.terminals {
        profile.terminals = t;
    }
    if let Some(r) = args.push_rate {
        profile.push_rate = r;
    }
    profile.reimport_directory = !args.no_reimport;
    profile.pod_env = args.pod_env.clone();
    let plan = scenarios(&args.scenarios, args.old_posgate.as_deref(), &profile)?;
    for why in &plan.left_out {
        eprintln!("{why}");
    }
    left_out.extend(plan.left_out);
    let list = plan.list;
    let upgrading = list.contains(&Scenario::RollingUpgrade);
    let pos_sim = match &args.pos_sim {
        Some(p) => p.clone(),
        None => procs::beside_this_binary("pos-sim")?,
    };
    if !charts::ENABLED {
        eprintln!("charts: off ({})", charts::ChartError::Disabled);
    }
    let started = Instant::now();
    let old = args.old_posgate.as_deref().filter(|_| upgrading);
    let sentinels = list.contains(&Scenario::RedisFailover);
    // Before anything else runs: H is the machine's, not shared with the run's processes.
    let handshake_rate = match list.contains(&Scenario::ColdStart) {
        true => {
            let h = calibrate::handshake_rate(
                &pos_sim,
                &dir.join("calibration"),
                calibrate::Window::COLD_START,
            )
            .await?;
            eprintln!("calibration: H = {}", h.describe());
            Some(h)
        }
        false => None,
    };
    // Then the same dials without posgate (`wire-dial`'s dialers, with the hello), which
    // the cold start is reported against: the protocol's own cost on this machine.
    let floor = match &handshake_rate {
        Some(h) => {
            let plan = floor::Plan {
                dialers: profile.pods,
                terminals: profile.terminals,
                dial_rate: profile.dial_rate,
                in_flight: profile.dial_concurrency,
                hello: true,
            };
            let wire_dial = procs::beside_this_binary("wire-dial")?;
            let f = floor::run(&wire_dial, &pos_sim, &dir.join("floor"), &plan).await?;
            let t = analysis::cold_start_t(
                profile.terminals,
                profile.pods as u64,
                profile.dial_rate,
                h.per_s(),
            );
            eprintln!("floor: {}", f.describe(t, analysis::bound_s(t)));
            Some(f)
        }
        None => None,
    };
    let mut cluster = Cluster::setup(
        profile.clone(),
        &args.posgate,
        old,
        &pos_sim,
        dir,
        sentinels,
    )
    .await?;
    cluster.handshake_rate = handshake_rate;
    cluster.floor = floor;
    if old.is_some() {
        check_serve_flags(&cluster.plan, Release::Previous).await?;
    }
    eprintln!(
        "setup: redis, {} terminals, directory imported in {:.1} s",
        profile.terminals,
        started.elapsed().as_secs_f64()
    );
    for sc in list {
        let t = Instant::now();
        eprintln!("scenario {} ...", sc.name());
        let mut report = run_scenario(&mut cluster, sc)
            .await
            .with_context(|| format!("scenario {}", sc.name()))?;
        // Neither the cold start (the cluster is up) nor the failover (its master is
        // gone, and a second failover is another scenario) can start over.
        let repeatable = !matches!(sc, Scenario::ColdStart | Scenario::RedisFailover);
        if let Some(jump) = report.failed_while_suspended().filter(|_| repeatable) {
            let first = format!("{}.suspended.json", sc.name());
            eprintln!(
                "scenario {} failed while the machine was suspended ({jump:.1} s); once more",
                sc.name()
            );
            write(&dir.join(&first), &serde_json::to_string_pretty(&report)?)?;
            report = run_scenario(&mut cluster, sc)
                .await
                .with_context(|| format!("scenario {} (second run)", sc.name()))?;
            report.notes.push(format!(
                "run twice: the first run failed a gate while the machine was suspended (the \
                 wall clock ran {jump:.1} s ahead of the monotonic one); its report is {first}"
            ));
        }
        charts::attach(&mut report, dir);
        eprintln!(
            "scenario {} done in {:.1} s: {}",
            sc.name(),
            t.elapsed().as_secs_f64(),
            if report.passed() { "pass" } else { "FAIL" }
        );
        eprintln!("  {}", alerts::timeline(&report));
        write(
            &dir.join(format!("{}.json", sc.name())),
            &serde_json::to_string_pretty(&report)?,
        )?;
        reports.push(report);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let profile = if args.full { "full" } else { "quick" };
    let dir = args.results.join(profile);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("creating {}: {e}", dir.display());
        return ExitCode::from(2);
    }
    let started = Instant::now();
    let mut reports = Vec::new();
    let mut left_out = Vec::new();
    let outcome = {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("installing the SIGTERM handler: {e}");
                    return ExitCode::from(2);
                }
            };
        // Dropping the run future drops the cluster, whose guards kill every child.
        tokio::select! {
            r = run(&args, &dir, &mut reports, &mut left_out) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted (Ctrl-C)")),
            _ = term.recv() => Err(anyhow::anyhow!("interrupted (SIGTERM)")),
        }
    };
    let command: Vec<String> = std::env::args().collect();
    let header = format!(
        "## posgate-load, {profile} profile\n\nCommand: `{}`  \nMachine: {}  \nTotal run time: {:.0} s  \nCharts: {}{}{}",
        command.join(" "),
        machine(),
        started.elapsed().as_secs_f64(),
        if charts::ENABLED {
            "PNG per scenario, linked below".to_owned()
        } else {
            charts::ChartError::Disabled.to_string()
        },
        left_out
            .iter()
            .map(|why| format!("  \n**Not run:** {why}"))
            .collect::<String>(),
        match &outcome {
            Ok(()) => String::new(),
            Err(e) => format!("  \n**Harness error:** {e:#}"),
        }
    );
    let md = markdown(&header, &reports);
    let _ = write(&dir.join("summary.md"), &md);
    println!("{md}");
    eprintln!("results in {}", dir.display());
    match outcome {
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
        Ok(()) if reports.iter().all(ScenarioReport::passed) => ExitCode::SUCCESS,
        Ok(()) => ExitCode::from(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_env_is_name_equals_value() {
        let ok = |s: &str| name_value(s).unwrap();
        assert_eq!(
            ok("TOKIO_WORKER_THREADS=1"),
            ("TOKIO_WORKER_THREADS".into(), "1".into())
        );
        // Only the first `=` splits: values like a malloc conf keep theirs.
        assert_eq!(ok("A=b=c,d:1"), ("A".into(), "b=c,d:1".into()));
        assert_eq!(ok("EMPTY="), ("EMPTY".into(), String::new()));
        for bad in ["NOVALUE", "=x", ""] {
            assert!(name_value(bad).is_err(), "{bad:?}");
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn list(names_: &[&str], old: Option<&Path>) -> Result<Vec<Scenario>> {
        scenarios(&names(names_), old, &Profile::quick()).map(|p| p.list)
    }

    #[test]
    fn rolling_upgrade_runs_only_when_named_and_given_the_old_binary() {
        let all = list(&["all"], None).unwrap();
        assert_eq!(all.len(), 13);
        assert_eq!(all.last(), Some(&Scenario::SinglePodOutage));
        assert!(!all.contains(&Scenario::RollingUpgrade));
        let err = list(&["rolling-upgrade"], None).unwrap_err();
        assert!(err.to_string().contains("--old-posgate PATH"), "{err}");
        let old = Path::new("/old/posgate");
        let both = list(&["rolling-upgrade", "kill"], Some(old)).unwrap();
        assert_eq!(both, [Scenario::RollingUpgrade, Scenario::Kill]);
        assert!(list(&["kill", "cold-start"], None).is_err());
        assert!(list(&["rolling-update"], Some(old)).is_err());
    }

    #[test]
    fn redis_failover_runs_only_when_named_and_on_its_own() {
        assert!(!list(&["all"], None)
            .unwrap()
            .contains(&Scenario::RedisFailover));
        assert_eq!(
            list(&["redis-failover"], None).unwrap(),
            [Scenario::RedisFailover]
        );
        assert!(list(&["cold-start", "redis-failover"], None).is_ok());
        let err = list(&["redis-failover", "redis-outage"], None).unwrap_err();
        assert!(err.to_string().contains("on its own"), "{err}");
    }

    #[test]
    fn all_leaves_out_what_one_pod_cannot_hold_and_says_so() {
        let quick = scenarios(&names(&["all"]), None, &Profile::quick()).unwrap();
        assert!(quick.left_out.is_empty(), "{:?}", quick.left_out);
        // Full: 50,000 over 19 pods (one down) and over 10 (half cut off) fit; on one
        // pod they do not.
        let full = scenarios(&names(&["all"]), None, &Profile::full()).unwrap();
        assert_eq!(full.list.len(), 12);
        assert!(!full.list.contains(&Scenario::SinglePodOutage));
        assert_eq!(full.left_out.len(), 1);
        assert!(
            full.left_out[0].starts_with("left out of all: single-pod-outage: 50000 terminals")
                && full.left_out[0].contains("--terminals 17000 or fewer"),
            "{:?}",
            full.left_out
        );
        // Named, it stops the run instead.
        let named = ["single-pod-outage"];
        assert!(scenarios(&names(&named), None, &Profile::full()).is_err());
        let fits = Profile {
            terminals: 17_000,
            ..Profile::full()
        };
        assert!(scenarios(&names(&named), None, &fits).is_ok());
        let over = Profile {
            terminals: 17_001,
            ..Profile::full()
        };
        assert!(scenarios(&names(&named), None, &over).is_err());
        // A profile no scenario fits stops the run rather than running nothing.
        let two = Profile {
            pods: 2,
            ..Profile::full()
        };
        assert!(scenarios(&names(&["all"]), None, &two).is_err());
        assert_eq!(Scenario::PartialPartition.fewest_holding(3), 2);
        assert_eq!(Scenario::PartialPartition.fewest_holding(20), 10);
        assert_eq!(Scenario::Kill.fewest_holding(1), 1);
    }
}
