//! Redial delays: exponential backoff with full jitter (AWS style): after the `n`-th
//! failure in a row, wait a uniformly random time in `[0, min(cap, base * 2^n)]`.
//!
//! Full jitter spreads the redials of thousands of terminals that failed together (a
//! network blip, a pod taking over a shard) instead of sending them back in waves. The
//! random source is passed in, so tests use a seeded RNG and get exact sequences.
//!
//! Not for: pacing dials pod-wide (that is the manager's rate limiter).

use std::time::Duration;

use rand::Rng;

/// Backoff settings (`--dial-backoff-base`, `--dial-backoff-cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// The ceiling after the first failure.
    pub base: Duration,
    /// The ceiling never grows beyond this.
    pub cap: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        }
    }
}

impl BackoffPolicy {
    /// The largest delay after `failures` failures in a row (0 = the first failure):
    /// `min(cap, base * 2^failures)`, saturating instead of overflowing.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// A delay drawn uniformly from `[0, ceiling(failures)]`.
    pub fn delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(failures);
        // Whole microseconds are fine-grained enough for redials and avoid float error.
        let max = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rng.random_range(0..=max))
    }
}

/// Failures in a row for one terminal, and the delay each one earns.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    failures: u32,
}

impl Backoff {
    pub fn new(policy: BackoffPolicy) -> Self {
        Backoff {
            policy,
            failures: 0,
        }
    }

    /// Records a failure and returns how long to wait before the next attempt.
    pub fn fail(&mut self, rng: &mut impl Rng) -> Duration {
        let delay = self.policy.delay(self.failures, rng);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// A success: the next failure starts from `base` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let p = BackoffPolicy::default();
        let ceilings: Vec<u64> = (0..9).map(|n| p.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        // Far beyond the shift width: saturates, no panic.
        assert_eq!(p.ceiling(40), 60 * S);
        assert_eq!(p.ceiling(u32::MAX), 60 * S);
        let custom = BackoffPolicy {
            base: Duration::from_millis(100),
            cap: S,
        };
        assert_eq!(custom.ceiling(3), Duration::from_millis(800));
        assert_eq!(custom.ceiling(4), S);
    }

    #[test]
    fn delays_stay_within_full_jitter_bounds_and_spread() {
        let p = BackoffPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        for failures in 0..12 {
            let ceiling = p.ceiling(failures);
            let delays: Vec<Duration> = (0..500).map(|_| p.delay(failures, &mut rng)).collect();
            assert!(delays.iter().all(|d| *d <= ceiling), "failures {failures}");
            // Full jitter: both halves of the range are used.
            assert!(
                delays.iter().any(|d| *d < ceiling / 4),
                "failures {failures}"
            );
            assert!(
                delays.iter().any(|d| *d > ceiling * 3 / 4),
                "failures {failures}"
            );
        }
    }

    #[test]
    fn seeded_sequence_is_reproducible_and_resets() {
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut b = Backoff::new(BackoffPolicy::default());
            (0..8).map(|_| b.fail(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));

        let mut rng = StdRng::seed_from_u64(1);
        let mut b = Backoff::new(BackoffPolicy::default());
        for _ in 0..10 {
            b.fail(&mut rng);
        }
        assert_eq!(b.failures(), 10);
        b.reset();
        assert_eq!(b.failures(), 0);
        assert!(b.fail(&mut rng) <= S);
    }
}
