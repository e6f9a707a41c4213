//! PNG charts of one scenario, written to `<results>/<profile>/<scenario>/` next to its
//! JSON and linked from `summary.md`: connected sessions per pod, terminals without a
//! connection, and push latency per second, each with the event marked (x = 0).
//!
//! What to draw ([`ChartSpec`], from a [`ScenarioReport`]) is plain data and always
//! compiled, so it is tested with or without plotters; drawing it needs the `charts`
//! cargo feature (on by default). posgate links this crate for its demo with default
//! features off, so the gateway build never compiles plotters; a `posgate-load` built
//! that way says so in its summary instead of linking charts.

use std::path::Path;

use super::{analysis::LatencyBucket, report::ScenarioReport};

#[cfg(feature = "charts")]
#[path = "chart_render.rs"]
mod render;

/// Whether this build can draw charts.
pub const ENABLED: bool = cfg!(feature = "charts");

/// Why charts were not written.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("built without the `charts` feature: no PNG charts (build posgate-loadtest with default features)")]
    Disabled,
    #[error("writing {path}: {message}")]
    Draw { path: String, message: String },
    #[error("the bundled chart font could not be loaded")]
    Font,
}

/// One line of a chart, in pieces where data is missing (a pod that did not answer, a
/// second without pushes), so gaps are not drawn over.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub label: String,
    pub segments: Vec<Vec<(f64, f64)>>,
}

/// One chart: x is seconds since the event (the event is at x = 0).
#[derive(Debug, Clone, PartialEq)]
pub struct ChartSpec {
    /// File name within the scenario's directory.
    pub file: &'static str,
    pub title: String,
    pub y_label: &'static str,
    /// Logarithmic y axis (latencies span 1 ms to seconds).
    pub log_y: bool,
    pub lines: Vec<Line>,
}

impl ChartSpec {
    /// Every point, for the axis ranges.
    pub fn points(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.lines
            .iter()
            .flat_map(|l| l.segments.iter().flatten().copied())
    }
}

/// Appends `point` to `line`, starting a new segment if `connected` is false.
fn extend(line: &mut Line, point: (f64, f64), connected: bool) {
    match line.segments.last_mut() {
        Some(seg) if connected => seg.push(point),
        _ => line.segments.push(vec![point]),
    }
}

fn secs(at_ms: u64, event_ms: u64) -> f64 {
    (at_ms as f64 - event_ms as f64) / 1000.0
}

/// Connected sessions per pod, as each pod counts its own (one line per pod; a sample
/// the pod did not answer breaks its line).
pub fn sessions_per_pod(r: &ScenarioReport) -> ChartSpec {
    let mut lines: Vec<Line> = Vec::new();
    for (i, s) in r.series.iter().enumerate() {
        for (pod, &n) in &s.pod_sessions {
            let prev = i.checked_sub(1).map(|j| &r.series[j]);
            let connected = prev.is_some_and(|p| p.pod_sessions.contains_key(pod));
            let idx = match lines.iter().position(|l| &l.label == pod) {
                Some(idx) => idx,
                None => {
                    lines.push(Line {
                        label: pod.clone(),
                        segments: Vec::new(),
                    });
                    lines.len() - 1
                }
            };
            extend(
                &mut lines[idx],
                (secs(s.at_unix_ms, r.event_unix_ms), n as f64),
                connected,
            );
        }
    }
    lines.sort_by_key(|l| natural(&l.label));
    ChartSpec {
        file: "sessions-per-pod.png",
        title: format!(
            "{}: connected sessions per pod (each pod's /v1/cluster)",
            r.name
        ),
        y_label: "sessions",
        log_y: false,
        lines,
    }
}

/// `pod-10` after `pod-9`.
fn natural(label: &str) -> (String, u64) {
    let digits = label.trim_start_matches(|c: char| !c.is_ascii_digit());
    let prefix = &label[..label.len() - digits.len()];
    (prefix.to_owned(), digits.parse().unwrap_or(0))
}

/// Terminals with no open connection, from the simulators' gauge (the terminals' own
/// view: a pod's count can miss a terminal it is still dialing or closing).
pub fn without_session(r: &ScenarioReport) -> ChartSpec {
    let mut line = Line {
        label: "no connection".into(),
        segments: Vec::new(),
    };
    for s in &r.series {
        let n = r.terminals.saturating_sub(s.terminals_connected);
        extend(
            &mut line,
            (secs(s.at_unix_ms, r.event_unix_ms), n as f64),
            true,
        );
    }
    ChartSpec {
        file: "without-session.png",
        title: format!("{}: terminals without a connection (pos-sim)", r.name),
        y_label: "terminals",
        log_y: false,
        lines: vec![line],
    }
}

/// p50 and p99 push latency per 1-s bucket of send time (bucket centres). No max line:
/// at the quick profile's 50 pushes/s a bucket's p99 is its max anyway.
pub fn push_latency(r: &ScenarioReport) -> ChartSpec {
    type Pick = fn(&LatencyBucket) -> u64;
    let pick: [(&str, Pick); 2] = [("p50", |b| b.p50_ms), ("p99", |b| b.p99_ms)];
    let lines = pick
        .iter()
        .map(|(label, get)| {
            let mut line = Line {
                label: (*label).into(),
                segments: Vec::new(),
            };
            let mut prev: Option<i64> = None;
            for b in r.push_latency_per_s.iter().filter(|b| b.answered > 0) {
                // A log axis cannot show 0 ms: sub-millisecond answers sit at 0.5.
                let y = (get(b) as f64).max(0.5);
                let connected = prev == Some(b.second - 1);
                extend(&mut line, (b.second as f64 + 0.5, y), connected);
                prev = Some(b.second);
            }
            line
        })
        .collect();
    ChartSpec {
        file: "push-latency.png",
        title: format!("{}: push latency per second of send time", r.name),
        y_label: "ms (log)",
        log_y: true,
        lines,
    }
}

/// The charts of a scenario.
pub fn specs(r: &ScenarioReport) -> Vec<ChartSpec> {
    vec![sessions_per_pod(r), without_session(r), push_latency(r)]
}

/// Draws the charts of `r` into `dir/<scenario>/`; returns their paths relative to `dir`
/// (where `summary.md` is).
pub fn write(r: &ScenarioReport, dir: &Path) -> Result<Vec<String>, ChartError> {
    #[cfg(feature = "charts")]
    {
        let sub = dir.join(&r.name);
        std::fs::create_dir_all(&sub).map_err(|e| ChartError::Draw {
            path: sub.display().to_string(),
            message: e.to_string(),
        })?;
        let mut out = Vec::new();
        for spec in specs(r) {
            render::png(&spec, &sub.join(spec.file), render::SIZE)?;
            out.push(format!("{}/{}", r.name, spec.file));
        }
        Ok(out)
    }
    #[cfg(not(feature = "charts"))]
    {
        let _ = (r, dir);
        Err(ChartError::Disabled)
    }
}

/// Writes the charts and records the outcome in the report (`charts` or `charts_note`).
pub fn attach(r: &mut ScenarioReport, dir: &Path) {
    match write(r, dir) {
        Ok(paths) => r.charts = paths,
        Err(e) => r.charts_note = Some(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::observe::Sample;

    fn report() -> ScenarioReport {
        let sample = |at: u64, pods: &[(&str, u64)], connected: u64| Sample {
            at_unix_ms: at,
            pod_sessions: pods.iter().map(|(p, n)| (p.to_string(), *n)).collect(),
            terminals_connected: connected,
            ..Sample::default()
        };
        let bucket = |second: i64, p50: u64| LatencyBucket {
            second,
            sent: 1,
            answered: 1,
            p50_ms: p50,
            p99_ms: p50 * 10,
            max_ms: p50 * 20,
            not_ok: 0,
        };
        ScenarioReport {
            name: "synthetic".into(),
            event_unix_ms: 10_000,
            terminals: 100,
            series: vec![
                sample(9_000, &[("pod-10", 50), ("pod-9", 50)], 100),
                sample(10_000, &[("pod-9", 50)], 60),
                sample(11_000, &[("pod-10", 0), ("pod-9", 60)], 80),
                sample(12_000, &[("pod-10", 40), ("pod-9", 60)], 100),
            ],
            push_latency_per_s: vec![bucket(-1, 1), bucket(0, 0), bucket(2, 30)],
            ..ScenarioReport::default()
        }
    }

    #[test]
    fn sessions_lines_per_pod_break_where_a_pod_did_not_answer() {
        let c = sessions_per_pod(&report());
        let labels: Vec<&str> = c.lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["pod-9", "pod-10"]);
        assert_eq!(c.lines[0].segments.len(), 1);
        assert_eq!(
            c.lines[1].segments,
            [vec![(-1.0, 50.0)], vec![(1.0, 0.0), (2.0, 40.0)]]
        );
    }

    #[test]
    fn without_session_is_terminals_minus_connected() {
        let c = without_session(&report());
        let ys: Vec<f64> = c.points().map(|p| p.1).collect();
        assert_eq!(ys, [0.0, 40.0, 20.0, 0.0]);
    }

    #[test]
    fn latency_lines_skip_empty_seconds_and_lift_zero_for_the_log_axis() {
        let c = push_latency(&report());
        assert!(c.log_y);
        let p50 = &c.lines[0];
        assert_eq!(p50.label, "p50");
        assert_eq!(
            p50.segments,
            [vec![(-0.5, 1.0), (0.5, 0.5)], vec![(2.5, 30.0)]]
        );
        assert_eq!(c.lines[1].segments[1], [(2.5, 300.0)]);
    }

    #[test]
    fn write_reports_what_this_build_can_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = report();
        attach(&mut r, dir.path());
        if ENABLED {
            assert_eq!(r.charts.len(), 3, "{:?}", r.charts_note);
            for rel in &r.charts {
                assert!(dir.path().join(rel).is_file(), "{rel}");
            }
        } else {
            assert!(r.charts.is_empty());
            assert!(r
                .charts_note
                .unwrap()
                .contains("without the `charts` feature"));
        }
    }
}
