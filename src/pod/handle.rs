//! [`PodHandle`]: what starting a pod returns, to watch it, reload it, shut it down
//! gracefully or abort it.

use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::{PodError, Reloader};
use crate::metrics::Metrics;
use crate::serving::ServingTable;
use crate::status::PodStatus;

/// A pod started with [`Pod::start`](crate::pod::Pod::start). Dropping it stops the pod at once (no graceful
/// shutdown), like [`PodHandle::abort`].
pub struct PodHandle {
    /// The pod's status, as its HTTP endpoints report it.
    pub status: watch::Receiver<PodStatus>,
    /// The shards the pod serves.
    pub serving: ServingTable,
    /// The pod's metrics (what `/metrics` serves).
    pub metrics: Arc<Metrics>,
    /// Replaces the pod's secrets and certificates in place (`SIGHUP`, changed files).
    pub reloader: Reloader,
    pub(super) stop: Option<oneshot::Sender<()>>,
    /// `None` once [`PodHandle::wait`] reported the end.
    pub(super) task: Option<JoinHandle<Result<(), PodError>>>,
}

impl PodHandle {
    /// Begins the graceful shutdown; [`PodHandle::wait`] tells when it is done.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits until the pod stopped (after a shutdown, a failure or an abort) and reports
    /// how; later calls return `Ok(())` at once. Cancel-safe.
    pub async fn wait(&mut self) -> Result<(), PodError> {
        let Some(task) = &mut self.task else {
            return Ok(());
        };
        let ended = task.await;
        self.task = None;
        ended?
    }

    /// Stops the pod at once, like a crash: nothing is released or deregistered.
    pub fn abort(&self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Drop for PodHandle {
    fn drop(&mut self) {
        self.abort();
    }
}
