//! Pushes with a TTL in the simulation, at their two ends: the terminal, which fences by
//! epoch and deduplicates by key for its window `W`, and the caller, whose push counts
//! once a pod acknowledged it (`202`); and the invariants between them.
//!
//! The invariants, checked at every copy that reaches the terminal and at the end:
//! - **never late**: no copy leaves a pod at or after its push's expiry (true time; the
//!   expiry was fixed on the accepting pod's clock and is judged on the sender's, which
//!   disagree by at most the skew allowance);
//! - **never acted on twice**: a copy of a stored push whose key the terminal took from
//!   it before arrives within `W` of that take (it is answered as a duplicate), never
//!   after (it would be taken again);
//! - **exactly one end**: every acknowledged push ends in one final state, and the one
//!   the terminal saw: `delivered` only if it has the key, `expired` and `replaced` only
//!   if no copy of that stored push reached it; or it is lost with the store's data (a
//!   wipe: the store's generation changed since it was acknowledged). A failover loses
//!   none, because every queue write waits for the replica.
//!
//! A stored push is told apart from an earlier one with the same key by when it was
//! accepted: after a wipe lost a delivered push, the caller's retry is stored as a new
//! one, which may wait past the terminal's window of the first and then be taken again.
//! That is the loss the wipe is, not a copy the gateway sent again: it is counted
//! ([`Ledger::retaken`]), and `docs/operations.md` says what a Redis that loses its data
//! costs.
//!
//! What it does not model: bodies, cancels, per-pod pacing, several terminals per shard.

use std::time::Duration;

use super::checks::{Checker, Violation};
use crate::core::ShardId;
use crate::store::queue::{Record, State};

/// What the terminal does with a copy that passed its epoch fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Taken now.
    New,
    /// Taken before, within the window: answered as a duplicate, not acted on.
    Repeat,
}

/// One stored push of a key (normally one; another after a wipe lost the first).
#[derive(Debug)]
pub struct Stored {
    /// The record's `accepted_ms`: which stored push a copy or a write is of.
    pub accepted_ms: u64,
    /// The true time it expires.
    pub expires: Duration,
    /// The store generation it was stored in.
    pub generation: String,
    /// Whether a copy of it passed the terminal's fence.
    pub reached: bool,
    /// The final state the store recorded for it.
    pub ended: Option<&'static str>,
}

/// One caller's push with a TTL.
#[derive(Debug)]
pub struct LaterKey {
    pub shard: ShardId,
    pub key: String,
    pub collapse: Option<String>,
    pub ttl: Duration,
    /// When the caller first sent it: it retries only within the terminal's window of
    /// that.
    pub first_sent: Option<Duration>,
    pub stored: Vec<Stored>,
    /// The store generation a pod acknowledged it in (the caller heard `202`).
    pub acked_in: Option<String>,
    /// When the terminal took the key, and from which stored push.
    pub taken: Option<(Duration, u64)>,
}

impl LaterKey {
    fn stored_at(&mut self, accepted_ms: u64) -> Option<&mut Stored> {
        self.stored
            .iter_mut()
            .find(|s| s.accepted_ms == accepted_ms)
    }
}

/// The ledger of every push with a TTL of one run.
#[derive(Debug, Default)]
pub struct Ledger {
    pub keys: Vec<LaterKey>,
    /// Copies the terminals answered as duplicates (sent again after a lost answer).
    pub repeats: u64,
    /// Keys taken again past the terminal's window from a new stored push, after the
    /// store lost the one that delivered them (see the module docs).
    pub retaken: u64,
}

impl Ledger {
    /// The store accepted a new push of `key` in `generation`.
    pub fn stored(&mut self, key: usize, accepted_ms: u64, expires: Duration, generation: &str) {
        self.keys[key].stored.push(Stored {
            accepted_ms,
            expires,
            generation: generation.to_string(),
            reached: false,
            ended: None,
        });
    }

    /// A copy of `key`'s stored push accepted at `accepted_ms`, which left its pod at
    /// `left`, passed the terminal's fence at `at`; `window` is the terminal's dedup
    /// window.
    pub fn arrived(
        &mut self,
        check: &mut Checker,
        at: Duration,
        left: Duration,
        (key, accepted_ms): (usize, u64),
        window: Duration,
    ) -> Result<Taken, Violation> {
        check.checks += 1;
        let k = &mut self.keys[key];
        let what = format!("queued push {} (shard {})", k.key, k.shard);
        let stored = k.stored_at(accepted_ms);
        let expires = stored.as_ref().map(|s| s.expires);
        if let Some(s) = stored {
            s.reached = true;
        }
        if let Some(expires) = expires.filter(|&e| left >= e) {
            let why = format!(
                "{what}: a copy left at {:.3}s, after its expiry at {:.3}s",
                left.as_secs_f64(),
                expires.as_secs_f64()
            );
            return Err(check.violation(at, why));
        }
        match k.taken {
            None => {
                k.taken = Some((at, accepted_ms));
                Ok(Taken::New)
            }
            Some((first, _)) if at < first + window => {
                self.repeats += 1;
                Ok(Taken::Repeat)
            }
            Some((_, from)) if from != accepted_ms => {
                check.log(
                    at,
                    format_args!(
                        "{what}: taken again from a new stored push after the store lost the first"
                    ),
                );
                self.retaken += 1;
                k.taken = Some((at, accepted_ms));
                Ok(Taken::New)
            }
            Some((first, _)) => {
                let why = format!(
                    "{what}: taken again at {:.3}s, past the window of its first take at {:.3}s",
                    at.as_secs_f64(),
                    first.as_secs_f64()
                );
                Err(check.violation(at, why))
            }
        }
    }

    /// The store recorded `state`, final, for `key`'s stored push accepted at
    /// `accepted_ms`: once, and as the terminal saw it (`delivered` only if it has the
    /// key, `expired`, `replaced` and `cancelled` only if no copy of this push reached
    /// it).
    pub fn ended(
        &mut self,
        check: &mut Checker,
        at: Duration,
        (key, accepted_ms): (usize, u64),
        state: &State,
    ) -> Result<(), Violation> {
        check.checks += 1;
        let k = &mut self.keys[key];
        let what = format!("queued push {} (shard {})", k.key, k.shard);
        let taken = k.taken.is_some();
        let Some(s) = k.stored_at(accepted_ms) else {
            return Err(check.violation(at, format!("{what}: ended {state:?}, never stored")));
        };
        if let Some(before) = s.ended {
            return Err(check.violation(at, format!("{what}: ended {state:?} after {before}")));
        }
        let consistent = match state {
            State::Delivered { .. } => taken,
            State::Expired { .. } | State::Replaced { .. } | State::Cancelled { .. } => !s.reached,
            State::Rejected { .. } | State::Unknown { .. } => true,
            State::Queued | State::Sending { .. } => false,
        };
        if !consistent {
            let why = format!(
                "{what}: ended {state:?}, but the terminal {}",
                if s.reached {
                    "got a copy"
                } else {
                    "never had the key"
                }
            );
            return Err(check.violation(at, why));
        }
        s.ended = Some(state.name());
        Ok(())
    }

    /// After a failover: `key`'s stored pushes of `generation` are what the store keeps
    /// (`record`); a push or an end the store no longer has never happened, as far as
    /// the store is concerned (its pods heard those writes fail).
    pub fn keep(&mut self, key: usize, generation: &str, record: Option<&Record>) {
        let k = &mut self.keys[key];
        k.stored.retain(|s| {
            s.generation != generation || record.is_some_and(|r| r.accepted_ms == s.accepted_ms)
        });
        if let Some(r) = record {
            if let Some(s) = k.stored_at(r.accepted_ms) {
                if !r.state.is_final() {
                    s.ended = None;
                }
            }
        }
    }

    /// At the end of the run, with the store in `generation` (and `record` the key's
    /// record there, if any): an acknowledged push ended, or a wipe lost it before it
    /// did. One that should have ended by `due_by` and did not, or that is gone from
    /// the generation it was acknowledged in without an end (a failover lost it), is a
    /// violation.
    pub fn at_end(
        &self,
        check: &mut Checker,
        at: Duration,
        key: usize,
        generation: Option<&str>,
        record: Option<&Record>,
        due_by: Duration,
    ) -> Result<End, Violation> {
        check.checks += 1;
        let k = &self.keys[key];
        let Some(acked_in) = &k.acked_in else {
            return Ok(End::NotAcked);
        };
        let what = format!("queued push {} (shard {})", k.key, k.shard);
        let Some(s) = k.stored.iter().find(|s| s.generation == *acked_in) else {
            return Err(check.violation(at, format!("{what}: acknowledged, never stored")));
        };
        if let Some(state) = s.ended {
            return Ok(End::Final(state));
        }
        if generation != Some(acked_in.as_str()) {
            return Ok(End::Lost);
        }
        match record {
            None => {
                Err(check.violation(at, format!("{what}: acknowledged, and gone from the store")))
            }
            Some(_) if s.expires <= due_by => {
                let why = format!(
                    "{what}: never reached a final state: {:?}",
                    record.map(|r| &r.state)
                );
                Err(check.violation(at, why))
            }
            Some(_) => Ok(End::Open),
        }
    }
}

/// How an acknowledged push ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    NotAcked,
    /// Lost with the store's data before it ended.
    Lost,
    /// Not final yet, and not due to be.
    Open,
    Final(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(4);
    const S: Duration = Duration::from_secs(1);

    fn ledger() -> Ledger {
        let mut l = Ledger::default();
        l.keys.push(LaterKey {
            shard: 0,
            key: "q1".into(),
            collapse: None,
            ttl: Duration::from_secs(5),
            first_sent: None,
            stored: Vec::new(),
            acked_in: Some("g".into()),
            taken: None,
        });
        l.stored(0, 0, 10 * S, "g");
        l
    }

    #[test]
    fn a_copy_is_late_after_the_expiry_and_twice_after_the_window() {
        let mut c = Checker::new(1, 4);
        let mut l = ledger();
        assert!(
            l.arrived(&mut c, 10 * S, 10 * S, (0, 0), W).is_err(),
            "left at its expiry"
        );
        assert_eq!(
            l.arrived(&mut c, 2 * S, 2 * S, (0, 0), W).unwrap(),
            Taken::New
        );
        assert_eq!(
            l.arrived(&mut c, 5 * S, 5 * S, (0, 0), W).unwrap(),
            Taken::Repeat
        );
        assert!(
            l.arrived(&mut c, 6 * S, 5 * S, (0, 0), W).is_err(),
            "taken again past W"
        );
        // A new stored push of the key (the first was lost with the store's data) is
        // not a resend: counted, not a violation.
        l.stored(0, 7, 20 * S, "h");
        assert_eq!(
            l.arrived(&mut c, 9 * S, 9 * S, (0, 7), W).unwrap(),
            Taken::New
        );
        assert_eq!(l.retaken, 1);
    }

    #[test]
    fn an_end_is_recorded_once_and_must_agree_with_the_terminal() {
        let mut c = Checker::new(1, 4);
        let mut l = ledger();
        let expired = State::Expired { at_ms: 1 };
        // Still open at the end: due, it is a violation; lost with a wipe, it is not.
        assert!(
            l.at_end(&mut c, S, 0, Some("g"), None, 20 * S).is_err(),
            "gone in a failover"
        );
        assert_eq!(
            l.at_end(&mut c, S, 0, Some("h"), None, 20 * S).unwrap(),
            End::Lost
        );
        l.ended(&mut c, S, (0, 0), &expired).unwrap();
        assert!(
            l.ended(&mut c, S, (0, 0), &expired).is_err(),
            "a second end"
        );
        assert_eq!(
            l.at_end(&mut c, S, 0, Some("h"), None, 20 * S).unwrap(),
            End::Final("expired")
        );
        // Expired although a copy reached the terminal: a lie.
        let mut l = ledger();
        l.arrived(&mut c, 2 * S, 2 * S, (0, 0), W).unwrap();
        assert!(l.ended(&mut c, S, (0, 0), &expired).is_err());
    }
}
