//! One terminal's connection, kept up for as long as its shard is served here: the
//! state machine ([`LinkState`]) and the task that runs it.
//!
//! `Disconnected -> Dialing -> Connected`; a failed dial or hello goes to `Backoff`
//! (full-jitter delay), then `Disconnected` again; a connection that dies (keep-alive
//! timeout, GOAWAY, socket error) goes straight back to `Disconnected`, paced like any
//! dial. A new shard epoch is announced with a hello on the live connection. A `409`
//! stale-epoch answer is reported to the driver, which bumps or drops the shard; one
//! naming an epoch no store can hand out is not (only that terminal backs off).
//!
//! A link publishes its state together with the connection's request handle
//! ([`LinkStatus`]), which pushes use directly; pushes waiting for the link put its next
//! dial in the pacer's urgent lane ([`LinkShared`]). They do not cut a backoff short: an
//! offline terminal must not be redialed faster because someone keeps pushing to it.
//!
//! Not for: which terminals to run (the manager), pacing (`pacer`), or closing a whole
//! shard at once.

use std::pin::pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use tokio::sync::{mpsc, watch, Notify};
use tracing::{debug, warn};

use super::backoff::{Backoff, BackoffPolicy};
use super::dialer::Dialer;
use super::handover::{Gate, Opened};
use super::pacer::Pacer;
use super::session::{ConnEnd, RequestSender, Session};
use super::wire::DialError;
use crate::core::lease::{StaleEpoch, MAX_EPOCH};
use crate::core::{Epoch, ShardId};
use crate::metrics::Metrics;
use crate::store::directory::Terminal;

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
    pub(super) fn failed(&mut self, rng: &mut impl rand::Rng) -> Duration {
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

/// What a link publishes: its state and, while connected, the handle requests go on.
#[derive(Clone, Debug)]
pub(crate) struct LinkStatus {
    pub state: LinkState,
    /// Set only in `Connected`: the session whose hello was accepted for that epoch.
    pub sender: Option<RequestSender>,
}

impl LinkStatus {
    pub(super) fn new() -> Self {
        LinkStatus {
            state: LinkState::Disconnected,
            sender: None,
        }
    }
}

/// What pushes and the link task of one terminal share.
#[derive(Debug, Default)]
pub(crate) struct LinkShared {
    /// Pushes waiting for a session; while non-zero the next dial is urgent.
    waiting: AtomicUsize,
    /// Tells the link task that a push started waiting.
    wake: Notify,
    /// How far the first dial is, a [`FirstDial`] (readiness waits for `Done`; a push
    /// is relayed through the predecessor while `Gated`).
    first_dial: AtomicU8,
}

/// How far a link is with its first dial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum FirstDial {
    /// Due: no handover gate, or it opened (the predecessor closed its session, or the
    /// walk fell back).
    Due = 0,
    /// Shut at a handover gate: the shard's predecessor still has the session.
    Gated = 1,
    /// Finished, however it ended.
    Done = 2,
}

impl LinkShared {
    /// The shared state of a link whose first dial waits at a handover gate.
    pub(super) fn gated() -> Self {
        let shared = LinkShared::default();
        shared.set(FirstDial::Gated);
        shared
    }

    fn set(&self, step: FirstDial) {
        self.first_dial.store(step as u8, Ordering::Release);
    }

    fn first_dial(&self) -> FirstDial {
        match self.first_dial.load(Ordering::Acquire) {
            0 => FirstDial::Due,
            1 => FirstDial::Gated,
            _ => FirstDial::Done,
        }
    }

    /// Registers a waiting push unless `cap` pushes already wait; the guard unregisters.
    pub(crate) fn wait(self: &Arc<Self>, cap: usize) -> Option<WaitingPush> {
        let admitted = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            return None;
        }
        self.wake.notify_one();
        Some(WaitingPush(self.clone()))
    }

    pub(crate) fn dialed(&self) -> bool {
        self.first_dial() == FirstDial::Done
    }

    /// Whether the first dial still waits at its handover gate.
    pub(crate) fn at_gate(&self) -> bool {
        self.first_dial() == FirstDial::Gated
    }

    pub(super) fn urgent(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Resolves when a push starts waiting (check [`LinkShared::urgent`] after).
    pub(super) async fn woken(&self) {
        self.wake.notified().await
    }
}

/// A push waiting for a terminal's session; dropping it stops counting it.
#[derive(Debug)]
pub struct WaitingPush(Arc<LinkShared>);

impl Drop for WaitingPush {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What every link of a manager shares.
#[derive(Debug)]
pub(super) struct LinkContext {
    pub dialer: Dialer,
    pub pacer: Pacer,
    /// Paces hellos re-sent on live connections (a re-claim gives every session of a
    /// shard a new epoch at once).
    pub hellos: Pacer,
    pub backoff: BackoffPolicy,
    pub close_budget: Duration,
    pub stale: mpsc::UnboundedSender<StaleEpoch>,
    pub metrics: Arc<Metrics>,
}

/// The epoch a shard is served with, and what its links may do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mode {
    pub epoch: Epoch,
    pub delivery: Delivery,
}

/// Whether a shard's sessions carry pushes and its links dial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Served (or held through a cluster-wide store outage): deliver, and redial a
    /// terminal whose connection dropped.
    Delivering,
    /// Held without a standing verdict: keep the open sessions, dial nothing, until the
    /// shard delivers again or is stopped. A dial with a held epoch then could race the
    /// pod that takes the shard over.
    Holding,
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
    pub state: watch::Sender<LinkStatus>,
    pub shared: Arc<LinkShared>,
    /// Backoff jitter only, so a small fast generator (32 bytes) rather than `StdRng`
    /// (320): every held connection keeps one.
    pub rng: SmallRng,
    /// Shut until the shard's predecessor released the terminal (`handover`); `None`
    /// when there is none to ask, and after the first dial.
    pub gate: Option<Gate>,
    /// Dropped with the task: tells the manager the link (and its socket) is gone.
    pub _ended: tokio::sync::oneshot::Sender<()>,
}

impl LinkTask {
    pub(super) async fn run(mut self) {
        let mut link = Link::new(self.cx.backoff);
        loop {
            // Boxed: a dial's state (TLS and HTTP/2 handshakes, ~12 KB) exists only while
            // dialing. Inline, it would size this task's future, and so every held
            // connection, for the connection's whole life (14 KB inline, 1.8 KB boxed).
            let Some(mut session) = Box::pin(self.connect(&mut link)).await else {
                return;
            };
            let outcome = self.serve(&mut link, &mut session).await;
            let reason = match outcome {
                Served::Lost(_) => "lost",
                Served::HelloFailed(..) => "hello_failed",
                Served::Removed => "stopped",
            };
            self.cx
                .metrics
                .connections_closed
                .get_or_create(&[("reason", reason)])
                .inc();
            if !matches!(outcome, Served::Lost(_)) {
                // Take back the published request handle first: HTTP/2 sends GOAWAY and
                // closes only once every handle is gone, so a published one would hold
                // the connection open for the whole budget (and the shard's handover
                // with it).
                self.publish(&link, None);
                // Boxed, like the dial in this loop: once per session, not held always.
                Box::pin(session.close(self.cx.close_budget)).await;
            }
            match outcome {
                Served::Removed => return,
                Served::Lost(end) => {
                    debug!(
                        shard = self.shard, terminal = %self.terminal.id, ?end,
                        "terminal connection lost; redialing"
                    );
                    link.disconnected();
                    self.publish(&link, None);
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
            self.publish(link, None);
            // A planned move: the predecessor closes its session to the terminal first.
            let opened = match self.gate.take() {
                Some(gate) => tokio::select! {
                    opened = gate.wait(&self.shared) => Some(opened),
                    () = self.state.closed() => return None,
                },
                None => None,
            };
            if opened.is_some() {
                self.shared.set(FirstDial::Due);
            }
            let delivering = self.mode.wait_for(|m| m.delivery == Delivery::Delivering);
            tokio::select! {
                waited = delivering => waited.ok()?,
                () = self.state.closed() => return None,
            };
            let epoch = self.mode.borrow().epoch;
            let (cx, terminal, shared) = (&self.cx, &self.terminal, &self.shared);
            let admitted = async {
                let queued = std::time::Instant::now();
                let slot = admit(&cx.pacer, shared).await;
                cx.metrics.dial_wait.observe(queued.elapsed().as_secs_f64());
                slot
            };
            // Held for the whole dial: the slot bounds handshakes in flight.
            let _slot = tokio::select! {
                slot = admitted => slot,
                () = self.state.closed() => return None,
            };
            // Admitted: the walk window's slot is free for the next terminal.
            let released_at = match opened {
                Some(Opened::Released { asked, .. }) => Some(asked),
                Some(Opened::Fallback) | None => None,
            };
            drop(opened);
            let started = std::time::Instant::now();
            link.dialing();
            self.state.send_replace(LinkStatus {
                state: link.state(),
                sender: None,
            });
            // A stop mid-dial leaves no socket behind (see `Dialer::dial_unless`), so the
            // lease may be released as soon as this link task ends.
            let result = cx
                .dialer
                .dial_unless(terminal, epoch, self.state.closed())
                .await?;
            cx.metrics
                .dial_duration
                .observe(started.elapsed().as_secs_f64());
            let label = result.as_ref().map_or_else(DialError::label, |_| "ok");
            cx.metrics.dials.get_or_create(&[("result", label)]).inc();
            self.shared.set(FirstDial::Done);
            match result {
                Ok(session) => {
                    // Per terminal, so debug: a shard start connects thousands.
                    debug!(
                        shard = self.shard, terminal = %self.terminal.id, epoch,
                        failures = link.failures(), "terminal connected"
                    );
                    link.connected(epoch);
                    self.publish(link, Some(&session));
                    if let Some(asked) = released_at {
                        // From asking the predecessor to close, to our session: what
                        // the terminal spent without one, at most.
                        cx.metrics
                            .handover_dark
                            .observe(asked.elapsed().as_secs_f64());
                    }
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
                // After a re-claim every session of the pod needs a new hello at once;
                // sent all together they would starve everything else on the pod and
                // the terminals. Paced, with terminals that have a push waiting first.
                // Boxed (as the hello below): only after a new epoch, not held always.
                let _slot = tokio::select! {
                    slot = Box::pin(admit(&self.cx.hellos, &self.shared)) => slot,
                    () = self.state.closed() => return Served::Removed,
                };
                // The epoch may have moved on while we waited: say hello with the latest.
                let epoch = self.mode.borrow_and_update().epoch;
                let timeout = self.cx.dialer.handshake_timeout();
                // Boxed for the reason `run` boxes the dial: rare, so not held always.
                let hello = tokio::select! {
                    r = Box::pin(session.hello(epoch, timeout)) => r,
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
                self.publish(link, Some(&*session));
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
        self.publish(link, None);
        let (shard, t) = (self.shard, &self.terminal);
        let delay_ms = delay.as_millis() as u64;
        match e {
            // No store hands out an epoch above `MAX_EPOCH`, so this refusal proves no
            // newer owner, only a fence that no owner can pass until it is reset on the
            // terminal (`docs/pos-protocol.md` §3). Reported, it would stop the whole
            // shard, which is claimed again and stopped again by the next refusal: its
            // other terminals would lose their sessions over and over. Only this
            // terminal backs off.
            DialError::StaleEpoch {
                highest: Some(highest),
            } if *highest > MAX_EPOCH => {
                if link.failures() == 1 {
                    warn!(
                        shard, terminal = %t.id, epoch, highest, delay_ms,
                        "terminal's epoch fence is above any epoch posgate can hand out; \
                         it refuses every owner until it is reset on the terminal"
                    );
                }
            }
            DialError::StaleEpoch { highest } => {
                warn!(
                    shard, terminal = %t.id, epoch, highest = ?highest,
                    "terminal refused our epoch: a newer owner exists"
                );
                // The driver may be gone (pod shutting down); then nobody needs to know.
                let _ = self.cx.stale.send(StaleEpoch {
                    shard,
                    epoch,
                    highest: *highest,
                });
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

    /// Publishes the link's state; `session` only with a hello accepted on it.
    fn publish(&self, link: &Link, session: Option<&Session>) {
        let state = link.state();
        let sender = match state {
            LinkState::Connected { .. } => session.map(Session::sender),
            _ => None,
        };
        self.state.send_replace(LinkStatus { state, sender });
    }
}

/// Waits for a dial slot, moving to the urgent lane when a push starts waiting.
async fn admit(pacer: &Pacer, shared: &LinkShared) -> Option<super::pacer::DialSlot> {
    let mut urgent = shared.urgent();
    let mut slot = pin!(pacer.admit(urgent));
    loop {
        tokio::select! {
            granted = &mut slot => return granted,
            () = shared.wake.notified(), if !urgent => {
                if shared.urgent() {
                    urgent = true;
                    // Dropping the normal-lane future gives up that place.
                    slot.set(pacer.admit(true));
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
