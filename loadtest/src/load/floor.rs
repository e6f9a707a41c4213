//! The cold start's floor: the dials a cold start's pods make, made by processes that
//! are not posgate, against a fresh farm of their own, timed the same way.
//!
//! `--dialers` processes of `wire-dial` in its dialer mode (one per pod, tokio's
//! default runtime like a pod), each dialing every `dialers`-th terminal at the pods'
//! dial rate with their handshakes in flight at most, and holding every connection, as
//! a pod does. With `hello` each dial also does what a pod's does on the wire after
//! TLS: the HTTP/2 handshake (hyper's client) and `POST /hello`, answered 200. The
//! figure is the time from spawning the dialers to the last one reporting all its
//! connections up, believed only once the farm's own counters say every terminal is
//! connected (and greeted).
//!
//! `wire-dial` runs it alone; `posgate-load` runs it before the pods of a cold start, so
//! that the cold start is reported beside the floor of the same run (`analysis::
//! against_floor`): on a machine whose cores also run the farm, the protocol's own cost
//! may exceed the bound built on H (`docs/performance.md`, "Cold start").
//!
//! Not for: the dialing itself (`wire-dial`'s dialer mode) or H (`calibrate`).

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{sims::SimFarm, LoadError};

/// The second octet of the floor farm's addresses (`127.0.200.1`...): apart from the
/// run's farm (`127.0.10.1`...) and the calibration's (`127.0.250.1`).
const NET: u8 = 200;
/// A TLS 1.3 client is done one flight before its server: how long the farm may take
/// to count the last connections after the dialers reported them.
const SETTLE: Duration = Duration::from_secs(5);

/// What the floor dials, as the pods would.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Dialing processes: the run's pods.
    pub dialers: usize,
    pub terminals: u64,
    /// Dials started per second by each dialer (the pods' `--dial-rate`).
    pub dial_rate: u64,
    /// Dials in flight per dialer (the pods' `--dial-concurrency`).
    pub in_flight: usize,
    /// After TLS, the HTTP/2 handshake and the hello.
    pub hello: bool,
}

/// The measured floor.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    pub hello: bool,
    pub dialers: usize,
    pub terminals: u64,
    /// From spawning the dialers to the last one's report.
    pub took_s: f64,
    /// The dialers' CPU time, summed.
    pub cpu_s: f64,
    /// Handshakes the farm saw fail (a dial that failed ends the run with an error, so
    /// these are the farm's view only).
    pub handshakes_failed: u64,
}

impl Floor {
    /// The protocol dialed.
    pub fn what(&self) -> &'static str {
        if self.hello {
            "TLS + HTTP/2 + hello"
        } else {
            "TLS only"
        }
    }

    /// The figure against `t_s` (T of the cold-start bound, whose bound is `bound_s`) and
    /// the dialers' CPU.
    pub fn describe(&self, t_s: f64, bound_s: f64) -> String {
        format!(
            "{}: {} terminals by {} dialers in {:.1} s = {:.2} x T (T = {t_s:.1} s, the \
             cold-start bound 1.2 x T + 5 s = {bound_s:.1} s); dialers' CPU {:.1} s, {:.3} ms per dial",
            self.what(),
            self.terminals,
            self.dialers,
            self.took_s,
            self.took_s / t_s,
            self.cpu_s,
            self.cpu_s * 1_000.0 / self.terminals as f64,
        )
    }
}

/// Starts a farm of `plan.terminals` (`pos_sim`, files under `dir`), runs `plan.dialers`
/// processes of `wire_dial` against it, checks the farm's counters, stops everything.
pub async fn run(
    wire_dial: &Path,
    pos_sim: &Path,
    dir: &Path,
    plan: &Plan,
) -> Result<Floor, LoadError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| LoadError::io(format!("creating {}", dir.display()), e))?;
    let farm = SimFarm::start_at(pos_sim, plan.terminals, dir, NET).await?;
    let start = Instant::now();
    let mut dialers = Vec::new();
    for k in 0..plan.dialers {
        let mut cmd = tokio::process::Command::new(wire_dial);
        cmd.arg("--dir")
            .arg(dir)
            .args(["--dialers", &plan.dialers.to_string()])
            .args(["--dial-rate", &plan.dial_rate.to_string()])
            .args(["--in-flight", &plan.in_flight.to_string()])
            .args(["--dialer", &k.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if plan.hello {
            cmd.arg("--hello");
        }
        let child = cmd.spawn().map_err(|source| LoadError::Spawn {
            what: format!("{} (dialer {k})", wire_dial.display()),
            source,
        })?;
        dialers.push(child);
    }
    // Each dialer prints one line once all its connections are up, then holds them
    // until its stdin closes (when `dialers` drops), so the farm carries every
    // connection to the end as it does in the cold start.
    let (mut took, mut cpu_s) = (Duration::ZERO, 0.0);
    for (k, child) in dialers.iter_mut().enumerate() {
        let what = format!("dialer {k}");
        let out = child
            .stdout
            .take()
            .ok_or_else(|| floor(&what, "no stdout"))?;
        let line = BufReader::new(out)
            .lines()
            .next_line()
            .await
            .map_err(|e| LoadError::io(format!("reading {what}"), e))?
            .ok_or_else(|| LoadError::Exited {
                what: what.clone(),
                status: "without its figure (its error is on stderr)".into(),
            })?;
        took = took.max(start.elapsed());
        cpu_s += line
            .strip_prefix("cpu ")
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| floor(&what, &format!("printed {line:?}, not `cpu <seconds>`")))?;
    }
    let hellos_wanted = if plan.hello { plan.terminals } else { 0 };
    let settled = Instant::now() + SETTLE;
    let (connected, hellos, handshakes_failed) = loop {
        let counted = farm.counters().await?;
        let count = |name: &str| counted.get(name).copied().unwrap_or(0);
        let seen = (count("terminals_connected"), count("sessions_accepted"));
        if seen == (plan.terminals, hellos_wanted) || Instant::now() > settled {
            break (seen.0, seen.1, count("handshakes_failed"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if (connected, hellos) != (plan.terminals, hellos_wanted) {
        return Err(floor(
            "the farm",
            &format!(
                "disagrees: {connected} of {} terminals connected, {hellos} hellos accepted \
                 ({hellos_wanted} sent)",
                plan.terminals
            ),
        ));
    }
    drop(dialers);
    drop(farm);
    Ok(Floor {
        hello: plan.hello,
        dialers: plan.dialers,
        terminals: plan.terminals,
        took_s: took.as_secs_f64(),
        cpu_s,
        handshakes_failed,
    })
}

fn floor(who: &str, what: &str) -> LoadError {
    LoadError::Floor(format!("{who}: {what}"))
}
