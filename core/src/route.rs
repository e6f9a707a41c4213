//! The entry pod's rule for one push attempt: where to send it, and which outcomes allow
//! another look. IO-free, so the push layer (`posgate::push::route`) and the simulation
//! (`posgate::sim`) follow the same rule and the simulation's key invariant tests it.
//!
//! The rule in one line: an attempt is looked up and sent again only while it is
//! certain that nothing reached a terminal; once that is uncertain the attempt ends
//! with "delivery unknown" and the caller decides (a retry with the same key, which the
//! terminal dedupes). So a key reaches a terminal a second time only after an answer was
//! lost, never because a pod retried on its own.
//!
//! Not for: forwarding, delivering or waiting (the push layer does the IO), or the
//! owner's own checks before it sends (`posgate::push::owner`).

use super::membership::Member;
use super::PodId;

/// Where an attempt goes next, from the entry pod's latest view; `P` is how the peer is
/// named (a [`Member`] here, its address in the push layer).
#[derive(Debug, PartialEq, Eq)]
pub enum Target<P> {
    /// This pod serves the shard: deliver here.
    Here,
    /// The lease holder, a member this pod can reach: forward one hop.
    Peer(P),
    /// No pod can take it now (no lease, the lease is ours but not serving yet, or the
    /// holder is not a member): wait for the view to change, up to the deadline.
    Nobody,
}

/// The target for a shard: `serving_here` is whether this pod serves it now, `owner`
/// the lease holder in this pod's latest view, `members` the members in it.
pub fn target<'a>(
    me: &PodId,
    serving_here: bool,
    owner: Option<&PodId>,
    members: &'a [Member],
) -> Target<&'a Member> {
    if serving_here {
        return Target::Here;
    }
    match owner {
        // Our lease, but not serving (yet, or any more): wait for it to settle.
        Some(owner) if owner == me => Target::Nobody,
        Some(owner) => members
            .iter()
            .find(|m| m.pod == *owner)
            .map_or(Target::Nobody, Target::Peer),
        None => Target::Nobody,
    }
}

/// An outcome of one try that is not the terminal's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// The target does not serve the shard (any more); it sent nothing.
    NotHere,
    /// The peer answered that it does not serve the shard; it sent nothing.
    Moved,
    /// The request never left this pod (connect failed, refused before writing).
    NotSent,
    /// The request may have reached the owner, and through it the terminal.
    Unknown,
}

impl Miss {
    /// Whether the attempt may look for the owner again and send: only when nothing can
    /// have reached a terminal.
    pub fn may_look_again(self) -> bool {
        match self {
            Miss::NotHere | Miss::Moved | Miss::NotSent => true,
            Miss::Unknown => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{member, pod};

    #[test]
    fn the_target_is_here_the_lease_holder_or_nobody() {
        let members = vec![member("a"), member("b")];
        let me = pod("a");
        assert_eq!(target(&me, true, Some(&pod("b")), &members), Target::Here);
        assert_eq!(
            target(&me, false, Some(&pod("b")), &members),
            Target::Peer(&members[1])
        );
        // Our own lease while not serving: nobody yet.
        assert_eq!(target(&me, false, Some(&me), &members), Target::Nobody);
        // A holder that is not a member cannot be reached.
        assert_eq!(
            target(&me, false, Some(&pod("c")), &members),
            Target::Nobody
        );
        assert_eq!(target(&me, false, None, &members), Target::Nobody);
    }

    #[test]
    fn only_a_try_that_sent_nothing_is_tried_again() {
        assert!(Miss::NotHere.may_look_again());
        assert!(Miss::Moved.may_look_again());
        assert!(Miss::NotSent.may_look_again());
        assert!(!Miss::Unknown.may_look_again());
    }
}
