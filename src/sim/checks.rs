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

use crate::core::membership::Lease;
use crate::core::{Epoch, PodId, ShardId};

/// What the terminals did with a pod's hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hello {
    Accepted,
    /// Stale: a newer hello was there first. The pod is told (`409` and
    /// `posgate-stale-epoch` in the real protocol) and drops the shard.
    Refused,
}

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
    /// Hellos the terminals refused as stale (see [`Checker::started`]).
    pub refused_hellos: u64,
    /// Whether the store went back in time in this run (a failover that lost writes):
    /// only then may two pods be handed the same epoch.
    went_back: bool,
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
            refused_hellos: 0,
            went_back: false,
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

    /// The store failed over to a replica that lost its last writes: its epochs are the
    /// grants it still remembers (`last(shard)`), and it only has to grant above those.
    /// What must not go back is what terminals saw ([`Checker::started`]).
    pub fn rolled_back(&mut self, last: impl Fn(ShardId) -> Epoch) {
        self.went_back = true;
        for (shard, granted) in self.granted.iter_mut().enumerate() {
            *granted = Some(last(shard as ShardId)).filter(|&e| e > 0);
        }
    }

    /// A pod started serving `shard` on `epoch` and says hello to its terminals. The
    /// terminal takes it if it is not older than the newest hello it has
    /// (`docs/pos-protocol.md` §4: an equal epoch is accepted and supersedes the older
    /// session); otherwise it refuses it as stale ([`Hello::Refused`]): the pod held the
    /// shard through a verdict it could not know was wrong, and another pod (outside its
    /// quorum) acquired meanwhile, or the store lost a grant and handed out a lower
    /// epoch. That is the fence at work, not a violation — unless the pod could have
    /// known: `known` is the lease its own last snapshot or answer showed for the shard,
    /// and resuming on an epoch older than another pod's lease it has seen is a
    /// violation. A pod going back on its own epochs is one too, and so is another
    /// pod's hello on an equal epoch unless the store lost grants in this run (then it
    /// can hand out an epoch equal to one it forgot).
    pub fn started(
        &mut self,
        at: Duration,
        pod: &PodId,
        shard: ShardId,
        epoch: Epoch,
        known: Option<&Lease>,
    ) -> Result<Hello, Violation> {
        self.checks += 1;
        let Some((p, e)) = self.last_start[shard as usize].clone() else {
            self.last_start[shard as usize] = Some((pod.clone(), epoch));
            return Ok(Hello::Accepted);
        };
        if p != *pod && epoch == e && !self.went_back {
            return Err(self.violation(
                at,
                format!("shard {shard}: {pod} and {p} were both handed epoch {epoch}"),
            ));
        }
        if epoch >= e {
            self.last_start[shard as usize] = Some((pod.clone(), epoch));
            return Ok(Hello::Accepted);
        }
        let knew = known.is_some_and(|l| l.owner != *pod && l.epoch > epoch);
        if p == *pod || knew {
            let why = if knew {
                " (it had seen the newer lease)"
            } else {
                ""
            };
            return Err(self.violation(
                at,
                format!("shard {shard}: {pod} serves epoch {epoch} after {p} served {e}{why}"),
            ));
        }
        self.refused_hellos += 1;
        self.log(
            at,
            format_args!("shard {shard}: terminals refuse {pod}'s hello on {epoch}, {p} said {e}"),
        );
        Ok(Hello::Refused)
    }

    /// The terminals' current session on `shard`: the newest hello they accepted.
    pub fn newest_hello(&self, shard: ShardId) -> Option<(&PodId, Epoch)> {
        self.last_start[shard as usize]
            .as_ref()
            .map(|(pod, epoch)| (pod, *epoch))
    }

    /// `servers` are the pods that may deliver on `shard` right now, with their epochs:
    /// at most one holds the terminals' current session (the newest hello: its pod and
    /// epoch); the others are fenced (an older epoch, or an equal one superseded).
    pub fn exclusive(
        &mut self,
        at: Duration,
        shard: ShardId,
        servers: &[(PodId, Epoch)],
    ) -> Result<(), Violation> {
        self.checks += 1;
        let newest = self.last_start[shard as usize].as_ref();
        let current: Vec<&(PodId, Epoch)> = servers
            .iter()
            .filter(|(p, e)| newest.is_none_or(|(np, n)| *e > *n || (*e == *n && p == np)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testing::pod;

    #[test]
    fn an_older_hello_is_refused_unless_the_pod_could_have_known() {
        let at = Duration::ZERO;
        let mut c = Checker::new(1, 4);
        assert_eq!(
            c.started(at, &pod("a"), 0, 5, None).unwrap(),
            Hello::Accepted
        );
        assert_eq!(
            c.started(at, &pod("b"), 0, 9, None).unwrap(),
            Hello::Accepted
        );
        // a held through a verdict while b acquired: the terminals refuse a's hello.
        assert_eq!(
            c.started(at, &pod("a"), 0, 5, None).unwrap(),
            Hello::Refused
        );
        assert_eq!(c.refused_hellos, 1);
        // ... but a that had seen b's newer lease must not have tried.
        let seen = Lease {
            owner: pod("b"),
            epoch: 9,
        };
        assert!(c.started(at, &pod("a"), 0, 5, Some(&seen)).is_err());
        // Its own lease, or another pod's older one, proves nothing.
        let own = Lease {
            owner: pod("a"),
            epoch: 9,
        };
        assert_eq!(
            c.started(at, &pod("a"), 0, 5, Some(&own)).unwrap(),
            Hello::Refused
        );
        let old = Lease {
            owner: pod("b"),
            epoch: 3,
        };
        assert_eq!(
            c.started(at, &pod("a"), 0, 5, Some(&old)).unwrap(),
            Hello::Refused
        );
        // A pod going back on its own epochs is always a violation.
        assert!(c.started(at, &pod("b"), 0, 8, None).is_err());
        assert_eq!(
            c.started(at, &pod("b"), 0, 9, None).unwrap(),
            Hello::Accepted
        );
    }

    #[test]
    fn an_equal_epoch_of_another_pod_needs_a_store_that_went_back() {
        let at = Duration::ZERO;
        let mut c = Checker::new(1, 4);
        c.started(at, &pod("a"), 0, 5, None).unwrap();
        assert!(c.started(at, &pod("b"), 0, 5, None).is_err());
        // A failover lost a's grant: b may be handed 5 again. The terminal takes the
        // newer hello, and only its session is current.
        c.rolled_back(|_| 0);
        assert_eq!(
            c.started(at, &pod("b"), 0, 5, None).unwrap(),
            Hello::Accepted
        );
        let (a, b) = ((pod("a"), 5), (pod("b"), 5));
        c.exclusive(at, 0, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(c.fenced_overlaps, 1);
        // Two current sessions are still a violation.
        c.started(at, &pod("a"), 0, 6, None).unwrap();
        assert!(c.exclusive(at, 0, &[(pod("a"), 6), (pod("a"), 6)]).is_err());
    }
}
