//! Following and changing the stored placement (rule 4 of the reconciler).
//!
//! Every pod follows the placement in the store. When the live member set differs from
//! the placement's for one debounce period, a pod writes the next placement
//! ([`Placement::next`]) with a version compare-and-set; all pods compute the same table
//! from the same inputs, so whichever write lands first is the one everybody adopts, and
//! the others' writes fail harmlessly and trigger a poll.
//!
//! After the store lost its data, pods that remember the last placement put it back
//! unchanged (even during the recovery hold): shards stay where they were while members
//! re-register. The same after a store that went back in time (a failover that lost the
//! last placement writes): a pod that followed a newer version than the store shows
//! keeps following it and writes it back over the older one. Only once the hold ends may the membership change the placement again,
//! because until then the member list in the store is incomplete.

use std::time::Instant;

use super::{Action, Reconciler, Stored};
use crate::placement::Placement;

impl Reconciler {
    /// Writes a placement when one is due: the remembered one after a data loss, or the
    /// next one once a membership change has been stable for the debounce period.
    pub(super) fn update_placement(&mut self, now: Instant) {
        if self.placing.is_some() || self.store.failing() {
            return;
        }
        let expected = match self.stored {
            Stored::Unknown => return,
            Stored::Absent => None,
            Stored::Version(v) => Some(v),
        };
        if expected.is_none() {
            if let Some(remembered) = self.placement() {
                let restored = Placement {
                    version: remembered.version + 1,
                    assignment: remembered.assignment.clone(),
                };
                self.send_place(None, restored);
                return;
            }
        }
        // The store went back to an older version (it lost ours): put ours back as it
        // was, version included, so pods that followed it see no change.
        if expected.is_some_and(|stored| stored < self.placement.version) {
            self.send_place(expected, self.placement.clone());
            return;
        }
        if self.holding(now) || !self.debounce.ready(now, self.cfg.debounce) {
            return;
        }
        let Some(view) = self.debounce.take() else {
            return;
        };
        // From version 0 (nothing known) this is `Placement::initial`.
        let next = self.placement.next(&view, self.cfg.shards);
        self.send_place(expected, next);
    }

    fn send_place(&mut self, expected: Option<u64>, placement: Placement) {
        self.placing = Some(placement.version);
        self.actions.push_back(Action::Place {
            expected,
            placement,
        });
    }
}
