//! The invariants a simulated run must keep, and the record of a violation.
//!
//! Overlap is checked after every event of a pod, for the shards that pod serves: a pod
//! only *starts* serving inside one of its own events (time alone can only end serving,
//! when a deadline passes or a verdict lapses), so checking there finds every overlap.
//!
//! What must hold is what a terminal can tell apart: at most one pod may deliver on a
//! shard with the newest epoch said hello with (the terminal's fence). Two pods may both
//! believe they hold a shard — a pod holding through an outage it judged cluster-wide
//! while a pod its quorum could not hear took the shard over — but then the older epoch
//! is fenced: the terminal refuses it once the newer hello arrived. The simulation
//! models the hello as arriving at once; per terminal, the real order is the same.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::core::{Epoch, PodId, ShardId};

/// An invariant that did not hold, with the recent history that led to it.
#[derive(Clone, Debug)]
pub struct Violation {
    pub seed: u64,
    pub at: Duration,
    pub what: String,
    pub recent: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} at {:.3}s: {}",
            self.seed,
            self.at.as_secs_f64(),
            self.what
        )?;
        writeln!(f, "replay: posgate simulate --seed {}", self.seed)?;
        writeln!(f, "last events:")?;
        for line in &self.recent {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}

/// Running invariant state for one seed.
pub struct Checker {
    seed: u64,
    /// Highest epoch the store ever granted, per shard.
    granted: Vec<Option<Epoch>>,
    /// Last `StartServing` per shard: (pod, epoch), the terminals' newest hello.
    last_start: Vec<Option<(PodId, Epoch)>>,
    /// Checks that found two pods holding a shard, one of them fenced by epoch.
    pub fenced_overlaps: u64,
    recent: VecDeque<String>,
    /// `POSGATE_SIM_TRACE=1` prints every history line as it happens (for replays).
    trace: bool,
    pub checks: u64,
}

const RECENT: usize = 60;

impl Checker {
    pub fn new(seed: u64, shards: u32) -> Self {
        Checker {
            seed,
            granted: vec![None; shards as usize],
            last_start: vec![None; shards as usize],
            recent: VecDeque::new(),
            fenced_overlaps: 0,
            trace: std::env::var_os("POSGATE_SIM_TRACE").is_some(),
            checks: 0,
        }
    }

    /// Remembers a line of history for the violation report.
    pub fn log(&mut self, at: Duration, line: impl fmt::Display) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        let line = format!("{:9.3}s {line}", at.as_secs_f64());
        if self.trace {
            eprintln!("{line}");
        }
        self.recent.push_back(line);
    }

    /// Whether every step is being printed (`POSGATE_SIM_TRACE`).
    pub fn tracing(&self) -> bool {
        self.trace
    }

    pub fn violation(&self, at: Duration, what: String) -> Violation {
        Violation {
            seed: self.seed,
            at,
            what,
            recent: self.recent.iter().cloned().collect(),
        }
    }

    /// The store granted `epoch` for `shard`: it must exceed every earlier grant.
    pub fn granted(&mut self, at: Duration, shard: ShardId, epoch: Epoch) -> Result<(), Violation> {
        self.checks += 1;
        if let Some(prev) = self.granted[shard as usize].filter(|&p| epoch <= p) {
            let what = format!("shard {shard}: store granted epoch {epoch} after {prev}");
            return Err(self.violation(at, what));
        }
        self.granted[shard as usize] = Some(epoch);
        Ok(())
    }

    /// A pod started serving: epochs seen by terminals must only grow, strictly on a
    /// change of pod.
    pub fn started(
        &mut self,
        at: Duration,
        pod: &PodId,
        shard: ShardId,
        epoch: Epoch,
    ) -> Result<(), Violation> {
        self.checks += 1;
        let bad = match &self.last_start[shard as usize] {
            Some((p, e)) if p == pod => epoch < *e,
            Some((_, e)) => epoch <= *e,
            None => false,
        };
        if bad {
            let (p, e) = self.last_start[shard as usize].clone().unwrap();
            return Err(self.violation(
                at,
                format!("shard {shard}: {pod} serves epoch {epoch} after {p} served {e}"),
            ));
        }
        self.last_start[shard as usize] = Some((pod.clone(), epoch));
        Ok(())
    }

    /// `servers` are the pods that may deliver on `shard` right now, with their epochs:
    /// at most one with the terminals' newest epoch; the others are fenced.
    pub fn exclusive(
        &mut self,
        at: Duration,
        shard: ShardId,
        servers: &[(PodId, Epoch)],
    ) -> Result<(), Violation> {
        self.checks += 1;
        let newest = self.last_start[shard as usize].as_ref().map(|(_, e)| *e);
        let current: Vec<&(PodId, Epoch)> = servers
            .iter()
            .filter(|(_, e)| newest.is_none_or(|n| *e >= n))
            .collect();
        if current.len() > 1 {
            return Err(self.violation(
                at,
                format!("shard {shard} delivered on by {current:?} at once (none fenced)"),
            ));
        }
        if servers.len() > 1 {
            self.fenced_overlaps += 1;
            if self.trace {
                self.log(
                    at,
                    format!("shard {shard} held by {servers:?}, older fenced"),
                );
            }
        }
        Ok(())
    }
}
