//! What every connection to Redis (and to sentinels) is made with, and what its errors
//! mean: the TLS files, read and checked before anything is sent (failures are
//! [`StoreError::Config`], naming the file), the socket options that make a vanished peer
//! fail in seconds rather than hours, the TLS crypto provider, the connection manager's
//! settings, the mapping of Redis errors to [`StoreError`]s, and a deadline of our own
//! around every Redis future.
//!
//! What it does not do: hold connections or retry (that is [`super::RedisStore`]).

use std::fmt::Display;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use redis::{Client, ClientTlsConfig, ErrorKind, RedisError, ServerErrorKind, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

use super::reply::bad;
use super::RedisOptions;
use crate::store::StoreError;

/// The error codes with which a Redis that answers says it cannot serve us *now*: the
/// same call may succeed later, so they mean [`StoreError::Refused`], which the pod treats
/// like an unreachable store, never as an answer. Our scripts are flagged as writing
/// (`#!lua` in `super`), so Redis checks these conditions before running one: a refused
/// call did nothing.
const REFUSALS: &[&str] = &[
    // A replica: a failover demoted the node we reach, or someone ran REPLICAOF.
    "READONLY",
    // `maxmemory` reached under `noeviction`.
    "OOM",
    // Loading its data set after a restart.
    "LOADING",
    // A replica that lost its master and does not serve stale data.
    "MASTERDOWN",
    // Someone else's script or function ran past `busy-reply-threshold`.
    "BUSY",
    // `min-replicas-to-write` not met.
    "NOREPLICAS",
    // RDB snapshots fail and `stop-writes-on-bgsave-error` is set.
    "MISCONF",
    // A Redis Cluster (or a proxy in front of one) without a serving master for the slot.
    "CLUSTERDOWN",
    "TRYAGAIN",
];

pub(super) fn map_redis_error(e: &RedisError, limit: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(limit);
    }
    if let Some(code) = e.code().filter(|code| REFUSALS.contains(code)) {
        return StoreError::Refused {
            code: code.to_string(),
            detail: e.detail().unwrap_or_default().to_string(),
        };
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
pub(super) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err only if another thread installed one in between, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A TLS client certificate: two PEM files, read once when the store is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

fn tls_error(what: &str, path: &Path, why: impl Display) -> StoreError {
    StoreError::Config(format!("Redis TLS {what} {}: {why}", path.display()))
}

fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| tls_error(what, path, format!("cannot read it: {e}")))
}

/// The certificates in a PEM file; none at all is an error, because an empty trust store
/// or chain would only fail later, at every connection, with a vaguer message.
fn certificates(
    what: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| tls_error(what, path, "not a valid PEM file"))?;
    if certs.is_empty() {
        return Err(tls_error(what, path, "no PEM CERTIFICATE in it"));
    }
    Ok(certs)
}

/// Reads and checks the TLS files of `opts`, returned as the PEM bytes the redis crate
/// takes. It would parse them itself, but with errors that do not name the file, and
/// rustls compares the client key with its certificate only when connecting: a wrong
/// file would then look like an outage instead of failing at start.
pub(super) fn tls_certificates(opts: &RedisOptions) -> Result<TlsCertificates, StoreError> {
    let root_cert = match &opts.ca_file {
        Some(path) => {
            let pem = read_pem("CA file", path)?;
            let mut roots = RootCertStore::empty();
            for cert in certificates("CA file", path, &pem)? {
                roots.add(cert).map_err(|e| {
                    tls_error("CA file", path, format!("not a usable CA certificate: {e}"))
                })?;
            }
            Some(pem)
        }
        None => None,
    };
    let client_tls = match &opts.client_cert {
        Some(ClientCert {
            cert_file,
            key_file,
        }) => {
            let client_cert = read_pem("client certificate", cert_file)?;
            let client_key = read_pem("client key", key_file)?;
            let chain = certificates("client certificate", cert_file, &client_cert)?;
            // The parse error is not shown: it could quote a piece of the key.
            let key = PrivateKeyDer::from_pem_slice(&client_key).map_err(|_| {
                tls_error(
                    "client key",
                    key_file,
                    "no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
                )
            })?;
            // ring is the provider `ensure_crypto_provider` installs.
            CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider()).map_err(
                |e| {
                    let pair = format!("{} and {}", cert_file.display(), key_file.display());
                    StoreError::Config(format!(
                        "Redis TLS client certificate {pair}: the key does not match the \
                         certificate or is of an unsupported type ({e})"
                    ))
                },
            )?;
            Some(ClientTlsConfig {
                client_cert,
                client_key,
            })
        }
        None => None,
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// The socket options of every connection, to Redis and to sentinels: without them, a
/// peer that vanished (no RST) leaves an idle socket open for hours.
pub(super) fn tcp_settings() -> TcpSettings {
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
    tcp
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

    /// The error a server reply `line` (`-CODE detail`) becomes in the client.
    fn server_error(line: &str) -> RedisError {
        let reply = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        reply.extract_error().unwrap_err()
    }

    #[test]
    fn a_redis_that_cannot_serve_now_refuses_and_other_errors_keep_their_meaning() {
        let limit = Duration::from_secs(1);
        for line in [
            "READONLY You can't write against a read only replica.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "NOREPLICAS Not enough good replicas to write.",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "CLUSTERDOWN The cluster is down",
            "TRYAGAIN Multiple keys request during rehashing of slot",
        ] {
            let (code, detail) = line.split_once(' ').unwrap();
            match map_redis_error(&server_error(line), limit) {
                StoreError::Refused { code: c, detail: d } => {
                    assert_eq!((c.as_str(), d.as_str()), (code, detail), "{line}")
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        // A script error or a missing script is our mistake, not a state of the server.
        for line in [
            "ERR user_script:1: Script attempted to access a nonexistent global variable",
            "NOSCRIPT No matching script.",
        ] {
            let mapped = map_redis_error(&server_error(line), limit);
            assert!(
                matches!(mapped, StoreError::Protocol(_)),
                "{line}: {mapped:?}"
            );
        }
        // Codes we do not know (a newer server, ACLs) still fail the call: unavailable.
        for line in [
            "NOPERM this user has no permissions",
            "FUTURE something new",
        ] {
            let mapped = map_redis_error(&server_error(line), limit);
            assert!(
                matches!(mapped, StoreError::Unavailable(_)),
                "{line}: {mapped:?}"
            );
        }
    }
}
