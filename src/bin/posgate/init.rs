//! `posgate init`: makes a new cluster's store ready before its first pod starts, so the
//! pods of a brand-new cluster dial at once instead of waiting out the recovery hold.
//!
//! Why a new cluster waits at all: a pod cannot tell a fresh Redis from one restarted
//! empty (both have no store generation), and after a restart pods of the old generation
//! may still serve until their lease deadlines. So every pod holds its claims until the
//! generation is one member TTL old (`core::reconciler::recovery`), which on a fresh
//! cluster is the first ~15 s of every pod's life. `init` pays that wait once, before
//! any pod exists: it creates the generation (as any pod's first call would), pins the
//! cluster metadata, and returns when the generation is one member TTL old by the
//! store's clock. Pods started then compute no hold left (`member_ttl - age`).
//!
//! Why that is exactly as safe as the hold: the pods' rule is unchanged. The hold is
//! measured from the generation's creation by the store clock; init only creates it
//! earlier and waits it out. A Redis that lost its data afterwards has no generation, so
//! the next one is created by a pod's call and held as before; a generation created by
//! init on a Redis wiped under a live cluster is held by those pods the same way, and
//! any pod still inside a pre-wipe lease deadline is past it before the generation is
//! one member TTL old (`CoreConfig::validate`), so no pod can overtake it sooner than
//! without init. Running it again is harmless (it finds the generation old and returns).
//!
//! Not for: the flags (`posgate::config::init_args`).

use std::process::ExitCode;
use std::time::Duration;

use posgate::config::init_args::InitArgs;
use posgate::store::redis::RedisStore;
use posgate::store::{ClusterMeta, CoordStore};

use crate::{exit_code_for, or_usage, runtime};

/// `posgate init`: one line on stdout when the store is ready; exit 2 for bad flags or a
/// cluster pinned with other metadata, 1 when Redis cannot be reached.
pub fn main(args: InitArgs) -> ExitCode {
    run(args).unwrap_or_else(|code| code)
}

fn run(args: InitArgs) -> Result<ExitCode, ExitCode> {
    let settings = or_usage(args.store.resolve())?;
    let runtime = runtime()?;
    let ready = async {
        let options = settings.redis_options();
        let store = RedisStore::connect(&settings.redis_url, &settings.cluster, options).await?;
        init(&store, args.store.shards, args.member_ttl).await
    };
    match runtime.block_on(ready) {
        Ok(line) => {
            println!("{line}");
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            Err(exit_code_for(&err))
        }
    }
}

/// Pins the metadata, then waits until the store generation is `member_ttl` old; returns
/// what to print. A generation that changes meanwhile (Redis restarted empty) is waited
/// out from its own creation.
async fn init<S: CoordStore>(
    store: &S,
    shards: u32,
    member_ttl: Duration,
) -> anyhow::Result<String> {
    store.pin_meta(&ClusterMeta::current(shards)).await?;
    let mut first: Option<String> = None;
    loop {
        let snapshot = store.snapshot(shards).await?;
        let generation = snapshot.generation;
        let created = first.get_or_insert_with(|| generation.id.clone());
        if *created != generation.id {
            eprintln!(
                "the store generation changed while waiting ({created} -> {}): Redis lost its data; waiting out the new one",
                generation.id
            );
            *created = generation.id.clone();
        }
        let left = member_ttl.saturating_sub(generation.age);
        if left.is_zero() {
            return Ok(format!(
                "cluster ready: store generation {} is {} old (member TTL {}), {} pod(s) registered; pods started now claim at once",
                generation.id,
                humantime::format_duration(round_ms(generation.age)),
                humantime::format_duration(member_ttl),
                snapshot.members.len(),
            ));
        }
        // Slept by our clock, checked again by the store's.
        tokio::time::sleep(left).await;
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
