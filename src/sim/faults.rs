//! The seeded fault plan of one simulated run.
//!
//! Faults are drawn up front (times and kinds); which pod a fault hits is drawn when it
//! fires, from the pods alive then. Every fault with a duration is clipped so that all of
//! them have ended by `fault_end`, after which the cluster must converge.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use super::world::Failover;
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
    /// Half the pods (rounded down) cannot reach the store for this long; they still
    /// reach their peers, which reach the store.
    HalfPartition(Duration),
    /// The store is unreachable for everyone for this long, then comes back empty.
    StoreOutageThenWipe(Duration),
    /// A pod freezes for `pause`; half-way through, a store outage of `outage` begins.
    PauseThenOutage { pause: Duration, outage: Duration },
    /// The store fails over to a replica that lacks its last writes, with another clock.
    StoreFailover(Failover),
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
            0..=15 => Fault::Join,
            16..=25 => Fault::Leave,
            26..=38 => Fault::Crash,
            39..=50 => Fault::Pause(span(rng, 0.2, 3.0)),
            51..=57 => Fault::StoreOutage(span(rng, 0.2, 2.5)),
            // Static stability: outages far beyond the lease TTL.
            58..=61 => Fault::StoreOutage(span(rng, 3.0, 10.0)),
            62..=69 => Fault::StoreWipe,
            70..=73 => Fault::StoreOutageThenWipe(span(rng, 1.0, 6.0)),
            74..=77 => Fault::PauseThenOutage {
                pause: span(rng, 1.2, 3.0),
                outage: span(rng, 1.0, 4.0),
            },
            78..=85 => Fault::Partition(span(rng, 0.2, 2.5)),
            86..=89 => Fault::StoreFailover(Failover {
                outage: span(rng, 0.1, 1.5),
                // Up to a whole lease TTL of writes: a replication link cut before the
                // master died (a replica is still promoted within 10x down-after).
                lost: ttl.mul_f64(rng.random_range(0.0..1.0)),
                // Behind by up to 20 s (beyond any failover's duration), or ahead by
                // less than the lease margin (more would break the deadline rule,
                // which assumes clocks that agree within it).
                clock_ms: rng.random_range(-20_000..=cfg.core.lease_margin.as_millis() as i64 / 2),
            }),
            _ => Fault::HalfPartition(span(rng, 0.5, 3.0)),
        };
        out.push((t, fault));
    }
    out
}
