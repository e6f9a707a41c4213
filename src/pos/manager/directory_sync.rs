//! Keeping each served shard's links in line with the terminal directory: the first load
//! when a shard starts, and the poll of every served shard's directory version that
//! picks up added and removed terminals.

use super::*;

impl<D: Directory> Inner<D> {
    /// Reads `shard`'s version and terminals and brings its links in line.
    pub(super) async fn load(self: Arc<Self>, shard: ShardId, incarnation: u64) {
        let read = async {
            let versions = self.directory.versions(&[shard]).await?.versions;
            let terminals = self.directory.terminals(shard).await?;
            Ok::<_, StoreError>((versions.first().copied(), terminals))
        };
        let result = tokio::time::timeout(self.directory_poll, read).await;
        let mut shards = lock(&self.shards);
        let Some(entry) = shards
            .get_mut(&shard)
            .filter(|e| e.incarnation == incarnation)
        else {
            return; // stopped meanwhile
        };
        entry.loading = false;
        match result {
            // Version 0 with no terminals is a shard the directory never held — or a
            // directory lost with its store (Redis restarted empty). Dropping live
            // sessions for that would disconnect every terminal because Redis blinked,
            // so the links stay until the directory is imported again (a real removal
            // leaves a version above 0).
            Ok(Ok((Some(0), terminals))) if terminals.is_empty() && !entry.links.is_empty() => {
                warn!(
                    shard,
                    terminals = entry.links.len(),
                    "the terminal directory has no entry for this shard (store wiped?); \
                     keeping its connections until the directory is imported again"
                );
                entry.version = Some(0);
            }
            Ok(Ok((version, terminals))) => {
                let (added, removed) = self.sync(shard, entry, terminals);
                entry.version = version;
                if added + removed > 0 {
                    info!(
                        shard,
                        added,
                        removed,
                        terminals = entry.links.len(),
                        "shard terminals updated"
                    );
                }
            }
            // The poller retries: the version still differs from the directory's.
            Ok(Err(e)) => warn!(shard, error = %e, "cannot read shard terminals; retrying"),
            Err(_) => warn!(shard, "reading shard terminals timed out; retrying"),
        }
    }

    /// Starts links for new terminals, drops those of removed or changed ones.
    /// Returns (added, removed).
    fn sync(&self, shard: ShardId, entry: &mut ShardEntry, list: Vec<Terminal>) -> (usize, usize) {
        let mut wanted: HashMap<String, Terminal> =
            list.into_iter().map(|t| (t.id.clone(), t)).collect();
        let before = entry.links.len();
        // A changed address or name is a new terminal: close and redial.
        entry
            .links
            .retain(|id, link| wanted.get(id) == Some(&link.terminal));
        let removed = before - entry.links.len();
        wanted.retain(|id, _| !entry.links.contains_key(id));
        let added = wanted.len();
        for (id, terminal) in wanted {
            let (state_tx, state) = watch::channel(LinkStatus::new());
            let shared = Arc::new(LinkShared::default());
            let rng = StdRng::from_rng(&mut *lock(&self.rng));
            entry.tasks.spawn(
                LinkTask {
                    cx: self.links.clone(),
                    shard,
                    terminal: terminal.clone(),
                    mode: entry.mode.subscribe(),
                    state: state_tx,
                    shared: shared.clone(),
                    rng,
                }
                .run(),
            );
            let handle = LinkHandle {
                terminal,
                state,
                shared,
            };
            entry.links.insert(id, handle);
        }
        // Reap the tasks of removed terminals that have finished closing.
        while entry.tasks.try_join_next().is_some() {}
        (added, removed)
    }

    /// One directory poll: reload every served shard whose version moved.
    async fn poll_once(self: &Arc<Self>) {
        let known: Vec<(ShardId, u64, Option<u64>)> = lock(&self.shards)
            .iter()
            .filter(|(_, e)| !e.loading)
            .map(|(s, e)| (*s, e.incarnation, e.version))
            .collect();
        if known.is_empty() {
            return;
        }
        let shards: Vec<ShardId> = known.iter().map(|k| k.0).collect();
        let versions =
            match tokio::time::timeout(self.directory_poll, self.directory.versions(&shards)).await
            {
                Ok(Ok(v)) => v.versions,
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
        for ((shard, incarnation, version), now) in known.into_iter().zip(versions) {
            if version == Some(now) {
                continue;
            }
            if let Some(entry) = entries
                .get_mut(&shard)
                .filter(|e| e.incarnation == incarnation && !e.loading)
            {
                debug!(shard, from = ?version, to = now, "directory changed");
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
