//! Turning raw observations into numbers: shard moves, per-terminal session
//! gaps (from the simulators' connection events) and dial rates per pod.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::{floor::Floor, observe::Owners, pushgen::PushRecord, sims::TerminalView};
use posgate_pos_sim::dist::{dist, Dist};

/// Per shard, how many times its owner pod changed across the observations (in order),
/// ignoring gaps where it had no owner.
pub fn owner_changes(series: &[&Owners], shards: usize) -> Vec<u32> {
    let mut changes = vec![0u32; shards];
    let mut last: Vec<Option<String>> = vec![None; shards];
    for owners in series {
        for (shard, slot) in owners.iter().enumerate().take(shards) {
            if let Some((pod, _)) = slot {
                if let Some(prev) = &last[shard] {
                    if prev != pod {
                        changes[shard] += 1;
                    }
                }
                last[shard] = Some(pod.clone());
            }
        }
    }
    changes
}

/// `(shard, epoch)` -> pod, from every observation. Epochs alone are not unique: shards
/// acquired in the same millisecond get the same epoch (`max(last + 1, redis_time_ms)`).
pub fn epoch_owners(series: &[&Owners]) -> HashMap<(u32, u64), String> {
    let mut map = HashMap::new();
    for owners in series {
        for (shard, slot) in owners.iter().enumerate() {
            if let Some((pod, epoch)) = slot {
                map.insert((shard as u32, *epoch), pod.clone());
            }
        }
    }
    map
}

/// A terminal's time without any connection within `[from, to]` (ms, summed over every
/// gap), and whether it had none at `to`. `None` if it never lost its connection there.
///
/// Reconstructed from the terminal's last 32 connection events: the number of connections
/// open at the start of the history is the number of `closed` events whose `opened` is not
/// in it.
pub fn session_gap(view: &TerminalView, from: u64, to: u64) -> Option<(u64, bool)> {
    let mut events = view.recent_connections.clone();
    events.sort_by_key(|e| (e.at_unix_ms, e.event == "opened"));
    let opened: std::collections::HashSet<u64> = events
        .iter()
        .filter(|e| e.event == "opened")
        .map(|e| e.conn)
        .collect();
    let mut open = events
        .iter()
        .filter(|e| e.event == "closed" && !opened.contains(&e.conn))
        .count() as i64;
    let mut down_since: Option<u64> = None;
    let mut total = 0u64;
    let mut any = false;
    for e in &events {
        if e.event == "opened" {
            open += 1;
            if let Some(since) = down_since.take() {
                if e.at_unix_ms >= from {
                    total += e.at_unix_ms.saturating_sub(since.max(from));
                    any = true;
                }
            }
        } else {
            open -= 1;
            if open <= 0 {
                open = 0;
                down_since = Some(e.at_unix_ms);
            }
        }
    }
    let still_down = down_since.is_some() && view.open_connections.is_empty();
    if let Some(since) = down_since.filter(|_| still_down) {
        total += to.saturating_sub(since.max(from));
        any = true;
    }
    any.then_some((total, still_down))
}

/// Per pod, the most connections that pod opened (and still holds at the end) within any
/// 1-second window, from the open connections' open times and their session epochs.
pub fn dial_rate_max(
    views: &[TerminalView],
    epochs: &HashMap<(u32, u64), String>,
    shards: u32,
    from: u64,
) -> BTreeMap<String, u64> {
    let mut per_pod: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for view in views {
        let shard = super::shard_of(&view.id, shards);
        for c in &view.open_connections {
            if c.opened_unix_ms < from || c.superseded {
                continue;
            }
            let pod = c
                .session_epoch
                .and_then(|e| epochs.get(&(shard, e)).cloned())
                .unwrap_or_else(|| "unknown".into());
            per_pod.entry(pod).or_default().push(c.opened_unix_ms);
        }
    }
    per_pod
        .into_iter()
        .map(|(pod, mut ts)| {
            ts.sort_unstable();
            let (mut best, mut lo) = (0usize, 0usize);
            for hi in 0..ts.len() {
                while ts[hi] - ts[lo] >= 1000 {
                    lo += 1;
                }
                best = best.max(hi - lo + 1);
            }
            (pod, best as u64)
        })
        .collect()
}

/// Pushes terminals accepted under one of the `(shard, epoch)` grants in `held` later
/// than `after` (unix ms).
pub fn accepted_from_after(
    views: &[TerminalView],
    held: &std::collections::HashSet<(u32, u64)>,
    shards: u32,
    after: u64,
) -> usize {
    views
        .iter()
        .map(|v| {
            let shard = super::shard_of(&v.id, shards);
            v.recent_pushes
                .iter()
                .filter(|p| p.at_unix_ms > after)
                .filter(|p| held.contains(&(shard, p.epoch)))
                .count()
        })
        .sum()
}

/// Push attempts sent within one second of a scenario, by send time.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LatencyBucket {
    /// Bucket start in seconds relative to the event (negative before it).
    pub second: i64,
    /// Attempts (first sends and retries).
    pub sent: usize,
    /// Answered with any status; latency percentiles are over these.
    pub answered: usize,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
    /// Answered with a status other than 200, or not answered.
    pub not_ok: usize,
}

/// Push latency per 1-s bucket of send time, over every attempt (retries included, by
/// their own send time), from `records`, relative to `event_ms`. Buckets without an
/// attempt are left out (the chart draws a gap there, not a zero).
pub fn latency_buckets(records: &[PushRecord], event_ms: u64) -> Vec<LatencyBucket> {
    let mut by_second: BTreeMap<i64, (usize, usize, Vec<u64>)> = BTreeMap::new();
    for p in records.iter().flat_map(PushRecord::attempts) {
        let rel = p.sent_unix_ms as i64 - event_ms as i64;
        let slot = by_second.entry(rel.div_euclid(1000)).or_default();
        slot.0 += 1;
        if p.status != 200 {
            slot.1 += 1;
        }
        if !p.unanswered && p.status != 0 {
            slot.2.push(p.latency_ms);
        }
    }
    by_second
        .into_iter()
        .map(|(second, (sent, not_ok, latencies))| {
            let d = dist(latencies);
            LatencyBucket {
                second,
                sent,
                answered: d.count,
                p50_ms: d.p50,
                p99_ms: d.p99,
                max_ms: d.max,
                not_ok,
            }
        })
        .collect()
}

/// Push latency while shards moved, beside idle, in one run (ms, answered attempts).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MovingLatency {
    /// Sent from the event until convergence (or the end without one).
    pub moving: Dist,
    /// Of those, the pushes to terminals whose shard did not move: what the machine's
    /// load during the move costs a push by itself, the floor of `moving`.
    pub unmoved: Dist,
    /// Sent before the event or after convergence.
    pub idle: Dist,
}

/// Splits `records`' answered attempts into [`MovingLatency`]: the event at `event_ms`,
/// convergence at `converged_ms`, the terminals of moved shards `moved`.
pub fn moving_latency(
    records: &[PushRecord],
    (event_ms, converged_ms): (u64, Option<u64>),
    moved: &HashSet<String>,
) -> MovingLatency {
    let (mut moving, mut unmoved, mut idle) = (Vec::new(), Vec::new(), Vec::new());
    for p in records {
        let answered = p.attempts().filter(|a| !a.unanswered && a.status != 0);
        for a in answered {
            let during =
                a.sent_unix_ms >= event_ms && converged_ms.is_none_or(|c| a.sent_unix_ms < c);
            if !during {
                idle.push(a.latency_ms);
                continue;
            }
            moving.push(a.latency_ms);
            if !moved.contains(&p.terminal) {
                unmoved.push(a.latency_ms);
            }
        }
    }
    MovingLatency {
        moving: dist(moving),
        unmoved: dist(unmoved),
        idle: dist(idle),
    }
}

/// TLS handshakes per second overall, as the terminals saw them: the largest rise of
/// open connections between two samples at least 1 s apart, per second. `series` is
/// `(unix ms, connections open)` in time order. A lower bound while connections also
/// close; exact in a cold start, where nothing closes.
pub fn open_rise_max_per_s(series: &[(u64, u64)]) -> u64 {
    let mut best = 0;
    for (i, &(t0, open0)) in series.iter().enumerate() {
        let Some(&(t1, open1)) = series[i..].iter().find(|(t, _)| *t >= t0 + 1000) else {
            break;
        };
        best = best.max(open1.saturating_sub(open0) * 1000 / (t1 - t0));
    }
    best
}

/// A cold start that converged after `took` seconds (`None`: not within the limit)
/// against its bound `1.2 x T + 5 s`, where `T = max(terminals / (pods x dial rate),
/// terminals / handshakes per s)` is the time the dial limit or the machine's TLS
/// handshake rate (H, calibrated in the same run before the pods: `calibrate`) allows
/// at best. Returns whether it is
/// within, and the figure beside the bound and T.
pub fn cold_start(
    took: Option<f64>,
    terminals: u64,
    pods: u64,
    dial_rate: u64,
    handshakes: u64,
) -> (bool, String) {
    let (by_rate, by_cpu) = t_limits(terminals, pods, dial_rate, handshakes);
    let t = by_rate.max(by_cpu);
    let bound = bound_s(t);
    let took = took.unwrap_or(f64::INFINITY);
    let detail = format!(
        "{took:.1} s, bound {bound:.1} s, {:.2} x T; T = max({terminals} / ({pods} x \
         {dial_rate}/s) = {by_rate:.1} s, {terminals} / {handshakes} handshakes/s = \
         {by_cpu:.1} s) = {t:.1} s",
        took / t
    );
    (took <= bound, detail)
}

/// T of the cold-start bound (`cold_start`): the slower of the dial limit and H.
pub fn cold_start_t(terminals: u64, pods: u64, dial_rate: u64, handshakes: u64) -> f64 {
    let (by_rate, by_cpu) = t_limits(terminals, pods, dial_rate, handshakes);
    by_rate.max(by_cpu)
}

/// The two times T is the slower of: dialing every terminal at the pods' dial limit,
/// and handshaking with every terminal at H.
fn t_limits(terminals: u64, pods: u64, dial_rate: u64, handshakes: u64) -> (f64, f64) {
    let by_rate = terminals as f64 / (pods * dial_rate).max(1) as f64;
    let by_cpu = terminals as f64 / handshakes.max(1) as f64;
    (by_rate, by_cpu)
}

/// The cold start's bound over a baseline (T, or the floor): `1.2 x baseline + 5 s`.
pub fn bound_s(baseline_s: f64) -> f64 {
    1.2 * baseline_s + 5.0
}

/// A cold start that converged after `took` seconds against the floor measured before
/// its pods (`floor`): the same dials by processes that are not posgate. Within
/// `1.2 x floor + 5 s` is what the H-based bound asks of posgate once the protocol's own
/// cost on this machine is in the baseline. Reported, not gated: the bound is
/// `cold_start`'s.
pub fn against_floor(took: Option<f64>, floor: &Floor) -> (bool, String) {
    let bound = bound_s(floor.took_s);
    let took = took.unwrap_or(f64::INFINITY);
    let detail = format!(
        "{took:.1} s, bound {bound:.1} s, {:.2} x the floor ({}: {:.1} s by {} dialers)",
        took / floor.took_s,
        floor.what(),
        floor.took_s,
        floor.dialers
    );
    (took <= bound, detail)
}

/// Above this, the wall clock running ahead of the monotonic clock is reported.
const CLOCK_JUMP_MS: u64 = 2_000;

/// How many seconds further the wall clock moved than the monotonic clock over one span,
/// when that is more than 2 s: the machine was suspended (a VM snapshot or host pause;
/// Linux's monotonic clock stops meanwhile) or its clock was stepped. Every process then
/// froze or saw time jump at once, and Redis, which expires keys by the wall clock, let
/// member records and leases run out together: figures of such a run are not the
/// scenario's alone.
pub fn clock_jump_s(wall_ms: u64, monotonic: std::time::Duration) -> Option<f64> {
    let ahead = wall_ms.saturating_sub(monotonic.as_millis() as u64);
    (ahead > CLOCK_JUMP_MS).then(|| ahead as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_start_bound_takes_the_slower_of_the_dial_limit_and_the_handshake_rate() {
        // The dial limit: 50,000 / (20 x 200) = 12.5 s; bound 1.2 x 12.5 + 5 = 20 s.
        let (pass, why) = cold_start(Some(20.0), 50_000, 20, 200, 10_000);
        assert!(
            pass && why.contains("bound 20.0 s") && why.ends_with("= 12.5 s"),
            "{why}"
        );
        assert!(!cold_start(Some(20.1), 50_000, 20, 200, 10_000).0);
        // The machine: 50,000 / 1,000 = 50 s; bound 65 s.
        let (pass, why) = cold_start(Some(61.9), 50_000, 20, 200, 1_000);
        assert!(pass && why.contains("bound 65.0 s, 1.24 x T"), "{why}");
        assert!(!cold_start(None, 50_000, 20, 200, 1_000).0);
    }

    #[test]
    fn a_cold_start_is_weighed_against_the_floor_of_its_run() {
        let floor = Floor {
            hello: true,
            dialers: 20,
            terminals: 50_000,
            took_s: 25.0,
            cpu_s: 40.0,
            handshakes_failed: 0,
        };
        // Bound 1.2 x 25 + 5 = 35 s.
        let (pass, why) = against_floor(Some(30.0), &floor);
        assert!(pass, "{why}");
        assert!(
            why.contains("bound 35.0 s, 1.20 x the floor (TLS + HTTP/2 + hello: 25.0 s by 20"),
            "{why}"
        );
        assert!(against_floor(Some(35.0), &floor).0);
        assert!(!against_floor(Some(35.1), &floor).0);
        assert!(!against_floor(None, &floor).0);
    }
    use crate::load::{
        pushgen::Attempt,
        sims::{Event, TerminalView},
    };

    fn ev(conn: u64, event: &str, at: u64) -> Event {
        Event {
            conn,
            event: event.into(),
            at_unix_ms: at,
        }
    }

    #[test]
    fn a_wall_clock_ahead_of_the_monotonic_one_is_a_jump() {
        let secs = std::time::Duration::from_secs;
        assert_eq!(clock_jump_s(155_200, secs(37)), Some(118.2));
        assert_eq!(clock_jump_s(39_000, secs(37)), None);
        assert_eq!(
            clock_jump_s(36_000, secs(37)),
            None,
            "wall clock behind: no jump"
        );
    }

    /// An attempt sent at `sent` (Unix ms); status 0 is unanswered.
    fn attempt(sent: u64, status: u16, latency_ms: u64) -> Attempt {
        Attempt {
            sent_unix_ms: sent,
            entry_pod: "p".into(),
            status,
            outcome: String::new(),
            latency_ms,
            unanswered: status == 0,
            delivered_by: None,
        }
    }

    /// A push to `terminal` with one attempt.
    fn record(terminal: &str, sent: u64, status: u16, latency_ms: u64) -> PushRecord {
        PushRecord {
            terminal: terminal.into(),
            idempotency_key: format!("k{sent}"),
            first: attempt(sent, status, latency_ms),
            retries: Vec::new(),
        }
    }

    #[test]
    fn latency_buckets_by_send_second_relative_to_the_event() {
        let rec = |sent, status, latency_ms| record("t", sent, status, latency_ms);
        let records = [
            rec(9_500, 200, 3),
            rec(10_000, 200, 1),
            rec(10_400, 503, 5_000),
            rec(10_999, 0, 6_000),
            rec(12_100, 200, 7),
        ];
        // The 503 sent at 10_400 retried at 12_900: counted in its own second.
        let mut records = records.to_vec();
        records[2].retries.push(attempt(12_900, 200, 9));
        let b = latency_buckets(&records, 10_000);
        let seconds: Vec<i64> = b.iter().map(|x| x.second).collect();
        assert_eq!(seconds, [-1, 0, 2]);
        assert_eq!((b[1].sent, b[1].answered, b[1].not_ok), (3, 2, 2));
        assert_eq!((b[1].p50_ms, b[1].max_ms), (1, 5_000));
        assert_eq!((b[0].p99_ms, b[2].p50_ms), (3, 7));
        assert_eq!((b[2].sent, b[2].max_ms), (2, 9));
    }

    #[test]
    fn latency_while_moving_beside_idle() {
        let rec = record;
        let records = [
            rec("a", 9_000, 200, 2),
            rec("m", 10_000, 200, 40),
            rec("m", 10_500, 0, 6_000),
            rec("a", 19_999, 200, 30),
            rec("a", 20_000, 200, 3),
        ];
        let moved = HashSet::from(["m".to_string()]);
        let l = moving_latency(&records, (10_000, Some(20_000)), &moved);
        assert_eq!(
            (l.moving.count, l.moving.max, l.idle.count, l.idle.max),
            (2, 40, 2, 3)
        );
        assert_eq!((l.unmoved.count, l.unmoved.max), (1, 30));
        let l = moving_latency(&records, (10_000, None), &moved);
        assert_eq!((l.moving.count, l.idle.count), (3, 1));
    }

    #[test]
    fn gap_between_close_and_reopen() {
        let view = TerminalView {
            id: "t".into(),
            highest_epoch: None,
            open_connections: vec![],
            recent_connections: vec![ev(1, "closed", 1_000), ev(2, "opened", 1_250)],
            recent_pushes: vec![],
        };
        assert_eq!(session_gap(&view, 500, 5_000), Some((250, false)));
    }

    #[test]
    fn handshake_rate_is_the_steepest_rise_over_a_second() {
        // 250 ms samples: +100 per sample for a second (400/s), then flat, then a drop.
        let series: Vec<(u64, u64)> = [0, 100, 200, 300, 400, 400, 400, 50, 50]
            .iter()
            .enumerate()
            .map(|(i, &open)| (1_000 + i as u64 * 250, open))
            .collect();
        assert_eq!(open_rise_max_per_s(&series), 400);
        // Under a second of samples: no window, no rate.
        assert_eq!(open_rise_max_per_s(&series[..4]), 0);
        // Closing connections only: nothing rose.
        assert_eq!(open_rise_max_per_s(&[(0, 500), (1_000, 100)]), 0);
    }
}
