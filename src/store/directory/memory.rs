//! [`MemoryDirectory`]: the directory in one process (embedded mode, tests), with the
//! same answers as the Redis one: terminals sorted by id, a version per shard that is
//! bumped to `max(previous + 1, wall clock ms)` once per write that changes the shard.
//!
//! Its content lives exactly as long as the value, so it has one store generation for
//! its whole life (a random id made by [`MemoryDirectory::new`]) and never has a lost
//! shard to write back: [`Directory::restore`] always answers
//! [`Refusal::SameGeneration`].
//!
//! What it does not do: persist anything, or fail (every call answers `Ok` unless the
//! input is invalid).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{
    Directory, DirectoryAdmin, Entry, Grouped, Refusal, Restore, Restored, Terminal, Versions,
    WriteSummary,
};
use crate::core::lease::Checked;
use crate::core::ShardId;
use crate::store::StoreError;

#[derive(Debug, Default)]
struct State {
    terminals: BTreeMap<ShardId, BTreeMap<String, Entry>>,
    versions: BTreeMap<ShardId, u64>,
}

impl State {
    fn bump(&mut self, shards: &BTreeSet<ShardId>) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        for &shard in shards {
            let v = self.versions.entry(shard).or_insert(0);
            *v = (*v + 1).max(now);
        }
    }

    fn upsert(&mut self, grouped: Grouped<Entry>) -> WriteSummary {
        let mut sum = WriteSummary::default();
        for (shard, entries) in grouped {
            let held = self.terminals.entry(shard).or_default();
            for (id, entry) in entries {
                match held.insert(id, entry.clone()) {
                    None => sum.added += 1,
                    Some(old) if old == entry => {
                        sum.unchanged += 1;
                        continue;
                    }
                    Some(_) => sum.updated += 1,
                }
                sum.changed_shards.insert(shard);
            }
            if held.is_empty() {
                self.terminals.remove(&shard);
            }
        }
        sum
    }

    fn remove(&mut self, grouped: BTreeMap<ShardId, BTreeSet<String>>) -> WriteSummary {
        let mut sum = WriteSummary::default();
        for (shard, ids) in grouped {
            let Some(held) = self.terminals.get_mut(&shard) else {
                sum.unchanged += ids.len() as u64;
                continue;
            };
            for id in ids {
                if held.remove(&id).is_some() {
                    sum.removed += 1;
                    sum.changed_shards.insert(shard);
                } else {
                    sum.unchanged += 1;
                }
            }
            if held.is_empty() {
                self.terminals.remove(&shard);
            }
        }
        sum
    }

    fn terminals(&self, shard: ShardId) -> Vec<Terminal> {
        self.terminals
            .get(&shard)
            .map(|held| {
                held.iter()
                    .map(|(id, e)| e.clone().terminal(id.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The in-memory directory. Clones share the same terminals.
#[derive(Clone, Debug)]
pub struct MemoryDirectory {
    state: Arc<Mutex<State>>,
    /// The one generation of this directory's life.
    generation: Arc<str>,
}

impl Default for MemoryDirectory {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        MemoryDirectory {
            state: Arc::default(),
            generation: format!("memory-{:016x}", rand::random::<u64>()).into(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Directory for MemoryDirectory {
    async fn terminals(&self, shard: ShardId) -> Result<Vec<Terminal>, StoreError> {
        Ok(self.lock().terminals(shard))
    }

    async fn versions(&self, shards: &[ShardId]) -> Result<Versions, StoreError> {
        let state = self.lock();
        Ok(Versions {
            generation: Some(self.generation.to_string()),
            versions: shards
                .iter()
                .map(|s| state.versions.get(s).copied().unwrap_or(0))
                .collect(),
        })
    }

    /// Nothing is ever lost here (see the module docs).
    async fn restore(&self, _request: &Restore<'_>) -> Result<Checked<Restored>, StoreError> {
        Ok(Checked::Ok(Restored::Refused(Refusal::SameGeneration)))
    }
}

impl DirectoryAdmin for MemoryDirectory {
    async fn write_upserts(&self, grouped: Grouped<Entry>) -> Result<WriteSummary, StoreError> {
        let mut state = self.lock();
        let sum = state.upsert(grouped);
        state.bump(&sum.changed_shards);
        Ok(sum)
    }

    async fn write_removals(
        &self,
        grouped: BTreeMap<ShardId, BTreeSet<String>>,
    ) -> Result<WriteSummary, StoreError> {
        let mut state = self.lock();
        let sum = state.remove(grouped);
        state.bump(&sum.changed_shards);
        Ok(sum)
    }

    async fn count(&self, shards: u32) -> Result<u64, StoreError> {
        let state = self.lock();
        Ok(state
            .terminals
            .range(0..shards)
            .map(|(_, held)| held.len() as u64)
            .sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: &str, port: u16) -> Terminal {
        Terminal::new(id, &format!("h:{port}"), None).unwrap()
    }

    #[tokio::test]
    async fn writes_bump_only_changed_shards() {
        let d = MemoryDirectory::new();
        let all: Vec<ShardId> = (0..4).collect();
        let sum = d.upsert(4, &[t("a", 1), t("b", 2)]).await.unwrap();
        assert_eq!(sum.added, 2);
        let v1 = d.versions(&all).await.unwrap().versions;
        let sum = d.upsert(4, &[t("a", 1), t("b", 3)]).await.unwrap();
        assert_eq!((sum.unchanged, sum.updated), (1, 1));
        let v2 = d.versions(&all).await.unwrap().versions;
        let b = crate::core::shard::shard_of("b", 4) as usize;
        for s in 0..4 {
            assert_eq!(v1[s] != v2[s], s == b, "shard {s}");
        }
        let sum = d.replace_all(4, &[t("c", 1)]).await.unwrap();
        assert_eq!((sum.added, sum.removed), (1, 2));
        assert_eq!(d.count(4).await.unwrap(), 1);
        let sum = d.remove(4, &["c".into(), "zz".into()]).await.unwrap();
        assert_eq!((sum.removed, sum.unchanged), (1, 1));
        assert_eq!(d.count(4).await.unwrap(), 0);
    }
}
