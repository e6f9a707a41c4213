//! The coordination, queue and broadcast scripts (`store/lua/`), each with `lib.lua` prepended and
//! flagged as writing (see the parent module for why), but the queue's reads; the
//! directory's are `directory.rs`'s.

use redis::Script;

/// A script body with the shared helpers prepended, flagged as a writing script (the
/// `#!lua` line without `no-writes`; see the module docs).
macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            "#!lua\n",
            include_str!("../lua/lib.lua"),
            include_str!(concat!("../lua/", $file))
        ))
    };
}

/// A queue script (`queue_lib.lua` after `lib.lua`), flagged as writing.
macro_rules! queue_script {
    ($file:literal) => {
        Script::new(concat!(
            "#!lua\n",
            include_str!("../lua/lib.lua"),
            include_str!("../lua/queue_lib.lua"),
            include_str!(concat!("../lua/", $file))
        ))
    };
}

pub(super) struct Scripts {
    pub(super) pin_meta: Script,
    pub(super) heartbeat: Script,
    pub(super) deregister: Script,
    pub(super) acquire: Script,
    pub(super) renew: Script,
    pub(super) release: Script,
    pub(super) snapshot: Script,
    pub(super) place: Script,
    pub(super) queue_enqueue: Script,
    pub(super) queue_write: Script,
    pub(super) queue_cancel: Script,
    /// Flagged `no-writes`: a status lookup or a feed read runs also while Redis is out
    /// of memory.
    pub(super) queue_read: Script,
    pub(super) broadcast_create: Script,
    pub(super) broadcast_marks: Script,
    /// Flagged `no-writes`, like `queue_read`.
    pub(super) broadcast_read: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            pin_meta: script!("pin_meta.lua"),
            heartbeat: script!("heartbeat.lua"),
            deregister: script!("deregister.lua"),
            acquire: script!("acquire.lua"),
            renew: script!("renew.lua"),
            release: script!("release.lua"),
            snapshot: script!("snapshot.lua"),
            place: script!("place.lua"),
            queue_enqueue: queue_script!("queue_enqueue.lua"),
            queue_write: queue_script!("queue_write.lua"),
            queue_cancel: queue_script!("queue_cancel.lua"),
            queue_read: Script::new(concat!(
                "#!lua flags=no-writes\n",
                include_str!("../lua/queue_read.lua")
            )),
            broadcast_create: script!("broadcast_create.lua"),
            broadcast_marks: script!("broadcast_marks.lua"),
            broadcast_read: Script::new(concat!(
                "#!lua flags=no-writes\n",
                include_str!("../lua/broadcast_read.lua")
            )),
        }
    }
}
