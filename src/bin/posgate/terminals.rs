//! `posgate terminals`: imports, removes and counts the terminals of the directory in
//! Redis, for operators and scripts (one summary line on stdout).
//!
//! Not for: the flags (`posgate::config::terminals_args`), the CSV format
//! (`posgate::store::directory::csv`) or how the writes are chunked (the store).

use std::process::ExitCode;

use anyhow::Context;
use posgate::config::terminals_args::{TerminalsArgs, TerminalsCommand};
use posgate::config::StoreSettings;
use posgate::store::redis::RedisStore;
use posgate::store::StoreError;

use crate::{runtime, USAGE_ERROR};

/// `posgate terminals ...`: edits the terminal directory. An import file is read and
/// checked whole before Redis is contacted; a bad line is reported as `FILE:LINE: reason`
/// and nothing is imported (exit 1). Settings the store refuses (cluster metadata
/// mismatch, bad TLS files) exit 2, like a bad flag.
pub fn main(args: TerminalsArgs) -> ExitCode {
    let settings = match args.resolve() {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let import = match &args.command {
        TerminalsCommand::Import { file, .. } => match read_import(file) {
            Ok(terminals) => terminals,
            Err(code) => return code,
        },
        _ => Vec::new(),
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(run_terminals(&args, settings, import)) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            match err.downcast_ref::<StoreError>() {
                Some(StoreError::Config(_) | StoreError::MetaMismatch { .. }) => {
                    ExitCode::from(USAGE_ERROR)
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// Every terminal of the import file, or exit 1 after printing each bad line.
fn read_import(
    file: &std::path::Path,
) -> Result<Vec<posgate::store::directory::Terminal>, ExitCode> {
    let name = file.display();
    let text = std::fs::read_to_string(file).map_err(|err| {
        eprintln!("error: cannot read {name}: {err}");
        ExitCode::FAILURE
    })?;
    posgate::store::directory::csv::parse(&text).map_err(|errors| {
        for e in &errors {
            eprintln!("{name}:{}: {}", e.line, e.reason);
        }
        eprintln!(
            "error: {name}: {} invalid line(s); nothing was imported",
            errors.len()
        );
        ExitCode::FAILURE
    })
}

/// Connects (eagerly: fails at once if Redis is down), checks the cluster metadata and
/// runs the action; returns the line to print.
async fn run_terminals(
    args: &TerminalsArgs,
    settings: StoreSettings,
    import: Vec<posgate::store::directory::Terminal>,
) -> anyhow::Result<String> {
    use posgate::store::directory::DirectoryAdmin;
    use posgate::store::{ClusterMeta, CoordStore};

    let options = settings.redis_options();
    let store = RedisStore::connect(&settings.redis_url, &settings.cluster, options).await?;
    let shards = args.shards;
    store.pin_meta(&ClusterMeta::current(shards)).await?;
    Ok(match &args.command {
        TerminalsCommand::Import { replace, .. } => {
            let done = if *replace {
                store.replace_all(shards, &import).await
            } else {
                store.upsert(shards, &import).await
            }
            .context("import failed part-way (chunks already written stay; rerun the import)")?;
            let into: std::collections::BTreeSet<_> = import
                .iter()
                .map(|t| posgate::core::shard::shard_of(&t.id, shards))
                .collect();
            format!(
                "imported {} terminals ({} added, {} updated, {} removed) into {} shards",
                import.len(),
                done.added,
                done.updated,
                done.removed,
                into.len()
            )
        }
        TerminalsCommand::Remove { ids } => {
            let done = store.remove(shards, ids).await?;
            format!(
                "removed {} terminals ({} not found) from {} shards",
                done.removed,
                done.unchanged,
                done.changed_shards.len()
            )
        }
        TerminalsCommand::Count => store.count(shards).await?.to_string(),
    })
}
