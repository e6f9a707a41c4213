//! conn-bench's CPU figure: what holding idle connections costs the pod and the farm.
//!
//! An idle push connection is not free: the pod sends it an HTTP/2 PING after each
//! `--pos-keepalive` of silence, and the terminal answers; both ends pay a TLS record,
//! a socket write and a wakeup for it. The figure is CPU time per connection-second,
//! measured over a window long enough to include every connection's PINGs (a window
//! of one PING interval sees each connection pinged about once).
//!
//! Not for: memory (`memory`) or starting processes (`main.rs`).

use anyhow::{Context, Result};

/// `USER_HZ`, the unit of the times in `/proc/<pid>/stat` (100 on every Linux
/// architecture posgate runs on; it is part of the kernel's user-space ABI).
const TICKS_PER_SEC: f64 = 100.0;

/// User + system CPU seconds a process (all its threads) has used.
pub fn cpu_secs(pid: &str) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces; the fields after it may not.
    let after_name = stat.rsplit_once(')').context("no ')' in stat")?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks = |i: usize| -> Result<f64> {
        Ok(fields.get(i).context("short stat")?.parse::<u64>()? as f64)
    };
    Ok((ticks(11)? + ticks(12)?) / TICKS_PER_SEC)
}

/// CPU used while `connections` were held for `secs`, as table rows.
pub fn rows(pod_cpu_s: f64, farm_cpu_s: f64, connections: u64, secs: f64) -> Vec<String> {
    let per = |cpu: f64| cpu * 1e6 / (connections.max(1) as f64 * secs);
    vec![
        format!(
            "| CPU of {connections} held idle connections over {secs:.0} s, pod | {:.2} µs per connection-second ({:.1}% of a core) |",
            per(pod_cpu_s),
            pod_cpu_s * 100.0 / secs
        ),
        format!(
            "| - the same, farm (this process: the terminals' side) | {:.2} µs per connection-second ({:.1}% of a core) |",
            per(farm_cpu_s),
            farm_cpu_s * 100.0 / secs
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_used_some_cpu_and_rows_divide_by_connections_and_time() {
        // Burn a little CPU so the figure is above one tick.
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        assert!(x != 1);
        assert!(cpu_secs("self").unwrap() > 0.0);
        let rows = rows(2.0, 1.0, 1_000, 10.0);
        assert!(
            rows[0].contains("200.00 µs per connection-second (20.0% of a core)"),
            "{}",
            rows[0]
        );
        assert!(
            rows[1].contains("100.00 µs per connection-second (10.0% of a core)"),
            "{}",
            rows[1]
        );
    }
}
