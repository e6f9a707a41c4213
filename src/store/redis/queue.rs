//! [`QueueStore`] for [`RedisStore`]: each call one script (`store/lua/queue_*.lua`),
//! with its keys and arguments laid out as the scripts expect and its reply parsed
//! strictly. Writes wait for `--redis-wait-replicas` replicas like lease writes do: a
//! push is acknowledged (`202`) only once they have it, and a mark (a copy about to
//! leave) counts only once a promoted replica would know it.
//!
//! | call | script | keys |
//! |---|---|---|
//! | `enqueue` | `queue_enqueue.lua` | gen, seq, usage, the terminal's queue, bodies, order and collapse, the shard's waiting, the tenant's done, drops and feed, the shard's directory and lease |
//! | `write` | `queue_write.lua` | usage, the terminal's four, the shard's waiting, the tenant's three, the shard's lease, epochs |
//! | `cancel`, `purge` | `queue_cancel.lua` | usage, the terminal's four, the shard's waiting, the tenant's three |
//! | `find`, `pending`, `waiting`, `feed` | `queue_read.lua` (no writes) | what each reads |

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use redis::Value;

use super::ops::nonce;
use super::reply::{arg, bad, bytes, items, string, tagged, uint};
use super::RedisStore;
use crate::core::delivery::WallMs;
use crate::core::ShardId;
use crate::store::queue::{
    parse_bound, parse_record, push_id, Cancelled, Change, Enqueue, Enqueued, Feed, Found,
    QueueStore, Record, Waiting, Wakeup, Write, Written, FEED_MAX, GC_PER_CALL, RECORD_CHARGE,
};
use crate::store::StoreError;

fn record(v: Value) -> Result<Record, StoreError> {
    parse_record(&bytes(v)?)
}

/// The records of a list reply; one that cannot be read is left out with a warning
/// (something other than posgate wrote it), so it cannot hold up the others.
fn records(v: Value) -> Result<Vec<Record>, StoreError> {
    Ok(items(v)?
        .into_iter()
        .filter_map(|item| match record(item) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "a queued push record in Redis cannot be read; left out");
                None
            }
        })
        .collect())
}

/// The tail of the finishing scripts' arguments: charge per record, drops per call,
/// feed length.
fn finish_args() -> [Vec<u8>; 3] {
    [
        RECORD_CHARGE.to_string().into_bytes(),
        GC_PER_CALL.to_string().into_bytes(),
        FEED_MAX.to_string().into_bytes(),
    ]
}

fn json(record: &Record) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(record).map_err(|e| bad(format!("cannot encode a record: {e}")))
}

impl RedisStore {
    /// The keys of a terminal's queue and its shard's waiting hash, in the order the
    /// writing scripts take them after `queue-usage`.
    fn terminal_keys(&self, terminal: &str, shard: ShardId) -> [String; 5] {
        let k = &self.shared.keys;
        [
            k.queue(terminal),
            k.queue_bodies(terminal),
            k.queue_order(terminal),
            k.queue_collapse(terminal),
            k.queue_waiting(shard),
        ]
    }

    fn tenant_keys(&self, tenant: &str) -> [String; 3] {
        let k = &self.shared.keys;
        [
            k.queue_done(tenant),
            k.queue_drops(tenant),
            k.queue_feed(tenant),
        ]
    }

    async fn enqueue_call(&self, e: &Enqueue) -> Result<Enqueued, StoreError> {
        let k = &self.shared.keys;
        let r = &e.record;
        let mut keys = vec![k.generation(), k.queue_seq(), k.queue_usage()];
        keys.extend(self.terminal_keys(&r.terminal, e.shard));
        keys.extend(self.tenant_keys(&r.tenant));
        keys.extend([k.terminals(e.shard), k.lease(e.shard)]);
        let [charge, per_call, feed] = finish_args();
        let args = vec![
            arg(nonce()),
            arg(&e.id),
            json(r)?,
            e.body.to_vec(),
            arg(u8::from(e.check_directory)),
            arg(&e.pod),
            arg(e.limits.per_terminal),
            arg(e.limits.tenant_bytes),
            arg(e.limits.cluster_bytes),
            arg(e.limits.retention_ms),
            charge,
            per_call,
            feed,
            arg(k.events()),
            arg(e.shard),
        ];
        let script = &self.shared.scripts.queue_enqueue;
        let reply = self
            .run("queue_enqueue", script, &keys, &args, self.durable())
            .await?;
        let (tag, rest) = tagged(reply)?;
        match (tag.as_str(), <[Value; 3]>::try_from(rest)) {
            ("accepted", Ok([position, generation, replaced])) => Ok(Enqueued::Accepted {
                position: u32::try_from(uint(&position)?).map_err(bad)?,
                generation: string(generation)?,
                replaced: Some(string(replaced)?).filter(|k| !k.is_empty()),
            }),
            ("existing", Err(rest)) if rest.len() == 2 => {
                let [json, generation] = <[Value; 2]>::try_from(rest).expect("checked");
                Ok(Enqueued::Existing {
                    record: Box::new(record(json)?),
                    generation: string(generation)?,
                })
            }
            ("conflict", Err(rest)) if rest.is_empty() => Ok(Enqueued::Conflict),
            ("unknown_terminal", Err(rest)) if rest.is_empty() => Ok(Enqueued::UnknownTerminal),
            ("full", Err(mut rest)) if rest.len() == 1 => {
                Ok(Enqueued::Full(parse_bound(&string(rest.remove(0))?)?))
            }
            (tag, _) => Err(bad(format!("unexpected queue_enqueue reply {tag:?}"))),
        }
    }

    async fn write_call(&self, w: &Write) -> Result<Written, StoreError> {
        let k = &self.shared.keys;
        let r = &w.record;
        let mut keys = vec![k.queue_usage()];
        keys.extend(self.terminal_keys(&r.terminal, w.shard));
        keys.extend(self.tenant_keys(&r.tenant));
        keys.extend([k.lease(w.shard), k.epochs()]);
        let (change, pod, epoch, retention) = match &w.change {
            Change::Mark { pod, epoch } => ("mark", pod.to_string(), epoch.to_string(), 0),
            Change::Unsent => ("unsent", String::new(), String::new(), 0),
            Change::Final { retention_ms } => {
                ("final", String::new(), String::new(), *retention_ms)
            }
        };
        let [charge, per_call, feed] = finish_args();
        let args = vec![
            arg(&w.id),
            arg(w.expect),
            json(r)?,
            arg(change),
            arg(pod),
            arg(epoch),
            arg(w.shard),
            arg(w.now),
            arg(retention),
            charge,
            per_call,
            feed,
        ];
        let script = &self.shared.scripts.queue_write;
        let reply = self
            .run("queue_write", script, &keys, &args, self.durable())
            .await?;
        let (tag, mut rest) = tagged(reply)?;
        match (tag.as_str(), rest.len()) {
            ("done", 0) => Ok(Written::Done { body: None }),
            ("done", 1) => Ok(Written::Done {
                body: Some(Bytes::from(bytes(rest.remove(0))?)),
            }),
            ("changed", 1) => Ok(Written::Changed(Box::new(record(rest.remove(0))?))),
            ("gone", 0) => Ok(Written::Gone),
            ("not_holder", 0) => Ok(Written::NotHolder),
            ("no_body", 0) => {
                tracing::error!(id = %w.id, "a queued push in Redis has no body; not sent");
                Ok(Written::Gone)
            }
            (tag, n) => Err(bad(format!(
                "unexpected queue_write reply {tag:?} with {n} items"
            ))),
        }
    }

    async fn cancel_call(
        &self,
        shard: ShardId,
        tenant: &str,
        terminal: &str,
        id: Option<&str>,
        now: WallMs,
        retention_ms: u64,
    ) -> Result<Cancelled, StoreError> {
        let mut keys = vec![self.shared.keys.queue_usage()];
        keys.extend(self.terminal_keys(terminal, shard));
        keys.extend(self.tenant_keys(tenant));
        let [charge, per_call, feed] = finish_args();
        let args = vec![
            arg(tenant),
            arg(id.unwrap_or("")),
            arg(now),
            arg(retention_ms),
            charge,
            per_call,
            feed,
        ];
        let script = &self.shared.scripts.queue_cancel;
        let reply = self
            .run("queue_cancel", script, &keys, &args, self.durable())
            .await?;
        let [cancelled, left] = <[Value; 2]>::try_from(items(reply)?)
            .map_err(|v| bad(format!("queue_cancel answered {} parts", v.len())))?;
        Ok(Cancelled {
            cancelled: items(cancelled)?
                .into_iter()
                .map(string)
                .collect::<Result<_, _>>()?,
            in_flight: records(left)?,
        })
    }

    async fn read(&self, keys: Vec<String>, args: Vec<Vec<u8>>) -> Result<Value, StoreError> {
        let script = &self.shared.scripts.queue_read;
        self.run("queue_read", script, &keys, &args, None).await
    }
}

/// A generation id from a read: `''` means none.
fn generation(v: Value) -> Result<Option<String>, StoreError> {
    Ok(Some(string(v)?).filter(|g| !g.is_empty()))
}

/// Whether `cursor` is a stream id (`<ms>-<seq>`), the only cursor a feed read takes.
fn stream_id(cursor: &str) -> bool {
    cursor.split_once('-').is_some_and(|(ms, seq)| {
        [ms, seq]
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 20 && p.bytes().all(|b| b.is_ascii_digit()))
    })
}

impl QueueStore for RedisStore {
    fn enqueue<'a>(&'a self, e: &'a Enqueue) -> BoxFuture<'a, Result<Enqueued, StoreError>> {
        self.enqueue_call(e).boxed()
    }

    fn write<'a>(&'a self, w: &'a Write) -> BoxFuture<'a, Result<Written, StoreError>> {
        self.write_call(w).boxed()
    }

    fn find<'a>(
        &'a self,
        tenant: &'a str,
        terminal: &'a str,
        key: &'a str,
        now: WallMs,
    ) -> BoxFuture<'a, Result<Found, StoreError>> {
        async move {
            let k = &self.shared.keys;
            let keys = vec![
                k.generation(),
                k.queue(terminal),
                k.queue_done(tenant),
                k.queue_drops(tenant),
            ];
            let args = vec![arg("find"), arg(push_id(tenant, terminal, key)), arg(now)];
            let [gen, json] = <[Value; 2]>::try_from(items(self.read(keys, args).await?)?)
                .map_err(|v| bad(format!("queue find answered {} parts", v.len())))?;
            let json = bytes(json)?;
            Ok(Found {
                generation: generation(gen)?,
                record: if json.is_empty() {
                    None
                } else {
                    Some(parse_record(&json)?)
                },
            })
        }
        .boxed()
    }

    fn pending<'a>(&'a self, terminal: &'a str) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        async move {
            let k = &self.shared.keys;
            let keys = vec![k.queue(terminal), k.queue_order(terminal)];
            records(self.read(keys, vec![arg("pending")]).await?)
        }
        .boxed()
    }

    fn waiting<'a>(
        &'a self,
        shards: &'a [ShardId],
    ) -> BoxFuture<'a, Result<Vec<Waiting>, StoreError>> {
        async move {
            if shards.is_empty() {
                return Ok(Vec::new());
            }
            let keys = shards
                .iter()
                .map(|&s| self.shared.keys.queue_waiting(s))
                .collect();
            let per_shard = items(self.read(keys, vec![arg("waiting")]).await?)?;
            if per_shard.len() != shards.len() {
                return Err(bad("queue waiting answered another number of shards"));
            }
            let mut out = Vec::new();
            for (&shard, flat) in shards.iter().zip(per_shard) {
                let flat = items(flat)?;
                if flat.len() % 2 != 0 {
                    return Err(bad("queue waiting answered an odd list"));
                }
                let mut it = flat.into_iter();
                while let (Some(t), Some(n)) = (it.next(), it.next()) {
                    // An entry that cannot be read is left out, not the whole scan.
                    let entry = string(t).and_then(|t| {
                        let n = string(n)?.parse::<u32>().map_err(bad)?;
                        Ok((shard, t, n))
                    });
                    match entry {
                        Ok(entry) => out.push(entry),
                        Err(e) => tracing::warn!(shard, error = %e, "a queue waiting entry in Redis cannot be read; left out"),
                    }
                }
            }
            Ok(out)
        }
        .boxed()
    }

    fn cancel<'a>(
        &'a self,
        shard: ShardId,
        tenant: &'a str,
        terminal: &'a str,
        key: &'a str,
        now: WallMs,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<Cancelled, StoreError>> {
        async move {
            let id = push_id(tenant, terminal, key);
            self.cancel_call(shard, tenant, terminal, Some(&id), now, retention_ms)
                .await
        }
        .boxed()
    }

    fn purge<'a>(
        &'a self,
        shard: ShardId,
        tenant: &'a str,
        terminal: &'a str,
        now: WallMs,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<Cancelled, StoreError>> {
        self.cancel_call(shard, tenant, terminal, None, now, retention_ms)
            .boxed()
    }

    fn wakeups(&self) -> tokio::sync::broadcast::Receiver<Wakeup> {
        self.shared.wakeups.subscribe()
    }

    fn feed<'a>(
        &'a self,
        tenant: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Feed, StoreError>> {
        async move {
            if after.is_some_and(|a| !stream_id(a)) {
                return Err(StoreError::Config(format!("not a feed cursor: {after:?}")));
            }
            let k = &self.shared.keys;
            let keys = vec![k.generation(), k.queue_feed(tenant)];
            let args = vec![arg("feed"), arg(after.unwrap_or("")), arg(limit.max(1))];
            let mut parts = items(self.read(keys, args).await?)?.into_iter();
            let (Some(gen), Some(gap)) = (parts.next(), parts.next()) else {
                return Err(bad("queue feed answered too few parts"));
            };
            let events = parts
                .map(|entry| {
                    let [cursor, json] = <[Value; 2]>::try_from(items(entry)?)
                        .map_err(|_| bad("a feed entry is not (cursor, record)"))?;
                    Ok((string(cursor)?, record(json)?))
                })
                .collect::<Result<_, StoreError>>()?;
            Ok(Feed {
                events,
                generation: generation(gen)?,
                gap: uint(&gap)? == 1,
            })
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::stream_id;

    #[test]
    fn feed_cursors_are_stream_ids() {
        assert!(stream_id("1764412800000-0"));
        assert!(stream_id("0-12"));
        for bad in [
            "", "-", "1-", "-1", "1", "1-2-3", "a-1", "+", "(1-0", "1 -0",
        ] {
            assert!(!stream_id(bad), "{bad}");
        }
    }
}
