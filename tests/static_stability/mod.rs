//! Static stability (issue 14, acceptance), end to end: pods against a real
//! `redis-server` and a `PosFarm` of simulated terminals, open-loop pushes (100/s, a key
//! of its own each, `timeout_ms=3000`, retried with the same key through another entry
//! pod when not answered 200), short timings (`CoreConfig::fast()`: lease TTL 3 s):
//!
//! - `frozen_store`: Redis frozen (SIGSTOP) for 2.5x the lease TTL, with 3 pods and with
//!   1 pod: at least 99.5% of the pushes sent during the freeze answered 200, not one
//!   terminal disconnected, the same owner for every shard afterwards, no key delivered
//!   twice; the same freeze, then Redis killed and restarted empty: no disconnect,
//!   pushes 200 throughout;
//! - `half_partition`: half the pods cut off from Redis (not from each other or the
//!   terminals): the cut-off half gives up by its deadline, the rest take over with
//!   higher epochs, at least 99% of the pushes after the takeover answered 200, no key
//!   twice, no session overlap and no terminal accepting an older epoch after a newer
//!   one;
//! - `pause_then_outage`: a `posgate serve` process frozen (SIGSTOP) while it held its
//!   shards through an outage, its shards taken meanwhile, woken (SIGCONT) into a second
//!   outage: it sends nothing to a terminal (no hello, no push), so it delivers nothing.
//!
//! Here: what they share (the load, the farm's figures, the duplicate checks). The
//! figures the issue note quotes are printed (`--nocapture`); each test says how long it
//! took (15-20 s each).

mod frozen_store;
mod half_partition;
mod pause_then_outage;

use posgate::core::CoreConfig;
use posgate_loadtest::load::pods::TENANT;
use posgate_loadtest::load::pushgen::PushRecord;
use posgate_pos_sim::Duplicate;

use crate::support::farm::Farm;

/// Terminals of every test.
const TERMINALS: u64 = 300;
/// Open-loop pushes per second.
const RATE: f64 = 100.0;

fn fast() -> CoreConfig {
    CoreConfig::fast()
}

/// No key accepted twice by a terminal; otherwise fails with the duplicates and what
/// the sender saw of those keys in `pushes`.
fn assert_no_key_twice(farm: &Farm, pushes: &[PushRecord], test: &str) {
    let duplicates = farm.duplicates().duplicates;
    let twice = farm.counters().keys_delivered_twice;
    eprintln!("[{test}] keys delivered twice: {twice}");
    assert_eq!(
        twice,
        0,
        "keys delivered twice: {duplicates:#?}; their pushes: {:#?}",
        sent_as(&duplicates, pushes)
    );
}

/// Every key a terminal accepted twice was answered `504` (delivery unknown) to the
/// sender before the repeat: the uncertainty was reported, and the sender's retry with
/// the same key is what the terminal must dedupe (`docs/pos-protocol.md`). No silent
/// duplicate.
fn assert_no_silent_duplicate(farm: &Farm, pushes: &[PushRecord], test: &str) {
    let duplicates = farm.duplicates().duplicates;
    let twice = farm.counters().keys_delivered_twice;
    let sent = sent_as(&duplicates, pushes);
    let silent: Vec<_> = duplicates
        .iter()
        .zip(&sent)
        .filter(|(d, p)| {
            !p.is_some_and(|p| {
                p.attempts()
                    .any(|a| a.status == 504 && a.sent_unix_ms < d.this.at_unix_ms)
            })
        })
        .collect();
    eprintln!(
        "[{test}] keys delivered twice: {twice}, each after a 504 delivery unknown: {}",
        silent.is_empty()
    );
    assert_eq!(
        twice as usize,
        duplicates.len(),
        "every repeat is in the farm's log"
    );
    assert!(silent.is_empty(), "silent duplicates: {silent:#?}");
}

/// The push of each duplicate's key, as the sender saw it.
fn sent_as<'a>(duplicates: &[Duplicate], pushes: &'a [PushRecord]) -> Vec<Option<&'a PushRecord>> {
    duplicates
        .iter()
        .map(|d| {
            let key = d.key.strip_prefix(&format!("{TENANT}:")).unwrap_or(&d.key);
            pushes.iter().find(|p| p.idempotency_key == key)
        })
        .collect()
}
