//! [`CoordStore`] for [`RedisStore`]: each operation is one script call, with its keys
//! and arguments laid out as the scripts in `store/lua/` expect them (see the table in
//! the parent module) and its reply parsed in `reply.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::reply::{
    acquire_outcome, bad, checked, map_ok, parse_snapshot, released, renew_outcome, uint,
};
use super::{reply, RedisStore};
use crate::core::lease::{
    AcquireOutcome, Checked, Claim, LeaseCall, Release, ReleaseNote, Released, RenewOutcome,
};
use crate::core::membership::{Member, Snapshot};
use crate::core::placement::Placement;
use crate::core::{PodId, ShardId};
use crate::store::memory::ttl_ms;
use crate::store::{placement_table, ClusterMeta, CoordStore, StoreError};

pub(super) fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn to_json(v: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| bad(format!("cannot encode: {e}")))
}

fn shard_args(mut prefix: Vec<String>, shards: &[ShardId]) -> Vec<String> {
    prefix.extend(shards.iter().map(ShardId::to_string));
    prefix
}

/// `ARGV[1..4]` of `acquire.lua` and `renew.lua`: caller generation, nonce, pod id, TTL in
/// ms.
fn lease_args(call: &LeaseCall<'_>) -> Vec<String> {
    vec![
        call.generation.to_string(),
        nonce(),
        call.pod.to_string(),
        ttl_ms(call.ttl).to_string(),
    ]
}

impl RedisStore {
    /// The upkeep arguments of `acquire.lua` and `renew.lua` (`lib.lua`, "Pod leases"):
    /// the mode and the shard count, decided by the members of the last snapshot this
    /// store read in full. Before any, each lease keeps its own expiry and nothing is
    /// converted (a pod lease left from before is deleted: the leases it kept stay held
    /// while their owner is a live member, which a pod that calls this is).
    fn upkeep(&self) -> [String; 2] {
        let view = self.shared.view.lock().expect("not poisoned");
        let (mode, shards) = view.as_deref().map_or(("lease", 0), reply::View::upkeep);
        [mode.to_string(), shards.to_string()]
    }
}

impl CoordStore for RedisStore {
    async fn pin_meta(&self, meta: &ClusterMeta) -> Result<(), StoreError> {
        let (keys, args) = (vec![self.shared.keys.meta()], vec![to_json(meta)?]);
        let reply = self.call("pin_meta", &self.shared.scripts.pin_meta, keys, args);
        match checked(reply.await?, Some(meta), 0)? {
            Checked::Ok(_) => Ok(()),
            Checked::GenerationChanged(_) => Err(bad("pin_meta answered a generation")),
        }
    }

    async fn heartbeat(
        &self,
        generation: &str,
        member: &Member,
        meta: &ClusterMeta,
        ttl: Duration,
    ) -> Result<Checked<u64>, StoreError> {
        let k = &self.shared.keys;
        let keys = vec![
            k.generation(),
            k.members(),
            k.member_info(),
            k.meta(),
            k.pod_lease(&member.pod),
        ];
        let args = vec![
            generation.to_string(),
            nonce(),
            member.pod.to_string(),
            to_json(member)?,
            to_json(meta)?,
            ttl_ms(ttl).to_string(),
            k.events(),
            k.prefix().to_string(),
        ];
        let reply = self.call("heartbeat", &self.shared.scripts.heartbeat, keys, args);
        map_ok(checked(reply.await?, Some(meta), 1)?, |beats| {
            uint(&beats[0])
        })
    }

    async fn deregister(&self, pod: &PodId) -> Result<(), StoreError> {
        let k = &self.shared.keys;
        let (keys, args) = (
            vec![k.members(), k.member_info()],
            vec![pod.to_string(), k.events()],
        );
        let reply = self.call("deregister", &self.shared.scripts.deregister, keys, args);
        uint(&reply.await?).map(|_| ())
    }

    async fn acquire(
        &self,
        call: &LeaseCall<'_>,
        claims: &[Claim],
    ) -> Result<Checked<Vec<AcquireOutcome>>, StoreError> {
        let k = &self.shared.keys;
        let shards: Vec<ShardId> = claims.iter().map(|c| c.shard).collect();
        let fixed = vec![
            k.generation(),
            k.epochs(),
            k.members(),
            k.pod_lease(call.pod),
        ];
        let mut keys = self.with_leases(fixed, &shards);
        keys.extend(shards.iter().map(|&s| k.release_note(s)));
        let mut args = lease_args(call);
        args.extend(self.upkeep());
        args.push(k.prefix().to_string());
        let mut args = shard_args(args, &shards);
        args.extend(claims.iter().map(|c| c.floor.to_string()));
        let script = &self.shared.scripts.acquire;
        let reply = self.run("acquire", script, &keys, &args, self.durable());
        map_ok(checked(reply.await?, None, shards.len())?, |v| {
            v.into_iter().map(acquire_outcome).collect()
        })
    }

    async fn renew(
        &self,
        call: &LeaseCall<'_>,
        shards: &[ShardId],
    ) -> Result<Checked<Vec<RenewOutcome>>, StoreError> {
        let k = &self.shared.keys;
        let keys = [
            k.generation(),
            k.epochs(),
            k.pod_lease(call.pod),
            k.members(),
        ];
        let mut args = lease_args(call);
        args.push(k.prefix().to_string());
        args.extend(self.upkeep());
        let args = shard_args(args, shards);
        let script = &self.shared.scripts.renew;
        let reply = self.run("renew", script, &keys, &args, self.durable());
        map_ok(checked(reply.await?, None, shards.len())?, |v| {
            v.into_iter().map(renew_outcome).collect()
        })
    }

    async fn release(
        &self,
        pod: &PodId,
        releases: &[Release],
        note: Option<&ReleaseNote>,
        ttl: Duration,
    ) -> Result<Vec<Released>, StoreError> {
        let k = &self.shared.keys;
        let shards: Vec<ShardId> = releases.iter().map(|r| r.shard).collect();
        let mut keys = self.with_leases(Vec::new(), &shards);
        keys.extend(shards.iter().map(|&s| k.release_note(s)));
        keys.extend([k.epochs(), k.members()]);
        let (member, note_ttl) = match note {
            Some(note) => (to_json(&note.member)?, ttl_ms(note.ttl).to_string()),
            None => (String::new(), String::new()),
        };
        let head = vec![
            pod.to_string(),
            k.events(),
            member,
            note_ttl,
            ttl_ms(ttl).to_string(),
            k.prefix().to_string(),
        ];
        let mut args = shard_args(head, &shards);
        args.extend(
            releases
                .iter()
                .map(|r| r.to.as_ref().map_or(String::new(), PodId::to_string)),
        );
        args.extend(releases.iter().map(|r| r.floor.to_string()));
        let reply = self.call("release", &self.shared.scripts.release, keys, args);
        released(reply.await?, shards.len())
    }

    async fn snapshot(&self, shards: u32) -> Result<Snapshot, StoreError> {
        let k = &self.shared.keys;
        let keys = vec![
            k.generation(),
            k.members(),
            k.member_info(),
            k.epochs(),
            k.placement(),
        ];
        // The view this store read last, if any, so that Redis answers only its digest
        // while it is current (`snapshot.lua`).
        let held = self.shared.view.lock().expect("not poisoned").clone();
        let digest = held.as_ref().map_or(String::new(), |v| v.digest.clone());
        let args = vec![nonce(), shards.to_string(), k.prefix().to_string(), digest];
        let reply = self.call("snapshot", &self.shared.scripts.snapshot, keys, args);
        let (snapshot, read) = parse_snapshot(reply.await?, shards, held.as_deref())?;
        if let Some(read) = read {
            *self.shared.view.lock().expect("not poisoned") = Some(Arc::new(read));
        }
        Ok(snapshot)
    }

    async fn place(
        &self,
        expected: Option<u64>,
        placement: &Placement,
    ) -> Result<bool, StoreError> {
        let k = &self.shared.keys;
        let args = vec![
            expected.map_or(String::new(), |v| v.to_string()),
            placement.version.to_string(),
            placement_table(placement)?,
            k.events(),
        ];
        let (script, keys) = (&self.shared.scripts.place, [k.placement()]);
        let reply = self.run("place", script, &keys, &args, self.durable());
        match uint(&reply.await?)? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(bad(format!("place answered {n}"))),
        }
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }
}
