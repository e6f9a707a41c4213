//! `GET /`: the status page, one self-contained HTML file (`status_page.html`: its own
//! inline style and script, no external assets), served with headers that let it do
//! nothing else: a Content-Security-Policy allowing exactly its inline script and style
//! (by their SHA-256) and fetches to this pod, and no framing by any other page.
//!
//! Not for: the data it shows (`GET /v1/cluster`, `cluster.rs`, with the operator's
//! bearer token, which the page keeps in `sessionStorage` and takes out of the URL).

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};

const PAGE: &str = include_str!("status_page.html");

/// The page's policy. Computed from the page itself, so an edit of its script or style
/// cannot leave a stale hash behind (the browser test would show a blank page).
static POLICY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        inline_hash("script"),
        inline_hash("style"),
    )
});

/// `'sha256-…'` of the text of the page's one inline `<tag>` element.
fn inline_hash(tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = PAGE.find(&open).expect("the page has the element") + open.len();
    let len = PAGE[start..]
        .find(&format!("</{tag}>"))
        .expect("the element is closed");
    let digest = Sha256::digest(&PAGE.as_bytes()[start..start + len]);
    format!("'sha256-{}'", STANDARD.encode(digest))
}

pub(super) async fn serve() -> Response {
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, POLICY.as_str()),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        Html(PAGE),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_one_hash_each_for_the_script_and_the_style() {
        let policy = POLICY.as_str();
        assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
        assert_eq!(policy.matches("'sha256-").count(), 2, "{policy}");
        assert!(!policy.contains("unsafe"), "{policy}");
        // One of each: a second would go unhashed and be blocked.
        assert_eq!(PAGE.matches("<script").count(), 1);
        assert_eq!(PAGE.matches("<style").count(), 1);
    }
}
