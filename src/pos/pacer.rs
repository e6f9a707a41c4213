//! Pod-wide dial pacing: one token bucket (`--dial-rate`, burst 1, jittered), a bound on
//! handshakes in flight, and two lanes so terminals with a push waiting are dialed first.
//!
//! A single dispatcher task hands out dial slots: it takes a handshake permit, waits for
//! the next token, then gives both to the oldest urgent waiter, or else the oldest normal
//! one. Having one waiter on the limiter (instead of thousands racing for each token)
//! is what makes the order, and so the priority, well defined. A waiter that gives up
//! (its link was removed, or it re-queued as urgent) is skipped. The jitter is waited
//! by each granted dial on its own, after the grant: waited inside the dispatcher it
//! would be paid once per dial in series and cap the rate far below `--dial-rate`.
//! The jitter comes from a seedable RNG, and the tokens from a [`Tokens`] source (the
//! governor limiter on its own clock), so the tests can run the whole pacer on tokio's
//! paused clock and check the exact dial start times.
//!
//! Not for: backoff (each link has its own) or deciding which terminals to dial.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use rand::rngs::StdRng;
use rand::Rng;
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

/// A granted dial: hold it until the dial (through the hello) is done.
pub(super) type DialSlot = OwnedSemaphorePermit;

/// `rate` dials per second, evenly spaced: no burst.
pub(super) fn dial_quota(rate: NonZeroU32) -> Quota {
    Quota::per_second(rate).allow_burst(NonZeroU32::MIN)
}

/// Where the dispatcher's tokens come from. In the pod: governor's limiter, whose
/// `until_ready` sleeps on the real clock with sub-millisecond precision (tokio's timers
/// tick in whole milliseconds, which would lose pace at 200-1,000 dials/s). The tests
/// substitute the same quota on tokio's clock, which they can pause.
trait Tokens: Send + Sync + 'static {
    /// Returns once the next token is taken.
    fn next(&self) -> impl std::future::Future<Output = ()> + Send;
}

impl Tokens for DefaultDirectRateLimiter {
    async fn next(&self) {
        self.until_ready().await;
    }
}

/// The random wait of each granted dial before it starts.
pub(super) enum Jitter {
    None,
    /// Up to `max` (whole milliseconds), drawn from `rng` (boxed: it is 300+ bytes).
    UpTo {
        max: Duration,
        rng: Box<StdRng>,
    },
}

impl Jitter {
    fn draw(&mut self) -> Duration {
        match self {
            Jitter::None => Duration::ZERO,
            Jitter::UpTo { max, rng } => {
                Duration::from_millis(rng.random_range(0..=max.as_millis() as u64))
            }
        }
    }
}

#[derive(Default)]
struct Lanes {
    urgent: VecDeque<oneshot::Sender<DialSlot>>,
    normal: VecDeque<oneshot::Sender<DialSlot>>,
}

impl Lanes {
    /// The next waiter still waiting, urgent first.
    fn pop(&mut self) -> Option<oneshot::Sender<DialSlot>> {
        for lane in [&mut self.urgent, &mut self.normal] {
            while let Some(waiter) = lane.pop_front() {
                if !waiter.is_closed() {
                    return Some(waiter);
                }
            }
        }
        None
    }
}

struct Shared {
    lanes: Mutex<Lanes>,
    jitter: Mutex<Jitter>,
    /// Wakes the dispatcher when a waiter arrives.
    arrived: Notify,
}

/// See the module docs. Dropping it stops the dispatcher; waiters then get `None`.
pub(super) struct Pacer {
    shared: Arc<Shared>,
    dispatcher: AbortHandle,
}

impl std::fmt::Debug for Pacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacer").finish_non_exhaustive()
    }
}

impl Pacer {
    /// Spawns the dispatcher: call within a tokio runtime.
    pub(super) fn new(rate: NonZeroU32, jitter: Jitter, max_handshakes: usize) -> Self {
        let tokens = RateLimiter::direct(dial_quota(rate));
        Pacer::with_tokens(tokens, jitter, max_handshakes)
    }

    fn with_tokens(tokens: impl Tokens, jitter: Jitter, max_handshakes: usize) -> Self {
        let shared = Arc::new(Shared {
            lanes: Mutex::new(Lanes::default()),
            jitter: Mutex::new(jitter),
            arrived: Notify::new(),
        });
        let handshakes = Arc::new(Semaphore::new(max_handshakes.max(1)));
        let dispatcher = tokio::spawn(dispatch(shared.clone(), tokens, handshakes));
        Pacer {
            shared,
            dispatcher: dispatcher.abort_handle(),
        }
    }

    /// Waits for a dial slot; `urgent` waiters (a push is waiting for this terminal)
    /// go before all others. Cancel-safe: dropping the future gives up the place.
    pub(super) async fn admit(&self, urgent: bool) -> Option<DialSlot> {
        let (tx, rx) = oneshot::channel();
        {
            let mut lanes = self
                .shared
                .lanes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let lane = if urgent {
                &mut lanes.urgent
            } else {
                &mut lanes.normal
            };
            lane.push_back(tx);
        }
        self.shared.arrived.notify_one();
        let slot = rx.await.ok()?;
        let wait = self
            .shared
            .jitter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .draw();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Some(slot)
    }
}

impl Pacer {
    /// Dials waiting for a slot now (may include a few that just gave up).
    pub(super) fn queue_depth(&self) -> usize {
        let lanes = self
            .shared
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        lanes.urgent.len() + lanes.normal.len()
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        self.dispatcher.abort();
    }
}

async fn dispatch(shared: Arc<Shared>, tokens: impl Tokens, handshakes: Arc<Semaphore>) {
    // The semaphore is never closed.
    while let Ok(mut slot) = handshakes.clone().acquire_owned().await {
        loop {
            wait_for_waiter(&shared).await;
            tokens.next().await;
            let waiter = shared
                .lanes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            // When every waiter gave up meanwhile the token is spent anyway: that only
            // makes the pace slower, never faster.
            let Some(waiter) = waiter else {
                continue;
            };
            match waiter.send(slot) {
                Ok(()) => break,
                // It gave up between `pop` and `send`; offer the slot to the next one.
                Err(back) => slot = back,
            }
        }
    }
}

/// Returns once a waiter is in line.
async fn wait_for_waiter(shared: &Shared) {
    loop {
        // Registered before checking, so an arrival between the check and the await
        // is not missed.
        let arrived = shared.arrived.notified();
        {
            let lanes = shared.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            if !lanes.urgent.is_empty() || !lanes.normal.is_empty() {
                return;
            }
        }
        arrived.await;
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::{Clock, FakeRelativeClock};
    use governor::middleware::NoOpMiddleware;
    use governor::state::{InMemoryState, NotKeyed};
    use rand::SeedableRng;
    use tokio::time::Instant;

    use super::*;

    /// governor's clock read from tokio's, so a paused runtime drives the pace.
    #[derive(Clone, Copy)]
    struct TokioClock;

    impl Clock for TokioClock {
        type Instant = std::time::Instant;
        fn now(&self) -> std::time::Instant {
            Instant::now().into_std()
        }
    }

    /// The pod's quota on tokio's clock.
    struct VirtualTokens(
        RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<std::time::Instant>>,
    );

    impl Tokens for VirtualTokens {
        async fn next(&self) {
            while let Err(not_until) = self.0.check() {
                tokio::time::sleep(not_until.wait_time_from(TokioClock.now())).await;
            }
        }
    }

    /// Most of `starts` (sorted) within any `window`.
    fn most_in_window(starts: &[Duration], window: Duration) -> usize {
        (0..starts.len())
            .map(|i| starts[i..].partition_point(|&t| t < starts[i] + window))
            .max()
            .unwrap_or(0)
    }

    /// On virtual time with a seeded jitter, so every start time is exact and the same in
    /// every run: the limiter grants on the grid `k / rate`, and the jitter moves each
    /// dial's start off it by up to `jitter`, while the pace stays within
    /// `rate x (window + jitter) + burst` dials in any window.
    #[tokio::test(start_paused = true)]
    async fn dials_start_jittered_off_the_rate_grid_at_the_pace() {
        const N: usize = 60;
        const RATE: u32 = 100;
        let period = Duration::from_secs(1) / RATE;
        let jitter = Duration::from_millis(20);
        let quota = dial_quota(NonZeroU32::new(RATE).unwrap());
        let tokens = VirtualTokens(RateLimiter::direct_with_clock(quota, TokioClock));
        let rng = Box::new(StdRng::seed_from_u64(7));
        let pacer = Arc::new(Pacer::with_tokens(
            tokens,
            Jitter::UpTo { max: jitter, rng },
            N,
        ));
        let t0 = Instant::now();
        let dials: Vec<_> = (0..N)
            .map(|_| {
                let pacer = pacer.clone();
                tokio::spawn(async move {
                    let _slot = pacer.admit(false).await.unwrap();
                    t0.elapsed()
                })
            })
            .collect();
        let mut starts = Vec::new();
        for dial in dials {
            starts.push(dial.await.unwrap());
        }
        starts.sort();
        let on_grid = starts
            .iter()
            .filter(|t| t.as_nanos() % period.as_nanos() == 0)
            .count();
        // A draw of 0, 10 or 20 ms lands on the grid: 3 in 21, about 9 of 60.
        assert!(
            on_grid <= N / 2,
            "{on_grid} of {N} dials start on the {period:?} grid: {starts:?}"
        );
        let last_slot = period * (N as u32 - 1);
        assert!(*starts.last().unwrap() <= last_slot + jitter, "{starts:?}");
        let window = Duration::from_millis(100);
        let bound = (RATE as f64 * (window + jitter).as_secs_f64()) as usize + 1;
        let most = most_in_window(&starts, window);
        assert!(
            most <= bound,
            "{most} dials started within {window:?} (at most {bound} at {RATE}/s): {starts:?}"
        );
    }

    #[test]
    fn dial_quota_paces_evenly_without_burst() {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(
            dial_quota(NonZeroU32::new(200).unwrap()),
            clock.clone(),
        );
        // Burst 1: only one dial at once, the next one 5 ms later.
        assert!(limiter.check().is_ok());
        assert!(limiter.check().is_err());
        clock.advance(Duration::from_millis(4));
        assert!(limiter.check().is_err());
        clock.advance(Duration::from_millis(1));
        assert!(limiter.check().is_ok());
        // Over one (fake) second of eager callers, exactly the rate passes.
        let mut passed = 0;
        for _ in 0..1000 {
            clock.advance(Duration::from_millis(1));
            while limiter.check().is_ok() {
                passed += 1;
            }
        }
        assert_eq!(passed, 200);
    }

    /// Urgent waiters overtake normal ones already in line; a waiter that gave up is
    /// skipped; the handshake bound holds.
    #[tokio::test]
    async fn urgent_dials_go_first_and_handshakes_are_bounded() {
        // 50/s on the pod's limiter, which waits on the real clock: keep the test short.
        let pacer = Arc::new(Pacer::new(NonZeroU32::new(50).unwrap(), Jitter::None, 1));
        let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        // The first normal waiter takes the only handshake slot and holds it until told.
        let (release, released) = oneshot::channel::<()>();
        let first = pacer.clone();
        let first_tx = order_tx.clone();
        tasks.push(tokio::spawn(async move {
            let slot = first.admit(false).await.unwrap();
            first_tx.send("normal-0").unwrap();
            let _ = released.await;
            drop(slot);
        }));
        tokio::task::yield_now().await;
        while order.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for name in ["normal-1", "normal-2", "normal-3"] {
            let (p, tx) = (pacer.clone(), order_tx.clone());
            tasks.push(tokio::spawn(async move {
                let _slot = p.admit(false).await.unwrap();
                tx.send(name).unwrap();
            }));
        }
        // One that gives up before its turn.
        let gives_up = {
            let p = pacer.clone();
            tokio::spawn(async move { p.admit(false).await.map(drop) })
        };
        let (p, tx) = (pacer.clone(), order_tx.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = p.admit(true).await.unwrap();
            tx.send("urgent").unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Nobody else got a slot while the first holds the only one.
        assert_eq!(order.len(), 1, "the handshake bound was exceeded");
        gives_up.abort();
        release.send(()).unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        drop(order_tx);
        let mut seen = Vec::new();
        while let Some(name) = order.recv().await {
            seen.push(name);
        }
        assert_eq!(
            seen,
            ["normal-0", "urgent", "normal-1", "normal-2", "normal-3"]
        );
    }
}
