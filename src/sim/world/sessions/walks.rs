//! The walk of a shard taken over, terminal by terminal: asking its last holder to
//! release a batch, the asks and answers on the way (passed on to a predecessor the
//! holder owed terminals to), and the fallbacks when an answer is lost or late.

use rand::Rng;

use super::super::{Ev, World};
use super::{Answer, Forward, Opened, SessionEv, RELEASE_TIMEOUT};
use crate::core::ShardId;
use crate::sim::checks::Violation;

impl World<'_> {
    /// Asks for the next batch of the walk of `shard` by `pod`, if none is out.
    pub(super) fn walk_next(&mut self, pod: usize, shard: ShardId) -> Result<(), Violation> {
        let batch = self.rng.random_range(1..=2);
        let Some(walk) = self.sessions.walks.get_mut(&(pod, shard)) else {
            return Ok(());
        };
        if walk.asked.is_some() {
            return Ok(());
        }
        let terms: Vec<usize> = (0..batch).filter_map(|_| walk.queue.pop_front()).collect();
        if terms.is_empty() {
            self.sessions.walks.remove(&(pod, shard));
            return Ok(());
        }
        self.sessions.next_id += 1;
        let id = self.sessions.next_id;
        walk.asked = Some((id, terms.clone()));
        let to = walk.from;
        self.send_session(SessionEv::Ask {
            to,
            asker: pod,
            shard,
            terms,
            id,
        });
        let at = self.now + RELEASE_TIMEOUT;
        self.schedule(at, Ev::Session(SessionEv::Timeout { pod, id }));
        Ok(())
    }

    /// At the previous owner: close the draining sessions asked for, pass releases of
    /// terminals it never reached on to its own predecessor, answer.
    pub(super) fn ask_arrives(
        &mut self,
        at: usize,
        asker: usize,
        shard: ShardId,
        terms: Vec<usize>,
        id: u64,
    ) -> Result<(), Violation> {
        let draining = (0..self.cfg.terminals_per_shard).any(|k| {
            self.sessions.open[&(shard, k)]
                .iter()
                .any(|s| s.pod == at && s.draining)
        }) || self.sessions.owed.contains_key(&(at, shard));
        if !draining {
            self.send_session(SessionEv::Answer {
                to: asker,
                id,
                answer: Answer::NotDraining,
            });
            return Ok(());
        }
        for &k in &terms {
            let open = self.sessions.open.entry((shard, k)).or_default();
            open.retain(|s| !(s.pod == at && s.draining));
        }
        let owed: Vec<usize> = match self.sessions.owed.get_mut(&(at, shard)) {
            Some(o) => {
                let passed: Vec<usize> = terms
                    .iter()
                    .copied()
                    .filter(|k| o.terms.contains(k))
                    .collect();
                o.terms.retain(|k| !passed.contains(k));
                passed
            }
            None => Vec::new(),
        };
        if owed.is_empty() {
            self.send_session(SessionEv::Answer {
                to: asker,
                id,
                answer: Answer::Released {
                    by: vec![at],
                    sure: true,
                },
            });
            return Ok(());
        }
        let from = self.sessions.owed[&(at, shard)].from;
        if self.sessions.owed[&(at, shard)].terms.is_empty() {
            self.sessions.owed.remove(&(at, shard));
        }
        self.sessions.next_id += 1;
        let passed = self.sessions.next_id;
        self.sessions
            .forwards
            .insert((at, passed), Forward { asker, id, shard });
        self.send_session(SessionEv::Ask {
            to: from,
            asker: at,
            shard,
            terms: owed,
            id: passed,
        });
        let when = self.now + RELEASE_TIMEOUT;
        self.schedule(
            when,
            Ev::Session(SessionEv::Timeout {
                pod: at,
                id: passed,
            }),
        );
        Ok(())
    }

    pub(super) fn answer_arrives(
        &mut self,
        at: usize,
        id: u64,
        answer: Answer,
    ) -> Result<(), Violation> {
        if let Some(fwd) = self.sessions.forwards.remove(&(at, id)) {
            // Passed on and answered (whatever it said, it holds nothing of them now):
            // answer the pod that asked us.
            let _ = fwd.shard;
            let (mut by, sure) = match answer {
                Answer::Released { by, sure } => (by, sure),
                Answer::NotDraining => (Vec::new(), true),
            };
            by.push(at);
            self.send_session(SessionEv::Answer {
                to: fwd.asker,
                id: fwd.id,
                answer: Answer::Released { by, sure },
            });
            return Ok(());
        }
        let Some((&(pod, shard), _)) = self
            .sessions
            .walks
            .iter()
            .find(|(&(p, _), w)| p == at && w.asked.as_ref().is_some_and(|(i, _)| *i == id))
        else {
            return Ok(()); // late: timed out already, or the walk ended
        };
        let walk = self.sessions.walks.get_mut(&(pod, shard)).expect("found");
        let (_, terms) = walk.asked.take().expect("asked");
        let epoch = walk.epoch;
        if let Answer::Released { by, sure } = answer {
            for k in terms {
                let how = Opened::Released {
                    by: by.clone(),
                    sure,
                };
                self.open_session(pod, (shard, k), epoch, how)?;
            }
            self.walk_next(pod, shard)
        } else {
            let walk = self.sessions.walks.remove(&(pod, shard)).expect("found");
            for k in terms.into_iter().chain(walk.queue) {
                self.open_session(pod, (shard, k), epoch, Opened::Unasked)?;
            }
            Ok(())
        }
    }

    pub(super) fn ask_timed_out(&mut self, at: usize, id: u64) -> Result<(), Violation> {
        if let Some(fwd) = self.sessions.forwards.remove(&(at, id)) {
            // The predecessor did not answer in time: answer anyway (the next owner's
            // newer epoch fences whatever it still has).
            self.send_session(SessionEv::Answer {
                to: fwd.asker,
                id: fwd.id,
                answer: Answer::Released {
                    by: vec![at],
                    sure: false,
                },
            });
            return Ok(());
        }
        let found = self.sessions.walks.iter().find_map(|(&(p, s), w)| {
            (p == at && w.asked.as_ref().is_some_and(|(i, _)| *i == id)).then_some(s)
        });
        let Some(shard) = found else {
            return Ok(());
        };
        let walk = self.sessions.walks.remove(&(at, shard)).expect("found");
        let (_, terms) = walk.asked.expect("asked");
        for k in terms.into_iter().chain(walk.queue) {
            self.open_session(at, (shard, k), walk.epoch, Opened::Unasked)?;
        }
        Ok(())
    }
}
