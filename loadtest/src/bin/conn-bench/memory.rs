//! conn-bench's memory figures: a pod's RSS and its allocator's own statistics at one
//! moment, and the rows that turn two such moments into bytes per held connection,
//! each beside its bound.
//!
//! The allocator statistics come from the pod's log (`posgate::alloc` debug lines, one a
//! second, see `src/bin/posgate/alloc_stats.rs`); they split RSS into the live heap the
//! connections hold, pages the allocator keeps around them, and the rest.
//!
//! Not for: starting pods or connections (`main.rs`).

use std::path::Path;

use anyhow::{Context, Result};

/// The allocator's totals, in bytes, as one `posgate::alloc` log line gives them.
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocStats {
    /// Bytes the program holds.
    pub allocated: u64,
    /// Bytes in pages the allocator has handed out (allocated + their free slots).
    pub active: u64,
    /// Bytes resident, the allocator's own metadata and unpurged dirty pages included.
    pub resident: u64,
    /// The allocator's bookkeeping.
    pub metadata: u64,
}

/// One moment of a pod's memory.
#[derive(Clone, Copy, Debug)]
pub struct Snapshot {
    pub rss_kib: u64,
    pub alloc: Option<AllocStats>,
}

impl Snapshot {
    /// The pod's RSS now and the last allocator line of its log.
    pub fn take(pid: u32, log: &Path) -> Result<Snapshot> {
        Ok(Snapshot {
            rss_kib: rss_kib(pid)?,
            alloc: last_alloc_stats(log)?,
        })
    }
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("VmRSS value")?
        .parse()?)
}

/// The newest `allocator statistics` line of a JSON log, if any.
fn last_alloc_stats(log: &Path) -> Result<Option<AllocStats>> {
    let text = std::fs::read_to_string(log).with_context(|| format!("read {}", log.display()))?;
    let last = text
        .lines()
        .rev()
        .filter(|l| l.contains("allocator statistics"))
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    Ok(last.and_then(|v| {
        let f = v.get("fields")?;
        let get = |k: &str| f.get(k)?.as_u64();
        Some(AllocStats {
            allocated: get("allocated")?,
            active: get("active")?,
            resident: get("resident")?,
            metadata: get("metadata")?,
        })
    }))
}

/// Memory per held connection between `base` (no connections) and `now`, as table
/// rows; the second value is whether the RSS figure is within `bound_kib`.
pub fn rows(
    label: &str,
    base: &Snapshot,
    now: &Snapshot,
    connections: u64,
    bound_kib: f64,
) -> (Vec<String>, bool) {
    let n = connections.max(1) as f64;
    let per_conn = now.rss_kib.saturating_sub(base.rss_kib) as f64 / n;
    let ok = per_conn <= bound_kib;
    let verdict = if ok { "ok" } else { "FAIL" };
    let mut rows = vec![format!(
        "| **memory per held connection, {label}** (RSS) | **{per_conn:.1} KiB** (bound <= {bound_kib} KiB: {verdict}) |"
    )];
    if let (Some(b), Some(a)) = (base.alloc, now.alloc) {
        let kib = |x: u64, y: u64| x.saturating_sub(y) as f64 / 1024.0 / n;
        rows.push(format!(
            "| - live heap (allocator: allocated) | {:.1} KiB |",
            kib(a.allocated, b.allocated)
        ));
        rows.push(format!(
            "| - free slots in the allocator's pages (active - allocated) | {:.1} KiB |",
            kib(
                a.active.saturating_sub(a.allocated),
                b.active.saturating_sub(b.allocated)
            )
        ));
        rows.push(format!(
            "| - allocator metadata | {:.1} KiB |",
            kib(a.metadata, b.metadata)
        ));
        rows.push(format!(
            "| - unpurged pages (resident - active - metadata) | {:.1} KiB |",
            kib(
                a.resident.saturating_sub(a.active + a.metadata),
                b.resident.saturating_sub(b.active + b.metadata)
            )
        ));
    }
    (rows, ok)
}
