//! Bearer tokens of the `/v1` API: what a request may do ([`Grant`]).
//!
//! Tokens come from `--api-tokens-file` (one `tenant:token[:pattern,...]` per line; `#`
//! comments and blank lines ignored; a UTF-8 byte-order mark and CRLF line ends, as
//! editors on Windows write them, are accepted) or `POSGATE_API_TOKENS` (the same
//! entries, comma-separated; there a comma-separated item without `:` is one more
//! pattern of the entry before it). A tenant's token pushes to, and looks up, the
//! terminals whose ids match one of its glob patterns (every terminal without any), so
//! a token given to one vendor or one shop cannot reach another's terminals. The
//! reserved tenant name [`OPERATOR`] is the operator role: the cluster view and the
//! status page, no pushes. The reserved tenant name [`DIRECTORY`] is the directory
//! role: it adds, changes and removes the terminals its patterns match (the directory
//! API), and pushes nothing. A release without that role reads such a line as an
//! ordinary tenant named `directory` (so one tokens file serves both during a rollout;
//! `docs/operations.md` says what that allows meanwhile). A tenant may have several tokens, so a token can be rotated
//! without downtime. Only SHA-256 digests are kept, and a presented token is compared
//! against every entry in constant time, so neither timing nor a memory dump gives a
//! token away.
//!
//! Not for: pod-to-pod authentication (`crate::peer`, signed with the cluster secret).

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest token accepted: guessing one must be hopeless.
pub const MIN_TOKEN_LEN: usize = 16;

/// The tenant name whose tokens are the operator role.
pub const OPERATOR: &str = "operator";

/// The tenant name whose tokens are the directory role.
pub const DIRECTORY: &str = "directory";

/// The tenant a request was authenticated as.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tenant(pub String);

/// The terminals a tenant's token may reach.
#[derive(Clone, Debug, PartialEq)]
pub enum Scope {
    /// Every terminal (a `tenant:token` entry).
    All,
    /// The terminals whose id matches one of these.
    Matching(Vec<glob::Pattern>),
}

impl Scope {
    pub fn allows(&self, terminal: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Matching(patterns) => patterns.iter().any(|p| p.matches(terminal)),
        }
    }

    /// The patterns as text (none: every terminal), as a broadcast's record carries
    /// them to the owners.
    pub fn patterns(&self) -> Vec<String> {
        match self {
            Scope::All => Vec::new(),
            Scope::Matching(patterns) => patterns.iter().map(|p| p.as_str().to_string()).collect(),
        }
    }

    /// The scope [`Scope::patterns`] wrote.
    pub fn from_patterns(patterns: &[String]) -> Result<Scope, glob::PatternError> {
        if patterns.is_empty() {
            return Ok(Scope::All);
        }
        let patterns = patterns
            .iter()
            .map(|p| glob::Pattern::new(p))
            .collect::<Result<_, _>>()?;
        Ok(Scope::Matching(patterns))
    }
}

/// What a token may do.
#[derive(Clone, Debug, PartialEq)]
pub enum Grant {
    /// Push to, and look up, the terminals of `scope`, as `tenant`.
    Tenant { tenant: Tenant, scope: Scope },
    /// See the cluster (`/v1/cluster`, the status page); no pushes.
    Operator,
    /// Add, change and remove the terminals of `scope` in the directory; no pushes.
    Directory { scope: Scope },
}

impl Grant {
    fn name(&self) -> &str {
        match self {
            Grant::Tenant { tenant, .. } => &tenant.0,
            Grant::Operator => OPERATOR,
            Grant::Directory { .. } => DIRECTORY,
        }
    }
}

/// The configured tokens. `Debug` shows tenants only.
#[derive(Clone)]
pub struct ApiTokens {
    entries: Vec<(Grant, [u8; 32])>,
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tenants: Vec<&str> = self.entries.iter().map(|(g, _)| g.name()).collect();
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
    #[error("{at}: expected tenant:token or tenant:token:pattern,...")]
    Shape { at: Place },
    #[error(
        "{at}: a terminal pattern must be a glob (*, ?, [..]) over terminal-id characters \
         [A-Za-z0-9._:-]"
    )]
    Pattern { at: Place },
    #[error("{at}: operator tokens take no terminal patterns (they cannot push)")]
    OperatorScope { at: Place },
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
    (MIN_TOKEN_LEN..=256).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_graphic() && b != b':' && b != b',')
}

/// A glob over terminal ids: their characters and the glob's own, so a misplaced token
/// fragment (`+`, `/`, `=`) is refused rather than taken for a pattern nothing matches.
fn pattern(text: &str) -> Option<glob::Pattern> {
    let ok = (1..=128).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-*?[]!".contains(&b));
    ok.then(|| glob::Pattern::new(text).ok()).flatten()
}

/// The entries of a tokens file (`lines` ends them at `\n` or `\r\n`).
fn file_entries(text: &str) -> impl Iterator<Item = (Place, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines()
        .map(str::trim)
        .enumerate()
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .map(|(i, l)| (Place::Line(i + 1), l))
}

/// The entries of `POSGATE_API_TOKENS`: comma-separated, an item without `:` being one
/// more pattern of the entry before it.
fn env_entries(value: &str) -> Vec<(Place, String)> {
    let mut entries: Vec<(Place, String)> = Vec::new();
    let items = value.split(',').map(str::trim).filter(|e| !e.is_empty());
    for item in items {
        match entries.last_mut() {
            Some((_, entry)) if !item.contains(':') && entry.matches(':').count() >= 2 => {
                entry.push(',');
                entry.push_str(item);
            }
            _ => entries.push((Place::Entry(entries.len() + 1), item.to_string())),
        }
    }
    entries
}

/// The token of the first [`OPERATOR`] entry of a tokens file's text, or of
/// `POSGATE_API_TOKENS`'s value when `env`: what `posgate status` uses inside a pod.
pub fn operator_token(text: &str, env: bool) -> Option<String> {
    let of = |entry: &str| {
        let mut fields = entry.splitn(3, ':');
        (fields.next() == Some(OPERATOR))
            .then(|| fields.next().map(str::to_string))
            .flatten()
    };
    if env {
        env_entries(text).iter().find_map(|(_, e)| of(e))
    } else {
        file_entries(text).find_map(|(_, e)| of(e))
    }
}

impl ApiTokens {
    /// Parses the lines of a tokens file.
    pub fn from_file_text(text: &str) -> Result<Self, TokensError> {
        Self::parse(file_entries(text))
    }

    /// Parses `POSGATE_API_TOKENS` (see [`env_entries`]).
    pub fn from_env_value(value: &str) -> Result<Self, TokensError> {
        let entries = env_entries(value);
        Self::parse(entries.iter().map(|(at, e)| (*at, e.as_str())))
    }

    fn parse<'a>(entries: impl Iterator<Item = (Place, &'a str)>) -> Result<Self, TokensError> {
        let mut parsed: Vec<(Grant, [u8; 32])> = Vec::new();
        for (at, entry) in entries {
            let mut fields = entry.splitn(3, ':');
            let (Some(tenant), Some(token)) = (fields.next(), fields.next()) else {
                return Err(TokensError::Shape { at });
            };
            if !valid_tenant(tenant) {
                return Err(TokensError::Tenant { at });
            }
            if !valid_token(token) {
                return Err(TokensError::Token { at });
            }
            let scope = match fields.next() {
                None => Scope::All,
                Some(list) => Scope::Matching(
                    list.split(',')
                        .map(|p| pattern(p.trim()))
                        .collect::<Option<_>>()
                        .ok_or(TokensError::Pattern { at })?,
                ),
            };
            let grant = match (tenant, scope) {
                (OPERATOR, Scope::All) => Grant::Operator,
                (OPERATOR, Scope::Matching(_)) => return Err(TokensError::OperatorScope { at }),
                (DIRECTORY, scope) => Grant::Directory { scope },
                (tenant, scope) => Grant::Tenant {
                    tenant: Tenant(tenant.to_string()),
                    scope,
                },
            };
            let d = digest(token);
            if parsed.iter().any(|(_, known)| *known == d) {
                return Err(TokensError::Duplicate { at });
            }
            parsed.push((grant, d));
        }
        if parsed.is_empty() {
            return Err(TokensError::Empty);
        }
        Ok(ApiTokens { entries: parsed })
    }

    /// What `token` may do. Every entry is compared, matched or not, so the time taken
    /// does not depend on where (or whether) the token is listed.
    pub fn grant_of(&self, token: &str) -> Option<Grant> {
        let presented = digest(token);
        let mut found = None;
        for (grant, known) in &self.entries {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(grant);
            }
        }
        found.cloned()
    }

    /// A name for `token` in an audit line: the first 8 hex digits of its SHA-256,
    /// which tell two tokens of one tenant apart without giving either away.
    pub fn token_id(token: &str) -> String {
        digest(token)[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
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

    fn tenant(tokens: &ApiTokens, token: &str) -> Option<Tenant> {
        match tokens.grant_of(token)? {
            Grant::Tenant { tenant, .. } => Some(tenant),
            Grant::Operator | Grant::Directory { .. } => None,
        }
    }

    #[test]
    fn the_directory_role_is_a_reserved_tenant_with_patterns() {
        let text = format!(
            "directory:{A1}:store-17-*
directory:{B1}
"
        );
        let tokens = ApiTokens::from_file_text(&text).unwrap();
        let Some(Grant::Directory { scope }) = tokens.grant_of(A1) else {
            panic!("{:?}", tokens.grant_of(A1));
        };
        assert!(scope.allows("store-17-till-1") && !scope.allows("store-18-till-1"));
        assert_eq!(
            tokens.grant_of(B1),
            Some(Grant::Directory { scope: Scope::All })
        );
    }

    #[test]
    fn tokens_map_to_their_tenants_including_rotated_ones() {
        let text = format!("# tenants\nacme:{A1}\n\nacme:{A2}\n  bank-2:{B1}  \n");
        let tokens = ApiTokens::from_file_text(&text).unwrap();
        assert_eq!(tenant(&tokens, A1), Some(Tenant("acme".into())));
        assert_eq!(tenant(&tokens, A2), Some(Tenant("acme".into())));
        assert_eq!(tenant(&tokens, B1), Some(Tenant("bank-2".into())));
        assert_eq!(tenant(&tokens, "token-a-012345678"), None);
        assert_eq!(tenant(&tokens, ""), None);
        let env = ApiTokens::from_env_value(&format!("acme:{A1}, bank-2:{B1}")).unwrap();
        assert_eq!(tenant(&env, B1), Some(Tenant("bank-2".into())));
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
            "line 4: expected tenant:token or tenant:token:pattern,..."
        );
        let env = ApiTokens::from_env_value(&format!("acme:{A1},,bad")).unwrap_err();
        assert_eq!(
            env.to_string(),
            "entry 2: expected tenant:token or tenant:token:pattern,..."
        );
    }

    #[test]
    fn a_file_saved_with_a_byte_order_mark_and_crlf_line_ends_is_read() {
        let text = format!("\u{feff}# tenants\r\nacme:{A1}\r\n\r\nbank-2:{B1}\r\n");
        let tokens = ApiTokens::from_file_text(&text).unwrap();
        assert_eq!(tenant(&tokens, A1), Some(Tenant("acme".into())));
        assert_eq!(tenant(&tokens, B1), Some(Tenant("bank-2".into())));
        // A mark on the first entry itself, not on a comment.
        let text = format!("\u{feff}acme:{A1}\r\n");
        assert!(ApiTokens::from_file_text(&text).is_ok());
    }

    #[test]
    fn patterns_scope_a_token_and_the_operator_name_is_a_role() {
        let text = format!(
            "acme:{A1}:acme-*,shop-1?\nbank-2:{B1}\noperator:{A2}\nhub:token-hub-0123456789:hub:[ab]*\n"
        );
        let tokens = ApiTokens::from_file_text(&text).unwrap();
        let Some(Grant::Tenant {
            tenant: acme,
            scope,
        }) = tokens.grant_of(A1)
        else {
            panic!("a tenant's token");
        };
        assert_eq!(acme, Tenant("acme".into()));
        assert!(scope.allows("acme-7") && scope.allows("shop-12"));
        assert!(!scope.allows("bank-1") && !scope.allows("shop-123"));
        let Some(Grant::Tenant { scope, .. }) = tokens.grant_of(B1) else {
            panic!("a tenant's token");
        };
        assert_eq!(scope, Scope::All);
        assert_eq!(tokens.grant_of(A2), Some(Grant::Operator));
        // Terminal ids may hold a colon; so may their patterns.
        let Some(Grant::Tenant { scope, .. }) = tokens.grant_of("token-hub-0123456789") else {
            panic!("a tenant's token");
        };
        assert!(scope.allows("hub:a1") && !scope.allows("hub:c1"));
        // The environment variable: items without a colon are more patterns.
        let env =
            ApiTokens::from_env_value(&format!("acme:{A1}:acme-*, shop-*, bank-2:{B1}")).unwrap();
        let Some(Grant::Tenant { scope, .. }) = env.grant_of(A1) else {
            panic!("a tenant's token");
        };
        assert!(scope.allows("shop-3") && !scope.allows("bank-3"));
        assert_eq!(tenant(&env, B1), Some(Tenant("bank-2".into())));

        let err = |t: &str| ApiTokens::from_file_text(t).unwrap_err();
        let at = Place::Line(1);
        assert_eq!(err(&format!("acme:{A1}:")), TokensError::Pattern { at });
        assert_eq!(err(&format!("acme:{A1}:a*,")), TokensError::Pattern { at });
        // A token with a colon in it: its tail is no terminal pattern.
        assert_eq!(err("acme:abc:def+ghi/jkl=mno"), TokensError::Token { at });
        assert_eq!(
            err(&format!("acme:{A1}:def+ghi/jk=")),
            TokensError::Pattern { at }
        );
        assert_eq!(err(&format!("acme:{A1}:[a")), TokensError::Pattern { at });
        assert_eq!(
            err(&format!("operator:{A1}:a*")),
            TokensError::OperatorScope { at }
        );
        let env = ApiTokens::from_env_value(&format!("acme:{A1},shop-*")).unwrap_err();
        assert_eq!(
            env,
            TokensError::Shape {
                at: Place::Entry(2)
            }
        );
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
