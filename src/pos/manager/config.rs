//! The settings of a [`super::ConnectionManager`] and their defaults (what `posgate serve`
//! turns its POS flags into).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;
use crate::pos::backoff::BackoffPolicy;
use crate::pos::handover::{WalkConfig, DEFAULT_DRAIN_BUDGET};

/// Settings of a [`super::ConnectionManager`].
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// Dials per second, pod-wide (`--dial-rate`).
    pub dial_rate: NonZeroU32,
    /// Random extra wait per dial, so paced dials do not tick in lockstep.
    pub dial_jitter: Duration,
    /// TCP + TLS + HTTP/2 + hello handshakes in flight at once; also bounds re-sent
    /// hellos in flight.
    pub max_handshakes: usize,
    /// Hellos per second re-sent on live connections after an epoch change
    /// (`--hello-rate`).
    pub hello_rate: NonZeroU32,
    pub backoff: BackoffPolicy,
    /// How long a stopping shard's sessions get to close before they are dropped.
    pub close_budget: Duration,
    /// How often the directory versions are polled (also bounds each directory call).
    pub directory_poll: Duration,
    /// Seed of the backoff and dial jitter; `None` seeds from the OS.
    pub rng_seed: Option<u64>,
    /// How a shard taken over from a pod that drains is walked (`handover`); `None`:
    /// this pod neither asks predecessors nor drains (it advertises handover 0).
    pub walk: Option<WalkConfig>,
    /// How long a shard handed over keeps its sessions draining for the next owner to
    /// ask for them (`--drain-budget`); the rest are closed then.
    pub drain_budget: Duration,
    /// Where dials and closed connections are counted.
    pub metrics: Arc<Metrics>,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            dial_rate: NonZeroU32::new(200).expect("non-zero"),
            dial_jitter: Duration::from_millis(20),
            max_handshakes: 64,
            hello_rate: NonZeroU32::new(1000).expect("non-zero"),
            backoff: BackoffPolicy::default(),
            close_budget: Duration::from_secs(2),
            directory_poll: Duration::from_secs(2),
            rng_seed: None,
            walk: None,
            drain_budget: DEFAULT_DRAIN_BUDGET,
            metrics: Arc::new(Metrics::new()),
        }
    }
}
