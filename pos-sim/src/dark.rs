//! The farm-wide log of dark intervals: for each terminal, every span during which it had
//! no open TLS connection at all, from the close of its last open connection to the open
//! of its next one, measured by the terminal (`GET /dark`, [`super::PosFarm::dark_intervals`]).
//!
//! This is what a planned move costs a terminal (issue 15: "dark time per moved
//! terminal"), seen from the only side that cannot be wrong about it. Only intervals that
//! ended are logged: a terminal dark now is counted (`dark_now`) but its interval has no
//! length yet, and a terminal that never had a connection is not dark but not yet dialed
//! (`not_yet_dialed`). The log keeps the newest [`DARK_KEPT`] intervals and counts the
//! older ones it dropped.
//!
//! Not for: session gaps (a connection without a current session is not dark: the pods'
//! hellos are the handover's business, not the terminal's connectivity), or overlaps
//! (`raw_overlaps` in the counters).

use serde::{Deserialize, Serialize};

use super::{bounded::BoundedLog, counters::FarmCounters};
use crate::dist::{dist, Dist};

/// Most dark intervals a farm keeps (24 bytes each, ~4.8 MB); older ones are dropped and
/// counted. Enough for every terminal of a 15,000-terminal process to move 13 times.
pub const DARK_KEPT: usize = 200_000;

/// A dark interval that ended, as the terminal's bookkeeping hands it over (no id yet:
/// the log keeps terminal numbers, not strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended {
    pub(crate) start_unix_ms: u64,
    pub(crate) end_unix_ms: u64,
}

/// One terminal's ended dark interval, as logged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Logged {
    number: u64,
    span: Ended,
}

/// One ended dark interval: the terminal had no open connection from `start_unix_ms` (its
/// last open connection closed) to `end_unix_ms` (its next connection opened).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DarkInterval {
    pub terminal: String,
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
}

impl DarkInterval {
    /// The interval's length, ms.
    pub fn ms(&self) -> u64 {
        self.end_unix_ms.saturating_sub(self.start_unix_ms)
    }
}

/// `GET /dark?since=<unix_ms>`: the kept dark intervals that ended at or after `since`,
/// their lengths summarised, and the terminals dark or never connected now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DarkIntervals {
    pub since_unix_ms: u64,
    /// In the order they were logged: the order they ended, to within a millisecond.
    pub intervals: Vec<DarkInterval>,
    /// Count and p50/p99/max length (ms) of `intervals`.
    pub summary: Dist,
    /// Older intervals dropped from the log since the farm started (it keeps the newest
    /// [`DARK_KEPT`]).
    pub dropped: u64,
    /// Some intervals that ended at or after `since` may be missing: intervals were
    /// dropped and the oldest kept one ended after `since`.
    pub incomplete: bool,
    /// Terminals without an open connection now that had one before: dark, their interval
    /// not ended, so not listed.
    pub dark_now: u64,
    /// Terminals that never had a connection (not dark: not yet dialed).
    pub not_yet_dialed: u64,
}

/// The bounded log of dark intervals.
pub(crate) type DarkLog = BoundedLog<Logged>;

impl DarkLog {
    pub(crate) fn new() -> Self {
        BoundedLog::with_capacity(DARK_KEPT)
    }

    /// Logs terminal `number`'s interval that just ended.
    pub(crate) fn ended(&self, number: u64, span: Ended) {
        self.record(Logged { number, span });
    }

    /// The intervals that ended at or after `since`, ids spelled by `id`; the gauges
    /// from `counters`.
    pub(crate) fn since(
        &self,
        since: u64,
        id: impl Fn(u64) -> String,
        counters: &FarmCounters,
    ) -> DarkIntervals {
        let (kept, dropped) = self.snapshot();
        let oldest_end = kept.first().map_or(u64::MAX, |l| l.span.end_unix_ms);
        let intervals: Vec<DarkInterval> = kept
            .iter()
            .filter(|l| l.span.end_unix_ms >= since)
            .map(|l| DarkInterval {
                terminal: id(l.number),
                start_unix_ms: l.span.start_unix_ms,
                end_unix_ms: l.span.end_unix_ms,
            })
            .collect();
        DarkIntervals {
            since_unix_ms: since,
            summary: dist(intervals.iter().map(DarkInterval::ms).collect()),
            intervals,
            dropped,
            incomplete: dropped > 0 && oldest_end > since,
            dark_now: counters.terminals_dark,
            // The two gauges move under different terminals' locks: never below zero.
            not_yet_dialed: counters
                .terminals
                .saturating_sub(counters.terminals_connected)
                .saturating_sub(counters.terminals_dark),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start_unix_ms: u64, end_unix_ms: u64) -> Ended {
        Ended {
            start_unix_ms,
            end_unix_ms,
        }
    }

    #[test]
    fn since_filters_by_end_and_summarises_the_lengths() {
        let log = DarkLog::new();
        log.ended(1, span(1_000, 1_100));
        log.ended(2, span(1_900, 2_300));
        log.ended(1, span(2_000, 2_010));
        let counters = FarmCounters {
            terminals: 10,
            terminals_connected: 6,
            terminals_dark: 1,
            ..FarmCounters::default()
        };
        let d = log.since(2_010, |n| format!("t-{n}"), &counters);
        let got: Vec<(&str, u64)> = d
            .intervals
            .iter()
            .map(|i| (i.terminal.as_str(), i.ms()))
            .collect();
        assert_eq!(got, [("t-2", 400), ("t-1", 10)], "ended at or after 2,010");
        assert_eq!(
            (d.summary.count, d.summary.p50, d.summary.max),
            (2, 10, 400)
        );
        assert_eq!((d.dark_now, d.not_yet_dialed), (1, 3));
        assert_eq!((d.dropped, d.incomplete), (0, false));
        assert_eq!(
            log.since(0, |n| n.to_string(), &counters).intervals.len(),
            3
        );
    }

    #[test]
    fn the_log_keeps_the_newest_and_says_when_a_window_may_be_incomplete() {
        let log = DarkLog::new();
        let extra = 5u64;
        for k in 0..DARK_KEPT as u64 + extra {
            log.ended(k, span(k * 10, k * 10 + 1));
        }
        let all = log.since(0, |n| n.to_string(), &FarmCounters::default());
        assert_eq!(all.intervals.len(), DARK_KEPT);
        assert_eq!(all.dropped, extra);
        assert_eq!(
            all.intervals[0].terminal,
            extra.to_string(),
            "oldest dropped"
        );
        assert!(all.incomplete, "the dropped ones ended after 0");
        // A window that begins after the oldest kept interval ended lost nothing.
        let recent = log.since(extra * 10 + 1, |n| n.to_string(), &FarmCounters::default());
        assert!(!recent.incomplete);
        assert_eq!(recent.intervals.len(), DARK_KEPT);
    }
}
