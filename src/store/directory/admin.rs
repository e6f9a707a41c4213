//! Writes to the terminal directory ([`DirectoryAdmin`], `posgate terminals ...`): input
//! validated and grouped by shard ([`by_shard`], [`ids_by_shard`]) before anything is
//! written, and `replace_all` as a per-shard difference ([`diff_shard`]), so that only
//! shards whose content changes get a new version. A store implements the two grouped
//! writes; the rest is here, once for every store.
//!
//! Not for: reading (`Directory`) or what a valid terminal is (`Terminal::validate`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{stream, StreamExt, TryStreamExt};

use super::{Directory, Entry, InvalidTerminal, Shown, Terminal};
use crate::api::valid_terminal_id;
use crate::core::shard::shard_of;
use crate::core::ShardId;
use crate::store::StoreError;

/// Writes to the directory. `shards` is the cluster's shard count (it decides each
/// terminal's shard); every call validates its input first and writes nothing if any
/// terminal or id is invalid or repeated (`StoreError::Config`).
///
/// A store implements the two grouped writes and `count`; validation, grouping and the
/// per-shard diff of `replace_all` are the provided methods, so every store checks its
/// input by the same rules and writes only the shards that change.
pub trait DirectoryAdmin: Directory {
    /// Writes already validated terminals, grouped by shard ([`by_shard`]).
    fn write_upserts(
        &self,
        grouped: Grouped<Entry>,
    ) -> impl Future<Output = Result<WriteSummary, StoreError>> + Send;

    /// Deletes already validated ids, grouped by shard ([`ids_by_shard`]); absent ones
    /// count as `unchanged`.
    fn write_removals(
        &self,
        grouped: BTreeMap<ShardId, BTreeSet<String>>,
    ) -> impl Future<Output = Result<WriteSummary, StoreError>> + Send;

    /// The number of terminals in shards `0..shards`.
    fn count(&self, shards: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Adds or updates `terminals`; versions change only for shards whose content changed.
    fn upsert(
        &self,
        shards: u32,
        terminals: &[Terminal],
    ) -> impl Future<Output = Result<WriteSummary, StoreError>> + Send {
        async move { self.write_upserts(by_shard(shards, terminals)?).await }
    }

    /// Removes the terminals with these ids (absent ones count as `unchanged`).
    fn remove(
        &self,
        shards: u32,
        ids: &[String],
    ) -> impl Future<Output = Result<WriteSummary, StoreError>> + Send {
        async move { self.write_removals(ids_by_shard(shards, ids)?).await }
    }

    /// `terminals` with the labels the directory holds for them now (none for a new
    /// one): what an import file without a `labels` column means, since it says nothing
    /// about labels and must not clear them. Reads each shard it touches once.
    fn with_stored_labels(
        &self,
        shards: u32,
        mut terminals: Vec<Terminal>,
    ) -> impl Future<Output = Result<Vec<Terminal>, StoreError>> + Send {
        async move {
            let touched: BTreeSet<ShardId> =
                terminals.iter().map(|t| shard_of(&t.id, shards)).collect();
            let stored: Vec<Vec<Terminal>> = stream::iter(touched)
                .map(|s| self.terminals(s))
                .buffered(READS_IN_FLIGHT)
                .try_collect()
                .await?;
            let mut labels: BTreeMap<String, _> = stored
                .into_iter()
                .flatten()
                .map(|t| (t.id, t.labels))
                .collect();
            for t in &mut terminals {
                t.labels = labels.remove(&t.id).unwrap_or_default();
            }
            Ok(terminals)
        }
    }

    /// An import: adds or updates `terminals`; with `labeled` false (the file or request
    /// named no labels) each keeps its stored labels. With `replace`, also removes every
    /// terminal not among them. What `posgate terminals import` and the directory API do.
    fn import(
        &self,
        shards: u32,
        terminals: Vec<Terminal>,
        labeled: bool,
        replace: bool,
    ) -> impl Future<Output = Result<WriteSummary, StoreError>> + Send {
        async move {
            let terminals = if labeled {
                terminals
            } else {
                self.with_stored_labels(shards, terminals).await?
            };
            if replace {
                self.replace_all(shards, &terminals).await
            } else {
                self.upsert(shards, &terminals).await
            }
        }
    }

    /// Makes the directory hold exactly `terminals` in shards `0..shards`: reads each
    /// shard, computes the difference ([`diff_shard`]) and applies only that. Not atomic
    /// (a write racing with it may be undone or kept); repeating it converges.
    fn replace_all(
        &self,
        shards: u32,
        terminals: &[Terminal],
    ) -> impl Future<Output = Result<WriteSummary, StoreError>> + Send {
        async move {
            let desired = by_shard(shards, terminals)?;
            let current: Vec<(ShardId, Vec<Terminal>)> = stream::iter(0..shards)
                .map(|s| async move { Ok::<_, StoreError>((s, self.terminals(s).await?)) })
                .buffered(READS_IN_FLIGHT)
                .try_collect()
                .await?;
            let empty = BTreeMap::new();
            let (mut upserts, mut removals) = (BTreeMap::new(), BTreeMap::new());
            let mut unchanged = 0;
            for (shard, held) in current {
                let diff = diff_shard(&held, desired.get(&shard).unwrap_or(&empty));
                unchanged += diff.unchanged;
                if !diff.upserts.is_empty() {
                    let entries = diff.upserts.into_iter().map(|t| {
                        let entry = t.entry();
                        (t.id, entry)
                    });
                    upserts.insert(shard, entries.collect());
                }
                if !diff.removals.is_empty() {
                    removals.insert(shard, diff.removals.into_iter().collect());
                }
            }
            let mut summary = self.write_upserts(upserts).await?;
            summary.merge(self.write_removals(removals).await?);
            summary.unchanged += unchanged;
            Ok(summary)
        }
    }
}

/// The directory's writes for one cluster behind a pointer, for the directory API
/// (`http::directory`): [`DirectoryAdmin`] with the shard count fixed and the futures
/// boxed. Made by [`edits`].
pub trait DirectoryEdits: Send + Sync + 'static {
    /// [`DirectoryAdmin::import`].
    fn import(
        &self,
        terminals: Vec<Terminal>,
        labeled: bool,
        replace: bool,
    ) -> BoxFuture<'_, Result<WriteSummary, StoreError>>;

    /// Removes the terminals with these ids.
    fn remove<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<WriteSummary, StoreError>>;

    /// Every terminal of every shard, read a few shards at a time (a broadcast's dry
    /// run counts what it would select).
    fn all(&self) -> BoxFuture<'_, Result<Vec<Terminal>, StoreError>>;
}

/// [`DirectoryEdits`] over `store`, whose cluster has `shards` shards.
pub fn edits<D: DirectoryAdmin>(store: Arc<D>, shards: u32) -> Arc<dyn DirectoryEdits> {
    Arc::new(Edits { store, shards })
}

struct Edits<D> {
    store: Arc<D>,
    shards: u32,
}

impl<D: DirectoryAdmin> DirectoryEdits for Edits<D> {
    fn import(
        &self,
        terminals: Vec<Terminal>,
        labeled: bool,
        replace: bool,
    ) -> BoxFuture<'_, Result<WriteSummary, StoreError>> {
        Box::pin(DirectoryAdmin::import(
            &*self.store,
            self.shards,
            terminals,
            labeled,
            replace,
        ))
    }

    fn remove<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<WriteSummary, StoreError>> {
        Box::pin(DirectoryAdmin::remove(&*self.store, self.shards, ids))
    }

    fn all(&self) -> BoxFuture<'_, Result<Vec<Terminal>, StoreError>> {
        Box::pin(async move {
            let shards: Vec<Vec<Terminal>> = stream::iter(0..self.shards)
                .map(|s| self.store.terminals(s))
                .buffered(READS_IN_FLIGHT)
                .try_collect()
                .await?;
            Ok(shards.into_iter().flatten().collect())
        })
    }
}

/// Validated entries grouped by shard, then id: what [`by_shard`] returns.
pub type Grouped<T> = BTreeMap<ShardId, BTreeMap<String, T>>;

/// Shards `replace_all` reads at once.
const READS_IN_FLIGHT: usize = 8;

/// What a write did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteSummary {
    pub added: u64,
    pub updated: u64,
    pub removed: u64,
    /// Already as asked: an upserted terminal with the same entry, or a removed id that
    /// was absent.
    pub unchanged: u64,
    /// Shards whose content (and so version) changed.
    pub changed_shards: BTreeSet<ShardId>,
}

impl WriteSummary {
    /// Adds `other`'s counts and shards to this one.
    pub fn merge(&mut self, other: WriteSummary) {
        self.added += other.added;
        self.updated += other.updated;
        self.removed += other.removed;
        self.unchanged += other.unchanged;
        self.changed_shards.extend(other.changed_shards);
    }
}

/// Validates every terminal and refuses repeated ids; returns them grouped by shard
/// (sorted by shard, then id).
pub fn by_shard(shards: u32, terminals: &[Terminal]) -> Result<Grouped<Entry>, InvalidTerminal> {
    let mut out: Grouped<Entry> = BTreeMap::new();
    for t in terminals {
        t.validate()?;
        let shard = shard_of(&t.id, shards);
        if out
            .entry(shard)
            .or_default()
            .insert(t.id.clone(), t.entry())
            .is_some()
        {
            return Err(InvalidTerminal::Duplicate(t.id.clone()));
        }
    }
    Ok(out)
}

/// Validates ids and refuses repeats; returns them grouped by shard.
pub fn ids_by_shard(
    shards: u32,
    ids: &[String],
) -> Result<BTreeMap<ShardId, BTreeSet<String>>, InvalidTerminal> {
    let mut out: BTreeMap<ShardId, BTreeSet<String>> = BTreeMap::new();
    for id in ids {
        if !valid_terminal_id(id) {
            return Err(InvalidTerminal::Id(Shown::new(id)));
        }
        if !out
            .entry(shard_of(id, shards))
            .or_default()
            .insert(id.clone())
        {
            return Err(InvalidTerminal::Duplicate(id.clone()));
        }
    }
    Ok(out)
}

/// What to write to turn one shard's `current` terminals into `desired`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardDiff {
    /// New or changed terminals.
    pub upserts: Vec<Terminal>,
    /// Ids to delete.
    pub removals: Vec<String>,
    /// Terminals already as desired.
    pub unchanged: u64,
}

/// The difference between a shard's `current` terminals and the `desired` ones.
pub fn diff_shard(current: &[Terminal], desired: &BTreeMap<String, Entry>) -> ShardDiff {
    let mut diff = ShardDiff::default();
    let mut have: BTreeMap<&str, &Terminal> = BTreeMap::new();
    for t in current {
        have.insert(t.id.as_str(), t);
        if !desired.contains_key(&t.id) {
            diff.removals.push(t.id.clone());
        }
    }
    for (id, entry) in desired {
        match have.get(id.as_str()) {
            Some(t) if t.addr == entry.addr && t.server_name == entry.server_name => {
                diff.unchanged += 1;
            }
            _ => diff.upserts.push(entry.clone().terminal(id.clone())),
        }
    }
    diff
}

impl fmt::Display for WriteSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} added, {} updated, {} removed, {} unchanged; {} shards changed",
            self.added,
            self.updated,
            self.removed,
            self.unchanged,
            self.changed_shards.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_refuses_duplicates() {
        let a = Terminal::new("a", "h:1", None).unwrap();
        let b = Terminal::new("b", "h:2", None).unwrap();
        let grouped = by_shard(4, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(grouped.values().map(BTreeMap::len).sum::<usize>(), 2);
        assert_eq!(
            by_shard(4, &[a.clone(), b, a]),
            Err(InvalidTerminal::Duplicate("a".into()))
        );
        assert!(ids_by_shard(4, &["a".into(), "a".into()]).is_err());
        assert!(ids_by_shard(4, &["a b".into()]).is_err());
    }

    #[test]
    fn diff() {
        let t = |id: &str, port: u16| Terminal::new(id, &format!("h:{port}"), None).unwrap();
        let current = vec![t("a", 1), t("b", 2), t("c", 3)];
        let desired = by_shard(1, &[t("b", 2), t("c", 4), t("d", 5)]).unwrap();
        let d = diff_shard(&current, &desired[&0]);
        assert_eq!(d.upserts, vec![t("c", 4), t("d", 5)]);
        assert_eq!(d.removals, vec!["a".to_string()]);
        assert_eq!(d.unchanged, 1);
    }
}
