//! HTTPS on the pod's listener (`--tls-cert`/`--tls-key`) and between pods
//! (`https://` advertise URLs, `--peer-ca-file`): pushes over TLS with a client that
//! verifies the certificate, forwarded to the owner over TLS; certificate rotation
//! (`Reloader::reload`, and the binary's file poller on a Kubernetes-style symlink
//! swap) reaching new handshakes while open connections keep working.
//!
//! In-process pods run on the embedded store and directory with a simulated POS farm,
//! so no Redis is needed; the binary test needs none either (`/healthz` does not wait
//! for the store).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use posgate::config::{PodConfig, PosConfig};
use posgate::core::shard::shard_of;
use posgate::credentials::ApiTokens;
use posgate::http::tls::ServerTlsFiles;
use posgate::pod::{Pod, PodHandle};
use posgate::store::directory::{DirectoryAdmin, MemoryDirectory, Terminal};
use posgate::store::memory::MemoryStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::support::binary::BinPod;
use crate::support::farm::{self, Farm};
use crate::support::pod::{self, SHARDS};
use crate::support::redis_server::free_port;
use crate::support::tls::{TestPki, PEER_NAME};
use crate::support::wait::{wait_for, wait_for_async};

/// How long a pod may take to listen, serve or present a new certificate.
const LIMIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "https-test-token-0123456789";
/// The operator token of the test pods (`posgate status`).
const OPERATOR: &str = "https-test-operator-0123456789";

/// A client config trusting the CA files `cas`, offering `alpn`. It never resumes a
/// session: a resumed session shows the certificate of its first handshake, and the
/// tests look at what a full handshake presents.
fn client_tls(cas: &[&Path], alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// A verified TLS connection to `addr` (certificate checked for 127.0.0.1).
async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    tls_connect_as(addr, config, "127.0.0.1").await
}

/// [`tls_connect`], the certificate checked for `name`.
async fn tls_connect_as(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    name: &'static str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name).unwrap();
    TlsConnector::from(config).connect(name, tcp).await
}

/// The leaf certificate a TLS connection was handed.
fn presented(tls: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

fn leaf(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).unwrap()
}

/// An HTTP/1.1 keep-alive connection over `tls`.
async fn http1(tls: TlsStream<TcpStream>) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// An HTTP/2 connection over `tls` (ALPN must have chosen h2).
async fn http2(tls: TlsStream<TcpStream>) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("https://127.0.0.1{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn push_request(terminal: &str) -> Request<Full<Bytes>> {
    Request::post(format!("https://127.0.0.1/v1/terminals/{terminal}/push"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\": 1}")))
        .unwrap()
}

/// [`push_request`] with the caller's deadline `timeout_ms`.
fn push_request_within(terminal: &str, timeout_ms: u64) -> Request<Full<Bytes>> {
    let mut request = push_request(terminal);
    *request.uri_mut() =
        format!("https://127.0.0.1/v1/terminals/{terminal}/push?timeout_ms={timeout_ms}")
            .parse()
            .unwrap();
    request
}

async fn answer(response: http::Response<hyper::body::Incoming>) -> (StatusCode, Bytes) {
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// A pod serving HTTPS with `pki`'s server certificate, advertising `https://`,
/// verifying peers against `peer_ca`.
fn tls_config(name: &str, addr: SocketAddr, pki: &TestPki, peer_ca: &Path) -> PodConfig {
    let mut config = pod::config(name, &format!("https://{addr}"));
    let tokens = format!("acme:{TOKEN},operator:{OPERATOR}");
    config.api_tokens = Some(ApiTokens::from_env_value(&tokens).unwrap());
    config.tls = Some(ServerTlsFiles {
        cert_file: pki.path("server"),
        key_file: pki.path("server-key"),
    });
    config.peers.ca_file = Some(peer_ca.to_owned());
    config
}

/// Two pods serving HTTPS with `pki`'s certificate and verifying peers against
/// `peer_ca`, over the embedded store and a farm of 40 simulated terminals; returns once
/// each shard is served by one pod and every terminal is connected.
async fn tls_cluster(pki: &TestPki, peer_ca: &Path) -> (Farm, Vec<Terminal>, Vec<TlsPod>) {
    tls_cluster_with(pki, peer_ca, |_| {}).await
}

/// [`tls_cluster`] with each pod's config changed by `adjust` first.
async fn tls_cluster_with(
    pki: &TestPki,
    peer_ca: &Path,
    adjust: impl Fn(&mut PodConfig),
) -> (Farm, Vec<Terminal>, Vec<TlsPod>) {
    let farm = Farm::start(farm::config(40)).await;
    let entries = farm.entries();
    let directory = Arc::new(MemoryDirectory::new());
    directory.upsert(SHARDS, &entries).await.unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut pods = Vec::new();
    for i in 0..2 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut config = tls_config(&format!("tls-pod-{i}"), addr, pki, peer_ca);
        config.pos = pod::pos(&farm.ca_file, PosConfig::default().dial_rate.get());
        adjust(&mut config);
        let pod =
            Pod::start_with_directory(config, store.clone(), directory.clone(), listener).unwrap();
        pods.push((pod, addr));
    }
    wait_for(
        "both pods serve and every terminal is connected",
        LIMIT,
        || {
            pod::settled(pods.iter().map(|(p, _)| p))
                && farm.counters().terminals_connected == entries.len() as u64
        },
    )
    .await;
    (farm, entries, pods)
}

type TlsPod = (PodHandle, SocketAddr);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pushes_over_https_reach_owners_through_https_peers() {
    let pki = TestPki::generate();
    let (_farm, entries, pods) = tls_cluster(&pki, &pki.path("ca")).await;

    // A client that verifies the pods' certificate against the test CA, over h2.
    let verified = client_tls(&[&pki.path("ca")], &[b"h2"]);
    let mut forwarded = 0;
    for (entry, (pod, addr)) in pods.iter().enumerate() {
        let tls = tls_connect(*addr, verified.clone()).await.unwrap();
        assert_eq!(presented(&tls), leaf(&pki.path("server")));
        let mut send = http2(tls).await;
        let me = pod.status.borrow().pod.as_ref().unwrap().to_string();
        for t in &entries {
            let (status, body) =
                answer(send.send_request(push_request(&t.id)).await.unwrap()).await;
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(status, StatusCode::OK, "via pod {entry}: {body}");
            assert_eq!(body["shard"], shard_of(&t.id, SHARDS));
            if body["pod"].as_str() != Some(me.as_str()) {
                forwarded += 1;
            }
        }
    }
    // Each pod owns about half the shards: many pushes went pod to pod over TLS.
    assert!(forwarded > 0, "no push was forwarded");

    // HTTP/1.1 by ALPN on the same port (probes, Prometheus, curl).
    let h1_only = client_tls(&[&pki.path("ca")], &[b"http/1.1"]);
    let tls = tls_connect(pods[0].1, h1_only).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (status, _) = answer(
        http1(tls)
            .await
            .send_request(get("/healthz"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // A client that does not trust the CA is refused at the handshake.
    let other = TestPki::generate();
    let stranger = client_tls(&[&other.path("ca")], &[b"h2"]);
    assert!(tls_connect(pods[0].1, stranger).await.is_err());

    // `posgate status` verifies the pod against --ca-file, and refuses one it cannot.
    let url = format!("https://{}", pods[0].1);
    let status = |ca: std::path::PathBuf| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let ca = ca.to_str().unwrap().to_string();
            let args = ["status", "--url", &url, "--ca-file", &ca];
            crate::support::binary::posgate(&args, &[("POSGATE_OPERATOR_TOKEN", OPERATOR)])
        })
    };
    let out = status(pki.path("ca")).await.unwrap();
    let drawn = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{drawn}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        drawn.contains("\n2 members                    64       64         40\n"),
        "{drawn}"
    );
    let out = status(other.path("ca")).await.unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("request failed"), "{said}");
}

/// Pods sharing one certificate (a Secret) that names neither of their addresses:
/// with `--peer-tls-name` they verify each other by that name and forward; without it
/// (the address is verified) they refuse to, like an untrusted peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_sharing_one_certificate_verify_peers_by_name() {
    let pki = TestPki::generate();
    for by_name in [true, false] {
        let shared = |config: &mut PodConfig| {
            config.tls = Some(ServerTlsFiles {
                cert_file: pki.path("peer"),
                key_file: pki.path("peer-key"),
            });
            config.peers.name = by_name.then(|| ServerName::try_from(PEER_NAME).unwrap());
        };
        let (_farm, entries, pods) = tls_cluster_with(&pki, &pki.path("ca"), shared).await;
        let (pod, addr) = &pods[0];
        let now = tokio::time::Instant::now().into_std();
        let elsewhere: Vec<&Terminal> = entries
            .iter()
            .filter(|t| pod.serving.serving(shard_of(&t.id, SHARDS), now).is_none())
            .collect();
        let client = client_tls(&[&pki.path("ca")], &[b"h2"]);
        let tls = tls_connect_as(*addr, client, PEER_NAME).await.unwrap();
        let mut send = http2(tls).await;
        let request = push_request_within(&elsewhere[0].id, 1_000);
        let (status, body) = answer(send.send_request(request).await.unwrap()).await;
        let body: Value = serde_json::from_slice(&body).unwrap();
        if by_name {
            assert_eq!(
                status,
                StatusCode::OK,
                "forwarded, verified by name: {body}"
            );
            assert_ne!(
                body["pod"],
                pod.status.borrow().pod.as_ref().unwrap().to_string()
            );
        } else {
            assert_eq!(
                (status, body["error"].as_str()),
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some("terminal_unavailable")
                ),
                "not forwarded, the address is not in the certificate: {body}"
            );
        }
    }
}

/// `posgate status` as `kubectl exec deploy/posgate -- posgate status --url
/// https://127.0.0.1:8080` runs it in a prod pod: only the pod's environment (its tokens
/// file, peer CA and peer TLS name), a certificate that does not name 127.0.0.1. It
/// draws the cluster; without the name it refuses the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn posgate_status_inside_a_pod_needs_only_the_pods_environment() {
    let pki = TestPki::generate();
    let shared = |config: &mut PodConfig| {
        config.tls = Some(ServerTlsFiles {
            cert_file: pki.path("peer"),
            key_file: pki.path("peer-key"),
        });
        config.peers.name = Some(ServerName::try_from(PEER_NAME).unwrap());
    };
    let (_farm, _entries, pods) = tls_cluster_with(&pki, &pki.path("ca"), shared).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("api-tokens");
    std::fs::write(&tokens, format!("acme:{TOKEN}\noperator:{OPERATOR}\n")).unwrap();
    let url = format!("https://{}", pods[0].1);
    let (ca, tokens) = (pki.path("ca"), tokens.to_str().unwrap().to_string());
    for with_name in [true, false] {
        let (url, ca, tokens) = (url.clone(), ca.clone(), tokens.clone());
        let out = tokio::task::spawn_blocking(move || {
            let mut env = vec![
                ("POSGATE_API_TOKENS_FILE", tokens.as_str()),
                ("POSGATE_PEER_CA_FILE", ca.to_str().unwrap()),
            ];
            if with_name {
                env.push(("POSGATE_PEER_TLS_NAME", PEER_NAME));
            }
            crate::support::binary::posgate(&["status", "--url", &url], &env)
        })
        .await
        .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if with_name {
            assert!(out.status.success(), "{stdout}{stderr}");
            assert!(stdout.starts_with("posgate cluster, as "), "{stdout}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
            assert!(stderr.contains("certificate"), "{stderr}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn peers_with_an_untrusted_certificate_get_no_forwarded_push() {
    // The pods' peer CA did not issue their certificates: each delivers to its own
    // terminals, but refuses to forward to the other (verification is never off).
    let pki = TestPki::generate();
    let unrelated = TestPki::generate();
    let (_farm, entries, pods) = tls_cluster(&pki, &unrelated.path("ca")).await;
    let (pod, addr) = &pods[0];
    let now = tokio::time::Instant::now().into_std();
    let (mine, elsewhere): (Vec<&Terminal>, Vec<&Terminal>) = entries
        .iter()
        .partition(|t| pod.serving.serving(shard_of(&t.id, SHARDS), now).is_some());
    let tls = tls_connect(*addr, client_tls(&[&pki.path("ca")], &[b"h2"]))
        .await
        .unwrap();
    let mut send = http2(tls).await;
    let (status, body) = answer(send.send_request(push_request(&mine[0].id)).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let request = push_request_within(&elsewhere[0].id, 500);
    let (status, body) = answer(send.send_request(request).await.unwrap()).await;
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "terminal_unavailable", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_certificate_serves_new_handshakes_and_keeps_open_connections() {
    let first = TestPki::generate();
    let second = TestPki::generate();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(first.path("server"), &cert).unwrap();
    std::fs::copy(first.path("server-key"), &key).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = tls_config("rotating", addr, &first, &first.path("ca"));
    config.tls = Some(ServerTlsFiles {
        cert_file: cert.clone(),
        key_file: key.clone(),
    });
    let pod = Pod::start(config.clone(), MemoryStore::new(), listener, ()).unwrap();
    let both = client_tls(&[&first.path("ca"), &second.path("ca")], &[b"http/1.1"]);

    let tls = tls_connect(addr, both.clone()).await.unwrap();
    assert_eq!(presented(&tls), leaf(&first.path("server")));
    let mut open = http1(tls).await;
    let (status, _) = answer(open.send_request(get("/healthz")).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);

    std::fs::copy(second.path("server"), &cert).unwrap();
    std::fs::copy(second.path("server-key"), &key).unwrap();
    pod.reloader.reload(&config).unwrap();
    let tls = tls_connect(addr, both.clone()).await.unwrap();
    assert_eq!(presented(&tls), leaf(&second.path("server")));
    // The connection opened before the rotation still works. (hyper sends only on a
    // connection that reported ready.)
    open.ready().await.unwrap();
    let (status, _) = answer(open.send_request(get("/healthz")).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);

    // A broken certificate file is refused, and nothing of that reload applies: not the
    // certificate, not the new token that came with it.
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nbroken\n").unwrap();
    let mut broken = config.clone();
    broken.api_tokens = Some(ApiTokens::from_env_value("acme:another-token-0123456789").unwrap());
    let err = pod.reloader.reload(&broken).unwrap_err().to_string();
    assert!(err.contains("tls.crt"), "{err}");
    let tls = tls_connect(addr, both).await.unwrap();
    assert_eq!(presented(&tls), leaf(&second.path("server")));
    let cluster = Request::get("https://127.0.0.1/v1/cluster")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    open.ready().await.unwrap();
    let (status, _) = answer(open.send_request(cluster).await.unwrap()).await;
    // Known (a tenant's token may not see the cluster: 403), not unknown (401).
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the old token must still work"
    );
}

/// Points `<dir>/..data` at `<dir>/<version>` by an atomic rename, as the kubelet
/// updates a Secret volume.
fn swap_data_link(dir: &Path, version: &str) {
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_picks_up_a_swapped_secret_volume_without_a_signal() {
    let (first, second) = (TestPki::generate(), TestPki::generate());
    // The Secret volume layout: tls.crt -> ..data/tls.crt, ..data -> v1.
    let volume = tempfile::tempdir().unwrap();
    let root = volume.path();
    for (version, pki) in [("v1", &first), ("v2", &second)] {
        std::fs::create_dir(root.join(version)).unwrap();
        std::fs::copy(pki.path("server"), root.join(version).join("tls.crt")).unwrap();
        std::fs::copy(pki.path("server-key"), root.join(version).join("tls.key")).unwrap();
    }
    std::os::unix::fs::symlink("v1", root.join("..data")).unwrap();
    for file in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{file}"), root.join(file)).unwrap();
    }
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let advertise = format!("https://{addr}");
    let mut args = ["--insecure", "--redis-url", "redis://127.0.0.1:1"]
        .into_iter()
        .chain([
            "--advertise-url",
            &advertise,
            "--reload-poll-interval",
            "100ms",
        ])
        .map(OsString::from)
        .collect::<Vec<_>>();
    args.extend(["--tls-cert".into(), root.join("tls.crt").into()]);
    args.extend(["--tls-key".into(), root.join("tls.key").into()]);
    let _serve = BinPod::serve(port, args);
    let both = client_tls(&[&first.path("ca"), &second.path("ca")], &[b"http/1.1"]);
    wait_for_async("the pod listens", LIMIT, || async {
        tls_connect(addr, both.clone()).await.is_ok()
    })
    .await;
    let tls = tls_connect(addr, both.clone()).await.unwrap();
    assert_eq!(presented(&tls), leaf(&first.path("server")));
    let mut open = http1(tls).await;
    let (status, _) = answer(open.send_request(get("/healthz")).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);

    swap_data_link(root, "v2");
    let renewed = leaf(&second.path("server"));
    wait_for_async(
        "a new handshake presents the new certificate",
        LIMIT,
        || async { presented(&tls_connect(addr, both.clone()).await.unwrap()) == renewed },
    )
    .await;
    // hyper sends only on a connection that reported ready; right after a response the
    // connection task may not have caught up yet ("connection was not ready").
    open.ready().await.unwrap();
    let (status, _) = answer(open.send_request(get("/healthz")).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    open.ready().await.unwrap();
    let (status, metrics) = answer(open.send_request(get("/metrics")).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = String::from_utf8_lossy(&metrics);
    // One reload, or two if a poll read the files across the swap; none failed.
    assert!(
        metrics.contains("posgate_reloads_total{result=\"error\"} 0")
            && !metrics.contains("posgate_reloads_total{result=\"ok\"} 0"),
        "{metrics}"
    );
}
