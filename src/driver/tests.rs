//! The driver's stale-epoch input, against the in-memory store on the real clock (the
//! memory store keeps wall time, so a paused tokio clock would not expire its leases).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::core::lease::StaleEpoch;
use crate::core::reconciler::{Stop, StopReason};
use crate::core::{CoreConfig, Epoch, PodId};
use crate::credentials::Credentials;
use crate::store::memory::MemoryStore;

/// Generous: reached only when something is broken (a fresh store holds claims for one
/// member TTL, 3 s with the fast timings).
const LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug, PartialEq, Eq)]
enum Event {
    Start(ShardId, Epoch),
    Stop(ShardId, Epoch, StopReason),
}

struct Recorder(mpsc::UnboundedSender<Event>);

impl ServingHook for Recorder {
    fn start(&self, shard: ShardId, epoch: Epoch) {
        let _ = self.0.send(Event::Start(shard, epoch));
    }

    fn stop(&self, stop: Stop) -> impl Future<Output = ()> + Send + 'static {
        let _ = self
            .0
            .send(Event::Stop(stop.shard, stop.epoch, stop.reason));
        std::future::ready(())
    }
}

async fn next(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(LIMIT, events.recv())
        .await
        .expect("no serving event in time")
        .expect("driver gone")
}

#[tokio::test]
async fn a_reported_stale_epoch_stops_the_shard() {
    let core = CoreConfig {
        shards: 4,
        ..CoreConfig::fast()
    };
    let config = DriverConfig {
        pod: PodId::new("pod-1").unwrap(),
        advertise_url: "http://127.0.0.1:9".into(),
        core,
        store_timeout: Duration::from_millis(500),
    };
    let (hook, mut events) = mpsc::unbounded_channel();
    let (stale, stale_rx) = mpsc::unbounded_channel();
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let driver = Driver::new(
        config,
        Credentials::new(None, None),
        Arc::new(MemoryStore::new()),
        Recorder(hook),
        metrics,
    )
    .unwrap()
    .with_stale_epochs(stale_rx);
    let (shutdown, shutdown_rx) = oneshot::channel::<()>();
    let run = tokio::spawn(driver.run(async {
        let _ = shutdown_rx.await;
    }));

    let (shard, epoch) = loop {
        if let Event::Start(shard, epoch) = next(&mut events).await {
            break (shard, epoch);
        }
    };
    // An older epoch is not ours any more: ignored. Ours, refused without the epoch the
    // terminal has seen, stops the shard.
    let refused = |epoch| StaleEpoch {
        shard,
        epoch,
        highest: None,
    };
    stale.send(refused(epoch - 1)).unwrap();
    stale.send(refused(epoch)).unwrap();
    loop {
        match next(&mut events).await {
            Event::Stop(s, e, reason) if s == shard => {
                assert_eq!((e, reason), (epoch, StopReason::StaleEpoch));
                break;
            }
            Event::Stop(s, e, reason) => panic!("unexpected stop of {s}@{e}: {reason:?}"),
            Event::Start(..) => {}
        }
    }

    shutdown.send(()).unwrap();
    tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
}

mod store_health {
    use std::time::{Duration, Instant};

    use super::super::ops::{Line, StoreHealth, Symptom, WARN_EVERY};
    use crate::store::StoreError;

    fn refused(code: &str) -> StoreError {
        StoreError::Refused {
            code: code.into(),
            detail: "test".into(),
        }
    }

    #[test]
    fn one_line_per_change_of_symptom_then_one_when_the_store_serves_again() {
        let mut health = StoreHealth::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let readonly = Line::Changed(Symptom::Refusing("READONLY".into()));
        assert_eq!(
            health.note(at(0), None),
            None,
            "a healthy store logs nothing"
        );
        assert_eq!(
            health.note(at(0), Some(&refused("READONLY"))),
            Some(readonly)
        );
        let mut lines = Vec::new();
        for ms in 1..1_000 {
            lines.extend(health.note(at(ms), Some(&refused("READONLY"))));
        }
        assert_eq!(lines, [], "the same refusal again within {WARN_EVERY:?}");
        let timeout = StoreError::Timeout(Duration::from_millis(300));
        assert_eq!(
            health.note(at(1_000), Some(&timeout)),
            Some(Line::Changed(Symptom::Unreachable)),
            "a new symptom is logged at once"
        );
        let limit = at(1_000) + WARN_EVERY;
        assert_eq!(
            health.note(limit - Duration::from_millis(1), Some(&timeout)),
            None
        );
        assert_eq!(health.note(limit, Some(&timeout)), Some(Line::StillFailing));
        let oom = Line::Changed(Symptom::Refusing("OOM".into()));
        assert_eq!(health.note(limit, Some(&refused("OOM"))), Some(oom));
        assert_eq!(
            health.note(limit, None),
            Some(Line::Recovered {
                failures: 1_004,
                since: t0,
                symptom: Symptom::Refusing("OOM".into()),
            })
        );
        assert_eq!(health.note(limit, None), None, "recovery is told once");
        let readonly = Line::Changed(Symptom::Refusing("READONLY".into()));
        assert_eq!(
            health.note(limit, Some(&refused("READONLY"))),
            Some(readonly),
            "a new outage is logged at once"
        );
    }
}
