//! [`InitArgs`]: the flags of `posgate init`, which makes a new cluster's store ready
//! before its first pod starts (the store generation created and older than the pods'
//! recovery hold; the cluster metadata pinned).
//!
//! Not for: what init does or why it is safe (the binary's `init.rs`, `docs/design.md`
//! "Recovery").

use std::time::Duration;

use super::store_args::{parse_timeout, StoreArgs};

/// Flags of `posgate init`.
#[derive(Clone, clap::Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The pods' --member-ttl: how long a pod holds its claims after the store's
    /// generation was created. A shorter one leaves the pods the rest of their hold; a
    /// longer one only makes init wait longer
    #[arg(long, env = "POSGATE_MEMBER_TTL", default_value = "15s", value_parser = parse_timeout)]
    pub member_ttl: Duration,
}
