//! Bearer tokens of the push API: which tenant a request speaks for.
//!
//! Tokens come from `--api-tokens-file` (one `tenant:token` per line; `#` comments and
//! blank lines ignored; a UTF-8 byte-order mark and CRLF line ends, as editors on Windows
//! write them, are accepted) or `POSGATE_API_TOKENS` (the same entries, comma-separated). A
//! tenant may have several tokens, so a token can be rotated without downtime. Only
//! SHA-256 digests are kept, and a presented token is compared against every entry in
//! constant time, so neither timing nor a memory dump gives a token away.
//!
//! Not for: pod-to-pod authentication (`crate::peer`, signed with the cluster secret).

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest token accepted: guessing one must be hopeless.
pub const MIN_TOKEN_LEN: usize = 16;

/// The tenant a request was authenticated as.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tenant(pub String);

/// The configured tokens. `Debug` shows tenants only.
#[derive(Clone)]
pub struct ApiTokens {
    entries: Vec<(Tenant, [u8; 32])>,
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tenants: Vec<&str> = self.entries.iter().map(|(t, _)| t.0.as_str()).collect();
        f.debug_struct("ApiTokens")
            .field("tenants", &tenants)
            .finish()
    }
}

/// Where a bad entry is: a line of the tokens file (counting comments and blank lines,
/// as an editor does) or an entry of `POSGATE_API_TOKENS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Line(usize),
    Entry(usize),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Line(n) => write!(f, "line {n}"),
            Place::Entry(n) => write!(f, "entry {n}"),
        }
    }
}

/// Why a token list cannot be used; never contains a token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokensError {
    #[error("{at}: expected tenant:token")]
    Shape { at: Place },
    #[error("{at}: tenant must match [A-Za-z0-9._-]{{1,64}}")]
    Tenant { at: Place },
    #[error("{at}: token must be {MIN_TOKEN_LEN}..=256 visible ASCII characters")]
    Token { at: Place },
    #[error("{at}: the same token is listed twice")]
    Duplicate { at: Place },
    #[error("no tokens")]
    Empty,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn valid_tenant(t: &str) -> bool {
    (1..=64).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn valid_token(t: &str) -> bool {
    (MIN_TOKEN_LEN..=256).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic())
}

impl ApiTokens {
    /// Parses the lines of a tokens file (`lines` ends them at `\n` or `\r\n`).
    pub fn from_file_text(text: &str) -> Result<Self, TokensError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        Self::parse(
            text.lines()
                .map(str::trim)
                .enumerate()
                .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
                .map(|(i, l)| (Place::Line(i + 1), l)),
        )
    }

    /// Parses `POSGATE_API_TOKENS`: comma-separated entries.
    pub fn from_env_value(value: &str) -> Result<Self, TokensError> {
        let entries = value.split(',').map(str::trim).filter(|e| !e.is_empty());
        Self::parse(entries.enumerate().map(|(i, e)| (Place::Entry(i + 1), e)))
    }

    fn parse<'a>(entries: impl Iterator<Item = (Place, &'a str)>) -> Result<Self, TokensError> {
        let mut parsed: Vec<(Tenant, [u8; 32])> = Vec::new();
        for (at, entry) in entries {
            let (tenant, token) = entry.split_once(':').ok_or(TokensError::Shape { at })?;
            if !valid_tenant(tenant) {
                return Err(TokensError::Tenant { at });
            }
            if !valid_token(token) {
                return Err(TokensError::Token { at });
            }
            let d = digest(token);
            if parsed.iter().any(|(_, known)| *known == d) {
                return Err(TokensError::Duplicate { at });
            }
            parsed.push((Tenant(tenant.to_string()), d));
        }
        if parsed.is_empty() {
            return Err(TokensError::Empty);
        }
        Ok(ApiTokens { entries: parsed })
    }

    /// The tenant `token` belongs to. Every entry is compared, matched or not, so the
    /// time taken does not depend on where (or whether) the token is listed.
    pub fn tenant_of(&self, token: &str) -> Option<Tenant> {
        let presented = digest(token);
        let mut found = None;
        for (tenant, known) in &self.entries {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(tenant);
            }
        }
        found.cloned()
    }

    /// The token of an `Authorization` header value (`Bearer <token>`).
    pub fn bearer(header: &str) -> Option<&str> {
        let (scheme, token) = header.trim().split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim())
            .filter(|t| !t.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A1: &str = "token-a-0123456789";
    const A2: &str = "token-a-rotated-0123";
    const B1: &str = "token-b-0123456789";

    #[test]
    fn tokens_map_to_their_tenants_including_rotated_ones() {
        let text = format!("# tenants\nacme:{A1}\n\nacme:{A2}\n  bank-2:{B1}  \n");
        let tokens = ApiTokens::from_file_text(&text).unwrap();
        assert_eq!(tokens.tenant_of(A1), Some(Tenant("acme".into())));
        assert_eq!(tokens.tenant_of(A2), Some(Tenant("acme".into())));
        assert_eq!(tokens.tenant_of(B1), Some(Tenant("bank-2".into())));
        assert_eq!(tokens.tenant_of("token-a-012345678"), None);
        assert_eq!(tokens.tenant_of(""), None);
        let env = ApiTokens::from_env_value(&format!("acme:{A1}, bank-2:{B1}")).unwrap();
        assert_eq!(env.tenant_of(B1), Some(Tenant("bank-2".into())));
        // Debug never shows a token.
        let shown = format!("{tokens:?}");
        assert!(shown.contains("acme") && !shown.contains("token-a"));
    }

    #[test]
    fn bad_lists_are_refused_without_echoing_tokens() {
        let err = |t: &str| ApiTokens::from_file_text(t).unwrap_err();
        let line = |n| Place::Line(n);
        assert_eq!(err("acme"), TokensError::Shape { at: line(1) });
        assert_eq!(
            err(&format!("a b:{A1}")),
            TokensError::Tenant { at: line(1) }
        );
        assert_eq!(err("acme:short"), TokensError::Token { at: line(1) });
        assert_eq!(
            err(&format!("acme:{A1}\nother:{A1}")),
            TokensError::Duplicate { at: line(2) }
        );
        assert_eq!(err("# nothing\n"), TokensError::Empty);
        assert!(!err("acme:short").to_string().contains("short"));
        // A file names the line an editor shows, comments and blank lines counted; the
        // environment variable names the entry.
        assert_eq!(
            err(&format!("# tenants\n\nacme:{A1}\nbad\n")).to_string(),
            "line 4: expected tenant:token"
        );
        let env = ApiTokens::from_env_value(&format!("acme:{A1},,bad")).unwrap_err();
        assert_eq!(env.to_string(), "entry 2: expected tenant:token");
    }

    #[test]
    fn a_file_saved_with_a_byte_order_mark_and_crlf_line_ends_is_read() {
        let text = format!("\u{feff}# tenants\r\nacme:{A1}\r\n\r\nbank-2:{B1}\r\n");
        let tokens = ApiTokens::from_file_text(&text).unwrap();
        assert_eq!(tokens.tenant_of(A1), Some(Tenant("acme".into())));
        assert_eq!(tokens.tenant_of(B1), Some(Tenant("bank-2".into())));
        // A mark on the first entry itself, not on a comment.
        let text = format!("\u{feff}acme:{A1}\r\n");
        assert!(ApiTokens::from_file_text(&text).is_ok());
    }

    #[test]
    fn bearer_header_parsing() {
        assert_eq!(ApiTokens::bearer("Bearer abc"), Some("abc"));
        assert_eq!(ApiTokens::bearer("bearer   abc "), Some("abc"));
        assert_eq!(ApiTokens::bearer("Basic abc"), None);
        assert_eq!(ApiTokens::bearer("Bearer"), None);
        assert_eq!(ApiTokens::bearer("Bearer "), None);
    }
}
