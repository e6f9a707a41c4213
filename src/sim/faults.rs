//! The seeded fault plan of one simulated run.
//!
//! Faults are drawn up front (times and kinds); which pod a fault hits is drawn when it
//! fires, from the pods alive then. Every fault with a duration is clipped so that all of
//! them have ended by `fault_end`, after which the cluster must converge.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use super::SimConfig;

/// One injected fault.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// A new pod starts.
    Join,
    /// A pod shuts down gracefully (SIGTERM).
    Leave,
    /// A pod dies without releasing anything (kill -9).
    Crash,
    /// A pod freezes (SIGSTOP, GC pause) for this long, then continues.
    Pause(Duration),
    /// The store is unreachable for every pod for this long (data kept).
    StoreOutage(Duration),
    /// The store restarts empty: every key, epoch and registration is lost.
    StoreWipe,
    /// One pod cannot reach the store for this long (it can still reach its peers).
    Partition(Duration),
}

/// Draws the fault plan: `(virtual time, fault)` in time order.
pub fn plan(rng: &mut StdRng, cfg: &SimConfig) -> Vec<(Duration, Fault)> {
    let ttl = cfg.core.lease_ttl.max(cfg.core.member_ttl);
    let mut out = Vec::new();
    let mut t = cfg.fault_start;
    loop {
        t += Duration::from_millis(rng.random_range(500..6_000));
        if t >= cfg.fault_end {
            break;
        }
        let room = cfg.fault_end - t;
        let span =
            |rng: &mut StdRng, lo: f64, hi: f64| ttl.mul_f64(rng.random_range(lo..hi)).min(room);
        let fault = match rng.random_range(0..100) {
            0..=17 => Fault::Join,
            18..=29 => Fault::Leave,
            30..=44 => Fault::Crash,
            45..=59 => Fault::Pause(span(rng, 0.2, 3.0)),
            60..=69 => Fault::StoreOutage(span(rng, 0.2, 2.5)),
            70..=79 => Fault::StoreWipe,
            _ => Fault::Partition(span(rng, 0.2, 2.5)),
        };
        out.push((t, fault));
    }
    out
}
