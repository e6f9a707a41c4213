//! `rediss://` against a real TLS `redis-server` whose certificate comes from a private
//! CA (generated per test): trusted through `RedisOptions::ca_file`, refused without it,
//! mutual TLS with `RedisOptions::client_cert`, and bad TLS files as `Config` errors that
//! name the file. None of the failures may panic or leak the password.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::pod::member;
use crate::support::tls::TestPki;
use crate::support::RedisServer;
use posgate::core::lease::Checked;
use posgate::store::redis::{ClientCert, RedisOptions, RedisStore};
use posgate::store::{ClusterMeta, CoordStore, StoreError};

const SHARDS: u32 = 4;
const TTL: Duration = Duration::from_secs(30);

fn options(ca_file: Option<PathBuf>, client_cert: Option<ClientCert>) -> RedisOptions {
    RedisOptions {
        // TLS handshakes on a busy CI machine take longer than plain connects.
        response_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ca_file,
        client_cert,
        sentinel_password: None,
        wait: None,
    }
}

fn trusting(pki: &TestPki) -> RedisOptions {
    options(Some(pki.path("ca")), None)
}

fn client_cert(pki: &TestPki, key: &str) -> Option<ClientCert> {
    Some(ClientCert {
        cert_file: pki.path("client"),
        key_file: pki.path(key),
    })
}

fn url(server: &RedisServer, host: &str) -> String {
    format!("rediss://{host}:{}/", server.tls_port())
}

/// A heartbeat written over TLS is read back by a snapshot over TLS.
async fn round_trip(store: &RedisStore) {
    let meta = ClusterMeta::current(SHARDS);
    store.pin_meta(&meta).await.expect("pin_meta over TLS");
    let generation = store.snapshot(SHARDS).await.expect("snapshot").generation;
    let member = member("tls-a");
    let beat = store.heartbeat(&generation.id, &member, &meta, TTL).await;
    assert!(matches!(beat, Ok(Checked::Ok(_))), "heartbeat: {beat:?}");
    let snap = store.snapshot(SHARDS).await.expect("snapshot");
    assert_eq!(snap.generation.id, generation.id);
    assert_eq!(snap.members, vec![member]);
}

/// A connection that must fail: `Unavailable`, saying what was tried, no password.
async fn refused(url: &str, opts: RedisOptions) -> String {
    let err = RedisStore::connect(url, "tls", opts)
        .await
        .expect_err("must not connect");
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Unavailable(_)), "{msg}");
    assert!(msg.contains("cannot connect"), "{msg}");
    assert!(!msg.contains("topsecret"), "{msg}");
    msg
}

#[tokio::test]
async fn private_ca_is_trusted_through_ca_file() {
    let pki = TestPki::generate();
    let server = RedisServer::start_tls(&pki, false);
    // By name and by IP address: the certificate carries both.
    for host in ["localhost", "127.0.0.1"] {
        let store = RedisStore::connect(&url(&server, host), "tls", trusting(&pki))
            .await
            .unwrap_or_else(|e| panic!("connect to {host} over TLS: {e}"));
        round_trip(&store).await;
        assert_eq!(server.command(&["FLUSHALL"]), "+OK");
    }
    // The way a pod starts: the first calls connect, and the subscription follows.
    let lazy = RedisStore::connect_lazy(&url(&server, "localhost"), "tls", trusting(&pki))
        .expect("lazy TLS store");
    let mut changes = lazy.changes();
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .expect("the TLS pub/sub subscription never came up")
        .unwrap();
    round_trip(&lazy).await;
}

#[tokio::test]
async fn private_ca_is_refused_without_ca_file() {
    let pki = TestPki::generate();
    let server = RedisServer::start_tls(&pki, false);
    let tls = url(&server, "localhost");
    // The system store does not know the test CA; nor does a CA file of another CA.
    let msg = refused(&tls, options(None, None)).await;
    assert!(
        msg.contains("invalid peer certificate: UnknownIssuer"),
        "{msg}"
    );
    eprintln!("without a CA file: {msg}");
    // Same CA name, other key: the signature does not verify.
    let other = TestPki::generate();
    let msg = refused(&tls, trusting(&other)).await;
    assert!(msg.contains("invalid peer certificate"), "{msg}");
    eprintln!("with another CA's file: {msg}");
    // The password in the URL stays hidden when the handshake fails.
    let with_password = format!("rediss://:topsecret@localhost:{}/", server.tls_port());
    refused(&with_password, options(None, None)).await;
    let lazy = RedisStore::connect_lazy(&tls, "tls", options(None, None)).expect("lazy store");
    let err = lazy.snapshot(SHARDS).await.expect_err("untrusted server");
    assert!(
        matches!(err, StoreError::Unavailable(_) | StoreError::Timeout(_)),
        "{err}"
    );
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let pki = TestPki::generate();
    let server = RedisServer::start_tls(&pki, true);
    let tls = url(&server, "localhost");
    let with_cert = options(Some(pki.path("ca")), client_cert(&pki, "client-key"));
    let store = RedisStore::connect(&tls, "tls", with_cert)
        .await
        .expect("mutual TLS with the client certificate");
    round_trip(&store).await;
    let msg = refused(&tls, trusting(&pki)).await;
    eprintln!("mutual TLS without a client certificate: {msg}");
}

#[tokio::test]
async fn bad_tls_files_are_config_errors_naming_the_file() {
    let pki = TestPki::generate();
    let missing = pki.dir().join("missing.pem");
    let empty = pki.dir().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let garbage = pki.dir().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    let cert = |key_file: PathBuf| {
        Some(ClientCert {
            cert_file: pki.path("client"),
            key_file,
        })
    };
    let cases = [
        (options(Some(missing.clone()), None), missing.clone()),
        (options(Some(empty.clone()), None), empty.clone()),
        (options(Some(garbage.clone()), None), garbage.clone()),
        // A certificate is no private key.
        (options(None, cert(pki.path("client"))), pki.path("client")),
        (options(None, cert(missing.clone())), missing.clone()),
        // The server's key does not belong to the client certificate.
        (
            options(None, cert(pki.path("server-key"))),
            pki.path("server-key"),
        ),
        (
            options(
                None,
                Some(ClientCert {
                    cert_file: empty.clone(),
                    key_file: pki.path("client-key"),
                }),
            ),
            empty.clone(),
        ),
    ];
    // No server: the files are checked before anything is sent.
    let url = "rediss://:topsecret@localhost:1/";
    for (opts, file) in cases {
        let file = file.display().to_string();
        for err in [
            RedisStore::connect(url, "tls", opts.clone())
                .await
                .expect_err(&file),
            RedisStore::connect_lazy(url, "tls", opts).expect_err(&file),
        ] {
            let msg = err.to_string();
            assert!(matches!(err, StoreError::Config(_)), "{file}: {msg}");
            assert!(msg.contains(&file) && !msg.contains("topsecret"), "{msg}");
            eprintln!("{msg}");
        }
    }
    // TLS files with a plain-text URL would silently not be used.
    let err = RedisStore::connect_lazy("redis://:topsecret@localhost:1/", "tls", trusting(&pki))
        .expect_err("TLS files need rediss://");
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Config(_)), "{msg}");
    assert!(
        msg.contains("rediss://") && !msg.contains("topsecret"),
        "{msg}"
    );
}
