//! Keeping each served shard's links in line with the terminal directory: the first load
//! when a shard starts, the poll of every served shard's directory version that picks up
//! added and removed terminals, and the write-back of a shard whose directory the store
//! lost.
//!
//! A load reads the shard's version (with the store generation) before and after its
//! terminals, and applies the list only if neither moved in between: a Redis that
//! restarts empty during the read must not look like an operator removing terminals.
//!
//! Lost directories. A version goes back to 0 only when the store lost its data (every
//! write sets it to `max(previous + 1, store ms)`). Dropping the links then would
//! disconnect every terminal because Redis blinked, so a shard that finds no directory
//! (version 0, no terminals) while it has links becomes [`Listing::Lost`]: the links stay
//! and pushes are delivered on them, and each load asks the store to take them back as
//! the shard's directory, with the epoch the shard is served with
//! ([`Directory::restore`]; the checks are in `store::directory::restore`). The store
//! refuses until this pod holds the re-claimed lease in the new generation, and for good
//! once an import came first (the next load then reads that).

use super::*;
use crate::core::lease::Checked;
use crate::store::directory::{Restore, Restored};
use rand::rngs::SmallRng;

/// One consistent read of a shard's directory.
struct ShardRead {
    generation: Option<String>,
    version: u64,
    terminals: Vec<Terminal>,
}

/// A write-back to ask for after a load found the shard's directory lost.
struct WriteBack {
    generation: String,
    read_in: Option<String>,
    epoch: Epoch,
    terminals: Vec<Terminal>,
}

impl<D: Directory> Inner<D> {
    /// Reads `shard`'s directory and brings its links in line; if the store lost the
    /// directory, keeps the links and asks the store to take them back.
    pub(super) async fn load(self: Arc<Self>, shard: ShardId, incarnation: u64) {
        let result = tokio::time::timeout(self.directory_poll, self.read(shard)).await;
        let write_back = {
            let mut shards = lock(&self.shards);
            let Some(entry) = shards
                .get_mut(&shard)
                .filter(|e| e.incarnation == incarnation)
            else {
                return; // stopped meanwhile
            };
            // The poller retries whatever is not applied: the version still differs.
            let plan = match result {
                Ok(Ok(Some(read))) => self.apply(shard, entry, read),
                Ok(Ok(None)) => {
                    debug!(
                        shard,
                        "the directory changed while it was read; reading again"
                    );
                    None
                }
                Ok(Err(e)) => {
                    warn!(shard, error = %e, "cannot read shard terminals; retrying");
                    None
                }
                Err(_) => {
                    warn!(shard, "reading shard terminals timed out; retrying");
                    None
                }
            };
            // A write-back keeps the shard loading until it is answered.
            entry.loading = plan.is_some();
            plan
        };
        if let Some(plan) = write_back {
            self.write_back(shard, incarnation, plan).await;
        }
    }

    /// The shard's terminals, if its version and generation were the same before and
    /// after reading them.
    async fn read(&self, shard: ShardId) -> Result<Option<ShardRead>, StoreError> {
        let before = self.directory.versions(&[shard]).await?;
        let terminals = self.directory.terminals(shard).await?;
        let after = self.directory.versions(&[shard]).await?;
        if before != after {
            return Ok(None);
        }
        Ok(Some(ShardRead {
            generation: before.generation,
            version: before.versions.first().copied().unwrap_or(0),
            terminals,
        }))
    }

    /// Brings `entry` in line with `read`. Returns the write-back to ask for when the read
    /// found the directory lost (see the module docs).
    fn apply(&self, shard: ShardId, entry: &mut ShardEntry, read: ShardRead) -> Option<WriteBack> {
        let lost = read.version == 0 && read.terminals.is_empty() && !entry.links.is_empty();
        if !lost {
            let (added, removed) = self.sync(shard, entry, read.terminals);
            entry.listing = Listing::Read {
                generation: read.generation,
                version: read.version,
            };
            if added + removed > 0 {
                info!(
                    shard,
                    added,
                    removed,
                    terminals = entry.links.len(),
                    "shard terminals updated"
                );
            }
            return None;
        }
        let read_in = match &entry.listing {
            Listing::Lost { read_in } => read_in.clone(),
            Listing::Read { generation, .. } => {
                warn!(
                    shard,
                    terminals = entry.links.len(),
                    "the terminal directory has no entry for this shard (the store lost its \
                     data?): keeping its connections and writing them back once the shard \
                     is re-claimed"
                );
                generation.clone()
            }
            // Links come from a read, so a shard with links was read.
            Listing::Unread => None,
        };
        entry.listing = Listing::Lost {
            read_in: read_in.clone(),
        };
        let Some(generation) = read.generation else {
            debug!(
                shard,
                "the store has no generation yet: writing the directory back later"
            );
            return None;
        };
        Some(WriteBack {
            generation,
            read_in,
            epoch: entry.mode.borrow().epoch,
            terminals: entry
                .links
                .values()
                .map(|l| Terminal::clone(&l.terminal))
                .collect(),
        })
    }

    /// Asks the store to take `plan` back as `shard`'s directory; on success the links
    /// reflect the directory again.
    async fn write_back(&self, shard: ShardId, incarnation: u64, plan: WriteBack) {
        let request = Restore {
            shard,
            pod: self.links.dialer.pod(),
            epoch: plan.epoch,
            generation: &plan.generation,
            read_in: plan.read_in.as_deref().unwrap_or(""),
            terminals: &plan.terminals,
        };
        let result =
            tokio::time::timeout(self.directory_poll, self.directory.restore(&request)).await;
        let mut shards = lock(&self.shards);
        let Some(entry) = shards
            .get_mut(&shard)
            .filter(|e| e.incarnation == incarnation)
        else {
            return;
        };
        entry.loading = false;
        let epoch = plan.epoch;
        match result {
            Ok(Ok(Checked::Ok(Restored::Written { version }))) => {
                info!(
                    shard,
                    epoch,
                    version,
                    terminals = plan.terminals.len(),
                    "wrote the shard's terminal directory back"
                );
                entry.listing = Listing::Read {
                    generation: Some(plan.generation),
                    version,
                };
            }
            // Expected while the re-claim is under way (`NotHolder`); an import that came
            // first (`Present`) is read by the next load. Every refusal is retried there.
            Ok(Ok(Checked::Ok(Restored::Refused(why)))) => {
                debug!(shard, epoch, %why, "directory write-back refused; trying again")
            }
            Ok(Ok(Checked::GenerationChanged(g))) => {
                debug!(shard, generation = %g.id, "the store generation changed again; trying again")
            }
            Ok(Err(e)) => {
                warn!(shard, error = %e, "cannot write the shard's directory back; retrying")
            }
            Err(_) => warn!(
                shard,
                "writing the shard's directory back timed out; retrying"
            ),
        }
    }

    /// Starts links for new terminals, drops those of removed or changed ones.
    /// Returns (added, removed).
    fn sync(&self, shard: ShardId, entry: &mut ShardEntry, list: Vec<Terminal>) -> (usize, usize) {
        let mut wanted: HashMap<String, Terminal> =
            list.into_iter().map(|t| (t.id.clone(), t)).collect();
        let before = entry.links.len();
        // A changed address or name is a new terminal: close and redial. Changed labels
        // are not: relabeling a region must not reconnect it.
        entry.links.retain(|id, link| match wanted.get(id) {
            Some(t) if t.same_endpoint(&link.terminal) => {
                if t.labels != link.terminal.labels {
                    link.terminal = Arc::new(t.clone());
                }
                true
            }
            _ => false,
        });
        let removed = before - entry.links.len();
        wanted.retain(|id, _| !entry.links.contains_key(id));
        let added = wanted.len();
        // In id order: a walk (`handover`) asks for them in the order they come.
        let mut new: Vec<(String, Terminal)> = wanted.into_iter().collect();
        new.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (id, terminal) in new {
            let (state_tx, state) = watch::channel(LinkStatus::new());
            let gate = entry.walk.as_ref().map(|walk| walk.gate(&id));
            let shared = Arc::new(match gate {
                Some(_) => LinkShared::gated(),
                None => LinkShared::default(),
            });
            let rng = SmallRng::from_rng(&mut *lock(&self.rng));
            let (ended_tx, ended) = tokio::sync::oneshot::channel();
            entry.tasks.spawn(
                LinkTask {
                    cx: self.links.clone(),
                    shard,
                    terminal: terminal.clone(),
                    mode: entry.mode.subscribe(),
                    state: state_tx,
                    shared: shared.clone(),
                    rng,
                    gate,
                    _ended: ended_tx,
                }
                .run(),
            );
            let handle = LinkHandle {
                terminal: Arc::new(terminal),
                state,
                shared,
                ended,
            };
            entry.links.insert(id, handle);
        }
        // Reap the tasks of removed terminals that have finished closing.
        while entry.tasks.try_join_next().is_some() {}
        (added, removed)
    }

    /// One directory poll: reload every served shard whose version or generation moved,
    /// and every lost one (to try its write-back again).
    async fn poll_once(self: &Arc<Self>) {
        let known: Vec<(ShardId, u64, Listing)> = lock(&self.shards)
            .iter()
            .filter(|(_, e)| !e.loading)
            .map(|(s, e)| (*s, e.incarnation, e.listing.clone()))
            .collect();
        if known.is_empty() {
            return;
        }
        let shards: Vec<ShardId> = known.iter().map(|k| k.0).collect();
        let answer =
            match tokio::time::timeout(self.directory_poll, self.directory.versions(&shards)).await
            {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    warn!(error = %e, "cannot poll the terminal directory");
                    return;
                }
                Err(_) => {
                    warn!("polling the terminal directory timed out");
                    return;
                }
            };
        let mut entries = lock(&self.shards);
        for ((shard, incarnation, listing), now) in known.into_iter().zip(answer.versions) {
            let current = matches!(&listing, Listing::Read { generation, version }
                if *generation == answer.generation && *version == now);
            if current {
                continue;
            }
            if let Some(entry) = entries
                .get_mut(&shard)
                .filter(|e| e.incarnation == incarnation && !e.loading)
            {
                debug!(shard, from = ?listing, to = now, "directory changed");
                entry.loading = true;
                tokio::spawn(self.clone().load(shard, incarnation));
            }
        }
    }
}

/// Polls the directory while the manager exists.
pub(super) async fn poll_directory<D: Directory>(inner: Weak<Inner<D>>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        inner.poll_once().await;
    }
}
