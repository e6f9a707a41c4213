//! `posgate terminals`: imports, exports, removes and counts the terminals of the
//! directory in Redis, for operators and scripts (one summary line on stdout; an export
//! to stdout prints its summary on stderr).
//!
//! Not for: the flags (`posgate::config::terminals_args`), the CSV format
//! (`posgate::store::directory::csv`) or how the writes are chunked (the store).

use std::process::ExitCode;

use anyhow::Context;
use posgate::config::terminals_args::{TerminalsArgs, TerminalsCommand};
use posgate::config::StoreConfig;
use posgate::store::redis::RedisStore;

use crate::{exit_code_for, or_usage, runtime};

/// `posgate terminals ...`: edits the terminal directory. An import file is read and
/// checked whole before Redis is contacted; a bad line is reported as `FILE:LINE: reason`
/// and nothing is imported (exit 1). Settings the store refuses (cluster metadata
/// mismatch, bad TLS files) exit 2, like a bad flag.
pub fn main(args: TerminalsArgs) -> ExitCode {
    run(args).unwrap_or_else(|code| code)
}

fn run(args: TerminalsArgs) -> Result<ExitCode, ExitCode> {
    let settings = or_usage(args.resolve())?;
    let import = match &args.command {
        TerminalsCommand::Import { file, .. } => Some(read_import(file)?),
        _ => None,
    };
    let runtime = runtime()?;
    match runtime.block_on(run_terminals(&args, settings, import)) {
        Ok(Report { stdout, stderr }) => {
            // A closed stdout (`| head`) is no reason to panic.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), stdout.as_bytes());
            eprint!("{stderr}");
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            Err(exit_code_for(&err))
        }
    }
}

/// An import file's terminals, and whether it has the `labels` column.
type Import = (Vec<posgate::store::directory::Terminal>, bool);

/// Every terminal of the import file, or exit 1 after printing each bad line.
fn read_import(file: &std::path::Path) -> Result<Import, ExitCode> {
    let name = file.display();
    // `-` is standard input (a provisioning job pipes the file in).
    let read = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(file)
    };
    let text = read.map_err(|err| {
        eprintln!("error: cannot read {name}: {err}");
        ExitCode::FAILURE
    })?;
    let labeled = posgate::store::directory::csv::labeled(&text);
    let terminals = posgate::store::directory::csv::parse(&text).map_err(|errors| {
        for e in &errors {
            eprintln!("{name}:{}: {}", e.line, e.reason);
        }
        eprintln!(
            "error: {name}: {} invalid line(s); nothing was imported",
            errors.len()
        );
        ExitCode::FAILURE
    })?;
    Ok((terminals, labeled))
}

/// What a command prints.
struct Report {
    stdout: String,
    stderr: String,
}

impl Report {
    fn line(summary: String) -> Report {
        Report {
            stdout: summary + "\n",
            stderr: String::new(),
        }
    }
}

/// Connects (eagerly: fails at once if Redis is down), checks the cluster metadata and
/// runs the action; returns what to print.
async fn run_terminals(
    args: &TerminalsArgs,
    settings: StoreConfig,
    import: Option<Import>,
) -> anyhow::Result<Report> {
    use posgate::store::directory::DirectoryAdmin;
    use posgate::store::{ClusterMeta, CoordStore};

    let options = settings.redis_options();
    let store = RedisStore::connect(&settings.redis_url, &settings.cluster, options).await?;
    let shards = args.store.shards;
    store.pin_meta(&ClusterMeta::current(shards)).await?;
    Ok(match &args.command {
        TerminalsCommand::Export { output } => export(&store, shards, output.as_deref()).await?,
        TerminalsCommand::Import { replace, .. } => {
            let (import, labeled) = import.unwrap_or_default();
            let into: std::collections::BTreeSet<_> = import
                .iter()
                .map(|t| posgate::core::shard::shard_of(&t.id, shards))
                .collect();
            let count = import.len();
            let done = store
                .import(shards, import, labeled, *replace)
                .await
                .context(
                    "import failed part-way (chunks already written stay; rerun the import)",
                )?;
            Report::line(format!(
                "imported {} terminals ({} added, {} updated, {} removed) into {} shards",
                count,
                done.added,
                done.updated,
                done.removed,
                into.len()
            ))
        }
        TerminalsCommand::Remove { ids } => {
            let done = store.remove(shards, ids).await?;
            Report::line(format!(
                "removed {} terminals ({} not found) from {} shards",
                done.removed,
                done.unchanged,
                done.changed_shards.len()
            ))
        }
        TerminalsCommand::Count => Report::line(store.count(shards).await?.to_string()),
    })
}

/// Reads every shard of the directory (one shard at a time: an import running meanwhile
/// may be seen in part) and writes the import file of all its terminals, sorted by id,
/// to `output` (a temporary file renamed into place, so a failed export leaves no half
/// file) or stdout. A stored terminal that is not valid (the directory was edited behind
/// posgate's back) is written as stored and named on stderr, and the command fails: an
/// import of the file would refuse that line.
async fn export(
    store: &RedisStore,
    shards: u32,
    output: Option<&std::path::Path>,
) -> anyhow::Result<Report> {
    use posgate::store::directory::{csv, Directory, Shown};

    let mut all = Vec::new();
    for shard in 0..shards {
        all.extend(store.terminals(shard).await?);
    }
    all.sort_by(|a, b| a.id.cmp(&b.id));
    let invalid: Vec<String> = all
        .iter()
        .filter_map(|t| {
            t.validate()
                .err()
                .map(|e| format!("{}: {e}", Shown::new(&t.id)))
        })
        .collect();
    let text = csv::write(&all);
    let summary = format!("exported {} terminals from {shards} shards", all.len());
    let report = match output {
        None => Report {
            stdout: text,
            stderr: summary + "\n",
        },
        Some(file) => {
            write_whole(file, &text)?;
            Report::line(format!("{summary} to {}", file.display()))
        }
    };
    if invalid.is_empty() {
        return Ok(report);
    }
    // The file is out; say what an import of it would refuse.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), report.stdout.as_bytes());
    for line in &invalid {
        eprintln!("invalid stored terminal {line}");
    }
    anyhow::bail!(
        "{} stored terminal(s) are not valid; they are in the export as stored, and an \
         import of it refuses their lines",
        invalid.len()
    )
}

/// Writes `text` to `file` through a temporary file in the same directory, renamed
/// into place once complete.
fn write_whole(file: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let name = file
        .file_name()
        .with_context(|| format!("{} names no file", file.display()))?;
    let mut temp = name.to_owned();
    temp.push(format!(".{}.tmp", std::process::id()));
    let temp = file.with_file_name(temp);
    std::fs::write(&temp, text).with_context(|| format!("cannot write {}", temp.display()))?;
    std::fs::rename(&temp, file).with_context(|| {
        let _ = std::fs::remove_file(&temp);
        format!("cannot move {} to {}", temp.display(), file.display())
    })
}
