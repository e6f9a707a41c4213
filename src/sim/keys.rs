//! Pushes in the simulation, at their two ends: the terminal, which fences by epoch and
//! deduplicates by key (`docs/pos-protocol.md` §5), and the caller, which retries a key
//! whose answer it did not get; and the invariant between them.
//!
//! The invariant: **a key reaches a terminal a second time only after an earlier
//! attempt's answer was lost.** Each copy that reaches the terminal is recorded with the
//! caller's attempt it belongs to. A copy is a violation when its attempt already had a
//! copy there (a pod sent one attempt twice), when an earlier attempt that also reached
//! the terminal was answered with anything but "unknown" (the caller was told a lie:
//! "not delivered" for a push that was, or it retried after a `200`), or when it belongs
//! to an attempt the caller was told was not delivered. An answer is checked too: a
//! `200` needs the terminal to have taken the key; "not delivered" needs the attempt to
//! have reached no terminal.
//!
//! What it does not model: payloads, several terminals per shard, terminal restarts.

use std::collections::HashMap;
use std::time::Duration;

use super::checks::{Checker, Violation};
use crate::core::{Epoch, PodId, ShardId};

/// What the caller heard for one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// `200`: the terminal has the push (taken now, from an earlier copy, or replayed
    /// from the owner's idempotency cache).
    Delivered,
    /// An answer that says the push reached no terminal (`503`, `409` key in flight).
    NotDelivered,
    /// `504` delivery unknown, or no answer at all by the caller's timeout.
    Unknown,
}

/// What the terminal did with a copy that passed its epoch fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receipt {
    Taken,
    /// The key was taken before: answered with the duplicate marker, not acted on.
    Duplicate,
}

#[derive(Debug, Default)]
struct KeyLog {
    /// Per attempt (index = attempt - 1): what the caller heard, once it did.
    heard: Vec<Option<Heard>>,
    /// Copies that reached the terminal: (attempt, pod, epoch).
    copies: Vec<(u32, PodId, Epoch)>,
}

/// The ledger of every key of one run.
#[derive(Debug, Default)]
pub struct Keys {
    keys: HashMap<u64, KeyLog>,
    /// Copies the terminal deduplicated (a retry after a lost answer reached it again).
    pub deduplicated: u64,
    /// ... of which came from another pod than the copy before (across a handover).
    pub from_another_pod: u64,
}

impl Keys {
    /// The caller sends attempt `attempt` (1, 2, ...) of `key`.
    pub fn sent(&mut self, key: u64, attempt: u32) {
        let log = self.keys.entry(key).or_default();
        debug_assert_eq!(log.heard.len() + 1, attempt as usize, "attempts in order");
        log.heard.push(None);
    }

    /// A copy of `key`'s attempt `attempt` from `pod` on `epoch` passed the terminal's
    /// fence on `shard`.
    pub fn arrived(
        &mut self,
        check: &mut Checker,
        at: Duration,
        (shard, key, attempt): (ShardId, u64, u32),
        pod: &PodId,
        epoch: Epoch,
    ) -> Result<Receipt, Violation> {
        check.checks += 1;
        let log = self.keys.entry(key).or_default();
        let what = |why: String| format!("shard {shard} key {key} attempt {attempt}: {why}");
        if log.copies.iter().any(|(a, ..)| *a == attempt) {
            let why = format!(
                "{pod} sent a second copy of one attempt (copies {:?})",
                log.copies
            );
            return Err(check.violation(at, what(why)));
        }
        if log.heard[attempt as usize - 1] == Some(Heard::NotDelivered) {
            let why = format!("{pod} delivered an attempt the caller was told was not delivered");
            return Err(check.violation(at, what(why)));
        }
        for (earlier, p, _) in &log.copies {
            let heard = log.heard[*earlier as usize - 1];
            if heard != Some(Heard::Unknown) {
                let why = format!(
                    "reached the terminal again from {pod} although attempt {earlier} \
                     (from {p}) was answered {heard:?}, not lost"
                );
                return Err(check.violation(at, what(why)));
            }
        }
        let receipt = match log.copies.last() {
            None => Receipt::Taken,
            Some((_, last, _)) => {
                self.deduplicated += 1;
                if last != pod {
                    self.from_another_pod += 1;
                }
                check.log(
                    at,
                    format_args!("key {key}: terminal dedupes attempt {attempt} from {pod}"),
                );
                Receipt::Duplicate
            }
        };
        log.copies.push((attempt, pod.clone(), epoch));
        Ok(receipt)
    }

    /// Whether the caller has heard (or given up on) `key`'s attempt `attempt`.
    pub fn was_heard(&self, key: u64, attempt: u32) -> bool {
        self.keys
            .get(&key)
            .and_then(|log| log.heard.get(attempt as usize - 1))
            .is_some_and(Option::is_some)
    }

    /// The caller heard `heard` for attempt `attempt` of `key` (first hearing only).
    pub fn heard(
        &mut self,
        check: &mut Checker,
        at: Duration,
        key: u64,
        attempt: u32,
        heard: Heard,
    ) -> Result<(), Violation> {
        check.checks += 1;
        let log = self.keys.entry(key).or_default();
        log.heard[attempt as usize - 1] = Some(heard);
        let reached = log.copies.iter().any(|(a, ..)| *a == attempt);
        let bad = match heard {
            Heard::Delivered => log.copies.is_empty(),
            Heard::NotDelivered => reached,
            Heard::Unknown => false,
        };
        if bad {
            let what = format!(
                "key {key} attempt {attempt}: answered {heard:?}, copies at the terminal {:?}",
                log.copies
            );
            return Err(check.violation(at, what));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testing::pod;

    const AT: Duration = Duration::ZERO;

    #[test]
    fn a_second_copy_needs_the_first_answer_lost() {
        let mut c = Checker::new(1, 4);
        let mut k = Keys::default();
        k.sent(7, 1);
        let first = k.arrived(&mut c, AT, (0, 7, 1), &pod("a"), 5).unwrap();
        assert_eq!(first, Receipt::Taken);
        // The same attempt twice: a pod re-sent on its own.
        assert!(k.arrived(&mut c, AT, (0, 7, 1), &pod("b"), 6).is_err());
        k.heard(&mut c, AT, 7, 1, Heard::Unknown).unwrap();
        k.sent(7, 2);
        let again = k.arrived(&mut c, AT, (0, 7, 2), &pod("b"), 6).unwrap();
        assert_eq!(again, Receipt::Duplicate);
        assert_eq!((k.deduplicated, k.from_another_pod), (1, 1));
        k.heard(&mut c, AT, 7, 2, Heard::Delivered).unwrap();
    }

    #[test]
    fn an_answer_must_say_what_happened() {
        let mut c = Checker::new(1, 4);
        let mut k = Keys::default();
        k.sent(1, 1);
        k.arrived(&mut c, AT, (0, 1, 1), &pod("a"), 5).unwrap();
        // "Not delivered" for an attempt that reached the terminal is a lie ...
        assert!(k.heard(&mut c, AT, 1, 1, Heard::NotDelivered).is_err());
        // ... and a retry after it may not reach the terminal again.
        k.sent(1, 2);
        assert!(k.arrived(&mut c, AT, (0, 1, 2), &pod("a"), 5).is_err());
        // A 200 for a key the terminal never took is one too.
        k.sent(2, 1);
        assert!(k.heard(&mut c, AT, 2, 1, Heard::Delivered).is_err());
        // "Not delivered" first, then a copy of that attempt arriving late.
        k.sent(3, 1);
        k.heard(&mut c, AT, 3, 1, Heard::NotDelivered).unwrap();
        assert!(k.arrived(&mut c, AT, (0, 3, 1), &pod("a"), 5).is_err());
    }
}
