//! The invariant of the per-terminal handover model (`sessions`), checked at every
//! session that opens, and its end-of-run check.

use super::sessions::{Opened, Session, Term, TERMINALS_PER_SHARD};
use super::World;
use crate::core::{Epoch, ShardId};
use crate::sim::checks::Violation;

impl World<'_> {
    /// `pod` dials `term` with `epoch`: the invariant.
    pub(super) fn open_session(
        &mut self,
        pod: usize,
        term: Term,
        epoch: Epoch,
        how: Opened,
    ) -> Result<(), Violation> {
        let open = self.sessions.open.entry(term).or_default();
        let others: Vec<Session> = open.iter().copied().filter(|s| s.pod != pod).collect();
        // Draining sessions are the planned path's: whoever released the terminal has
        // none left. One of a pod the new owner did not know of (its view of the last
        // holder was stale) or that did not answer a release passed on is fenced by
        // the terminal, counted apart. A session another pod still serves on (a stale
        // belief, a hold through an outage) is not ours to release: fenced too.
        if let Opened::Released { by, sure } = &how {
            // The releasing pods, and (when every release passed on was answered) the
            // predecessors they owed terminals to: none of them may drain it still.
            let mut by = by.clone();
            if *sure {
                let owed_to = &self.sessions.owed_to;
                let more: Vec<usize> = by
                    .iter()
                    .filter_map(|&p| owed_to.get(&(p, term.0)).copied())
                    .collect();
                by.extend(more);
            }
            let by = &by;
            if let Some(s) = others.iter().find(|s| s.draining && by.contains(&s.pod)) {
                let what = format!(
                    "pod-{pod} dialed terminal {term:?} (epoch {epoch}) released by {by:?} \
                     while {s:?} was open"
                );
                return Err(self.check.violation(self.now, what));
            }
            if others.iter().any(|s| s.draining) {
                self.sessions.unknown_predecessor += 1;
            }
        }
        if others.iter().any(|s| s.epoch >= epoch) {
            // The terminal refuses the older epoch: our hello is the stale one (the
            // shard-level model already tells the pod).
            return Ok(());
        }
        self.sessions.fenced += others.len() as u64;
        open.retain(|s| s.pod == pod);
        match open.first_mut() {
            Some(s) => {
                s.epoch = epoch;
                s.draining = false;
            }
            None => open.push(Session {
                pod,
                epoch,
                draining: false,
            }),
        }
        match how {
            Opened::Released { .. } => self.sessions.released += 1,
            Opened::Unasked => self.sessions.unasked += 1,
        }
        self.check.log(
            self.now,
            format_args!("pod-{pod} session to {term:?} epoch {epoch} ({how:?})"),
        );
        Ok(())
    }

    /// At the end: every terminal has one session, with its shard's serving owner and
    /// that owner's epoch.
    pub(super) fn sessions_converged(
        &mut self,
        shard: ShardId,
        owner: usize,
        epoch: Epoch,
    ) -> Result<(), Violation> {
        for k in 0..TERMINALS_PER_SHARD {
            let open = self
                .sessions
                .open
                .get(&(shard, k))
                .cloned()
                .unwrap_or_default();
            let want = [Session {
                pod: owner,
                epoch,
                draining: false,
            }];
            if open != want {
                let what = format!(
                    "not converged: terminal {:?} has sessions {open:?}, not pod-{owner}'s with epoch {epoch}",
                    (shard, k)
                );
                return Err(self.check.violation(self.now, what));
            }
        }
        Ok(())
    }
}
