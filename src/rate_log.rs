//! Log lines for events a stranger can cause at will (refused requests), or that come
//! in bursts of one per shard (a crashed predecessor, found gone by each of its shards'
//! walks), at most one (or a few) per interval per kind, each saying how many were
//! suppressed since the last one. A
//! flood of refusals costs a counter increment each, not a line each, yet an operator
//! still sees the first one at once and the volume afterwards. The exact counts are in
//! the metrics.
//!
//! Not for: logging anything that happens at a bounded rate by design.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One line per second per kind at most.
pub const INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Kind {
    /// When the current interval began (with its first line).
    since: Instant,
    /// Lines written in it.
    lines: u32,
    suppressed: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct RateLog {
    kinds: Mutex<HashMap<&'static str, Kind>>,
}

impl RateLog {
    /// Whether a line for `kind` may be written at `now`; if so, how many events of
    /// that kind were suppressed since the previous line (the caller writes the line).
    pub fn admit(&self, kind: &'static str, now: Instant) -> Option<u64> {
        self.admit_up_to(kind, now, 1)
    }

    /// As [`RateLog::admit`], with up to `lines` lines per interval: for events that
    /// deserve a line each while they are few (one per push), and a count once they are
    /// many.
    pub fn admit_up_to(&self, kind: &'static str, now: Instant, lines: u32) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(PoisonError::into_inner);
        let k = kinds.entry(kind).or_insert(Kind {
            since: now,
            lines: 0,
            suppressed: 0,
        });
        if now.duration_since(k.since) >= INTERVAL {
            k.since = now;
            k.lines = 0;
        }
        if k.lines >= lines {
            k.suppressed += 1;
            return None;
        }
        k.lines += 1;
        Some(std::mem::take(&mut k.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_per_kind_with_the_suppressed_count() {
        let log = RateLog::default();
        let t = Instant::now();
        assert_eq!(log.admit("replay", t), Some(0));
        for i in 1..=1000 {
            assert_eq!(log.admit("replay", t + Duration::from_micros(i)), None);
        }
        assert_eq!(log.admit("stale", t), Some(0), "kinds are independent");
        assert_eq!(log.admit("replay", t + INTERVAL), Some(1000));
        assert_eq!(log.admit("replay", t + INTERVAL), None);
    }

    #[test]
    fn up_to_n_lines_per_interval() {
        let log = RateLog::default();
        let t = Instant::now();
        let admitted = (0..10)
            .filter(|i| {
                log.admit_up_to("push", t + Duration::from_millis(*i), 3)
                    .is_some()
            })
            .count();
        assert_eq!(admitted, 3);
        assert_eq!(log.admit_up_to("push", t + INTERVAL, 3), Some(7));
        assert_eq!(log.admit_up_to("push", t + INTERVAL, 3), Some(0));
    }
}
