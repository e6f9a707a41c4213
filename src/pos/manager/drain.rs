//! A shard handed over, at the pod that gives it up: its sessions stay open as
//! *draining* (nothing is dialed, and only what the new owner relays is delivered on
//! them, [`ConnectionManager::draining_session`]) until the new owner asks for
//! each terminal (`release`), right before it dials it; the drain budget closes what is
//! left. The stop that begins a drain is acknowledged once no push is being sent on the
//! shard ([`Sending`]), so the lease is released with every answer final: the kept
//! answers the new owner takes over (`push::handover`) are complete.
//!
//! What a terminal sees when two pods disagree: this pod delivers nothing of its own on a
//! draining session, only pushes the new owner relays to it before asking for the
//! terminal ([`ConnectionManager::draining_session`]; the new owner holds the key's
//! reservation, the terminal dedupes by key), and the new owner dials a terminal only
//! after this pod closed it (or, if asking failed, with a newer epoch, which the
//! terminal's fence prefers, refusing a relayed push on the older session). A pod that
//! takes a shard back while it drains resumes it with its new epoch.
//!
//! Not for: the new owner's side (`pos::handover`), or deciding to drain (the
//! reconciler's `Close::Drain`).

use std::time::Instant;

use super::*;
use crate::pos::handover::Chain;

/// After closing released sessions, how long before answering: the terminal handles a
/// closed connection asynchronously (like `HANDOVER_SETTLE`, for a handful of sockets
/// rather than a shard, so far shorter), and the new owner dials once answered.
const RELEASE_SETTLE: Duration = Duration::from_millis(30);

/// A shard draining here.
pub(super) struct Drained {
    /// Tells this drain from a later one of the same shard (its budget timer).
    id: u64,
    entry: ShardEntry,
    since: Instant,
    /// The shard was handed on before its own walk finished: whom that walk asked.
    chain: Option<Chain>,
}

/// A terminal's session in a shard draining here, for a push the new owner relays
/// through this pod before it asked for the terminal.
#[derive(Debug)]
pub struct DrainingSession {
    pub terminal: Arc<Terminal>,
    pub sender: RequestSender,
    /// The epoch the session's hello was accepted with: this pod's, older than the
    /// new owner's.
    pub epoch: Epoch,
}

/// A push being sent on a shard's sessions; see [`super::TerminalLink::sending`].
#[derive(Debug)]
pub struct Sending(Arc<watch::Sender<usize>>);

impl Sending {
    pub(super) fn new(sends: Arc<watch::Sender<usize>>) -> Self {
        sends.send_modify(|n| *n += 1);
        Sending(sends)
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl<D: Directory> Inner<D> {
    /// Begins draining `shard` (served with `epoch`): announces it to the members
    /// (closing the shard whole if one cannot be told) and resolves once no push is
    /// being sent on it, at most the close budget. A push checks that the shard is
    /// served after taking its `Sending` guard, so none starts sending once this began.
    pub(super) fn drain(
        self: Arc<Self>,
        shard: ShardId,
        epoch: Epoch,
    ) -> impl Future<Output = ()> + Send + 'static {
        let entry = lock(&self.shards).remove(&shard);
        let budget = self.close_budget;
        // No terminal to hand over (or nothing served): nobody will ask, nothing drains.
        let drain = entry
            .filter(|e| !e.links.is_empty())
            .map(|entry| self.begin_drain(shard, epoch, entry));
        async move {
            // Before the lease is released, every member learns that we drain: the one
            // that acquires next asks us, however stale its own view of the holder.
            let Some((id, mut sends)) = drain else {
                return;
            };
            if let Some(walk) = self.walk.clone() {
                if !walk.announce(shard).await {
                    self.close_drained(shard, id).await;
                }
            }
            let idle = tokio::time::timeout(budget, sends.wait_for(|n| *n == 0)).await;
            if idle.is_err() {
                warn!(
                    shard,
                    "pushes still being sent after the close budget; handing over anyway"
                );
            }
        }
    }

    /// Moves `entry` into the drain (sessions kept, nothing dialed or delivered) and
    /// starts its budget timer: the drain's id, and the count of pushes being sent.
    fn begin_drain(
        self: &Arc<Self>,
        shard: ShardId,
        epoch: Epoch,
        mut entry: ShardEntry,
    ) -> (u64, watch::Receiver<usize>) {
        // A walk of our own still under way asks our predecessor for nothing more by
        // itself; releases of terminals it had not reached are passed on.
        let chain = entry.walk.take().map(Walk::stop);
        entry.mode.send_replace(Mode {
            epoch,
            delivery: Delivery::Holding,
        });
        let sends = entry.sends.subscribe();
        let terminals = entry.links.len();
        self.metrics.draining_sessions.inc_by(terminals as i64);
        let id = self.next_incarnation.fetch_add(1, Ordering::Relaxed);
        let drained = Drained {
            id,
            entry,
            since: Instant::now(),
            chain,
        };
        lock(&self.draining).insert(shard, drained);
        self.count_draining();
        info!(
            shard,
            epoch,
            terminals,
            "shard handed over; its sessions drain until the new owner asks for them"
        );
        // Weak: a pod stopped or aborted meanwhile takes its links with it.
        tokio::spawn(drain_budget(
            Arc::downgrade(self),
            self.drain_budget,
            shard,
            id,
        ));
        (id, sends)
    }

    /// Closes drain `id` of `shard` whole, before the lease is released: it could not be
    /// announced. Like a stop with `Close::Now`, including the settle.
    async fn close_drained(&self, shard: ShardId, id: u64) {
        if let Some(left) = self.end_drain(shard, id, "unannounced").await {
            if left > 0 {
                tokio::time::sleep(HANDOVER_SETTLE).await;
            }
        }
    }

    /// Closes what is left of drain `id` of `shard`: the drain budget ran out.
    async fn budget_ran_out(&self, shard: ShardId, id: u64) {
        if let Some(left) = self.end_drain(shard, id, "budget").await {
            if left > 0 {
                warn!(
                    shard,
                    terminals = left,
                    "drain budget ran out before the new owner asked for every terminal; closed the rest"
                );
            }
        }
    }

    /// Ends drain `id` of `shard` if it is still the one draining, closing what is
    /// left and counting it as ended `how`; the number of terminals it still had.
    async fn end_drain(&self, shard: ShardId, id: u64, how: &'static str) -> Option<usize> {
        let drained = {
            let mut draining = lock(&self.draining);
            match draining.get(&shard) {
                Some(d) if d.id == id => draining.remove(&shard),
                _ => None,
            }
        }?;
        self.count_draining();
        let left = drained.entry.links.len();
        self.metrics.draining_sessions.dec_by(left as i64);
        self.metrics
            .drains_ended
            .get_or_create(&[("how", how)])
            .inc();
        let handles: Vec<LinkHandle> = drained.entry.links.into_values().collect();
        self.closed(handles).await;
        Some(left)
    }

    /// The new owner asks for `terminals` of `shard`: closes their sessions and says
    /// how many had one, or that the shard does not drain here.
    pub(super) async fn release(&self, shard: ShardId, terminals: &[String]) -> Released {
        let (handles, chain) = {
            let mut draining = lock(&self.draining);
            let Some(drained) = draining.get_mut(&shard) else {
                return Released::NotDraining;
            };
            let links = &mut drained.entry.links;
            let handles: Vec<LinkHandle> =
                terminals.iter().filter_map(|id| links.remove(id)).collect();
            (handles, drained.chain.clone())
        };
        self.metrics.draining_sessions.dec_by(handles.len() as i64);
        let closed = handles
            .iter()
            .filter(|h| matches!(h.state.borrow().state, LinkState::Connected { .. }))
            .count();
        // Never dialed here: our own walk had not reached them, so their session may
        // still be open at our predecessor.
        let undialed: Vec<String> = handles
            .iter()
            .filter(|h| !h.shared.dialed())
            .map(|h| h.terminal.id.clone())
            .collect();
        self.closed(handles).await;
        if let Some(chain) = chain.filter(|_| !undialed.is_empty()) {
            chain.release(shard, undialed).await;
        }
        if closed > 0 {
            tokio::time::sleep(RELEASE_SETTLE).await;
        }
        let done = {
            let mut draining = lock(&self.draining);
            match draining.get(&shard) {
                Some(d) if d.entry.links.is_empty() => draining.remove(&shard),
                _ => None,
            }
        };
        if let Some(done) = done {
            self.count_draining();
            self.metrics
                .drains_ended
                .get_or_create(&[("how", "released")])
                .inc();
            info!(
                shard,
                secs = done.since.elapsed().as_secs_f64(),
                "every terminal of the shard handed over was released to the new owner"
            );
        }
        Released::Closed { closed }
    }

    /// Takes `shard` back out of the drain, if it drains here.
    pub(super) fn resume_drained(&self, shard: ShardId) -> Option<ShardEntry> {
        let drained = lock(&self.draining).remove(&shard)?;
        self.count_draining();
        let left = drained.entry.links.len();
        self.metrics.draining_sessions.dec_by(left as i64);
        self.metrics
            .drains_ended
            .get_or_create(&[("how", "resumed")])
            .inc();
        info!(shard, terminals = left, "shard taken back while it drained");
        Some(drained.entry)
    }

    /// Drops `handles` (each link closes its session) and waits until their tasks
    /// ended, sockets included; a link stuck past the close budget is left to its task,
    /// which drops the socket when it ends.
    async fn closed(&self, handles: Vec<LinkHandle>) {
        let ended: Vec<_> = handles.into_iter().map(|h| h.ended).collect();
        let all = futures::future::join_all(ended);
        let _ = tokio::time::timeout(self.close_budget + CLOSE_SLACK, all).await;
    }

    fn count_draining(&self) {
        let n = lock(&self.draining).len();
        self.draining_count.send_replace(n);
    }
}

/// Waits out the drain budget of drain `id` of `shard`, unless the manager is gone.
async fn drain_budget<D: Directory>(
    inner: Weak<Inner<D>>,
    budget: Duration,
    shard: ShardId,
    id: u64,
) {
    tokio::time::sleep(budget).await;
    if let Some(inner) = inner.upgrade() {
        inner.budget_ran_out(shard, id).await;
    }
}

impl<D: Directory> ConnectionManager<D> {
    /// `terminal`'s session, if `shard` drains here and the new owner has not asked for
    /// the terminal yet. A release that asks for it meanwhile closes the session only
    /// once the push sent on it is done: HTTP/2 closes a connection when its last
    /// request handle is gone, and the one returned here is such a handle.
    pub fn draining_session(&self, shard: ShardId, terminal: &str) -> Option<DrainingSession> {
        let draining = lock(&self.inner.draining);
        let link = draining.get(&shard)?.entry.links.get(terminal)?;
        let status = link.state.borrow();
        match (status.state, &status.sender) {
            (LinkState::Connected { epoch }, Some(sender)) => Some(DrainingSession {
                terminal: link.terminal.clone(),
                sender: sender.clone(),
                epoch,
            }),
            _ => None,
        }
    }

    /// A peer that took `shard` over asks for `terminals` (see the module docs).
    pub fn release_terminals(
        &self,
        shard: ShardId,
        terminals: Vec<String>,
    ) -> impl Future<Output = Released> + Send + 'static {
        let inner = self.inner.clone();
        async move { inner.release(shard, &terminals).await }
    }

    /// Resolves once no shard drains here (the pod's shutdown waits for it, bounded).
    pub fn drained(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut count = self.inner.draining_count.subscribe();
        async move {
            let _ = count.wait_for(|n| *n == 0).await;
        }
    }
}
