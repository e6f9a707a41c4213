//! The public push API's names and shapes (`docs/openapi.yaml`), in one place: routes,
//! the query parameter and header names, what a terminal id and an idempotency key may
//! look like, and the two push fields posgate passes on wherever the push goes (to the
//! owner pod, then to the terminal) under the same names.
//!
//! Not for: handling requests (`crate::http`), or the internal wire formats
//! (`crate::peer::wire`, `crate::pos::wire`), which reuse the names here.

/// `POST {PUSH_ROUTE}`: push to one terminal.
pub const PUSH_ROUTE: &str = "/v1/terminals/{id}/push";
/// `POST {BATCH_ROUTE}`: many pushes, one result each.
pub const BATCH_ROUTE: &str = "/v1/pushes";
/// `GET {TERMINAL_ROUTE}`: where a terminal is served.
pub const TERMINAL_ROUTE: &str = "/v1/terminals/{id}";
/// `GET {CLUSTER_ROUTE}`: members and shard ownership.
pub const CLUSTER_ROUTE: &str = "/v1/cluster";
/// The push's deadline, milliseconds (`?timeout_ms=`).
pub const TIMEOUT_PARAM: &str = "timeout_ms";
/// A push that may wait for its terminal: its TTL, seconds (`?ttl_s=`).
pub const TTL_PARAM: &str = "ttl_s";
/// Replaces a queued push of the same tenant and terminal with this key
/// (`?collapse_key=`; needs `ttl_s`).
pub const COLLAPSE_PARAM: &str = "collapse_key";
/// `GET`, `DELETE` {PUSHES_ROUTE}: one push with a TTL, by its idempotency key
/// (percent-encoded in the path).
pub const PUSH_STATUS_ROUTE: &str = "/v1/terminals/{id}/pushes/{key}";
/// `DELETE`: cancel every queued push of the tenant to a terminal.
pub const PUSHES_ROUTE: &str = "/v1/terminals/{id}/pushes";
/// `GET`: the tenant's feed of pushes that reached a final state.
pub const FEEDBACK_ROUTE: &str = "/v1/feedback";

/// The caller's idempotency key; passed on under this name to the owner and terminal.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The tenant a push came from (named by its bearer token), added by posgate wherever
/// it passes a push on: keys are unique per tenant and terminal.
pub const TENANT_HEADER: &str = "posgate-tenant";

/// Whether `id` is a valid terminal id: `[A-Za-z0-9._:-]{1,64}`.
pub fn valid_terminal_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Whether `key` is a valid `?collapse_key=`: `[A-Za-z0-9._:-]{1,64}`, like a terminal
/// id, so it needs no escaping in a URL, a log line or a store key.
pub fn valid_collapse_key(key: &str) -> bool {
    valid_terminal_id(key)
}

/// Whether `key` is a valid `Idempotency-Key`: 1-128 visible ASCII characters.
pub fn valid_key(key: &str) -> bool {
    (1..=128).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_keys_are_checked() {
        assert!(valid_key("a"));
        assert!(valid_key(&"k".repeat(128)));
        assert!(!valid_key(""));
        assert!(!valid_key(&"k".repeat(129)));
        assert!(!valid_key("has space"));
        assert!(!valid_key("tab\t"));
        assert!(valid_terminal_id("store-17:till-3"));
        assert!(!valid_terminal_id("bad id!"));
        assert!(!valid_terminal_id(&"t".repeat(65)));
        assert!(!valid_terminal_id(""));
    }
}
