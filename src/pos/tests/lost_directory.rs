//! The connection manager when the store loses the directory (Redis restarted empty),
//! against fake terminals and a directory that can be wiped at a chosen moment: the
//! links stay, pushes still find them, and the manager asks to write them back with the
//! shard's epoch, naming the generation it read them in — also when the wipe lands in
//! the middle of a load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::fake::{wait_until, FakeTerminal, Pki};
use super::stop;
use crate::core::lease::Checked;
use crate::core::reconciler::{Close, StopReason};
use crate::core::{Epoch, ShardId};
use crate::pos::manager::{ConnectionManager, Lookup, ManagerConfig};
use crate::pos::LinkState;
use crate::serving::ServingHook;
use crate::store::directory::{
    Directory, DirectoryAdmin, MemoryDirectory, Refusal, Restore, Restored, Terminal, Versions,
};
use crate::store::StoreError;

/// What a write-back asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Asked {
    shard: ShardId,
    epoch: Epoch,
    generation: String,
    read_in: String,
    terminals: Vec<Terminal>,
}

/// A one-shard memory directory that [`Wipeable::wipe`] replaces by an empty one of a new
/// generation (a Redis restarted empty); armed with `wipe_in_next_read`, it does so inside
/// the next `terminals` call, before answering. Write-backs are recorded, and written
/// when they carry the `holder` epoch (the store's lease check, reduced to the epoch).
#[derive(Default)]
struct Wipeable {
    inner: Mutex<Arc<MemoryDirectory>>,
    wipe_in_next_read: AtomicBool,
    holder: Mutex<Option<Epoch>>,
    asked: Mutex<Vec<Asked>>,
}

impl Wipeable {
    fn current(&self) -> Arc<MemoryDirectory> {
        self.inner.lock().unwrap().clone()
    }

    fn wipe(&self) {
        *self.inner.lock().unwrap() = Arc::new(MemoryDirectory::new());
    }

    fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }
}

impl Directory for Wipeable {
    async fn terminals(&self, shard: ShardId) -> Result<Vec<Terminal>, StoreError> {
        if self.wipe_in_next_read.swap(false, Ordering::SeqCst) {
            self.wipe();
        }
        self.current().terminals(shard).await
    }

    async fn versions(&self, shards: &[ShardId]) -> Result<Versions, StoreError> {
        self.current().versions(shards).await
    }

    async fn restore(&self, request: &Restore<'_>) -> Result<Checked<Restored>, StoreError> {
        self.asked.lock().unwrap().push(Asked {
            shard: request.shard,
            epoch: request.epoch,
            generation: request.generation.to_string(),
            read_in: request.read_in.to_string(),
            terminals: request.terminals.to_vec(),
        });
        let holder = *self.holder.lock().unwrap();
        if holder != Some(request.epoch) {
            let owner = None;
            let refusal = Refusal::NotHolder {
                owner,
                epoch: holder,
            };
            return Ok(Checked::Ok(Restored::Refused(refusal)));
        }
        let directory = self.current();
        directory.upsert(1, request.terminals).await?;
        let version = directory.versions(&[request.shard]).await?.versions[0];
        Ok(Checked::Ok(Restored::Written { version }))
    }
}

async fn generation(d: &MemoryDirectory) -> String {
    let now = d.versions(&[0]).await.unwrap();
    now.generation.expect("a memory directory has a generation")
}

#[tokio::test]
async fn a_lost_directory_keeps_the_links_and_is_written_back_even_mid_read() {
    let pki = Pki::new();
    let server = FakeTerminal::spawn(pki.server("pos-1.test", &[b"h2"])).await;
    let mut terminals: Vec<Terminal> = ["pos-1", "pos-2", "pos-3"]
        .iter()
        .map(|id| server.terminal(id, "pos-1.test"))
        .collect();
    let directory = Arc::new(Wipeable::default());
    directory.current().upsert(1, &terminals).await.unwrap();
    let read_in = generation(&directory.current()).await;
    let config = ManagerConfig {
        directory_poll: Duration::from_millis(100),
        rng_seed: Some(1),
        ..ManagerConfig::default()
    };
    let (stale, _stale_rx) = mpsc::unbounded_channel();
    let m = ConnectionManager::new(directory.clone(), pki.dialer(), config, stale);
    m.start(0, 10);
    let connected = |m: &ConnectionManager<Wipeable>| {
        m.shard(0).is_some_and(|v| {
            v.links.len() == 3
                && v.links
                    .values()
                    .all(|s| *s == LinkState::Connected { epoch: 10 })
        })
    };
    wait_until("all three connected", || connected(&m)).await;

    // A change makes the poller load the shard, and Redis loses everything while that
    // load reads the terminals: the read sees no terminals at the old version.
    directory.wipe_in_next_read.store(true, Ordering::SeqCst);
    directory
        .current()
        .upsert(1, &[server.terminal("pos-4", "pos-1.test")])
        .await
        .unwrap();
    wait_until("the load read through the wipe", || {
        !directory.wipe_in_next_read.load(Ordering::SeqCst)
    })
    .await;
    let wiped_into = generation(&directory.current()).await;
    // Polls come and go (the write-backs refused: not re-claimed yet); the links stay.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(connected(&m), "links dropped by the wipe: {:?}", m.shard(0));
    assert!(
        matches!(m.lookup(0, "pos-2"), Lookup::Found(_)),
        "pushes find the kept links"
    );
    // The re-claim in the new generation, with a higher epoch: only that one is written.
    *directory.holder.lock().unwrap() = Some(11);
    m.start(0, 11);
    let written = |a: &Asked| a.epoch == 11;
    wait_until("written back", || directory.asked().iter().any(written)).await;
    let asked = directory.asked();
    let mut sent = asked.iter().find(|a| written(a)).unwrap().clone();
    sent.terminals.sort_by(|a, b| a.id.cmp(&b.id));
    terminals.sort_by(|a, b| a.id.cmp(&b.id));
    let expected = Asked {
        shard: 0,
        epoch: 11,
        generation: wiped_into,
        read_in,
        terminals: terminals.clone(),
    };
    assert_eq!(
        sent, expected,
        "exactly the links kept, read in the old generation"
    );
    assert!(
        asked.iter().all(|a| a.epoch == 10 || written(a)),
        "{asked:?}"
    );
    // No link was dropped and no terminal redialed: one hello per connection, plus the
    // re-hello for epoch 11.
    wait_until("re-hello'd with epoch 11", || {
        m.shard(0).is_some_and(|v| {
            v.links.len() == 3
                && v.links
                    .values()
                    .all(|s| *s == LinkState::Connected { epoch: 11 })
        })
    })
    .await;
    assert_eq!(server.open.load(Ordering::SeqCst), 3);
    assert_eq!(server.hellos().len(), 6, "{:?}", server.hellos());
    assert!(matches!(m.lookup(0, "pos-2"), Lookup::Found(_)));
    // Written back, the directory is read again like any other: nothing changes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(m.shard(0).unwrap().links.len(), 3);
    assert_eq!(directory.current().terminals(0).await.unwrap(), terminals);
    m.stop(stop(0, 11, StopReason::Shutdown, Close::Now)).await;
}
