//! Turning settings into a Redis client, and Redis errors into [`StoreError`]s.
//!
//! Checks the URL and the cluster name before anything is sent (failures are
//! [`StoreError::Config`], with the password redacted), sets the socket options that
//! make a vanished peer fail in seconds rather than hours, installs the TLS crypto
//! provider for `rediss://`, and bounds every Redis future by a deadline of our own.
//!
//! What it does not do: hold connections or retry (that is [`super::RedisStore`]).

use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use redis::{Client, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind};

use super::reply::bad;
use super::RedisOptions;
use crate::store::keys::Keys;
use crate::store::StoreError;

/// `url` with any password replaced by `***`, for logs and errors. Splits at the last
/// `@`, so a password containing an unescaped `/` or `@` is still hidden (an `@` in the
/// path would only over-redact).
fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let user = rest[..at].split(':').next().unwrap_or_default();
    let sep = if scheme.is_empty() { "" } else { "://" };
    format!("{scheme}{sep}{user}:***{}", &rest[at..])
}

fn map_redis_error(e: &RedisError, limit: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(limit);
    }
    match e.kind() {
        ErrorKind::Parse
        | ErrorKind::UnexpectedReturnType
        | ErrorKind::Server(ServerErrorKind::ResponseError | ServerErrorKind::NoScript) => bad(e),
        _ => StoreError::Unavailable(e.to_string()),
    }
}

/// Runs a Redis future with a hard deadline on our side.
pub(super) async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, fut).await {
        Err(_) => Err(StoreError::Timeout(limit)),
        Ok(result) => result.map_err(|e| map_redis_error(&e, limit)),
    }
}

/// rustls needs a process-wide crypto provider. Only ring is compiled in (no aws-lc), so
/// rustls would pick it anyway; installing it explicitly keeps `rediss://` working even
/// if another crate in the process enables a second provider, in which case rustls
/// refuses to guess. An application that installed its own provider keeps it.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err only if another thread installed one in between, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Checks `url` and `cluster` and builds the client; nothing is sent to Redis yet.
/// Returns the client, the key names and the redacted URL.
pub(super) fn open(url: &str, cluster: &str) -> Result<(Client, Keys, String), StoreError> {
    let redacted = redact(url);
    let invalid = |why: String| StoreError::Config(format!("Redis URL {redacted:?}: {why}"));
    let keys = Keys::new(cluster).map_err(|e| StoreError::Config(e.to_string()))?;
    let tls = url.starts_with("rediss://");
    if !tls && !url.starts_with("redis://") {
        return Err(invalid(
            "expected redis://[user:password@]host[:port][/db] or rediss://...".into(),
        ));
    }
    if tls {
        ensure_crypto_provider();
    }
    let info = url
        .into_connection_info()
        .map_err(|e| invalid(e.to_string()))?;
    // Without these, a peer that vanished (no RST) leaves an idle socket open for hours.
    let keepalive = TcpKeepalive::new().with_time(Duration::from_secs(10));
    #[cfg(target_os = "linux")]
    let keepalive = keepalive
        .with_interval(Duration::from_secs(2))
        .with_retries(3);
    let tcp = TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive);
    // Unacknowledged writes fail the socket after this, instead of ~15 minutes.
    #[cfg(target_os = "linux")]
    let tcp = tcp.set_user_timeout(Duration::from_secs(10));
    // Client::open also builds the TLS configuration for rediss://.
    let client = Client::open(info.set_tcp_settings(tcp)).map_err(|e| invalid(e.to_string()))?;
    Ok((client, keys, redacted))
}

fn manager_config(opts: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(opts.response_timeout))
        .set_connection_timeout(Some(opts.connect_timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(100))
        .set_max_delay(Duration::from_secs(1))
}

/// A connection manager that connects on first use.
pub(super) fn lazy_manager(
    client: &Client,
    opts: &RedisOptions,
) -> Result<ConnectionManager, RedisError> {
    ConnectionManager::new_lazy_with_config(client.clone(), manager_config(opts))
}

/// Prefixes a failure to reach Redis at `redacted` with what we tried.
pub(super) fn cannot_connect(redacted: &str, e: StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(why) | StoreError::Protocol(why) => {
            StoreError::Unavailable(format!("cannot connect to Redis at {redacted}: {why}"))
        }
        // At start-up a timeout is a configuration question more often than a blip.
        StoreError::Timeout(t) => StoreError::Unavailable(format!(
            "cannot connect to Redis at {redacted}: no answer within {t:?} (wrong address, \
             a firewall, or rediss:// against a plain-text port or the reverse?)"
        )),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("rediss://:secret@h"), "rediss://:***@h");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("redis://u:p/a@ss@h:1/0"), "redis://u:***@h:1/0");
        assert!(!redact("u:p@a:b@h").contains("p@a"));
    }

    #[test]
    fn bad_settings_are_config_errors_without_the_password() {
        for (url, cluster) in [
            ("http://u:topsecret@h:6379", "c"),
            ("redis://u:topsecret@h:notaport/", "c"),
            ("redis://h:6379", "bad{name}"),
        ] {
            match open(url, cluster) {
                Err(StoreError::Config(why)) => assert!(!why.contains("topsecret"), "{why}"),
                other => panic!("{url} {cluster}: {:?}", other.map(|_| ())),
            }
        }
    }
}
