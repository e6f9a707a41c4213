//! The terminal directory in Redis: [`Directory`] and [`DirectoryAdmin`] for
//! [`RedisStore`].
//!
//! Keys (see `store::keys`): two hashes per shard, `terminals:<shard>` (id -> JSON
//! [`Entry`]) and `terminal-labels:<shard>` (id -> labels text, for terminals with
//! labels), and the hash `terminals-version` (shard -> version). All share the
//! cluster's hash tag, so a script may touch several shards at once.
//!
//! | call | Redis |
//! |---|---|
//! | `terminals` | `directory_read.lua` `scan`: `HSCAN` pages of [`PAGE`] entries, so a big shard is never one giant reply; then the same for the labels hash |
//! | `versions` | `directory_read.lua` `versions`: the generation id and `HMGET` (missing = 0), one call |
//! | `count` | `directory_read.lua` `count`: sum of `HLEN` |
//! | `upsert` (`write_upserts`) | `directory_upsert.lua` per chunk of [`WRITE_CHUNK`] terminals: `HGET`, `HSET` if different (the entry and the labels), then one version bump per changed shard |
//! | `remove` (`write_removals`) | `directory_remove.lua` per chunk: `HDEL` (entry and labels), version bump per changed shard |
//! | `replace_all` | the trait's own: `terminals` of every shard, `directory::diff_shard`, then the two writes above for only the difference |
//! | `restore` | `directory_restore.lua`, one call per shard (so the checks of `directory::restore` and the write are one atomic step): generation, lease owner + epoch, shard untouched in this generation; then `HSET` every entry and its labels, the version, and the `terminals-restored` record |
//!
//! Writes are sorted by shard before chunking, so a chunk touches few shards; up to
//! [`IN_FLIGHT`] chunks are sent concurrently on the multiplexed connection. Each chunk
//! is atomic (one script); a whole write is not, and two concurrent `replace_all` calls
//! may interleave (the last chunk written wins per terminal).
//!
//! What it does not do: notify pods (they poll versions), or keep the directory across
//! a Redis that lost its data by itself: the owners write back what they hold
//! (`restore`), and shards nobody held need a re-import (versions still move forward).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use futures::{StreamExt, TryStreamExt};
use redis::{Script, Value};

use super::reply::{bad, checked, items, map_ok, restore_outcome, uint};
use super::RedisStore;
use crate::api::Labels;
use crate::core::lease::Checked;
use crate::core::ShardId;
use crate::store::directory::{
    Directory, DirectoryAdmin, Entry, Grouped, Restore, Restored, Terminal, Versions, WriteSummary,
    WRITE_CHUNK,
};
use crate::store::StoreError;

/// Entries asked for per `HSCAN` page.
pub const PAGE: usize = 1_000;
/// Write chunks (script calls) in flight at once.
pub const IN_FLIGHT: usize = 8;
/// Shards per `count` call.
const SHARDS_PER_READ: usize = 1_000;

struct DirScripts {
    read: Script,
    upsert: Script,
    remove: Script,
    restore: Script,
}

static SCRIPTS: LazyLock<DirScripts> = LazyLock::new(|| DirScripts {
    read: Script::new(include_str!("../lua/directory_read.lua")),
    upsert: Script::new(concat!(
        include_str!("../lua/lib.lua"),
        include_str!("../lua/directory_lib.lua"),
        include_str!("../lua/directory_upsert.lua")
    )),
    remove: Script::new(concat!(
        include_str!("../lua/lib.lua"),
        include_str!("../lua/directory_lib.lua"),
        include_str!("../lua/directory_remove.lua")
    )),
    restore: Script::new(concat!(
        include_str!("../lua/lib.lua"),
        include_str!("../lua/directory_restore.lua")
    )),
});

fn string(v: Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).map_err(|_| bad("non-UTF-8 string in reply")),
        Value::SimpleString(s) => Ok(s),
        other => Err(bad(format!("expected a string, got {other:?}"))),
    }
}

/// One write chunk: the shards it touches (KEYS after the versions key) and its items,
/// each naming its shard by index into that list.
struct Chunk<T> {
    shards: Vec<ShardId>,
    items: Vec<(usize, T)>,
}

/// Splits `(shard, item)` pairs (sorted by shard) into chunks of [`WRITE_CHUNK`].
fn chunks<T>(all: Vec<(ShardId, T)>) -> Vec<Chunk<T>> {
    let mut out: Vec<Chunk<T>> = Vec::new();
    for (shard, item) in all {
        if out.last().is_none_or(|c| c.items.len() >= WRITE_CHUNK) {
            out.push(Chunk {
                shards: Vec::new(),
                items: Vec::new(),
            });
        }
        let chunk = out.last_mut().expect("pushed above");
        if chunk.shards.last() != Some(&shard) {
            chunk.shards.push(shard);
        }
        chunk.items.push((chunk.shards.len(), item));
    }
    out
}

/// `{shard...}` from a write script's reply.
fn changed_shards(v: Value, summary: &mut WriteSummary) -> Result<(), StoreError> {
    for s in items(v)? {
        let shard = ShardId::try_from(uint(&s)?).map_err(|_| bad("shard out of range"))?;
        summary.changed_shards.insert(shard);
    }
    Ok(())
}

/// The `N` items of a script's reply, or an error naming `what` answered otherwise.
fn exactly<const N: usize>(what: &str, reply: Value) -> Result<[Value; N], StoreError> {
    <[Value; N]>::try_from(items(reply)?)
        .map_err(|v| bad(format!("{what}: expected {N} items, got {}", v.len())))
}

impl RedisStore {
    /// Every `(field, value)` of the hash `key`, by `HSCAN` pages of [`PAGE`] (a field
    /// may come twice; the later wins where it matters).
    async fn scan(&self, key: &str) -> Result<Vec<(String, String)>, StoreError> {
        let mut out = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let args = vec!["scan".to_string(), cursor, PAGE.to_string()];
            let reply = self.call("directory_scan", &SCRIPTS.read, vec![key.to_string()], args);
            let [next, page] = exactly("HSCAN", reply.await?)?;
            let mut page = items(page)?.into_iter();
            while let (Some(field), Some(value)) = (page.next(), page.next()) {
                out.push((string(field)?, string(value)?));
            }
            cursor = string(next)?;
            if cursor == "0" {
                return Ok(out);
            }
        }
    }

    /// The KEYS of a write script for `chunk` (the versions hash, then one terminals hash
    /// per shard, then one labels hash per shard) and the start of its ARGV (the shard
    /// ids, in the same order).
    fn write_layout<T>(&self, chunk: &Chunk<T>) -> (Vec<String>, Vec<String>) {
        let k = self.keys();
        let mut keys = vec![k.terminals_version()];
        keys.extend(chunk.shards.iter().map(|&s| k.terminals(s)));
        keys.extend(chunk.shards.iter().map(|&s| k.terminal_labels(s)));
        let args = chunk.shards.iter().map(ShardId::to_string).collect();
        (keys, args)
    }

    /// Writes one chunk of `(index, (id, json, labels text))` entries.
    async fn upsert_chunk(&self, chunk: Chunk<[String; 3]>) -> Result<WriteSummary, StoreError> {
        let (keys, mut args) = self.write_layout(&chunk);
        for (i, [id, json, labels]) in chunk.items {
            args.extend([i.to_string(), id, json, labels]);
        }
        let reply = self.call("directory_upsert", &SCRIPTS.upsert, keys, args);
        let [added, updated, unchanged, changed] = exactly("directory_upsert", reply.await?)?;
        let mut summary = WriteSummary {
            added: uint(&added)?,
            updated: uint(&updated)?,
            unchanged: uint(&unchanged)?,
            ..WriteSummary::default()
        };
        changed_shards(changed, &mut summary)?;
        Ok(summary)
    }

    /// Removes one chunk of `(index, id)` entries.
    async fn remove_chunk(&self, chunk: Chunk<String>) -> Result<WriteSummary, StoreError> {
        let (keys, mut args) = self.write_layout(&chunk);
        for (i, id) in chunk.items {
            args.extend([i.to_string(), id]);
        }
        let reply = self.call("directory_remove", &SCRIPTS.remove, keys, args);
        let [removed, absent, changed] = exactly("directory_remove", reply.await?)?;
        let mut summary = WriteSummary {
            removed: uint(&removed)?,
            unchanged: uint(&absent)?,
            ..WriteSummary::default()
        };
        changed_shards(changed, &mut summary)?;
        Ok(summary)
    }
}

/// Splits `all` (sorted by shard) into chunks, writes up to [`IN_FLIGHT`] of them at once
/// with `write`, and adds up what they did.
async fn write_chunks<T, F>(
    all: Vec<(ShardId, T)>,
    write: impl FnMut(Chunk<T>) -> F,
) -> Result<WriteSummary, StoreError>
where
    F: std::future::Future<Output = Result<WriteSummary, StoreError>>,
{
    futures::stream::iter(chunks(all))
        .map(write)
        .buffer_unordered(IN_FLIGHT)
        .try_fold(WriteSummary::default(), |mut sum, part| async move {
            sum.merge(part);
            Ok(sum)
        })
        .await
}

impl Directory for RedisStore {
    async fn terminals(&self, shard: ShardId) -> Result<Vec<Terminal>, StoreError> {
        let key = self.keys().terminals(shard);
        let mut found: BTreeMap<String, Terminal> = BTreeMap::new();
        for (id, json) in self.scan(&key).await? {
            let entry: Entry = serde_json::from_str(&json).map_err(|e| {
                bad(format!(
                    "terminal {id:?} in {key} is not a valid entry ({e}): {json:?}"
                ))
            })?;
            found.insert(id.clone(), entry.terminal(id));
        }
        // Read after the entries: a terminal imported in between has no labels yet, and
        // its write bumped the version, so the next poll reads the shard again.
        let key = self.keys().terminal_labels(shard);
        for (id, text) in self.scan(&key).await? {
            let labels = Labels::parse(&text)
                .map_err(|e| bad(format!("labels of {id:?} in {key}: {e}: {text:?}")))?;
            // Labels whose terminal is gone (a previous release's remove) count for
            // nothing.
            if let Some(t) = found.get_mut(&id) {
                t.labels = labels;
            }
        }
        Ok(found.into_values().collect())
    }

    async fn versions(&self, shards: &[ShardId]) -> Result<Versions, StoreError> {
        let k = self.keys();
        let mut args = vec!["versions".to_string()];
        args.extend(shards.iter().map(ShardId::to_string));
        let keys = vec![k.terminals_version(), k.generation()];
        let reply = self.call("directory_versions", &SCRIPTS.read, keys, args);
        let [generation, values] = exactly("directory versions", reply.await?)?;
        let generation = match generation {
            Value::Nil => None,
            v => Some(string(v)?),
        };
        let values = items(values)?;
        if values.len() != shards.len() {
            return Err(bad(format!(
                "directory versions: expected {} items, got {}",
                shards.len(),
                values.len()
            )));
        }
        let versions = values
            .into_iter()
            .map(|v| match v {
                Value::Nil => Ok(0),
                v => {
                    let s = string(v)?;
                    s.parse()
                        .map_err(|_| bad(format!("directory version {s:?} is not a number")))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Versions {
            generation,
            versions,
        })
    }

    async fn restore(&self, request: &Restore<'_>) -> Result<Checked<Restored>, StoreError> {
        if request.terminals.is_empty() {
            return Err(StoreError::Config(format!(
                "nothing to write back for shard {}",
                request.shard
            )));
        }
        let k = self.keys();
        let shard = request.shard;
        let keys = vec![
            k.generation(),
            k.epochs(),
            k.lease(shard),
            k.terminals(shard),
            k.terminals_version(),
            k.terminals_restored(),
            k.terminal_labels(shard),
        ];
        let mut args = vec![
            request.generation.to_string(),
            super::ops::nonce(),
            request.pod.to_string(),
            request.epoch.to_string(),
            request.read_in.to_string(),
            shard.to_string(),
        ];
        for t in request.terminals {
            t.validate()?;
            let json = serde_json::to_string(&t.entry())
                .map_err(|e| bad(format!("cannot encode: {e}")))?;
            args.extend([t.id.clone(), json, t.labels.to_string()]);
        }
        let reply = self.call("directory_restore", &SCRIPTS.restore, keys, args);
        map_ok(checked(reply.await?, None, 1)?, |mut outcome| {
            restore_outcome(outcome.remove(0))
        })
    }
}

impl DirectoryAdmin for RedisStore {
    async fn write_upserts(&self, grouped: Grouped<Entry>) -> Result<WriteSummary, StoreError> {
        let mut all = Vec::new();
        for (shard, entries) in grouped {
            for (id, entry) in entries {
                let json = serde_json::to_string(&entry)
                    .map_err(|e| bad(format!("cannot encode: {e}")))?;
                all.push((shard, [id, json, entry.labels.to_string()]));
            }
        }
        write_chunks(all, |c| self.upsert_chunk(c)).await
    }

    async fn write_removals(
        &self,
        grouped: BTreeMap<ShardId, BTreeSet<String>>,
    ) -> Result<WriteSummary, StoreError> {
        let all: Vec<(ShardId, String)> = grouped
            .into_iter()
            .flat_map(|(shard, ids)| ids.into_iter().map(move |id| (shard, id)))
            .collect();
        write_chunks(all, |c| self.remove_chunk(c)).await
    }

    async fn count(&self, shards: u32) -> Result<u64, StoreError> {
        let all: Vec<ShardId> = (0..shards).collect();
        let mut total = 0;
        for part in all.chunks(SHARDS_PER_READ) {
            let keys = part.iter().map(|&s| self.keys().terminals(s)).collect();
            let reply = self.call(
                "directory_count",
                &SCRIPTS.read,
                keys,
                vec!["count".to_string()],
            );
            total += uint(&reply.await?)?;
        }
        Ok(total)
    }
}
