//! `posgate ring-report`: how evenly and how stably each shard-assignment variant places
//! shards, measured on random pod-name sets.
//!
//! The production algorithm is the stored placement ([`Placement::next`], which remembers
//! the current owners); the memoryless variants exist to show what it is measured
//! against: `hash % N`, the plain ring without a load bound, the bounded ring
//! ([`Assignment::compute`], production before the placement and still its first table),
//! rendezvous hashing, and rendezvous scores with a greedy global matching under the same
//! cap (the reference the issue asked to beat). Everything is seeded, so a report is
//! reproducible for the same arguments and build. This module prints numbers; it does not
//! decide anything at runtime.

use std::fmt::Write as _;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use posgate::core::placement::Placement;
use posgate::core::ring::{Assignment, Ring, RING_VERSION, VNODES};
use posgate::core::PodId;

/// Flags of `posgate ring-report`.
#[derive(clap::Args, Debug, Clone)]
pub struct RingReportArgs {
    /// Shards to assign.
    #[arg(long, default_value_t = 64)]
    pub shards: u32,
    /// Smallest pod count to measure (at least 1).
    #[arg(long, default_value_t = 2)]
    pub min_pods: usize,
    /// Largest pod count to measure.
    #[arg(long, default_value_t = 32)]
    pub max_pods: usize,
    /// Random pod-name sets per pod count.
    #[arg(long, default_value_t = 200)]
    pub sets: usize,
    /// Seed of the pod-name generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The movement targets for the production ring, as ratios to the ideal.
const JOIN_TARGET: f64 = 1.35;
const LEAVE_TARGET: f64 = 1.5;
/// The pod counts the summary averages over.
const SUMMARY_PODS: std::ops::RangeInclusive<usize> = 4..=32;

#[derive(Clone, Copy)]
enum Variant {
    HashMod,
    Plain,
    Bounded,
    Rendezvous,
    RendezvousCap,
    Placement,
}

#[rustfmt::skip]
const VARIANTS: [Variant; 6] = {
    use Variant::*;
    [HashMod, Plain, Bounded, Rendezvous, RendezvousCap, Placement]
};
/// Where the production algorithm is in [`VARIANTS`].
const PRODUCTION: usize = 5;

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::HashMod => "hash%N",
            Variant::Plain => "plain ring",
            Variant::Bounded => "bounded ring",
            Variant::Rendezvous => "rendezvous",
            Variant::RendezvousCap => "rdv+greedy cap",
            Variant::Placement => "placement",
        }
    }

    /// Owners (indices into each member list) before, after the join and after the leave.
    /// Memoryless variants compute each from its member set; the placement starts from the
    /// table of a cluster that reached `pods` by one join and changes it from there.
    fn steps(self, pods: &[PodId], joined: &[PodId], left: &[PodId], shards: u32) -> Steps {
        if !matches!(self, Variant::Placement) {
            return Steps {
                before: self.owners(pods, shards),
                join: self.owners(joined, shards),
                leave: (!left.is_empty()).then(|| self.owners(left, shards)),
            };
        }
        let indices = |a: &Assignment| a.owner_indices().iter().map(|&i| i as usize).collect();
        let before = Placement::initial(&pods[1..], shards).next(pods, shards);
        Steps {
            before: indices(&before.assignment),
            join: indices(&before.next(joined, shards).assignment),
            leave: (!left.is_empty()).then(|| indices(&before.next(left, shards).assignment)),
        }
    }

    /// Owner of every shard, as an index into `pods` (sorted, distinct, non-empty), for
    /// the memoryless variants.
    fn owners(self, pods: &[PodId], shards: u32) -> Vec<usize> {
        let n = pods.len();
        match self {
            Variant::Placement => unreachable!("the placement is measured by `steps`"),
            Variant::HashMod => (0..shards)
                .map(|s| (xxh3_64(&s.to_le_bytes()) % n as u64) as usize)
                .collect(),
            Variant::Plain => {
                let ring = Ring::new(pods);
                (0..shards)
                    .map(|s| ring.walk(s, shards).next().map_or(0, |(_, p)| p as usize))
                    .collect()
            }
            Variant::Bounded => {
                let a = Assignment::compute(pods, shards);
                (0..shards)
                    .map(|s| {
                        a.owner(s)
                            .and_then(|o| pods.binary_search(o).ok())
                            .unwrap_or(0)
                    })
                    .collect()
            }
            Variant::Rendezvous => {
                let seeds = name_hashes(pods);
                // Highest score wins; `max_by_key` keeps the last maximum, so ties go to
                // the later pod in sorted order.
                (0..shards)
                    .map(|s| (0..n).max_by_key(|&p| rendezvous(seeds[p], s)).unwrap_or(0))
                    .collect()
            }
            Variant::RendezvousCap => {
                let seeds = name_hashes(pods);
                let mut pairs: Vec<(u64, u32, usize)> = (0..shards)
                    .flat_map(|s| {
                        seeds
                            .iter()
                            .enumerate()
                            .map(move |(p, &h)| (!rendezvous(h, s), s, p))
                    })
                    .collect();
                pairs.sort_unstable();
                let cap = (shards as usize).div_ceil(n);
                let (mut owner, mut load) = (vec![usize::MAX; shards as usize], vec![0; n]);
                for (_, s, p) in pairs {
                    if owner[s as usize] == usize::MAX && load[p] < cap {
                        owner[s as usize] = p;
                        load[p] += 1;
                    }
                }
                owner
            }
        }
    }
}

/// One variant's owners on one pod-name set, see [`Variant::steps`].
struct Steps {
    before: Vec<usize>,
    join: Vec<usize>,
    /// `None` when the leave would leave no member.
    leave: Option<Vec<usize>>,
}

fn name_hashes(pods: &[PodId]) -> Vec<u64> {
    pods.iter()
        .map(|p| xxh3_64(p.as_str().as_bytes()))
        .collect()
}

fn rendezvous(name_hash: u64, shard: u32) -> u64 {
    xxh3_64_with_seed(&shard.to_le_bytes(), name_hash)
}

/// One variant at one pod count: sums over the sets while measuring, then means.
#[derive(Clone, Copy, Default)]
struct Cell {
    max_load: f64,
    max_load_min: usize,
    max_load_worst: usize,
    join: f64,
    join_worst: usize,
    leave: f64,
    leave_ideal: f64,
    leave_worst: usize,
}

impl Cell {
    fn join_ratio(&self, pods: usize, shards: u32) -> f64 {
        self.join / join_ideal(pods, shards)
    }

    fn leave_ratio(&self) -> f64 {
        // With more pods than shards a leaver may own nothing; moving nothing is then ideal.
        if self.leave_ideal > 0.0 {
            self.leave / self.leave_ideal
        } else if self.leave == 0.0 {
            1.0
        } else {
            f64::INFINITY
        }
    }
}

fn join_ideal(pods: usize, shards: u32) -> f64 {
    f64::from(shards) / (pods + 1) as f64
}

struct Row {
    pods: usize,
    cells: Vec<Cell>,
}

/// Pod ids like a Deployment's: `posgate-<template hash>-<suffix>`, one template hash per
/// set (pods of one ReplicaSet share it, which is the hard case for weak hashes).
struct Names {
    rng: StdRng,
}

impl Names {
    const ALPHABET: &'static [u8] = b"bcdfghjklmnpqrstvwxz2456789";

    fn chars(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| Self::ALPHABET[self.rng.random_range(0..Self::ALPHABET.len())] as char)
            .collect()
    }

    /// `n` distinct members and one more distinct pod that joins.
    fn set(&mut self, n: usize) -> (Vec<PodId>, PodId) {
        let template = self.chars(10);
        let mut names: Vec<PodId> = Vec::with_capacity(n + 1);
        while names.len() < n + 1 {
            let id = PodId::new(format!("posgate-{template}-{}", self.chars(5))).expect("valid id");
            if !names.contains(&id) {
                names.push(id);
            }
        }
        let joiner = names.pop().expect("n + 1 names");
        names.sort();
        (names, joiner)
    }
}

fn moved(old_pods: &[PodId], old: &[usize], new_pods: &[PodId], new: &[usize]) -> usize {
    old.iter()
        .zip(new)
        .filter(|&(&o, &n)| old_pods[o] != new_pods[n])
        .count()
}

fn max_load(owners: &[usize], pods: usize) -> usize {
    let mut load = vec![0; pods];
    for &o in owners {
        load[o] += 1;
    }
    load.into_iter().max().unwrap_or(0)
}

fn measure(args: &RingReportArgs, n: usize) -> Row {
    let seed = args.seed ^ (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut names = Names {
        rng: StdRng::seed_from_u64(seed),
    };
    let fresh = Cell {
        max_load_min: usize::MAX,
        ..Cell::default()
    };
    let mut cells = vec![fresh; VARIANTS.len()];
    for _ in 0..args.sets {
        let (pods, joiner) = names.set(n);
        let victim = names.rng.random_range(0..n);
        let mut joined = pods.clone();
        joined.push(joiner);
        joined.sort();
        let mut left = pods.clone();
        left.remove(victim);
        for (v, c) in VARIANTS.iter().zip(cells.iter_mut()) {
            let steps = v.steps(&pods, &joined, &left, args.shards);
            let before = steps.before;
            let max = max_load(&before, n);
            let join = moved(&pods, &before, &joined, &steps.join);
            let leave = match &steps.leave {
                None => before.len(),
                Some(after) => moved(&pods, &before, &left, after),
            };
            c.max_load += max as f64;
            c.max_load_min = c.max_load_min.min(max);
            c.max_load_worst = c.max_load_worst.max(max);
            c.join += join as f64;
            c.join_worst = c.join_worst.max(join);
            c.leave += leave as f64;
            c.leave_worst = c.leave_worst.max(leave);
            c.leave_ideal += before.iter().filter(|&&o| o == victim).count() as f64;
        }
    }
    let sets = args.sets as f64;
    for c in &mut cells {
        (c.max_load, c.join, c.leave, c.leave_ideal) = (
            c.max_load / sets,
            c.join / sets,
            c.leave / sets,
            c.leave_ideal / sets,
        );
    }
    Row { pods: n, cells }
}

/// The whole report (Markdown) for `args`.
pub fn run(args: &RingReportArgs) -> String {
    let args = RingReportArgs {
        shards: args.shards.max(1),
        min_pods: args.min_pods.max(1),
        max_pods: args.max_pods.max(args.min_pods.max(1)),
        sets: args.sets.max(1),
        seed: args.seed,
    };
    let counts: Vec<usize> = (args.min_pods..=args.max_pods).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(counts.len());
    // Each pod count has its own seeded generator, so splitting the work across threads
    // does not change the numbers.
    let mut rows: Vec<Row> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (args, counts) = (&args, &counts);
                scope.spawn(move || {
                    counts
                        .iter()
                        .skip(t)
                        .step_by(threads)
                        .map(|&n| measure(args, n))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("report worker panicked"))
            .collect()
    });
    rows.sort_by_key(|r| r.pods);
    render(&args, &rows)
}

fn render(args: &RingReportArgs, rows: &[Row]) -> String {
    let shards = args.shards;
    let ceil = |n: usize| (shards as usize).div_ceil(n);
    let mut out = String::new();
    let names: Vec<&str> = VARIANTS.iter().map(|v| v.name()).collect();
    let (header, rule) = (names.join(" | "), "---|".repeat(VARIANTS.len()));
    let (min, max, sets, seed) = (args.min_pods, args.max_pods, args.sets, args.seed);
    let _ = writeln!(
        out,
        "# Ring report\n\n\
         {shards} shards, {min}..={max} pods, {sets} random pod-name sets per pod count, \
         seed {seed}.\n\n\
         - `hash%N`: xxh3(shard) mod N over the sorted members.\n\
         - `plain ring`: `hashring` with {VNODES} virtual nodes per pod (xxh3), no load bound.\n\
         - `bounded ring`: `Assignment::compute`, cap ceil(shards/N) (memoryless; the \
         placement's first table).\n\
         - `rendezvous`: highest xxh3 score per shard, no load bound.\n\
         - `rdv+greedy cap`: rendezvous scores, greedy global matching, cap ceil(shards/N).\n\
         - `placement`: production ({RING_VERSION}): the stored table, changed by \
         `Placement::next` (keep each shard with its pod up to a floor/ceil quota, place the \
         rest by the bounded ring). It remembers the current owners, so its \"before\" is \
         the table of a cluster that reached N pods by one join.\n\n\
         Join: one random pod joins (N -> N+1), ideal shards/(N+1). Leave: one random member \
         leaves (N -> N-1), ideal = its load before. Ratio = mean moved / mean ideal.\n"
    );
    let mut table = |title: &str, ideal_column: bool, cell: &dyn Fn(&Row, &Cell) -> String| {
        let extra = if ideal_column { "ideal" } else { "ceil" };
        let _ = writeln!(
            out,
            "## {title}\n\n| N | {extra} | {header} |\n|---|---|{rule}"
        );
        for r in rows {
            let cells: Vec<String> = r.cells.iter().map(|c| cell(r, c)).collect();
            let first = if ideal_column {
                format!("{:.2}", join_ideal(r.pods, shards))
            } else {
                ceil(r.pods).to_string()
            };
            let _ = writeln!(out, "| {} | {first} | {} |", r.pods, cells.join(" | "));
        }
        let _ = writeln!(out);
    };
    table("Max shards per pod: mean / worst", false, &|_, c| {
        format!("{:.1} / {}", c.max_load, c.max_load_worst)
    });
    table("Moved on join: mean (ratio) / worst", true, &|r, c| {
        let (m, q, w) = (c.join, c.join_ratio(r.pods, shards), c.join_worst);
        format!("{m:.2} ({q:.2}) / {w}")
    });
    table(
        "Moved on leave: mean / ideal (ratio) / worst",
        false,
        &|_, c| {
            let (m, i, q, w) = (c.leave, c.leave_ideal, c.leave_ratio(), c.leave_worst);
            format!("{m:.2} / {i:.2} ({q:.2}) / {w}")
        },
    );
    let (lo, hi) = (SUMMARY_PODS.start(), SUMMARY_PODS.end());
    let summary: Vec<&Row> = rows
        .iter()
        .filter(|r| SUMMARY_PODS.contains(&r.pods))
        .collect();
    let _ = writeln!(
        out,
        "## Summary: means over the measured N in {lo}..={hi}\n"
    );
    if summary.is_empty() {
        let _ = writeln!(out, "No measured pod count in that range.");
    } else {
        let mean = |f: &dyn Fn(&Row) -> f64| {
            summary.iter().map(|r| f(r)).sum::<f64>() / summary.len() as f64
        };
        let _ = writeln!(
            out,
            "| variant | max load / ceil | join | leave |\n|---|---|---|---|"
        );
        for (v, name) in names.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {name} | {:.2} | {:.2} | {:.2} |",
                mean(&|r| r.cells[v].max_load / ceil(r.pods) as f64),
                mean(&|r| r.cells[v].join_ratio(r.pods, shards)),
                mean(&|r| r.cells[v].leave_ratio()),
            );
        }
    }
    let _ = writeln!(
        out,
        "\n## Production placement against the targets\n\n\
         Targets: max load = ceil(shards/N) in every set, join ratio <= {JOIN_TARGET}, \
         leave ratio <= {LEAVE_TARGET} (per-N means).\n"
    );
    let misses: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let c = &r.cells[PRODUCTION];
            let mut why = Vec::new();
            if c.max_load_min != ceil(r.pods) || c.max_load_worst != ceil(r.pods) {
                let (lo, hi) = (c.max_load_min, c.max_load_worst);
                why.push(format!("max load {lo}..={hi} != {}", ceil(r.pods)));
            }
            if c.join_ratio(r.pods, shards) > JOIN_TARGET {
                why.push(format!("join {:.2}", c.join_ratio(r.pods, shards)));
            }
            if c.leave_ratio() > LEAVE_TARGET {
                why.push(format!("leave {:.2}", c.leave_ratio()));
            }
            (!why.is_empty()).then(|| format!("{} ({})", r.pods, why.join(", ")))
        })
        .collect();
    let listed = if misses.is_empty() {
        "none".to_string()
    } else {
        misses.join("; ")
    };
    let _ = writeln!(out, "Missed at N = {listed}");
    out
}

#[cfg(test)]
mod tests;
