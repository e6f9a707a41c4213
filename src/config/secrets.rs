//! Where secrets come from (a file or an environment variable, never a flag value), and
//! how a Redis URL is given a password or has it hidden.
//!
//! What it does not do: check a secret's content (`ClusterSecret::new` does) or decide
//! whether one is required (`ServeArgs::resolve`).

use std::path::Path;

use super::{invalid, ConfigError};
use crate::store::redis::sentinel_url::SentinelUrl;

/// Where a setting came from, to blame in an error.
#[derive(Clone, Copy)]
pub(super) enum Origin {
    Flag(&'static str),
    Env(&'static str),
}

impl Origin {
    pub(super) fn error(self, reason: impl Into<String>) -> ConfigError {
        match self {
            Origin::Flag(flag) => invalid(flag, reason),
            Origin::Env(var) => ConfigError::InvalidEnv {
                var,
                reason: reason.into(),
            },
        }
    }
}

/// A secret from `file` or the environment variable `var`, trimmed (an empty variable
/// counts as unset). Both at once is refused: which one wins would be a guess.
pub(super) fn secret_from(
    file_flag: &'static str,
    file: Option<&Path>,
    var: &'static str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Option<(Origin, Vec<u8>)>, ConfigError> {
    let from_env = env(var)
        .map(|v| v.trim().as_bytes().to_vec())
        .filter(|v| !v.is_empty());
    match (file, from_env) {
        (Some(_), Some(_)) => Err(invalid(
            file_flag,
            format!("{var} is set too; give the secret one way"),
        )),
        (Some(path), None) => {
            let bytes = std::fs::read(path)
                .map_err(|e| invalid(file_flag, format!("cannot read {}: {e}", path.display())))?;
            Ok(Some((Origin::Flag(file_flag), bytes.trim_ascii().to_vec())))
        }
        (None, Some(bytes)) => Ok(Some((Origin::Env(var), bytes))),
        (None, None) => Ok(None),
    }
}

/// Puts `password` into `url`, percent-encoded.
pub(super) fn inject_password(url: &str, password: &str) -> Result<String, String> {
    if SentinelUrl::is_sentinel(url) {
        let mut parsed = SentinelUrl::parse(url)?;
        if parsed.password.is_some() {
            return Err("--redis-url already contains a password; give it one way".to_string());
        }
        parsed.password = Some(password.to_string());
        return Ok(parsed.to_url());
    }
    let mut parsed =
        redis::parse_redis_url(url).ok_or("--redis-url is not a valid Redis URL".to_string())?;
    if parsed.password().is_some() {
        return Err("--redis-url already contains a password; give it one way".to_string());
    }
    parsed.set_password(Some(password)).map_err(|()| {
        "a password can only be added to a redis:// or rediss:// URL with a host".to_string()
    })?;
    Ok(parsed.to_string())
}

/// `url` with the password replaced. The query is hidden whole: for Unix sockets the
/// password is a query parameter (`?pass=`).
pub(super) fn redact_url(url: &str) -> String {
    if SentinelUrl::is_sentinel(url) {
        return SentinelUrl::parse(url)
            .map(|u| u.redacted())
            .unwrap_or_else(|_| "<unparseable Redis Sentinel URL>".to_string());
    }
    let Some(mut parsed) = redis::parse_redis_url(url) else {
        // Where a secret would be in an unparseable URL is unknown; show nothing.
        return "<unparseable Redis URL>".to_string();
    };
    if parsed.password().is_some() {
        // Cannot fail: a URL that has a password can hold a password.
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query().is_some() {
        parsed.set_query(Some("***"));
    }
    parsed.to_string()
}
