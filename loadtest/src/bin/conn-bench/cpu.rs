//! conn-bench's CPU figures: what holding idle connections costs the pod and the farm,
//! and what one dial costs each (TCP, TLS, HTTP/2 and the hello, both ends).
//!
//! An idle push connection is not free: the pod sends it an HTTP/2 PING after each
//! `--pos-keepalive` of silence, and the terminal answers; both ends pay a TLS record,
//! a socket write and a wakeup for it. The figure is CPU time per connection-second,
//! measured over a window long enough to include every connection's PINGs (a window
//! of one PING interval sees each connection pinged about once).
//!
//! Not for: memory (`memory`) or starting processes (`main.rs`).

use anyhow::{Context, Result};
use posgate_loadtest::load::procs::{cpu_ticks_of, CLOCK_TICKS};

/// User + system CPU seconds a process (all its threads) has used.
pub fn cpu_secs(pid: &str) -> Result<f64> {
    let ticks = cpu_ticks_of(pid).with_context(|| format!("read /proc/{pid}/stat"))?;
    Ok(ticks as f64 / CLOCK_TICKS)
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

/// CPU per dial of the handshake-rate step, as a table row: comparable between builds
/// where handshakes per second are not (that also moves with how busy the machine is).
pub fn dial_row(pod_cpu_s: f64, farm_cpu_s: f64, dials: u64) -> String {
    let ms = |cpu: f64| cpu * 1e3 / dials.max(1) as f64;
    format!(
        "| CPU per dial in the handshake-rate step, pod / farm (first connection to last session) | {:.3} / {:.3} ms |",
        ms(pod_cpu_s),
        ms(farm_cpu_s)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_divide_by_connections_and_time() {
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

    #[test]
    fn dial_row_divides_by_dials() {
        let row = dial_row(7.0, 4.0, 10_000);
        assert!(row.contains("0.700 / 0.400 ms"), "{row}");
    }
}
