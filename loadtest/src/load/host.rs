//! How the machine's CPU was spent over a span, from `/proc/stat`: busy, idle, and
//! stolen by the hypervisor.
//!
//! On a virtual machine the host can run other guests on "our" cores; the kernel counts
//! that time as steal. A run during which the host took a tenth of the CPU is not
//! comparable with one during which it took nothing: on the 2-core development VM the
//! same full cold start took 39 s in one run and 70 s in another of the same hour, and
//! the slow ones were the ones with steal (docs/performance.md, "Cold start"). Every
//! scenario and the handshake calibration report this, so that a figure is read with
//! the machine's state beside it.
//!
//! Not for: per-process CPU (`procs`), or judging a run: the shares are reported and
//! checked without gating.

use serde::Serialize;

/// Cumulative CPU time of all cores, in `USER_HZ` ticks, at one moment.
#[derive(Debug, Clone, Copy)]
pub struct CpuTimes {
    pub total: u64,
    /// Idle and waiting for I/O.
    pub idle: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// The machine's counters now; `None` where `/proc/stat` cannot be read.
    pub fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        CpuTimes::parse(&stat)
    }

    /// The aggregate `cpu` line: user nice system idle iowait irq softirq steal
    /// [guest guest_nice], which are already counted in user and nice.
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if v.len() < 8 {
            return None;
        }
        Some(CpuTimes {
            total: v[..8].iter().sum(),
            idle: v[3] + v[4],
            steal: v[7],
        })
    }
}

/// The shares of the machine's CPU time between two moments.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuShares {
    pub busy: f64,
    pub idle: f64,
    /// Taken by the hypervisor for other guests.
    pub steal: f64,
}

/// Above this share of steal a run's timings say more about the host than about posgate.
pub const STEAL_NOTABLE: f64 = 0.05;

impl CpuShares {
    pub fn between(before: CpuTimes, after: CpuTimes) -> Option<CpuShares> {
        let total = after.total.checked_sub(before.total)?;
        if total == 0 {
            return None;
        }
        let share = |a: u64, b: u64| a.saturating_sub(b) as f64 / total as f64;
        let idle = share(after.idle, before.idle);
        let steal = share(after.steal, before.steal);
        Some(CpuShares {
            busy: (1.0 - idle - steal).max(0.0),
            idle,
            steal,
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "busy {:.0}%, idle {:.0}%, taken by the host (steal) {:.1}%",
            self.busy * 100.0,
            self.idle * 100.0,
            self.steal * 100.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_come_from_the_aggregate_line_and_count_guest_time_once() {
        let before = "cpu  100 0 50 800 50 0 0 0 7 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n";
        let after = "cpu  250 0 100 900 50 0 0 100 9 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n";
        let (b, a) = (
            CpuTimes::parse(before).unwrap(),
            CpuTimes::parse(after).unwrap(),
        );
        assert_eq!((b.total, b.idle, b.steal), (1000, 850, 0));
        // 150 user + 50 system + 100 idle + 100 steal; the guest column is not added.
        let s = CpuShares::between(b, a).unwrap();
        assert_eq!((s.busy, s.idle, s.steal), (0.5, 0.25, 0.25));
        assert_eq!(
            s.describe(),
            "busy 50%, idle 25%, taken by the host (steal) 25.0%"
        );
        assert!(CpuShares::between(a, a).is_none());
        assert!(CpuTimes::parse("intr 1 2 3\n").is_none());
    }

    #[test]
    fn this_machine_reports_its_counters() {
        let t = CpuTimes::now().expect("/proc/stat on Linux");
        assert!(t.total >= t.idle + t.steal);
    }
}
