//! Lease calls as the tests write them: a generation, a pod, shards and a TTL, claimed
//! without a floor (the caller knows no epoch of them). Tests of floors and bumps call
//! `CoordStore::acquire` with their own `Claim`s.

use std::time::Duration;

use posgate::core::lease::{
    AcquireOutcome, Checked, Claim, LeaseCall, Release, ReleaseNote, Released, RenewOutcome,
};
use posgate::core::{PodId, ShardId};
use posgate::store::{CoordStore, StoreError};

fn call<'a>(generation: &'a str, pod: &'a PodId, ttl: Duration) -> LeaseCall<'a> {
    LeaseCall {
        generation,
        pod,
        ttl,
    }
}

/// The lease of `shard` for `pod`, claimed with `floor` (far above the store's clock, so
/// that two stores grant the same epoch): the epoch granted.
pub async fn held_above(
    store: &impl CoordStore,
    shards: u32,
    shard: ShardId,
    pod: &PodId,
    floor: posgate::core::Epoch,
) -> posgate::core::Epoch {
    let snapshot = store.snapshot(shards).await.unwrap();
    let call = call(&snapshot.generation.id, pod, Duration::from_secs(60));
    match store
        .acquire(&call, &[Claim { shard, floor }])
        .await
        .unwrap()
    {
        Checked::Ok(outcomes) => match outcomes[..] {
            [AcquireOutcome::Acquired { epoch, .. }] => epoch,
            ref other => panic!("acquire: {other:?}"),
        },
        other => panic!("acquire: {other:?}"),
    }
}

/// `store.acquire` of `shards` with floor 0.
pub async fn acquire(
    store: &impl CoordStore,
    generation: &str,
    pod: &PodId,
    shards: &[ShardId],
    ttl: Duration,
) -> Result<Checked<Vec<AcquireOutcome>>, StoreError> {
    let claims: Vec<Claim> = shards
        .iter()
        .map(|&shard| Claim { shard, floor: 0 })
        .collect();
    store.acquire(&call(generation, pod, ttl), &claims).await
}

/// `store.renew` of `shards`.
pub async fn renew(
    store: &impl CoordStore,
    generation: &str,
    pod: &PodId,
    shards: &[ShardId],
    ttl: Duration,
) -> Result<Checked<Vec<RenewOutcome>>, StoreError> {
    store.renew(&call(generation, pod, ttl), shards).await
}

/// Releases as the tests before lease handovers wrote them: each lease deleted (no
/// target), answered `true` where one of `pod` was deleted. Tests of handovers call
/// `CoordStore::release` with their own `Release`s.
pub trait Deletes {
    fn delete(
        &self,
        pod: &PodId,
        shards: &[ShardId],
        note: Option<&ReleaseNote>,
    ) -> impl std::future::Future<Output = Result<Vec<bool>, StoreError>>;
}

impl<S: CoordStore> Deletes for S {
    async fn delete(
        &self,
        pod: &PodId,
        shards: &[ShardId],
        note: Option<&ReleaseNote>,
    ) -> Result<Vec<bool>, StoreError> {
        let releases: Vec<Release> = shards
            .iter()
            .map(|&shard| Release {
                shard,
                to: None,
                floor: 0,
            })
            .collect();
        let answers = self
            .release(pod, &releases, note, Duration::from_secs(60))
            .await?;
        Ok(answers.iter().map(|a| *a == Released::Deleted).collect())
    }
}
