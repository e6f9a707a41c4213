//! The allocator's own figures, logged at debug level (target `posgate::alloc`) once a
//! second while that target is enabled: bytes the program holds (`allocated`), pages
//! the allocator has handed out (`active`), what is resident (`resident`, metadata
//! included), its bookkeeping (`metadata`) and address space kept for reuse
//! (`retained`). `resident - allocated` is the allocator's overhead and fragmentation;
//! conn-bench reads these lines to split a pod's memory per connection.
//!
//! Not a metric: the figures answer a profiling question, and the RSS gauge already
//! tells an operator how much a pod uses.

use std::time::Duration;

use tikv_jemalloc_ctl::{epoch, stats};

/// The log target; `--log-level warn,posgate::alloc=debug` turns the lines on.
const TARGET: &str = "posgate::alloc";

/// Starts the logging thread if the target is enabled at start-up (the filter is fixed
/// for the process's life).
pub fn spawn() {
    if !tracing::enabled!(target: TARGET, tracing::Level::DEBUG) {
        return;
    }
    let started = std::thread::Builder::new()
        .name("alloc-stats".into())
        .spawn(|| loop {
            log_once();
            std::thread::sleep(Duration::from_secs(1));
        });
    if let Err(err) = started {
        tracing::warn!(error = %err, "cannot start the allocator statistics thread");
    }
}

fn log_once() {
    // jemalloc refreshes its totals only when the epoch advances.
    let figures = epoch::advance().and_then(|_| {
        Ok((
            stats::allocated::read()?,
            stats::active::read()?,
            stats::resident::read()?,
            stats::metadata::read()?,
            stats::retained::read()?,
        ))
    });
    match figures {
        Ok((allocated, active, resident, metadata, retained)) => tracing::debug!(
            target: TARGET,
            allocated,
            active,
            resident,
            metadata,
            retained,
            "allocator statistics"
        ),
        Err(err) => tracing::debug!(target: TARGET, error = %err, "allocator statistics"),
    }
}
