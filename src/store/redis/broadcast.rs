//! [`BroadcastStore`] for [`RedisStore`]: each call one script
//! (`store/lua/broadcast_*.lua`). A create and a mark write wait for
//! `--redis-wait-replicas` replicas like a queued push does: a broadcast is acknowledged
//! (`202`) only once they have it, and a `sending` mark counts only once a promoted
//! replica would know it (else a new owner could send again past the terminal's window).
//!
//! | call | script | keys |
//! |---|---|---|
//! | `create` | `broadcast_create.lua` | the record, the unexpired set |
//! | `write_marks` | `broadcast_marks.lua` | the shard's lease, epochs, the record, the shard's marks, the progress |
//! | `find`, `active`, `body`, `marks` | `broadcast_read.lua` (no writes) | what each reads |

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use redis::Value;

use super::reply::{arg, bad, bytes, items, string, tagged, uint};
use super::RedisStore;
use crate::core::delivery::WallMs;
use crate::core::ShardId;
use crate::store::broadcast::{
    parse_broadcast, parse_progress, BroadcastStore, Create, Created, Found, Mark, MarkWrite,
    MarksWritten,
};
use crate::store::queue::Wakeup;
use crate::store::StoreError;

impl RedisStore {
    async fn broadcast_read(
        &self,
        keys: Vec<String>,
        args: Vec<Vec<u8>>,
    ) -> Result<Value, StoreError> {
        let script = &self.shared.scripts.broadcast_read;
        self.run("broadcast_read", script, &keys, &args, None).await
    }

    async fn create_call(&self, c: &Create) -> Result<Created, StoreError> {
        let k = &self.shared.keys;
        let b = &c.broadcast;
        let keys = vec![k.broadcast(&b.id), k.broadcasts()];
        let record = serde_json::to_vec(b).map_err(|e| bad(format!("cannot encode: {e}")))?;
        let args = vec![
            arg(&b.id),
            record,
            c.body.to_vec(),
            arg(c.now_ms),
            arg(b.expires_ms),
            arg(c.keep_until_ms),
            arg(c.max_active),
            arg(k.events()),
        ];
        let script = &self.shared.scripts.broadcast_create;
        let reply = self
            .run("broadcast_create", script, &keys, &args, self.durable())
            .await?;
        let (tag, mut rest) = tagged(reply)?;
        match (tag.as_str(), rest.len()) {
            ("new", 0) => Ok(Created::New),
            ("existing", 1) => Ok(Created::Existing(Box::new(parse_broadcast(&bytes(
                rest.remove(0),
            )?)?))),
            ("full", 1) => Ok(Created::Full {
                active: uint(&rest[0])? as usize,
            }),
            (tag, n) => Err(bad(format!(
                "unexpected broadcast_create reply {tag:?} with {n} items"
            ))),
        }
    }

    async fn find_call(&self, id: &str) -> Result<Option<Found>, StoreError> {
        let k = &self.shared.keys;
        let keys = vec![k.broadcast(id), k.broadcast_progress(id)];
        let reply = self.broadcast_read(keys, vec![arg("find")]).await?;
        let [meta, progress] = <[Value; 2]>::try_from(items(reply)?)
            .map_err(|v| bad(format!("broadcast find answered {} parts", v.len())))?;
        let meta = bytes(meta)?;
        if meta.is_empty() {
            return Ok(None);
        }
        let mut shards = BTreeMap::new();
        let mut flat = items(progress)?.into_iter();
        while let (Some(shard), Some(json)) = (flat.next(), flat.next()) {
            let shard = string(shard)?
                .parse::<ShardId>()
                .map_err(|_| bad("a broadcast progress field is not a shard"))?;
            shards.insert(shard, parse_progress(&bytes(json)?)?);
        }
        Ok(Some(Found {
            broadcast: parse_broadcast(&meta)?,
            shards,
        }))
    }

    async fn active_call(&self, now: WallMs) -> Result<Vec<String>, StoreError> {
        let keys = vec![self.shared.keys.broadcasts()];
        let ids = self
            .broadcast_read(keys, vec![arg("active"), arg(now)])
            .await?;
        items(ids)?.into_iter().map(string).collect()
    }

    async fn body_call(&self, id: &str) -> Result<Option<Bytes>, StoreError> {
        let keys = vec![self.shared.keys.broadcast(id)];
        let body = bytes(self.broadcast_read(keys, vec![arg("body")]).await?)?;
        // A broadcast's body may be empty: only a missing record is `None`.
        if body.is_empty() && self.find_call(id).await?.is_none() {
            return Ok(None);
        }
        Ok(Some(Bytes::from(body)))
    }

    async fn marks_call(
        &self,
        id: &str,
        shard: ShardId,
    ) -> Result<HashMap<String, Mark>, StoreError> {
        let keys = vec![self.shared.keys.broadcast_marks(id, shard)];
        let mut flat = items(self.broadcast_read(keys, vec![arg("marks")]).await?)?.into_iter();
        let mut marks = HashMap::new();
        while let (Some(terminal), Some(mark)) = (flat.next(), flat.next()) {
            let mark = string(mark)?;
            let mark = Mark::parse(&mark).ok_or_else(|| bad(format!("not a mark: {mark:?}")))?;
            marks.insert(string(terminal)?, mark);
        }
        Ok(marks)
    }

    async fn write_marks_call(&self, w: &MarkWrite) -> Result<MarksWritten, StoreError> {
        let k = &self.shared.keys;
        let keys = vec![
            k.lease(w.shard),
            k.epochs(),
            k.broadcast(&w.id),
            k.broadcast_marks(&w.id, w.shard),
            k.broadcast_progress(&w.id),
        ];
        let progress = match &w.progress {
            Some(p) => serde_json::to_vec(p).map_err(|e| bad(format!("cannot encode: {e}")))?,
            None => Vec::new(),
        };
        let mut args = vec![
            arg(&w.pod),
            arg(w.epoch),
            arg(w.shard),
            arg(w.keep_until_ms),
            progress,
        ];
        for (terminal, mark) in &w.marks {
            args.extend([arg(terminal), arg(mark.text())]);
        }
        for (terminal, since_ms) in &w.unsent {
            let sending = Mark::Sending {
                since_ms: *since_ms,
            };
            args.extend([arg(terminal), arg(format!("-{}", sending.text()))]);
        }
        let script = &self.shared.scripts.broadcast_marks;
        let reply = self
            .run("broadcast_marks", script, &keys, &args, self.durable())
            .await?;
        let (tag, rest) = tagged(reply)?;
        match tag.as_str() {
            "not_holder" if rest.is_empty() => Ok(MarksWritten::NotHolder),
            "done" if rest.len() == w.marks.len() + w.unsent.len() => {
                let kept = rest
                    .into_iter()
                    .take(w.marks.len())
                    .map(|v| {
                        let text = string(v)?;
                        if text.is_empty() {
                            return Ok(None);
                        }
                        Mark::parse(&text)
                            .map(Some)
                            .ok_or_else(|| bad(format!("not a mark: {text:?}")))
                    })
                    .collect::<Result<_, StoreError>>()?;
                Ok(MarksWritten::Done { kept })
            }
            tag => Err(bad(format!(
                "unexpected broadcast_marks reply {tag:?} with {} items",
                rest.len()
            ))),
        }
    }
}

impl BroadcastStore for RedisStore {
    fn create<'a>(&'a self, c: &'a Create) -> BoxFuture<'a, Result<Created, StoreError>> {
        self.create_call(c).boxed()
    }

    fn find<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Found>, StoreError>> {
        self.find_call(id).boxed()
    }

    fn active(&self, now: WallMs) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        self.active_call(now).boxed()
    }

    fn body<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Bytes>, StoreError>> {
        self.body_call(id).boxed()
    }

    fn marks<'a>(
        &'a self,
        id: &'a str,
        shard: ShardId,
    ) -> BoxFuture<'a, Result<HashMap<String, Mark>, StoreError>> {
        self.marks_call(id, shard).boxed()
    }

    fn write_marks<'a>(
        &'a self,
        w: &'a MarkWrite,
    ) -> BoxFuture<'a, Result<MarksWritten, StoreError>> {
        self.write_marks_call(w).boxed()
    }

    fn news(&self) -> tokio::sync::broadcast::Receiver<Wakeup> {
        self.shared.wakeups.subscribe()
    }
}
