//! A terminal presenting a certificate for another name never gets a session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use posgate::store::directory::Terminal;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::support::binary::{self};
use crate::support::farm::{self, connect_limit, import, Farm};
use crate::support::wait::{secs, wait_for};
use crate::support::RedisServer;

// ----- 4. a certificate for the wrong name -----------------------------------------------

/// A TLS server presenting a certificate for `localhost` only, issued by its own CA;
/// counts the TCP connections it accepts.
struct WrongNameServer {
    addr: std::net::SocketAddr,
    ca_pem: String,
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

async fn wrong_name_server() -> WrongNameServer {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone(), ca.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = accepted.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::Relaxed);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // The client is expected to abort the handshake (bad certificate).
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let mut sink = Vec::new();
                    let _ = tls.read_to_end(&mut sink).await;
                }
            });
        }
    });
    WrongNameServer {
        addr,
        ca_pem: ca.pem(),
        accepted,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_the_wrong_name_is_refused_with_one_clear_log_line() {
    const N: u64 = 100;
    const WRONG: &str = "wrong-name-0";
    let test = "wrong-name";
    let test_started = Instant::now();
    let redis = RedisServer::start();
    let t = Farm::with_directory(&redis, farm::config(N)).await;
    let server = wrong_name_server().await;
    // The pod trusts both CAs: the wrong terminal's chain is valid, only its name is not.
    let bundle = t.dir.path().join("bundle.pem");
    std::fs::write(&bundle, format!("{}{}", t.ca_pem(), server.ca_pem)).unwrap();
    let wrong = Terminal::new(WRONG, &server.addr.to_string(), Some("wrong.example")).unwrap();
    import(&redis, &[wrong]).await;

    let mut pod = binary::terminal_pod("wrong-name-pod", &redis.url(), &bundle, t.dir.path(), &[]);
    let took = wait_for(
        "every good terminal with a session",
        connect_limit(),
        || t.all_settled(),
    )
    .await;
    pod.assert_running();
    eprintln!(
        "[{test}] all {N} good terminals have a session after {:.3} s",
        secs(took)
    );
    // Let the wrong terminal be retried a few times (backoff 1 s, 2 s, 4 s ...).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let attempts = server.accepted.load(Ordering::Relaxed);
    let warned = pod.log_lines_with(&[
        "terminal presented a certificate for another name; check its directory entry",
        WRONG,
    ]);
    let failed_again = pod.log_lines_with(&[WRONG, "terminal dial failed"]);
    let counters = t.counters();
    eprintln!(
        "[{test}] the wrong-name terminal was dialed {attempts} times in ~{:.0} s; warn lines: \
         {}; other dial-failure lines naming it at info+: {}",
        secs(test_started.elapsed()),
        warned.len(),
        failed_again.len()
    );
    for line in &warned {
        eprintln!("[{test}] log: {line}");
    }
    eprintln!("[{test}] farm: {counters:?}");
    // The metric: wrong-name refusals count as `tls_error` dials.
    let metrics = match pod.get("/metrics", binary::API_TOKEN).await {
        Some((200, text)) => text,
        _ => String::new(),
    };
    let tls_errors: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("posgate_dials_total{result=\"tls_error\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    eprintln!("[{test}] posgate_dials_total{{result=\"tls_error\"}} = {tls_errors}");
    assert!(
        tls_errors >= attempts.min(2) as u64,
        "the refusals are counted as tls_error dials ({tls_errors})"
    );
    assert!(attempts >= 2, "the wrong terminal is retried ({attempts})");
    assert!(
        attempts <= 10,
        "the wrong terminal is retried with backoff, not in a loop ({attempts})"
    );
    assert_eq!(
        warned.len(),
        1,
        "exactly one warning for the streak, naming the terminal"
    );
    assert!(warned[0].contains("wrong.example"), "{}", warned[0]);
    assert!(
        warned[0].contains("\"level\":\"WARN\""),
        "logged as a warning: {}",
        warned[0]
    );
    assert_eq!(counters.sessions_accepted, N, "only the good terminals");
    assert_eq!(counters.handshakes_failed, 0);
    assert_eq!(counters.unknown_sni_refused, 0);
    server.task.abort();
    pod.signal("-TERM");
    eprintln!("[{test}] test took {:.3} s", secs(test_started.elapsed()));
}
