//! One terminal's connection, kept up for as long as its shard is served here: the
//! state machine ([`LinkState`]), the pod-wide dial pacing ([`Pacer`]) and the task
//! that runs them.
//!
//! `Disconnected -> Dialing -> Connected`; a failed dial or hello goes to `Backoff`
//! (full-jitter delay), then `Disconnected` again; a connection that dies (keep-alive
//! timeout, GOAWAY, socket error) goes straight back to `Disconnected`, paced like any
//! dial. A new shard epoch is announced with a hello on the live connection. A `409`
//! stale-epoch answer is reported to the driver, which drops the shard.
//!
//! Not for: which terminals to run (the manager), or closing a whole shard at once.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Jitter, Quota, RateLimiter};
use rand::rngs::StdRng;
use tokio::sync::{mpsc, watch, Semaphore, SemaphorePermit};
use tracing::{debug, warn};

use super::backoff::{Backoff, BackoffPolicy};
use super::dialer::{DialError, Dialer};
use super::directory::Terminal;
use super::session::{ConnEnd, Session};
use crate::core::{Epoch, ShardId};

/// Where one terminal's connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// No connection; a dial is due (waiting for the pacer).
    Disconnected,
    /// Connecting, handshaking or waiting for the hello answer.
    Dialing,
    /// Connected; the terminal accepted the hello for `epoch`.
    Connected { epoch: Epoch },
    /// The last attempt failed; redial after a delay.
    Backoff,
}

/// The transitions of [`LinkState`], kept apart from the I/O so they can be tested.
#[derive(Debug)]
pub(super) struct Link {
    state: LinkState,
    backoff: Backoff,
}

impl Link {
    pub(super) fn new(policy: BackoffPolicy) -> Self {
        Link {
            state: LinkState::Disconnected,
            backoff: Backoff::new(policy),
        }
    }

    pub(super) fn state(&self) -> LinkState {
        self.state
    }

    /// `Disconnected -> Dialing`.
    pub(super) fn dialing(&mut self) {
        debug_assert_eq!(self.state, LinkState::Disconnected);
        self.state = LinkState::Dialing;
    }

    /// A hello (on a new or a live connection) was accepted for `epoch`.
    pub(super) fn connected(&mut self, epoch: Epoch) {
        self.backoff.reset();
        self.state = LinkState::Connected { epoch };
    }

    /// A dial or hello failed: `-> Backoff`, returning how long to stay there.
    pub(super) fn failed(&mut self, rng: &mut StdRng) -> Duration {
        self.state = LinkState::Backoff;
        self.backoff.fail(rng)
    }

    /// `Backoff -> Disconnected` once the delay passed, or `Connected -> Disconnected`
    /// when the connection died.
    pub(super) fn disconnected(&mut self) {
        self.state = LinkState::Disconnected;
    }

    /// Failures in a row so far.
    pub(super) fn failures(&self) -> u32 {
        self.backoff.failures()
    }
}

/// Paces dials pod-wide: one token bucket (burst 1, so dials are spread evenly) and a
/// bound on handshakes in flight (slow terminals must not pile up sockets).
#[derive(Debug)]
pub(super) struct Pacer {
    limiter: DefaultDirectRateLimiter,
    jitter: Duration,
    handshakes: Semaphore,
}

/// `rate` dials per second, evenly spaced: no burst.
pub(super) fn dial_quota(rate: NonZeroU32) -> Quota {
    Quota::per_second(rate).allow_burst(NonZeroU32::MIN)
}

impl Pacer {
    pub(super) fn new(rate: NonZeroU32, jitter: Duration, max_handshakes: usize) -> Self {
        Pacer {
            limiter: RateLimiter::direct(dial_quota(rate)),
            jitter,
            handshakes: Semaphore::new(max_handshakes.max(1)),
        }
    }

    /// Waits for a handshake slot, then for the next dial token. Hold the permit until
    /// the dial is done.
    async fn admit(&self) -> Option<SemaphorePermit<'_>> {
        // The semaphore is never closed, so this is always `Some`.
        let permit = self.handshakes.acquire().await.ok();
        self.limiter
            .until_ready_with_jitter(Jitter::up_to(self.jitter))
            .await;
        permit
    }
}

/// What every link of a manager shares.
#[derive(Debug)]
pub(super) struct LinkContext {
    pub dialer: Dialer,
    pub pacer: Pacer,
    pub backoff: BackoffPolicy,
    pub close_budget: Duration,
    pub stale: mpsc::UnboundedSender<(ShardId, Epoch)>,
}

/// The epoch a shard is served with, and whether it may deliver (false while suspended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mode {
    pub epoch: Epoch,
    pub delivering: bool,
}

/// Why [`LinkTask::serve`] returned.
enum Served {
    Lost(ConnEnd),
    HelloFailed(DialError, Epoch),
    Removed,
}

/// One terminal's task. It ends when every receiver of `state` is dropped: that is how
/// the manager removes a terminal or stops its shard.
pub(super) struct LinkTask {
    pub cx: Arc<LinkContext>,
    pub shard: ShardId,
    pub terminal: Terminal,
    pub mode: watch::Receiver<Mode>,
    pub state: watch::Sender<LinkState>,
    pub rng: StdRng,
}

impl LinkTask {
    pub(super) async fn run(mut self) {
        let mut link = Link::new(self.cx.backoff);
        loop {
            let Some(mut session) = self.connect(&mut link).await else {
                return;
            };
            let outcome = self.serve(&mut link, &mut session).await;
            if !matches!(outcome, Served::Lost(_)) {
                session.close(self.cx.close_budget).await;
            }
            match outcome {
                Served::Removed => return,
                Served::Lost(end) => {
                    debug!(
                        shard = self.shard, terminal = %self.terminal.id, ?end,
                        "terminal connection lost; redialing"
                    );
                    link.disconnected();
                    self.publish(&link);
                }
                Served::HelloFailed(e, epoch) => {
                    if self.back_off(&mut link, &e, epoch).await.is_none() {
                        return;
                    }
                }
            }
        }
    }

    /// Dials (paced, with backoff) until a session is up; `None` if removed meanwhile.
    async fn connect(&mut self, link: &mut Link) -> Option<Session> {
        loop {
            self.publish(link);
            let epoch = self.mode.borrow().epoch;
            let (cx, terminal, state) = (&self.cx, &self.terminal, &self.state);
            let dial = async {
                let _permit = cx.pacer.admit().await;
                link.dialing();
                state.send_replace(link.state());
                cx.dialer.dial(terminal, epoch).await
            };
            let result = tokio::select! {
                result = dial => result,
                () = self.state.closed() => return None,
            };
            match result {
                Ok(session) => {
                    // Per terminal, so debug: a shard start connects thousands.
                    debug!(
                        shard = self.shard, terminal = %self.terminal.id, epoch,
                        failures = link.failures(), "terminal connected"
                    );
                    link.connected(epoch);
                    self.publish(link);
                    return Some(session);
                }
                Err(e) => self.back_off(link, &e, epoch).await?,
            }
        }
    }

    /// Keeps a connected session until it dies or the terminal is removed, re-sending
    /// the hello whenever the shard's epoch changes.
    async fn serve(&mut self, link: &mut Link, session: &mut Session) -> Served {
        loop {
            let epoch = self.mode.borrow_and_update().epoch;
            if session.epoch() != Some(epoch) {
                let timeout = self.cx.dialer.handshake_timeout();
                let hello = tokio::select! {
                    r = session.hello(epoch, timeout) => r,
                    () = self.state.closed() => return Served::Removed,
                };
                if let Err(e) = hello {
                    return Served::HelloFailed(e, epoch);
                }
                debug!(
                    shard = self.shard, terminal = %self.terminal.id, epoch,
                    "hello re-sent for new epoch"
                );
                link.connected(epoch);
                self.publish(link);
            }
            tokio::select! {
                end = session.ended() => return Served::Lost(end),
                changed = self.mode.changed() => {
                    // The manager dropped the mode sender: the shard is going away.
                    if changed.is_err() {
                        return Served::Removed;
                    }
                }
                () = self.state.closed() => return Served::Removed,
            }
        }
    }

    /// Logs and counts a failure, reports a stale epoch, and waits out the backoff;
    /// `None` if the terminal was removed meanwhile.
    async fn back_off(&mut self, link: &mut Link, e: &DialError, epoch: Epoch) -> Option<()> {
        let delay = link.failed(&mut self.rng);
        self.publish(link);
        let (shard, t) = (self.shard, &self.terminal);
        let delay_ms = delay.as_millis() as u64;
        match e {
            DialError::StaleEpoch { highest } => {
                warn!(
                    shard, terminal = %t.id, epoch, highest = ?highest,
                    "terminal refused our epoch: a newer owner exists"
                );
                // The driver may be gone (pod shutting down); then nobody needs to know.
                let _ = self.cx.stale.send((shard, epoch));
            }
            DialError::WrongName { .. } if link.failures() == 1 => warn!(
                shard, terminal = %t.id, addr = %t.addr, server_name = %t.server_name,
                error = %e, delay_ms,
                "terminal presented a certificate for another name; check its directory entry"
            ),
            // Only the first failure of a streak is a warning: thousands of terminals
            // failing together must not flood the log.
            _ if link.failures() == 1 => warn!(
                shard, terminal = %t.id, addr = %t.addr, result = e.label(), error = %e,
                delay_ms, "terminal dial failed; backing off"
            ),
            _ => debug!(
                shard, terminal = %t.id, addr = %t.addr, result = e.label(), error = %e,
                failures = link.failures(), delay_ms, "terminal dial failed again"
            ),
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = self.state.closed() => return None,
        }
        link.disconnected();
        Some(())
    }

    fn publish(&self, link: &Link) {
        self.state.send_replace(link.state());
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn link_transitions() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut link = Link::new(BackoffPolicy::default());
        assert_eq!(link.state(), LinkState::Disconnected);
        link.dialing();
        assert_eq!(link.state(), LinkState::Dialing);
        // Failures back off with growing ceilings.
        let first = link.failed(&mut rng);
        assert_eq!(link.state(), LinkState::Backoff);
        assert!(first <= Duration::from_secs(1));
        link.disconnected();
        link.dialing();
        assert!(link.failed(&mut rng) <= Duration::from_secs(2));
        assert_eq!(link.failures(), 2);
        link.disconnected();
        link.dialing();
        link.connected(7);
        assert_eq!(link.state(), LinkState::Connected { epoch: 7 });
        // Success resets the streak; a new epoch's hello keeps the link connected.
        assert_eq!(link.failures(), 0);
        link.connected(9);
        assert_eq!(link.state(), LinkState::Connected { epoch: 9 });
        // A dead connection redials without backoff.
        link.disconnected();
        assert_eq!(link.state(), LinkState::Disconnected);
        assert_eq!(link.failures(), 0);
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
}
