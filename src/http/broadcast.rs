//! The broadcast routes: `POST /v1/broadcasts?selector=&ttl_s=` creates one (or with
//! `&dry_run=true` only counts what it would select) and `GET /v1/broadcasts/{id}`
//! answers its progress. Any pod answers: they read and write the store.
//!
//! This module only checks and parses (grant, selector, TTL, key, body); what a
//! broadcast does is `crate::push::broadcast`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;

use super::caller::Caller;
use super::errors::respond;
use super::push::body_headers;
use super::{read_bounded, HttpState};
use crate::api::{Labels, TTL_PARAM};
use crate::push::answer::{Answer, ErrorCode};
use crate::push::broadcast::{Broadcasts, DryRun, NewBroadcast};

/// `POST /v1/broadcasts`'s query. Unknown parameters are refused, as for a push.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateQuery {
    selector: Option<String>,
    ttl_s: Option<String>,
    dry_run: Option<String>,
}

/// How long a dry run may read the directory.
const DRY_RUN_TIMEOUT: Duration = Duration::from_secs(10);

fn invalid(message: impl Into<String>) -> Answer {
    Answer::error(ErrorCode::InvalidRequest, message)
}

fn service(state: &HttpState) -> Result<&Arc<Broadcasts>, Answer> {
    state.push.broadcasts().ok_or_else(|| {
        Answer::error(
            ErrorCode::QueueUnavailable,
            "this pod keeps no broadcasts (it has no store for pushes kept for later)",
        )
    })
}

/// `POST /v1/broadcasts`.
pub(super) async fn create(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    request: Request,
) -> Response {
    match create_answer(&state, &caller, request).await {
        Ok(response) => response,
        Err(refused) => respond(refused),
    }
}

async fn create_answer(
    state: &HttpState,
    caller: &Caller,
    request: Request,
) -> Result<Response, Answer> {
    let (tenant, scope, insecure) = caller.broadcaster()?;
    let broadcasts = service(state)?;
    broadcasts.granted(&tenant, insecure)?;
    let (head, body) = request.into_parts();
    let axum::extract::Query(query) = axum::extract::Query::<CreateQuery>::try_from_uri(&head.uri)
        .map_err(|e| invalid(e.body_text()))?;
    let selector = match query.selector.as_deref().map(Labels::parse) {
        Some(Ok(selector)) if !selector.is_empty() => selector,
        Some(Err(why)) => return Err(invalid(format!("selector: {why}"))),
        _ => {
            return Err(invalid(
                "selector is required: the labels a terminal must have, as k=v;k=v",
            ))
        }
    };
    let dry_run = match query.dry_run.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(invalid("dry_run must be true or false")),
    };
    if dry_run {
        let directory = state.directory.as_ref().ok_or_else(|| {
            Answer::error(
                ErrorCode::QueueUnavailable,
                "this pod has no terminal directory",
            )
        })?;
        let read = tokio::time::timeout(DRY_RUN_TIMEOUT, directory.all()).await;
        let unread = |why: String| {
            let message = format!("the directory could not be read: {why}");
            Answer::error(ErrorCode::QueueUnavailable, message)
        };
        let terminals = match read {
            Ok(read) => read.map_err(|e| unread(e.to_string()))?,
            Err(_) => return Err(unread(format!("no answer within {DRY_RUN_TIMEOUT:?}"))),
        };
        let matched = terminals
            .iter()
            .filter(|t| selector.selects(&t.labels) && scope.allows(&t.id))
            .count() as u64;
        let answer = DryRun {
            selector: selector.to_string(),
            matched,
        };
        return Ok(respond(Answer::json(StatusCode::OK, &answer)));
    }
    let max = broadcasts.max_ttl().as_secs();
    let ttl_s = query
        .ttl_s
        .as_deref()
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| (1..=max).contains(t))
        .ok_or_else(|| {
            invalid(format!(
                "{TTL_PARAM} is required: an integer from 1 to {max} (--queue-max-ttl)"
            ))
        })?;
    let (key, content_type) = body_headers(&head.headers)?;
    let content_type = match content_type {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| invalid("Content-Type must be visible ASCII"))?
                .to_string(),
        ),
    };
    let settings = state.push.settings();
    let body = read_bounded(
        &head.headers,
        body,
        settings.max_push_bytes,
        settings.body_read_timeout,
    )
    .await?;
    let new = NewBroadcast {
        tenant,
        key,
        selector,
        scope,
        content_type,
        body,
        ttl: Duration::from_secs(ttl_s),
    };
    let (status, fresh) = broadcasts.create(new).await?;
    let code = if fresh {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let mut response = respond(Answer::json(code, &status));
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/broadcasts/{}", status.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /v1/broadcasts/{id}`.
pub(super) async fn status(
    State(state): State<Arc<HttpState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let answer = async {
        let tenant = caller.tenant()?;
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("a broadcast id is 32 hex digits"));
        }
        let status = service(&state)?.find(&tenant, &id).await?;
        Ok(Answer::json(StatusCode::OK, &status))
    };
    respond(answer.await.unwrap_or_else(|refused| refused))
}
