//! The public push API's names and shapes (`docs/openapi.yaml`), in one place: routes,
//! the query parameter and header names, what a terminal id, an idempotency key and a
//! terminal's [`Labels`] may look like, and the two push fields posgate passes on
//! wherever the push goes (to the owner pod, then to the terminal) under the same names.
//!
//! Not for: handling requests (`crate::http`), or the internal wire formats
//! (`crate::peer::wire`, `crate::pos::wire`), which reuse the names here.

use std::collections::BTreeMap;

/// `POST {PUSH_ROUTE}`: push to one terminal.
pub const PUSH_ROUTE: &str = "/v1/terminals/{id}/push";
/// `POST {BATCH_ROUTE}`: many pushes, one result each.
pub const BATCH_ROUTE: &str = "/v1/pushes";
/// `GET {TERMINAL_ROUTE}`: where a terminal is served; `PUT`: add or change its
/// directory entry; `DELETE`: remove it from the directory.
pub const TERMINAL_ROUTE: &str = "/v1/terminals/{id}";
/// `POST {TERMINALS_ROUTE}`: import many terminals (the CSV of `posgate terminals
/// import`).
pub const TERMINALS_ROUTE: &str = "/v1/terminals";
/// `GET {CLUSTER_ROUTE}`: members and shard ownership.
pub const CLUSTER_ROUTE: &str = "/v1/cluster";
/// Create a broadcast (`POST`, `?selector=&ttl_s=`, `?dry_run=true` only counts).
pub const BROADCASTS_ROUTE: &str = "/v1/broadcasts";
/// A broadcast's status (`GET`).
pub const BROADCAST_ROUTE: &str = "/v1/broadcasts/{id}";
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

/// Labels of one terminal at most.
pub const MAX_LABELS: usize = 16;

/// A terminal's labels (`store=17`, `region=eu`), by key: what a broadcast selects
/// terminals by. A key is 1-63 characters of `[A-Za-z0-9._/-]` starting with a letter or
/// digit, a value 1-63 of `[A-Za-z0-9._-]`; at most [`MAX_LABELS`]. The text form (the
/// import file's `labels` column, the store) is `key=value` pairs joined by `;`, sorted
/// by key, empty for none: none of those characters can occur inside a key or a value,
/// so the text needs no quoting anywhere (CSV, a Redis hash, a URL query).
///
/// In JSON an object of strings, checked when read.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(
    try_from = "BTreeMap<String, String>",
    into = "BTreeMap<String, String>"
)]
pub struct Labels(BTreeMap<String, String>);

impl TryFrom<BTreeMap<String, String>> for Labels {
    type Error = String;

    fn try_from(map: BTreeMap<String, String>) -> Result<Labels, String> {
        for (key, value) in &map {
            check_label(key, value)?;
        }
        Labels::bounded(map)
    }
}

impl From<Labels> for BTreeMap<String, String> {
    fn from(labels: Labels) -> Self {
        labels.0
    }
}

/// Whether `key` is a valid label key.
fn valid_label_key(key: &str) -> bool {
    (1..=63).contains(&key.len())
        && key.as_bytes()[0].is_ascii_alphanumeric()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'))
}

/// Whether `value` is a valid label value.
fn valid_label_value(value: &str) -> bool {
    (1..=63).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Why `key=value` is not a valid label.
fn check_label(key: &str, value: &str) -> Result<(), String> {
    if !valid_label_key(key) {
        return Err(format!(
            "label key {key:?}: must be 1-63 characters of [A-Za-z0-9._/-], \
             starting with a letter or digit"
        ));
    }
    if !valid_label_value(value) {
        return Err(format!(
            "label {key}: value {value:?} must be 1-63 characters of [A-Za-z0-9._-]"
        ));
    }
    Ok(())
}

impl Labels {
    /// Parses the text form; the error says which pair is wrong and why.
    pub fn parse(text: &str) -> Result<Labels, String> {
        let mut labels = BTreeMap::new();
        for pair in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("label {pair:?} is not key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            check_label(key, value)?;
            if labels.insert(key.to_string(), value.to_string()).is_some() {
                return Err(format!("label {key} given twice"));
            }
        }
        Labels::bounded(labels)
    }

    fn bounded(labels: BTreeMap<String, String>) -> Result<Labels, String> {
        if labels.len() > MAX_LABELS {
            return Err(format!(
                "{} labels: a terminal has at most {MAX_LABELS}",
                labels.len()
            ));
        }
        Ok(Labels(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `key`, if the terminal has it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Whether a terminal with `labels` is selected by `self` as a broadcast's selector:
    /// it has every one of these pairs (more of its own do not matter). An empty
    /// selector selects nothing: a broadcast always names what it reaches.
    pub fn selects(&self, labels: &Labels) -> bool {
        !self.is_empty() && self.0.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// The text form: `a=1;b=2`.
impl std::fmt::Display for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_back_from_their_text() {
        let labels = Labels::parse(" region=eu ; store=17;; chain/brand=acme-1").unwrap();
        assert_eq!(labels.to_string(), "chain/brand=acme-1;region=eu;store=17");
        assert_eq!(Labels::parse(&labels.to_string()), Ok(labels.clone()));
        assert_eq!(labels.get("store"), Some("17"));
        assert_eq!(Labels::parse(""), Ok(Labels::default()));
        for bad in [
            "store",
            "=17",
            "store=",
            "-x=1",
            "store=a/b",
            "store=1;store=2",
            "st ore=1",
            "store=1=2",
        ] {
            assert!(Labels::parse(bad).is_err(), "{bad}");
        }
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("k{i}=v")).collect();
        assert!(Labels::parse(&many.join(";"))
            .unwrap_err()
            .contains("at most 16"));
        assert!(Labels::parse(&many[1..].join(";")).is_ok());
        assert!(!valid_label_key(&"k".repeat(64)));
        assert!(valid_label_value(&"v".repeat(63)));
        let selector = Labels::parse("store=17").unwrap();
        assert!(selector.selects(&labels) && !Labels::default().selects(&labels));
        assert!(!Labels::parse("store=18").unwrap().selects(&labels));
        assert!(!Labels::parse("store=17;lane=1").unwrap().selects(&labels));
        let json: Labels = serde_json::from_str(r#"{"store":"17"}"#).unwrap();
        assert_eq!(json.to_string(), "store=17");
        assert!(serde_json::from_str::<Labels>(r#"{"a":"1;b=2"}"#).is_err());
    }

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
