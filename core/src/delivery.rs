//! The delivery rule: what a copy of a push must pass the instant before it leaves the
//! owner for its terminal, as one IO-free function, [`check`]. The owner's live path
//! (`posgate::push::owner`), the queue's drain (`posgate::push::queue`) and the simulation
//! (`posgate::sim`) all call it, so the order of the checks is written once.
//!
//! In order, each for a reason:
//! 1. **Served here now** ([`Moment::serving`]): the lease is ours and within its
//!    deadline (or held through a cluster-wide outage). Otherwise nothing may leave: a
//!    live push looks for the new owner, a drain stops.
//! 2. **The session carries that epoch** ([`Moment::session`]): its accepted hello was
//!    for the epoch the shard is served with. A re-claim bumps the epoch; the link says
//!    hello again and the copy waits for that.
//! 3. **A queued push is still due** ([`step`]): not past its expiry (judged on this
//!    pod's clock with [`QueueRules::skew`] to spare, because the expiry was fixed on
//!    the clock of whichever pod accepted it), and a copy whose answer was lost is sent
//!    again only while the terminal still remembers the key ([`QueueRules::window`]).
//! 4. **Time to hear the answer** ([`MIN_SEND_BUDGET`]): a copy sent later is often
//!    taken by the terminal and answered too late, an unknown outcome.
//!
//! What the terminal does when two pods disagree is not decided here: it fences by epoch
//! and deduplicates by key (`docs/pos-protocol.md` §4-5). These checks keep a pod from
//! sending what the terminal would refuse (1, 2), what it would act on twice (3) or what
//! would leave the caller in doubt (4).
//!
//! Not for: waiting for a session, reserving keys, or recording anything (the callers
//! do the IO, then ask again).

use std::time::Duration;

use super::Epoch;

/// Least time left before the deadline for a copy to leave: a terminal's answer takes a
/// round trip plus its own work.
pub const MIN_SEND_BUDGET: Duration = Duration::from_millis(20);

/// What the owner knows the instant a copy would leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment<'a> {
    /// The epoch this pod may deliver on the shard with now; `None` when it may not.
    pub serving: Option<Epoch>,
    /// The epoch of the session the copy would go on (its accepted hello).
    pub session: Epoch,
    /// Time left to hear the answer: of the caller's deadline (a live push), of the
    /// copy's own bound (a queued one).
    pub left: Duration,
    /// A queued push: what the store holds about it, and this pod's wall clock.
    pub queued: Option<(&'a Pending, WallMs, &'a QueueRules)>,
}

/// Milliseconds since the Unix epoch, on some pod's wall clock.
pub type WallMs = u64;

/// What decides whether a queued push is still due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    /// When it expires, fixed at acceptance on the accepting pod's clock.
    pub expires_ms: WallMs,
    /// When the first copy whose answer is still missing left, on the clock of the pod
    /// that sent it (recorded in the store before it left); `None` when no copy may
    /// have been taken.
    pub unanswered_since_ms: Option<WallMs>,
}

/// The bounds a queued push is sent within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueRules {
    /// The terminal's dedup window `W` (at least `--idempotency-ttl`, a MUST of the
    /// protocol): a repeat of a key within it is answered as a duplicate, not acted on.
    pub window: Duration,
    /// How far two pods' wall clocks may disagree: an expiry or a first copy's time
    /// recorded by one pod is judged by another.
    pub skew: Duration,
    /// How long one copy waits for its answer: a copy that leaves at `t` reaches the
    /// terminal before `t + copy_timeout` or is not answered.
    pub copy_timeout: Duration,
}

/// Whether a copy may leave now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Send,
    /// The shard is not served here now.
    NotServed,
    /// The session's hello was for another epoch: wait for one with the serving epoch.
    StaleSession,
    /// Too little of the deadline left to hear the answer.
    TooLate,
    /// A queued push that is not due now ([`step`] says what instead).
    Queued(Step),
}

/// What to do with a queued push at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send a copy (the first, or again after an answer was lost).
    Send,
    /// Its expiry passed and no copy can have been taken: it ends `expired`.
    Expire,
    /// A copy may have been taken and sending another is no longer safe (the window
    /// has passed) or no longer allowed (the expiry has): it ends `unknown`.
    GiveUp,
    /// Neither sendable nor over yet: within `skew` of its expiry. Look again then.
    WaitUntil(WallMs),
}

/// The checks of the module docs, in their order.
pub fn check(moment: &Moment<'_>) -> Verdict {
    let Some(epoch) = moment.serving else {
        return Verdict::NotServed;
    };
    if moment.session != epoch {
        return Verdict::StaleSession;
    }
    if let Some((pending, now, rules)) = moment.queued {
        match step(pending, now, rules) {
            Step::Send => {}
            other => return Verdict::Queued(other),
        }
    }
    if moment.left < MIN_SEND_BUDGET {
        return Verdict::TooLate;
    }
    Verdict::Send
}

/// What a queued push is due for at `now` (this pod's wall clock), whatever the session.
///
/// A copy that leaves at `now` reaches the terminal before `now + copy_timeout`; the
/// first copy was taken (if at all) after it left, at `since` on its sender's clock. So
/// the terminal still remembers the key when the new copy arrives if
/// `now + skew + copy_timeout < since + window`. Expiry: a copy may leave only while
/// `now + skew < expires`, so no clock within the skew sees it leave late; it ends
/// `expired` once `now >= expires`.
pub fn step(pending: &Pending, now: WallMs, rules: &QueueRules) -> Step {
    let ms = |d: Duration| d.as_millis() as u64;
    let skewed = now.saturating_add(ms(rules.skew));
    if let Some(since) = pending.unanswered_since_ms {
        let arrives = skewed.saturating_add(ms(rules.copy_timeout));
        if arrives >= since.saturating_add(ms(rules.window)) || skewed >= pending.expires_ms {
            return Step::GiveUp;
        }
        return Step::Send;
    }
    if now >= pending.expires_ms {
        Step::Expire
    } else if skewed >= pending.expires_ms {
        Step::WaitUntil(pending.expires_ms)
    } else {
        Step::Send
    }
}

/// How long a queued copy that leaves at `now` may take to leave and be answered: its
/// copy timeout, but never past the point where it would leave after its expiry (an
/// HTTP/2 request can wait for a stream before it leaves; bounded by this, it leaves
/// in time or not at all).
pub fn send_bound(pending: &Pending, now: WallMs, rules: &QueueRules) -> Duration {
    let ms = |d: Duration| d.as_millis() as u64;
    let last = pending.expires_ms.saturating_sub(ms(rules.skew));
    rules
        .copy_timeout
        .min(Duration::from_millis(last.saturating_sub(now)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: QueueRules = QueueRules {
        window: Duration::from_secs(600),
        skew: Duration::from_millis(500),
        copy_timeout: Duration::from_secs(10),
    };

    fn live(serving: Option<Epoch>, session: Epoch, left_ms: u64) -> Verdict {
        check(&Moment {
            serving,
            session,
            left: Duration::from_millis(left_ms),
            queued: None,
        })
    }

    #[test]
    fn a_live_copy_needs_the_shard_the_session_epoch_and_time_in_that_order() {
        assert_eq!(live(Some(7), 7, 1_000), Verdict::Send);
        assert_eq!(live(None, 7, 1_000), Verdict::NotServed);
        // Not served outranks the session: a pod that lost the shard must not wait for
        // a hello it will never send.
        assert_eq!(live(None, 6, 0), Verdict::NotServed);
        assert_eq!(live(Some(8), 7, 1_000), Verdict::StaleSession);
        assert_eq!(live(Some(8), 7, 0), Verdict::StaleSession);
        assert_eq!(live(Some(7), 7, 19), Verdict::TooLate);
        assert_eq!(live(Some(7), 7, 20), Verdict::Send);
    }

    #[test]
    fn a_queued_push_leaves_only_before_its_expiry_with_the_skew_to_spare() {
        let p = Pending {
            expires_ms: 10_000,
            unanswered_since_ms: None,
        };
        assert_eq!(step(&p, 9_499, &RULES), Step::Send);
        assert_eq!(step(&p, 9_500, &RULES), Step::WaitUntil(10_000));
        assert_eq!(step(&p, 9_999, &RULES), Step::WaitUntil(10_000));
        assert_eq!(step(&p, 10_000, &RULES), Step::Expire);
        let at = |now| {
            check(&Moment {
                serving: Some(3),
                session: 3,
                left: RULES.copy_timeout,
                queued: Some((&p, now, &RULES)),
            })
        };
        assert_eq!(at(9_000), Verdict::Send);
        assert_eq!(at(10_001), Verdict::Queued(Step::Expire));
    }

    #[test]
    fn a_queued_copy_is_bounded_by_its_expiry() {
        let p = Pending {
            expires_ms: 10_000,
            unanswered_since_ms: None,
        };
        assert_eq!(send_bound(&p, 0, &RULES), Duration::from_millis(9_500));
        let far = Pending {
            expires_ms: 100_000,
            ..p
        };
        assert_eq!(send_bound(&far, 0, &RULES), RULES.copy_timeout);
        assert_eq!(send_bound(&p, 9_000, &RULES), Duration::from_millis(500));
        assert_eq!(send_bound(&p, 9_600, &RULES), Duration::ZERO);
    }

    #[test]
    fn a_lost_answer_is_sent_again_only_within_the_window() {
        let since = 1_000_000;
        let p = Pending {
            expires_ms: since + 3_600_000,
            unanswered_since_ms: Some(since),
        };
        // Due while the copy arrives (now + skew + copy timeout) before since + W.
        let last = since + 600_000 - 500 - 10_000 - 1;
        assert_eq!(step(&p, since + 1, &RULES), Step::Send);
        assert_eq!(step(&p, last, &RULES), Step::Send);
        assert_eq!(step(&p, last + 1, &RULES), Step::GiveUp);
        // A lost answer and then the expiry: it may have been delivered, so unknown,
        // never `expired`.
        let short = Pending {
            expires_ms: since + 5_000,
            ..p
        };
        assert_eq!(step(&short, since + 4_499, &RULES), Step::Send);
        assert_eq!(step(&short, since + 4_500, &RULES), Step::GiveUp);
    }
}
