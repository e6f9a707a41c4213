//! `posgate simulate`: the deterministic cluster simulation (`posgate::sim`) over a range
//! of seeds, with progress on stderr, stopping at the first invariant violation; or one
//! seed replayed, optionally traced.
//!
//! Not for: the simulation itself (`posgate::sim`), only running it from the command line.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use posgate::sim::{run_seed, SimConfig, SimStats};

use crate::USAGE_ERROR;

/// How often `posgate simulate` reports progress on stderr.
const SIM_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Flags of `posgate simulate`.
#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Run only this seed, e.g. to replay a failure
    #[arg(long, value_name = "N", conflicts_with_all = ["first", "seeds"])]
    seed: Option<u64>,
    /// With --seed: print every simulated event to stderr as it happens
    #[arg(long, requires = "seed")]
    trace: bool,
    /// First seed of the range
    #[arg(long, value_name = "N", default_value_t = 0)]
    first: u64,
    /// Number of seeds to run
    #[arg(long, value_name = "M", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// Pods started; joins add up to as many again
    #[arg(long, value_name = "P", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pods: u64,
    /// Shards of the simulated cluster
    #[arg(long, value_name = "S", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    shards: u32,
    /// Terminals of each shard
    #[arg(long, value_name = "T", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    terminals_per_shard: u64,
}

impl SimulateArgs {
    /// The simulated cluster these flags ask for.
    fn config(&self) -> SimConfig {
        let mut cfg = SimConfig::default();
        cfg.core.shards = self.shards;
        cfg.initial_pods = self.pods as usize;
        cfg.max_pods = 2 * self.pods as usize;
        cfg.terminals_per_shard = self.terminals_per_shard as usize;
        cfg
    }
}

/// Runs the seeds `args` select, stopping at the first invariant violation.
pub fn main(args: &SimulateArgs) -> ExitCode {
    let (first, count) = match args.seed {
        Some(seed) => (seed, 1),
        None => (args.first, args.seeds),
    };
    let Some(end) = first.checked_add(count) else {
        eprintln!("error: invalid --seeds: --first plus --seeds must fit in 64 bits");
        return ExitCode::from(USAGE_ERROR);
    };
    if args.trace {
        // The simulation's checker reads this when each run starts. Set before any
        // thread exists, so nothing reads the environment concurrently.
        std::env::set_var("POSGATE_SIM_TRACE", "1");
    }
    let cfg = args.config();
    let started = Instant::now();
    let mut reported = started;
    let mut total = SimStats::default();
    for seed in first..end {
        match run_seed(seed, &cfg) {
            Ok(stats) => total.add(&stats),
            Err(violation) => {
                // The violation ends with a newline and names the replay command.
                eprint!("error: invariant violated in {violation}");
                eprintln!(
                    "  (with --pods {} --shards {} --terminals-per-shard {})",
                    args.pods, args.shards, args.terminals_per_shard
                );
                let line = sim_line(seed - first, &total, started.elapsed());
                eprintln!("before it: {line}");
                return ExitCode::FAILURE;
            }
        }
        if reported.elapsed() >= SIM_PROGRESS_EVERY {
            let line = sim_line(seed + 1 - first, &total, started.elapsed());
            eprintln!("progress: {line} (at seed {seed}, last {})", end - 1);
            reported = Instant::now();
        }
    }
    println!(
        "simulated seeds {first}..{end} ({} pods, {} shards, {} terminals each): {}",
        cfg.initial_pods,
        cfg.core.shards,
        cfg.terminals_per_shard,
        sim_line(count, &total, started.elapsed())
    );
    ExitCode::SUCCESS
}

/// `<n> seeds in <t>s, <r> seeds/s, <e> events, <r> events/s, <f> faults, <a> acquisitions,
/// <l> leases handed over, <h> handovers, <o> fenced overlaps, <s> served in outages, <r> refused hellos, <k> keys
/// (<d> delivered), <a> attempts, <u> answered unknown, <d> deduplicated by the terminal
/// (<x> across pods), <h> answers handed over, <t> terminals dialed on a release, <u>
/// without one, <f> sessions fenced by the terminals, <p> released while a holder not
/// asked drained them, <n> drains not announced, <f> store failovers that lost writes,
/// <r> times a pod found the store gone back; pushes with a TTL: <q> sent, <a>
/// acknowledged, <d> delivered, <e> expired, <r> replaced, <u> unknown, <l> lost with the
/// store's data, <c> copies (<r> repeats the terminal deduplicated), <t> taken again from
/// a retry stored after a wipe`.
fn sim_line(seeds: u64, total: &SimStats, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    format!(
        "{seeds} seeds in {secs:.1}s, {:.1} seeds/s, {} events, {:.0} events/s, {} faults, \
         {} acquisitions, {} leases handed over, {} handovers, {} fenced overlaps, {} served in outages, \
         {} refused hellos, {} keys ({} delivered), {} attempts, {} answered unknown, \
         {} deduplicated by the terminal ({} across pods), {} answers handed over, \
         {} terminals dialed on a release, {} without one, {} sessions fenced by the terminals, \
         {} released while a holder not asked drained them, {} drains not announced, \
         {} store failovers that lost writes, {} times a pod found the store gone back; \
         pushes with a TTL: {} sent, {} acknowledged, {} delivered, {} expired, {} replaced, \
         {} unknown, {} lost with the store's data, {} copies ({} repeats the terminal \
         deduplicated), {} taken again from a retry stored after a wipe",
        rate(seeds),
        total.events,
        rate(total.events),
        total.faults,
        total.acquisitions,
        total.leases_handed_over,
        total.handovers,
        total.fenced_overlaps,
        total.served_in_outage,
        total.refused_hellos,
        total.pushes,
        total.keys_delivered,
        total.push_attempts,
        total.push_answers_unknown,
        total.deduplicated,
        total.deduplicated_across_pods,
        total.answers_handed_over,
        total.terminals_released,
        total.terminals_unasked,
        total.sessions_fenced,
        total.unknown_predecessor,
        total.unannounced_drains,
        total.failovers,
        total.rollbacks_seen,
        total.later_pushes,
        total.later_acked,
        total.later_delivered,
        total.later_expired,
        total.later_replaced,
        total.later_unknown,
        total.later_lost,
        total.later_copies,
        total.later_repeats,
        total.later_retaken,
    )
}
