//! Pushes with a TTL (`?ttl_s=`) under load: sending them (offline-later's rounds, and a
//! generator beside the plain one in rolling-upgrade), following each to where it ended
//! (`GET /v1/terminals/{id}/pushes/{key}`), what the terminals took and in which order
//! (pos-sim's per-terminal reports), and the gates on them ([`checks`]): no push
//! answered `200` or `202` left undelivered, every other one refused with a clear answer
//! (`400` from a pod of the previous release, `503 queue_unavailable` while the releases
//! mix) and not stored, each terminal's pushes taken in the order they were accepted,
//! none taken after its expiry.
//!
//! Not for: pushes without a TTL (`pushgen`, `push_summary`) or the scenarios' events
//! (`scenarios`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Write as _,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Method;
use serde::Serialize;
use tokio::{sync::Semaphore, task::JoinSet};

use super::{
    cluster::Cluster,
    http::{exchange, HttpClient},
    pods::{TENANT, TOKEN},
    push_summary::{self, outcome_key, PushSummary},
    pushgen::{pick_target, snapshot, Push, PushRecord, Targets},
    report::ScenarioReport,
    sims::TerminalView,
};
use posgate_pos_sim::{
    dist::{dist, Dist},
    FaultConfig,
};

/// `?ttl_s=` of every push with a TTL the harness sends: far beyond any scenario, so a
/// push that does not arrive was dropped, not expired.
pub const TTL_S: u64 = 120;
/// offline-later: the share of the terminals offline while the rounds are sent.
pub const OFFLINE_FRACTION: f64 = 0.2;
/// offline-later: pushes per terminal, one per round.
pub const ROUNDS: usize = 3;
/// A round's pushes in flight at once.
const IN_FLIGHT: usize = 128;
/// A round push's deadline: an owner waits this long for an offline terminal's session
/// before it stores the push (`202`), so it sets the rounds' length (2 s: 72 s for three
/// rounds with 64 in flight, which let PosgateTerminalsDisconnected fire; 500 ms with
/// 128: ~8 s).
const ROUND_TIMEOUT_MS: u64 = 500;
/// Status lookups in flight at once.
const LOOKUPS: usize = 32;
/// How long, after convergence, a push may still be on its way (queued, sending) before
/// it counts as lost: every terminal has its session by then.
const SETTLE: Duration = Duration::from_secs(30);
/// Examples of lost or misordered pushes kept for the report.
const EXAMPLES: usize = 20;

/// How a scenario sent its pushes with a TTL.
#[derive(Debug, Clone)]
pub enum How {
    /// offline-later and cold-start-queued: one push to every terminal per round, each
    /// round once the previous one was answered, so each terminal's pushes were accepted
    /// in round order; the `offline` terminals were offline meanwhile and came back at
    /// `back_unix_ms` (cold-start-queued: all of them, at the cold start).
    Rounds {
        offline: FaultConfig,
        back_unix_ms: u64,
    },
    /// A generator at a fixed rate to random terminals, beside the plain pushes
    /// (rolling-upgrade): where each push ended is followed, the order is not.
    Generator,
}

/// The pushes with a TTL of a scenario and how they were sent.
#[derive(Debug, Clone)]
pub struct Sent {
    pub pushes: Vec<PushRecord>,
    pub how: How,
}

/// offline-later's and cold-start-queued's pushes: `rounds` rounds of one push to each
/// of `terminals` ([`IN_FLIGHT`] at once, each through a random pod in service, retried
/// as `pushgen` retries), a round once the previous one was answered. In round order.
pub async fn rounds(
    client: &HttpClient,
    targets: &Targets,
    terminals: &[String],
    tag: &str,
    rounds: usize,
) -> Vec<PushRecord> {
    let mut out = Vec::with_capacity(terminals.len() * rounds);
    for round in 0..rounds {
        let gate = Arc::new(Semaphore::new(IN_FLIGHT));
        let mut tasks = JoinSet::new();
        for (i, terminal) in terminals.iter().enumerate() {
            let Ok(permit) = gate.clone().acquire_owned().await else {
                break;
            };
            let Some(target) = pick_target(&snapshot(targets), &[]) else {
                continue;
            };
            let push = Push {
                terminal: terminal.clone(),
                key: format!("{tag}-{i}-{round}"),
                body: Bytes::from(format!("{{\"round\":{round}}}")),
                timeout_ms: ROUND_TIMEOUT_MS,
                ttl_s: Some(TTL_S),
            };
            let (client, targets) = (client.clone(), targets.clone());
            tasks.spawn(async move {
                let record = push.send(&client, &targets, target).await;
                drop(permit);
                (i, record)
            });
        }
        let mut done = Vec::with_capacity(terminals.len());
        while let Some(joined) = tasks.join_next().await {
            done.extend(joined.ok());
        }
        done.sort_by_key(|(i, _)| *i);
        out.extend(done.into_iter().map(|(_, record)| record));
    }
    out
}

/// Where the status API says a push stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Its `state`: queued, sending, delivered, rejected, expired, ...
    State(String),
    /// `404 unknown_push`: never stored.
    NotStored,
    /// No status: what the lookup got instead.
    Unread(String),
}

impl Seen {
    /// Whether it can still change: on its way, or not read.
    fn pending(&self) -> bool {
        match self {
            Seen::State(s) => matches!(s.as_str(), "queued" | "sending"),
            Seen::NotStored => false,
            Seen::Unread(_) => true,
        }
    }

    fn name(&self) -> String {
        match self {
            Seen::State(s) => s.clone(),
            Seen::NotStored => "not stored".into(),
            Seen::Unread(why) => format!("unread ({why})"),
        }
    }
}

/// What became of one push with a TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// The terminal took it: answered `200`, or the status API says `delivered`.
    Delivered,
    /// Refused with a clear answer (its status and error code) and never stored: the
    /// sender knows it was not kept.
    Refused(String),
    /// Anything else (answered `202`, not answered, or refused but stored) and not
    /// delivered by the end: the last answer and where it stands. A silent drop.
    Lost { answer: String, state: String },
}

/// The fate of `p` from its last answer and, unless that was a `200`, its status.
pub fn fate(p: &PushRecord, seen: Option<&Seen>) -> Fate {
    let last = p.last();
    let answer = outcome_key(last);
    match seen {
        _ if last.status == 200 => Fate::Delivered,
        Some(Seen::State(s)) if s == "delivered" => Fate::Delivered,
        Some(Seen::NotStored) if last.status >= 400 => Fate::Refused(answer),
        seen => Fate::Lost {
            answer,
            state: seen.map_or("not looked up".into(), Seen::name),
        },
    }
}

/// Whether a terminal took its pushes in acceptance order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    InOrder,
    /// Keys accepted for it that it never took.
    Missing(Vec<String>),
    /// It took every one, first copies in this order.
    Reordered(Vec<String>),
}

/// `accepted`: a terminal's keys in the order they were accepted; `taken`: the keys it
/// took in the order it took them, repeats and other pushes included (only the first
/// copy of an accepted key counts).
pub fn order(accepted: &[String], taken: &[String]) -> Order {
    let mut firsts: Vec<&String> = Vec::new();
    for k in taken {
        if accepted.contains(k) && !firsts.contains(&k) {
            firsts.push(k);
        }
    }
    let missing: Vec<String> = accepted
        .iter()
        .filter(|k| !firsts.contains(k))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Order::Missing(missing);
    }
    if firsts.iter().zip(accepted).all(|(t, a)| *t == a) {
        Order::InOrder
    } else {
        Order::Reordered(firsts.into_iter().cloned().collect())
    }
}

/// What the terminals of offline-later took.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Taken {
    pub terminals: usize,
    /// Terminals whose report could not be read.
    pub unread: usize,
    pub in_order: usize,
    pub missing: usize,
    pub reordered: usize,
    /// The first terminals missing a push or out of order, with what they took.
    pub examples: Vec<String>,
    /// Terminals offline while the rounds were sent.
    pub offline: usize,
    /// Per offline terminal: from the fault lifted (its return) to the last of its
    /// pushes it took, ms.
    pub back_to_last_ms: Dist,
    /// Per offline terminal: from its first connection after the return to the last of
    /// its pushes it took, ms.
    pub session_to_last_ms: Dist,
}

/// The pushes with a TTL of a scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LaterReport {
    pub ttl_s: u64,
    /// Every attempt's answer and each push's last, as for the plain pushes.
    pub answers: PushSummary,
    /// Pushes answered `202` at their last attempt: waiting for their terminal.
    pub queued: usize,
    /// Per push, where it ended: `delivered`, `refused <answer>`, `lost <answer> -> <state>`.
    pub fates: BTreeMap<String, usize>,
    pub delivered: usize,
    pub refused: usize,
    pub lost: usize,
    /// The first lost pushes, `terminal key: answer -> state`.
    pub lost_examples: Vec<String>,
    /// How long the status lookups took, after convergence.
    pub followed_s: f64,
    /// offline-later: what the terminals took, and when.
    pub taken: Option<Taken>,
    /// pos-sim: pushes that came through posgate's queue (`posgate-expires-at`) during
    /// the scenario, and of those arrived after their expiry.
    pub queued_copies: u64,
    pub after_expiry: u64,
}

/// The status of push `p` through a pod in service.
async fn look_up(client: &HttpClient, targets: &Targets, p: &PushRecord) -> Seen {
    let Some((_, base)) = pick_target(&snapshot(targets), &[]) else {
        return Seen::Unread("no pod in service".into());
    };
    // Keys are the harness's own: letters, digits and `-`, nothing to encode.
    let url = format!(
        "{base}/v1/terminals/{}/pushes/{}",
        p.terminal, p.idempotency_key
    );
    let auth = format!("Bearer {TOKEN}");
    let headers = [("authorization", auth.as_str())];
    let limit = Duration::from_secs(5);
    let answer = match exchange(client, Method::GET, &url, &headers, Bytes::new(), limit).await {
        Ok(a) => a,
        Err(e) => return Seen::Unread(e.to_string()),
    };
    let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
    let field = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    match (answer.status, field("state"), field("error")) {
        (200, Some(state), _) => Seen::State(state),
        (404, _, Some(e)) if e == "unknown_push" => Seen::NotStored,
        (status, _, e) => Seen::Unread(format!("{status} {}", e.unwrap_or_default())),
    }
}

/// Where each push not answered `200` stands, looked up again while it is on its way
/// until [`SETTLE`] passed. A `200` is not looked up: the terminal answered 2xx.
async fn follow(c: &Cluster, pushes: &[PushRecord]) -> HashMap<usize, Seen> {
    let mut seen = HashMap::new();
    let mut ask: Vec<usize> = (0..pushes.len())
        .filter(|&i| pushes[i].last().status != 200)
        .collect();
    let started = Instant::now();
    loop {
        let gate = Arc::new(Semaphore::new(LOOKUPS));
        let mut tasks = JoinSet::new();
        for i in ask {
            let Ok(permit) = gate.clone().acquire_owned().await else {
                break;
            };
            let (client, targets, p) = (c.client.clone(), c.targets.clone(), pushes[i].clone());
            tasks.spawn(async move {
                let s = look_up(&client, &targets, &p).await;
                drop(permit);
                (i, s)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            if let Ok((i, s)) = joined {
                seen.insert(i, s);
            }
        }
        ask = seen
            .iter()
            .filter(|(_, s)| s.pending())
            .map(|(&i, _)| i)
            .collect();
        if ask.is_empty() || started.elapsed() > SETTLE {
            return seen;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What the terminals took of the rounds' pushes: the order, and the offline terminals'
/// times from their return to their last push.
fn taken(
    pushes: &[PushRecord],
    views: &[TerminalView],
    terminals: usize,
    offline: &HashSet<String>,
    back_unix_ms: u64,
) -> Taken {
    // Each terminal's accepted keys in acceptance (round) order, as pos-sim records them.
    let mut accepted: HashMap<&str, Vec<String>> = HashMap::new();
    for p in pushes
        .iter()
        .filter(|p| matches!(p.last().status, 200 | 202))
    {
        let key = format!("{TENANT}:{}", p.idempotency_key);
        accepted.entry(p.terminal.as_str()).or_default().push(key);
    }
    let mut t = Taken {
        terminals,
        unread: terminals.saturating_sub(views.len()),
        offline: offline.len(),
        ..Taken::default()
    };
    let (mut back, mut session) = (Vec::new(), Vec::new());
    for v in views {
        let mine = accepted.get(v.id.as_str()).map_or(&[][..], Vec::as_slice);
        let keys: Vec<String> = v
            .recent_pushes
            .iter()
            .map(|p| p.idempotency_key.clone())
            .collect();
        let seen = match order(mine, &keys) {
            Order::InOrder => {
                t.in_order += 1;
                None
            }
            Order::Missing(m) => {
                t.missing += 1;
                Some(format!("missing {m:?}"))
            }
            Order::Reordered(o) => {
                t.reordered += 1;
                Some(format!("took {o:?}"))
            }
        };
        if let Some(what) = seen.filter(|_| t.examples.len() < EXAMPLES) {
            t.examples
                .push(format!("{}: accepted {mine:?}, {what}", v.id));
        }
        if !offline.contains(&v.id) {
            continue;
        }
        let last = v
            .recent_pushes
            .iter()
            .filter(|p| mine.contains(&p.idempotency_key))
            .map(|p| p.at_unix_ms)
            .max();
        let opened = v
            .recent_connections
            .iter()
            .filter(|e| e.event == "opened" && e.at_unix_ms >= back_unix_ms)
            .map(|e| e.at_unix_ms)
            .min();
        if let Some(last) = last {
            back.push(last.saturating_sub(back_unix_ms));
            if let Some(opened) = opened {
                session.push(last.saturating_sub(opened));
            }
        }
    }
    t.back_to_last_ms = dist(back);
    t.session_to_last_ms = dist(session);
    t
}

/// Follows `sent` to where each push ended and, for rounds, reads what every terminal
/// took. `queued_copies` and `after_expiry`: pos-sim's counters over the scenario.
pub async fn report(
    c: &Cluster,
    sent: &Sent,
    queued_copies: u64,
    after_expiry: u64,
) -> LaterReport {
    let started = Instant::now();
    let seen = follow(c, &sent.pushes).await;
    // No pod is killed or paused while pushes with a TTL are sent: no attempt is excused.
    let mut r = LaterReport {
        ttl_s: TTL_S,
        answers: push_summary::summarize(&sent.pushes, &[], 0),
        queued: sent
            .pushes
            .iter()
            .filter(|p| p.last().status == 202)
            .count(),
        queued_copies,
        after_expiry,
        ..LaterReport::default()
    };
    for (i, p) in sent.pushes.iter().enumerate() {
        let label = match fate(p, seen.get(&i)) {
            Fate::Delivered => {
                r.delivered += 1;
                "delivered".to_owned()
            }
            Fate::Refused(answer) => {
                r.refused += 1;
                format!("refused {answer}")
            }
            Fate::Lost { answer, state } => {
                r.lost += 1;
                if r.lost_examples.len() < EXAMPLES {
                    r.lost_examples.push(format!(
                        "{} {}: {answer} -> {state}",
                        p.terminal, p.idempotency_key
                    ));
                }
                format!("lost {answer} -> {state}")
            }
        };
        *r.fates.entry(label).or_default() += 1;
    }
    r.followed_s = started.elapsed().as_secs_f64();
    if let How::Rounds {
        offline,
        back_unix_ms,
    } = &sent.how
    {
        let numbers: Vec<u64> = (0..c.profile.terminals).collect();
        let down: HashSet<String> = numbers
            .iter()
            .map(|&n| c.sims.id(n))
            .enumerate()
            .filter(|(n, id)| offline.is_offline(*n as u64, id))
            .map(|(_, id)| id)
            .collect();
        let views = c.sims.reports(&numbers).await;
        r.taken = Some(taken(
            &sent.pushes,
            &views,
            numbers.len(),
            &down,
            *back_unix_ms,
        ));
    }
    r
}

/// The gates on the pushes with a TTL, when the scenario sent some.
pub fn checks(r: &mut ScenarioReport) {
    let Some(l) = r.later.clone() else {
        return;
    };
    let d = format!(
        "{} pushes: {} delivered, {} refused clearly and not stored, {} lost; {:?}{}",
        l.answers.sent,
        l.delivered,
        l.refused,
        l.lost,
        l.fates,
        match l.lost_examples.first() {
            Some(e) => format!("; e.g. {e}"),
            None => String::new(),
        }
    );
    r.check(
        "no push with a TTL silently dropped: 200/202 delivered, the rest refused clearly \
         and not stored",
        true,
        l.lost == 0,
        d,
    );
    // Without a push through the queue the gate above proves nothing.
    let through = l.delivered > 0 && (l.taken.is_none() || l.queued > 0);
    let d = format!(
        "{} delivered, {} answered 202 (waiting for their terminal)",
        l.delivered, l.queued
    );
    r.check(
        "pushes with a TTL went through (delivered > 0; offline-later: 202s > 0)",
        true,
        through,
        d,
    );
    let un = l.answers.unanswered;
    r.check(
        "every push attempt with a TTL answered by its deadline + 1 s",
        true,
        un == 0,
        format!("{un} attempts unanswered"),
    );
    let d = format!(
        "{} pushes arrived through the queue (posgate-expires-at), {} of them after their \
         expiry",
        l.queued_copies, l.after_expiry
    );
    r.check(
        "no push with a TTL taken after its expiry (pos-sim)",
        true,
        l.after_expiry == 0,
        d,
    );
    if let Some(t) = &l.taken {
        let d = format!(
            "{} terminals: {} in order, {} missing a push, {} out of order, {} unread{}",
            t.terminals,
            t.in_order,
            t.missing,
            t.reordered,
            t.unread,
            match t.examples.first() {
                Some(e) => format!("; e.g. {e}"),
                None => String::new(),
            }
        );
        let pass = t.missing == 0 && t.reordered == 0 && t.unread == 0;
        r.check(
            "each terminal took its pushes with a TTL in acceptance order",
            true,
            pass,
            d,
        );
    }
}

/// cold-start-queued's benchmark: from the cold start to the last queued push taken,
/// beside the same start's convergence (every terminal with its session). Passes when
/// every offline terminal took its push and the cluster converged; the figures are the
/// point, not the pass.
pub fn drained(r: &ScenarioReport) -> (bool, String) {
    let Some(t) = r.later.as_ref().and_then(|l| l.taken.as_ref()) else {
        return (false, "no pushes with a TTL followed".into());
    };
    let b = &t.back_to_last_ms;
    let drained_s = b.max as f64 / 1000.0;
    let beside = match r.converged_after_s {
        Some(c) => format!(
            "converged after {c:.1} s: drained / converged {:.2}",
            drained_s / c
        ),
        None => "not converged".into(),
    };
    let d = format!(
        "{} of {} terminals took their queued push, the last {drained_s:.1} s after the cold \
         start (per terminal p50/p99 {}/{} ms); {beside}",
        b.count, t.offline, b.p50, b.p99
    );
    (b.count == t.offline && r.converged_after_s.is_some(), d)
}

/// The report's Markdown lines about the pushes with a TTL.
pub fn lines(md: &mut String, l: &LaterReport) {
    let a = &l.answers;
    let _ = writeln!(
        md,
        "- pushes with a TTL (ttl_s={}): {} in {} attempts; answers per attempt {:?}; last \
         answers {:?}; {} answered 202; where they ended (status API, {:.1} s of lookups) {:?}",
        l.ttl_s,
        a.sent,
        a.attempts,
        a.by_outcome,
        a.by_final_outcome,
        l.queued,
        l.followed_s,
        l.fates
    );
    if let Some(t) = &l.taken {
        let (b, s) = (&t.back_to_last_ms, &t.session_to_last_ms);
        let _ = writeln!(
            md,
            "- {} terminals offline while the pushes were sent; from their return to their \
             last push taken p50/p99/max {}/{}/{} ms ({} terminals), from their first \
             connection after it {}/{}/{} ms",
            t.offline, b.p50, b.p99, b.max, b.count, s.p50, s.p99, s.max
        );
    }
    let _ = writeln!(
        md,
        "- pos-sim: {} pushes arrived through the queue, {} after their expiry",
        l.queued_copies, l.after_expiry
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::pushgen::testing::{attempt, push};

    fn keys(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn order_takes_first_copies_of_accepted_keys_only() {
        let accepted = keys(&["a", "b", "c"]);
        let took = |list: &[&str]| order(&accepted, &keys(list));
        assert_eq!(took(&["a", "b", "c"]), Order::InOrder);
        // Other pushes between them and a repeat of a copy do not matter.
        assert_eq!(took(&["x", "a", "y", "a", "b", "c", "b"]), Order::InOrder);
        assert_eq!(
            took(&["a", "c", "b"]),
            Order::Reordered(keys(&["a", "c", "b"]))
        );
        // A repeat of an early key after a later one is not a reorder: its first copy
        // came first.
        assert_eq!(took(&["a", "b", "a", "c"]), Order::InOrder);
        assert_eq!(took(&["a", "c"]), Order::Missing(keys(&["b"])));
        assert_eq!(took(&[]), Order::Missing(accepted.clone()));
        assert_eq!(order(&[], &keys(&["x"])), Order::InOrder);
    }

    #[test]
    fn a_push_is_delivered_refused_clearly_or_lost() {
        let answered = |status, outcome| push(attempt("p", 1, status, outcome), vec![]);
        let state = |s: &str| Seen::State(s.into());
        // A 200 is the terminal's 2xx: not looked up.
        assert_eq!(fate(&answered(200, "ok"), None), Fate::Delivered);
        let queued = answered(202, "queued");
        assert_eq!(fate(&queued, Some(&state("delivered"))), Fate::Delivered);
        for end in [state("queued"), state("expired"), Seen::NotStored] {
            assert!(
                matches!(fate(&queued, Some(&end)), Fate::Lost { .. }),
                "{end:?}"
            );
        }
        // Refused by an old pod or while the releases mix, and not stored: clear.
        let old = answered(400, "invalid_request");
        assert_eq!(
            fate(&old, Some(&Seen::NotStored)),
            Fate::Refused("400 invalid_request".into())
        );
        let mixed = push(
            attempt("p", 1, 503, "queue_unavailable"),
            vec![attempt("q", 2, 503, "queue_unavailable")],
        );
        assert_eq!(
            fate(&mixed, Some(&Seen::NotStored)),
            Fate::Refused("503 queue_unavailable".into())
        );
        // Refused, yet stored (a write whose answer was lost) and delivered: delivered;
        // stored and still waiting at the end: lost.
        assert_eq!(fate(&mixed, Some(&state("delivered"))), Fate::Delivered);
        assert_eq!(
            fate(&mixed, Some(&state("sending"))),
            Fate::Lost {
                answer: "503 queue_unavailable".into(),
                state: "sending".into()
            }
        );
        // No answer: the sender cannot know, whatever the store says but delivered.
        let silent = answered(0, "unanswered");
        assert!(matches!(
            fate(&silent, Some(&Seen::NotStored)),
            Fate::Lost { .. }
        ));
        assert!(matches!(
            fate(&queued, Some(&Seen::Unread("503 ?".into()))),
            Fate::Lost { .. }
        ));
    }
}
