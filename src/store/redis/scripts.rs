//! The coordination scripts (`store/lua/`), each with `lib.lua` prepended and flagged as
//! writing (see the parent module for why); the directory's are `directory.rs`'s.

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

pub(super) struct Scripts {
    pub(super) pin_meta: Script,
    pub(super) heartbeat: Script,
    pub(super) deregister: Script,
    pub(super) acquire: Script,
    pub(super) renew: Script,
    pub(super) release: Script,
    pub(super) snapshot: Script,
    pub(super) place: Script,
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
        }
    }
}
