//! `GET /`: the status page, one self-contained HTML document (`status_page.html` with
//! `status_page.css` and `status_page.js` put inline: no external assets), served with
//! headers that let it do nothing else: a Content-Security-Policy allowing exactly its
//! inline script and style (by their SHA-256) and fetches to this pod, and no framing by
//! any other page. The script draws the shards as an SVG ring coloured by pod, bars of
//! connected vs expected terminals per pod with the pushes waiting for their terminals
//! (unknown for a pod that did not say), and the last minutes' timeline; SVG
//! attributes and classes only, as the policy allows no style attribute.
//!
//! Not for: the data it shows (`GET /v1/cluster`, `cluster.rs`, with the operator's
//! bearer token, which the page keeps in `sessionStorage` and takes out of the URL).

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};

/// The page as served: the style and script files inside its empty `<style>` and
/// `<script>` elements, kept as separate files only to be read and edited as such.
static PAGE: LazyLock<String> = LazyLock::new(|| {
    include_str!("status_page.html")
        .replacen(
            "<style></style>",
            &inline("style", include_str!("status_page.css")),
            1,
        )
        .replacen(
            "<script></script>",
            &inline("script", include_str!("status_page.js")),
            1,
        )
});

fn inline(tag: &str, text: &str) -> String {
    format!("<{tag}>\n{text}</{tag}>")
}

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
        Html(PAGE.as_str()),
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
        // Both files went in, so the hashes cover what the browser runs.
        assert!(PAGE.contains("function renderRing(") && PAGE.contains(".seg.moving {"));
        assert!(!PAGE.contains("<script></script>") && !PAGE.contains("<style></style>"));
    }
}
