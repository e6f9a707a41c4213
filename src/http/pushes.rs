//! The public routes of pushes with a TTL besides the push itself: a push's status
//! (`GET /v1/terminals/{id}/pushes/{key}`), cancelling it (`DELETE` there), cancelling
//! every queued push of the tenant to a terminal (`DELETE /v1/terminals/{id}/pushes`),
//! and the tenant's outcome feed (`GET /v1/feedback`). Any pod answers: they read and
//! write the store, not a pod's memory.
//!
//! This module only checks and parses (id, key, query, tenant); what each does is
//! `crate::push::later`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;

use super::caller::Caller;
use super::errors::respond;
use super::push::NoQuery;
use super::HttpState;
use crate::api::{valid_key, valid_terminal_id};
use crate::credentials::Tenant;
use crate::push::answer::{Answer, ErrorCode};

/// Most outcomes one feed read returns, and the longest it waits for the first.
pub const MAX_FEED_LIMIT: usize = 1_000;
pub const MAX_FEED_WAIT_MS: u64 = 30_000;

fn invalid(message: &str) -> Answer {
    Answer::error(ErrorCode::InvalidRequest, message)
}

/// The terminal and key of a push route, checked, and the tenant the caller speaks for.
fn push_of(caller: &Caller, terminal: &str, key: Option<&str>) -> Result<Tenant, Answer> {
    if !valid_terminal_id(terminal) {
        return Err(invalid("terminal id must match [A-Za-z0-9._:-]{1,64}"));
    }
    if key.is_some_and(|k| !valid_key(k)) {
        return Err(invalid(
            "the key must be 1-128 visible ASCII characters (percent-encoded in the path)",
        ));
    }
    caller.tenant_for(terminal)
}

/// `GET` (the status) and `DELETE` (cancel) of one push.
pub(super) fn push_status_route() -> axum::routing::MethodRouter<Arc<HttpState>> {
    axum::routing::get(status).delete(cancel)
}

/// `?generation=`: the store generation the push's `202` named.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatusQuery {
    generation: Option<String>,
}

/// `GET /v1/terminals/{id}/pushes/{key}`.
pub(super) async fn status(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Path((terminal, key)): Path<(String, String)>,
    Query(query): Query<StatusQuery>,
) -> Response {
    match push_of(&caller, &terminal, Some(&key)) {
        Ok(tenant) => {
            let generation = query.generation.as_deref();
            respond(
                state
                    .push
                    .push_status(&tenant, &terminal, &key, generation)
                    .await,
            )
        }
        Err(refused) => respond(refused),
    }
}

/// `DELETE /v1/terminals/{id}/pushes/{key}`.
pub(super) async fn cancel(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Path((terminal, key)): Path<(String, String)>,
    Query(NoQuery {}): Query<NoQuery>,
) -> Response {
    match push_of(&caller, &terminal, Some(&key)) {
        Ok(tenant) => respond(state.push.cancel(&tenant, &terminal, &key).await),
        Err(refused) => respond(refused),
    }
}

/// `DELETE /v1/terminals/{id}/pushes`.
pub(super) async fn purge(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Path(terminal): Path<String>,
    Query(NoQuery {}): Query<NoQuery>,
) -> Response {
    match push_of(&caller, &terminal, None) {
        Ok(tenant) => respond(state.push.purge(&tenant, &terminal).await),
        Err(refused) => respond(refused),
    }
}

/// `GET /v1/feedback?cursor=&limit=&wait_ms=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FeedQuery {
    cursor: Option<String>,
    limit: Option<String>,
    wait_ms: Option<String>,
}

/// `GET /v1/feedback`.
pub(super) async fn feedback(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<FeedQuery>,
) -> Response {
    let tenant = match caller.tenant() {
        Ok(tenant) => tenant,
        Err(refused) => return respond(refused),
    };
    // `None` when given and not an integer in `min..=max`.
    let number = |raw: Option<&str>, default: u64, min: u64, max: u64| match raw {
        None => Some(default),
        Some(raw) => raw.parse::<u64>().ok().filter(|n| (min..=max).contains(n)),
    };
    let Some(limit) = number(query.limit.as_deref(), 100, 1, MAX_FEED_LIMIT as u64) else {
        return respond(invalid("limit must be an integer from 1 to 1000"));
    };
    let Some(wait) = number(query.wait_ms.as_deref(), 0, 0, MAX_FEED_WAIT_MS) else {
        return respond(invalid("wait_ms must be an integer from 0 to 30000"));
    };
    let cursor = query.cursor.as_deref();
    if cursor
        .is_some_and(|c| c.is_empty() || c.len() > 200 || !c.bytes().all(|b| b.is_ascii_graphic()))
    {
        return respond(invalid("not a feed cursor"));
    }
    let wait = Duration::from_millis(wait);
    respond(
        state
            .push
            .feedback(&tenant, cursor, limit as usize, wait)
            .await,
    )
}
