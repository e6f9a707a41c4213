//! The directory API: `PUT /v1/terminals/{id}` adds or changes one terminal,
//! `DELETE /v1/terminals/{id}` removes it, `POST /v1/terminals` imports many (the CSV of
//! `posgate terminals import`, `?replace=true` to also remove the rest). Only a
//! directory token may, and only for the terminals its patterns match; an import is
//! checked whole (every line, every id against the patterns) before anything is written,
//! so a bad one changes nothing and names its lines. Owners pick a change up within
//! `--directory-poll`, as after a CLI import. Each change is logged once at info on the
//! target `posgate::audit`: who (the token's id), what, and the outcome.
//!
//! This module only checks and parses; the writes are the store's
//! (`store::directory::DirectoryEdits`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde::{Deserialize, Serialize};
use tracing::info;

use super::caller::Caller;
use super::errors::respond;
use super::{read_bounded, HttpState};
use crate::api::Labels;
use crate::credentials::{ApiTokens, Scope};
use crate::push::answer::{Answer, ErrorCode};
use crate::store::directory::{csv, DirectoryEdits, Terminal, WriteSummary};

/// Largest import body: about 200,000 terminals of typical length.
pub const MAX_IMPORT_BYTES: usize = 32 << 20;
/// Largest `PUT` body.
const MAX_ENTRY_BYTES: usize = 16 << 10;
/// Bad lines an import's answer names, at most (it says how many there are).
const SHOWN_LINES: usize = 100;
/// How long a write may take in all: an import of 50,000 terminals is 50 script calls.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

fn invalid(message: impl Into<String>) -> Answer {
    Answer::error(ErrorCode::InvalidRequest, message)
}

/// The directory API's writes, or `503` when the pod has none (it runs without a
/// terminal directory).
fn edits(state: &HttpState) -> Result<&Arc<dyn DirectoryEdits>, Answer> {
    state.directory.as_ref().ok_or_else(|| {
        Answer::error(
            ErrorCode::NotFound,
            "this pod has no terminal directory to change",
        )
    })
}

/// Who an audit line names: the token's id (`-` without tokens).
fn who(headers: &HeaderMap) -> String {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(ApiTokens::bearer)
        .map_or_else(|| "-".to_string(), ApiTokens::token_id)
}

/// A write, bounded by [`WRITE_TIMEOUT`]; a store error is `503` (retry: every write is
/// idempotent).
async fn write(
    f: impl std::future::Future<Output = Result<WriteSummary, crate::store::StoreError>>,
) -> Result<WriteSummary, Answer> {
    let unavailable = |why: String| {
        Answer::error(
            ErrorCode::DirectoryUnavailable,
            format!("the directory could not be written ({why}); retry, every write is idempotent"),
        )
    };
    match tokio::time::timeout(WRITE_TIMEOUT, f).await {
        Ok(Ok(summary)) => Ok(summary),
        Ok(Err(e)) => Err(unavailable(e.to_string())),
        Err(_) => Err(unavailable(format!("no answer within {WRITE_TIMEOUT:?}"))),
    }
}

/// `GET` (where a terminal is served, `push.rs`), `PUT` and `DELETE` of one terminal.
pub(super) fn terminal_route() -> axum::routing::MethodRouter<Arc<HttpState>> {
    axum::routing::get(super::push::terminal)
        .put(put)
        .delete(delete)
}

/// The body of `PUT /v1/terminals/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    addr: String,
    /// The TLS name; the host of `addr` when absent.
    server_name: Option<String>,
    /// Absent: the stored labels stay. `{}`: none.
    labels: Option<Labels>,
}

#[derive(Serialize)]
struct Written<'a> {
    terminal: &'a Terminal,
    result: &'static str,
}

/// `PUT /v1/terminals/{id}`.
pub(super) async fn put(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    reply(put_answer(&state, &caller, &id, request).await)
}

async fn put_answer(
    state: &HttpState,
    caller: &Caller,
    id: &str,
    request: Request,
) -> Result<Answer, Answer> {
    let scope = caller.directory()?;
    if !scope.allows(id) {
        return Err(outside(id));
    }
    let edits = edits(state)?;
    let (head, body) = request.into_parts();
    let body = read_bounded(
        &head.headers,
        body,
        MAX_ENTRY_BYTES,
        state.body_read_timeout(),
    )
    .await?;
    let entry: EntryBody =
        serde_json::from_slice(&body).map_err(|e| invalid(format!("not a terminal entry: {e}")))?;
    let terminal = Terminal::new(id, &entry.addr, entry.server_name.as_deref())
        .map_err(|e| invalid(e.to_string()))?;
    let labeled = entry.labels.is_some();
    let terminal = terminal.with_labels(entry.labels.unwrap_or_default());
    let done = write(edits.import(vec![terminal.clone()], labeled, false)).await?;
    let result = if done.added > 0 {
        "added"
    } else if done.updated > 0 {
        "updated"
    } else {
        "unchanged"
    };
    info!(
        target: "posgate::audit",
        who = %who(&head.headers),
        action = "put",
        terminal = id,
        addr = %terminal.addr,
        server_name = %terminal.server_name,
        labels = %if labeled { terminal.labels.to_string() } else { "(kept)".to_string() },
        result,
        "directory changed"
    );
    let status = if result == "added" {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    // An entry written without labels kept the stored ones, which this answer does not
    // know: it shows what was written.
    Ok(Answer::json(
        status,
        &Written {
            terminal: &terminal,
            result,
        },
    ))
}

/// `DELETE /v1/terminals/{id}`.
pub(super) async fn delete(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    reply(delete_answer(&state, &caller, &id, &headers).await)
}

async fn delete_answer(
    state: &HttpState,
    caller: &Caller,
    id: &str,
    headers: &HeaderMap,
) -> Result<Answer, Answer> {
    let scope = caller.directory()?;
    if !crate::api::valid_terminal_id(id) {
        return Err(invalid("terminal id must match [A-Za-z0-9._:-]{1,64}"));
    }
    if !scope.allows(id) {
        return Err(outside(id));
    }
    let ids = [id.to_string()];
    let done = write(edits(state)?.remove(&ids)).await?;
    let result = if done.removed > 0 {
        "removed"
    } else {
        "absent"
    };
    info!(
        target: "posgate::audit",
        who = %who(headers),
        action = "delete",
        terminal = id,
        result,
        "directory changed"
    );
    Ok(Answer::json(
        StatusCode::OK,
        &serde_json::json!({ "terminal": id, "result": result }),
    ))
}

/// `POST /v1/terminals`'s query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ImportQuery {
    /// Also remove every terminal the file does not list (an unscoped token only).
    #[serde(default)]
    replace: bool,
}

#[derive(Serialize)]
struct Imported {
    terminals: usize,
    added: u64,
    updated: u64,
    removed: u64,
    unchanged: u64,
    shards_changed: usize,
}

/// `POST /v1/terminals`.
pub(super) async fn import(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<ImportQuery>,
    request: Request,
) -> Response {
    reply(import_answer(&state, &caller, query.replace, request).await)
}

async fn import_answer(
    state: &HttpState,
    caller: &Caller,
    replace: bool,
    request: Request,
) -> Result<Answer, Answer> {
    let scope = caller.directory()?;
    if replace && *scope != Scope::All {
        return Err(Answer::error(
            ErrorCode::Forbidden,
            "?replace=true removes terminals the file does not list: it needs a directory \
             token without patterns",
        ));
    }
    let edits = edits(state)?;
    let (head, body) = request.into_parts();
    let body = read_bounded(&head.headers, body, MAX_IMPORT_BYTES, WRITE_TIMEOUT).await?;
    let text = std::str::from_utf8(&body).map_err(|_| invalid("the import is not UTF-8"))?;
    // Lines the token may not write are bad lines too: nothing is written.
    let (terminals, mut bad) = match csv::parse_within(text, |id| scope.allows(id)) {
        Ok(terminals) => (terminals, Vec::new()),
        Err(errors) => (Vec::new(), errors),
    };
    if !bad.is_empty() {
        let count = bad.len();
        bad.truncate(SHOWN_LINES);
        return Err(Answer::json(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({
                "error": ErrorCode::InvalidRequest.as_str(),
                "message": format!("{count} invalid line(s); nothing was imported"),
                "lines": bad,
            }),
        ));
    }
    let count = terminals.len();
    let done = write(edits.import(terminals, csv::labeled(text), replace)).await?;
    info!(
        target: "posgate::audit",
        who = %who(&head.headers),
        action = if replace { "import_replace" } else { "import" },
        terminals = count,
        added = done.added,
        updated = done.updated,
        removed = done.removed,
        "directory changed"
    );
    Ok(Answer::json(
        StatusCode::OK,
        &Imported {
            terminals: count,
            added: done.added,
            updated: done.updated,
            removed: done.removed,
            unchanged: done.unchanged,
            shards_changed: done.changed_shards.len(),
        },
    ))
}

/// The answer of a handler whose refusals are answers too.
fn reply(answer: Result<Answer, Answer>) -> Response {
    respond(answer.unwrap_or_else(|refused| refused))
}

/// `403` for a terminal outside the token's patterns.
fn outside(id: &str) -> Answer {
    Answer::error(
        ErrorCode::Forbidden,
        format!("terminal {id:?} is outside this token's patterns"),
    )
}
