//! The status page's live timeline: a small ring of samples of this pod's metrics, one
//! every [`TIMELINE_EVERY`] for the last five minutes (terminals connected, and the
//! totals of dials, pushes answered ok and pushes failed), turned into points with
//! per-second rates from the counters' deltas between neighbouring samples. Kept by the
//! pod, so a page opened in the middle of an incident shows what led up to it.
//!
//! Bounded: at most [`KEPT`] samples of four numbers each, never an id. Not for:
//! alerting or history beyond a few minutes (Prometheus scrapes `/metrics` for that); a
//! restarted pod starts with an empty timeline.

use std::collections::VecDeque;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{known_series, Metrics};

/// How often the timeline takes a sample.
pub const TIMELINE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept: 60 points (five minutes) need one sample more than points.
pub const KEPT: usize = 61;

/// What one sample reads from the metrics: a gauge and three counter totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Terminals connected now (`posgate_terminals{state="connected"}`).
    pub connected: u64,
    /// Finished dials, any result (`posgate_dials_total`).
    pub dials: u64,
    /// Push API answers `200` (`posgate_push_requests_total{result="ok"}`).
    pub pushes_ok: u64,
    /// Push API answers with an error code.
    pub pushes_failed: u64,
}

/// One point of the timeline, as `/v1/cluster` shows it: the later sample of a pair,
/// with the rates over the interval since the earlier one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// How long before the answer the sample was taken.
    pub age_ms: u64,
    pub terminals_connected: u64,
    pub dials_per_s: f64,
    pub pushes_ok_per_s: f64,
    pub pushes_failed_per_s: f64,
}

/// The ring of samples, oldest first.
#[derive(Debug, Default)]
pub struct Timeline {
    samples: VecDeque<(Instant, Totals)>,
}

impl Timeline {
    /// Whether a sample is due at `now`: none taken yet, or [`TIMELINE_EVERY`] since
    /// the last one.
    pub fn due(&self, now: Instant) -> bool {
        self.samples
            .back()
            .is_none_or(|(last, _)| now.saturating_duration_since(*last) >= TIMELINE_EVERY)
    }

    /// Keeps `totals` taken at `at`, dropping the oldest sample beyond [`KEPT`]. A
    /// sample not later than the newest is ignored, so the ring stays in time order and
    /// no interval is empty.
    pub fn record(&mut self, at: Instant, totals: Totals) {
        if self.samples.back().is_some_and(|(last, _)| at <= *last) {
            return;
        }
        if self.samples.len() == KEPT {
            self.samples.pop_front();
        }
        self.samples.push_back((at, totals));
    }

    /// The points at `now`, oldest first: one per pair of neighbouring samples.
    pub fn points(&self, now: Instant) -> Vec<Point> {
        self.samples
            .iter()
            .zip(self.samples.iter().skip(1))
            .map(|((t0, before), (t1, after))| {
                let secs = t1.saturating_duration_since(*t0).as_secs_f64();
                // Counters only grow; a smaller total (a metric reset) counts as none.
                let rate = |x0: u64, x1: u64| round2(x1.saturating_sub(x0) as f64 / secs);
                Point {
                    age_ms: now.saturating_duration_since(*t1).as_millis() as u64,
                    terminals_connected: after.connected,
                    dials_per_s: rate(before.dials, after.dials),
                    pushes_ok_per_s: rate(before.pushes_ok, after.pushes_ok),
                    pushes_failed_per_s: rate(before.pushes_failed, after.pushes_failed),
                }
            })
            .collect()
    }
}

impl Metrics {
    /// Takes a timeline sample at `now` if one is due; `push_failures` are the `result`
    /// values of `posgate_push_requests_total` that count as failed.
    pub fn sample_timeline(&self, now: Instant, push_failures: &[&'static str]) {
        // Only the sampler writes, so a poisoned lock still holds a whole ring.
        let mut ring = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.due(now) {
            ring.record(now, self.timeline_totals(push_failures));
        }
    }

    /// The timeline's points at `now`, oldest first.
    pub fn timeline(&self, now: Instant) -> Vec<Point> {
        let ring = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        ring.points(now)
    }

    fn timeline_totals(&self, push_failures: &[&'static str]) -> Totals {
        let pushes = |results: &[&'static str]| -> u64 {
            let mut n = 0;
            for path in known_series::PUSH_PATHS {
                for &result in results {
                    let labels = [("path", path), ("result", result)];
                    // `get` rather than `get_or_create`: no series appears by reading.
                    n += self.push_requests.get(&labels).map_or(0, |c| c.get());
                }
            }
            n
        };
        let connected = self.terminals.get(&[("state", "connected")]);
        Totals {
            connected: connected.map_or(0, |g| g.get().max(0) as u64),
            dials: known_series::DIAL_RESULTS
                .iter()
                .map(|&r| self.dials.get(&[("result", r)]).map_or(0, |c| c.get()))
                .sum(),
            pushes_ok: pushes(&["ok"]),
            pushes_failed: pushes(push_failures),
        }
    }
}

/// `x` to two decimals: the page shows no more, and the JSON stays short.
fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(connected: u64, dials: u64, ok: u64, failed: u64) -> Totals {
        Totals {
            connected,
            dials,
            pushes_ok: ok,
            pushes_failed: failed,
        }
    }

    #[test]
    fn rates_come_from_the_deltas_between_neighbours() {
        let t0 = Instant::now();
        let mut timeline = Timeline::default();
        assert!(timeline.due(t0));
        timeline.record(t0, totals(0, 0, 0, 0));
        assert!(timeline.points(t0).is_empty(), "one sample is no interval");
        assert!(!timeline.due(t0 + Duration::from_secs(4)));
        assert!(timeline.due(t0 + TIMELINE_EVERY));
        timeline.record(t0 + Duration::from_secs(5), totals(40, 50, 10, 1));
        timeline.record(t0 + Duration::from_secs(10), totals(50, 60, 35, 1));
        let points = timeline.points(t0 + Duration::from_secs(12));
        assert_eq!(
            points,
            vec![
                Point {
                    age_ms: 7_000,
                    terminals_connected: 40,
                    dials_per_s: 10.0,
                    pushes_ok_per_s: 2.0,
                    pushes_failed_per_s: 0.2,
                },
                Point {
                    age_ms: 2_000,
                    terminals_connected: 50,
                    dials_per_s: 2.0,
                    pushes_ok_per_s: 5.0,
                    pushes_failed_per_s: 0.0,
                },
            ]
        );
    }

    #[test]
    fn the_ring_is_bounded_and_ordered() {
        let t0 = Instant::now();
        let mut timeline = Timeline::default();
        for i in 0..200u64 {
            timeline.record(t0 + TIMELINE_EVERY * i as u32, totals(i, i * 5, 0, 0));
        }
        // Out of order and duplicate times are not kept.
        timeline.record(t0, totals(999, 0, 0, 0));
        timeline.record(t0 + TIMELINE_EVERY * 199, totals(999, 0, 0, 0));
        let now = t0 + TIMELINE_EVERY * 199;
        let points = timeline.points(now);
        assert_eq!(points.len(), KEPT - 1);
        assert_eq!(points.last().unwrap().terminals_connected, 199);
        assert_eq!(points.last().unwrap().age_ms, 0);
        assert_eq!(points[0].terminals_connected, 200 - KEPT as u64 + 1);
        assert_eq!(points[0].age_ms, 5_000 * (KEPT as u64 - 2));
        assert!(points.windows(2).all(|w| w[0].age_ms > w[1].age_ms));
        assert!(points.iter().all(|p| p.dials_per_s == 1.0));
    }

    #[test]
    fn a_counter_that_went_back_counts_as_no_events() {
        let t0 = Instant::now();
        let mut timeline = Timeline::default();
        timeline.record(t0, totals(3, 100, 7, 7));
        timeline.record(t0 + TIMELINE_EVERY, totals(3, 10, 2, 2));
        let point = &timeline.points(t0 + TIMELINE_EVERY)[0];
        assert_eq!(point.dials_per_s, 0.0);
        assert_eq!(point.pushes_ok_per_s, 0.0);
    }

    #[test]
    fn the_timeline_reads_connected_dials_and_pushes_from_the_counters() {
        let m = Metrics::new();
        let t0 = Instant::now();
        m.sample_timeline(t0, &["overloaded"]);
        m.terminals.get_or_create(&[("state", "connected")]).set(12);
        m.dials.get_or_create(&[("result", "ok")]).inc_by(8);
        m.dials.get_or_create(&[("result", "timeout")]).inc_by(2);
        let push = |path, result, n| {
            m.push_requests
                .get_or_create(&[("path", path), ("result", result)])
                .inc_by(n);
        };
        push("local", "ok", 20);
        push("forwarded", "ok", 5);
        push("none", "overloaded", 5);
        // Not a failure the caller named: not counted.
        push("none", "unknown_terminal", 100);
        // Not due yet: no second sample.
        m.sample_timeline(t0 + Duration::from_secs(1), &["overloaded"]);
        assert!(m.timeline(t0).is_empty());
        let t1 = t0 + TIMELINE_EVERY;
        m.sample_timeline(t1, &["overloaded"]);
        assert_eq!(
            m.timeline(t1),
            vec![Point {
                age_ms: 0,
                terminals_connected: 12,
                dials_per_s: 2.0,
                pushes_ok_per_s: 5.0,
                pushes_failed_per_s: 1.0,
            }]
        );
    }
}
