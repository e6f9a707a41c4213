//! Every error answer of the pod is JSON `{"error": code, "message": text}`: the
//! handlers' own ([`json_error`]), and — through [`edge`], the one layer over the whole
//! router — the ones produced below them, which axum writes as plain text: an
//! extractor's rejection (a path that is not UTF-8, an undefined query value), a route
//! or method that does not exist. The request limits every route shares are checked
//! there too, so they answer JSON before any handler runs. One layer rather than one per
//! job: each `from_fn` layer boxes a future and clones the service below it on every
//! request.
//!
//! Not for: the answers hyper writes itself on a request head it cannot parse
//! (`head_errors.rs`).

use axum::body::to_bytes;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::push::answer::{Answer, ErrorCode};

/// Longest request target (path and query) any route accepts; `414` above.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Largest header section any route accepts, counted as on an HTTP/1.1 line (name,
/// value and 4 bytes of `: ` and CRLF each); `431` above. hyper's own buffer limit
/// (~400 KiB) is not a head limit: a head that arrives whole in one read past it is
/// parsed, so how big a head passes would depend on the network.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Largest body of a plain-text error that is turned into a JSON message.
const MAX_TEXT_ERROR: usize = 4 * 1024;

/// Turns an [`Answer`] into a response (JSON, `Retry-After` on `503`).
pub fn respond(answer: Answer) -> Response {
    let retry_after = answer.retry_after();
    let mut response = (answer.status, answer.body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(secs) = retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// The JSON answer for `code` with `message`.
pub fn json_error(code: ErrorCode, message: impl Into<String>) -> Response {
    respond(Answer::error(code, message))
}

/// The layer over the whole router: the limits every route shares, then the JSON form
/// of whatever error answer comes back.
pub async fn edge(request: Request, next: Next) -> Response {
    if let Some(refused) = check_head(&request) {
        return refused;
    }
    json_bodies(next.run(request).await).await
}

/// Limits shared by every route, checked before routing: the request target's length
/// and the header section's size.
pub(super) fn check_head(request: &Request) -> Option<Response> {
    let target = request
        .uri()
        .path_and_query()
        .map_or(0, |pq| pq.as_str().len());
    if target > MAX_URI_BYTES {
        return Some(json_error(
            ErrorCode::UriTooLong,
            format!("the request target is {target} bytes; at most {MAX_URI_BYTES} are accepted"),
        ));
    }
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers > MAX_HEADER_BYTES {
        return Some(json_error(
            ErrorCode::HeadersTooLarge,
            format!(
                "the request headers are {headers} bytes; at most {MAX_HEADER_BYTES} are accepted"
            ),
        ));
    }
    None
}

/// Rewrites an error answer that is not JSON (axum's plain-text rejections) into the
/// documented body, keeping its status and its text as the message.
async fn json_bodies(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match to_bytes(body, MAX_TEXT_ERROR).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let code = ErrorCode::for_status(status);
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let mut json = json_error(code, message);
    // The status stays what the layer below chose (e.g. 415 keeps 415).
    *json.status_mut() = status;
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            json.headers_mut().insert(name.clone(), value.clone());
        }
    }
    json
}

/// `404` for a path no route serves.
pub async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    json_error(
        ErrorCode::NotFound,
        format!("no route for {method} {}", uri.path()),
    )
}

/// `405` for a known path with another method.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    json_error(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::StatusCode;

    use super::*;

    #[tokio::test]
    async fn plain_text_errors_become_json_with_their_status_and_text() {
        use axum::routing::get;
        use tower_service::Service;
        let mut app = axum::Router::new()
            .route(
                "/teapot",
                get(|| async { (StatusCode::IM_A_TEAPOT, "short and stout") }),
            )
            .route("/ok", get(|| async { "fine" }))
            .layer(axum::middleware::from_fn(edge));
        let request = |path: &str| Request::get(path).body(Body::empty()).unwrap();
        let response = app.call(request("/teapot")).await.unwrap();
        assert_eq!(response.status(), StatusCode::IM_A_TEAPOT);
        let body = to_bytes(response.into_body(), 1024).await.unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"], "invalid_request");
        assert_eq!(json["message"], "short and stout");
        let response = app.call(request("/ok")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = to_bytes(response.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"fine", "successes pass untouched");
    }
}
