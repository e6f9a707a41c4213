//! The push API end to end: pods (`Pod::start_with_terminals`) against a real
//! `redis-server` and a `PosFarm` of simulated terminals, pushes sent over HTTP to any
//! pod. Every documented status code is produced through the real server; pushes sent
//! round-robin to all pods reach each terminal exactly once, from the owner.
//!
//! Timings are `CoreConfig::fast()`; measured figures are printed (`--nocapture`).

pub mod support;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use posgate::config::{PodConfig, PosSettings};
use posgate::core::shard::shard_of;
use posgate::core::{CoreConfig, PodId};
use posgate::credentials::ApiTokens;
use posgate::credentials::ClusterSecret;
use posgate::pod::{Pod, PodHandle};
use posgate::pos::tls::TlsFiles;
use posgate::push::PushSettings;
use posgate::store::directory::{DirectoryAdmin, Terminal};
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate_loadtest::pos_sim::{FarmConfig, FaultConfig, PosFarm};
use serde_json::Value;
use support::peer_tap::PeerTap;
use support::RedisServer;
use tokio::net::TcpListener;

const SHARDS: u32 = 64;
const CLUSTER: &str = "push-e2e";
const ACME: &str = "acme-token-0123456789";
const BANK: &str = "bank-token-0123456789";
const STORE_TIMEOUT: Duration = Duration::from_millis(300);

/// A cluster of pods over one Redis and one farm.
struct Cluster {
    redis: RedisServer,
    ca_file: std::path::PathBuf,
    farm: PosFarm,
    pods: Vec<PodHandle>,
    /// Each pod's own listener.
    urls: Vec<String>,
    /// With `Cluster::start_tapped`, the tap in front of each pod (what peers reach).
    taps: Vec<PeerTap>,
    ids: Vec<String>,
    _dir: tempfile::TempDir,
}

fn options() -> RedisOptions {
    RedisOptions {
        response_timeout: STORE_TIMEOUT,
        connect_timeout: STORE_TIMEOUT,
        ..Default::default()
    }
}

/// A pod's config: fast timings, both tenants' tokens, `push` limits.
fn pod_config(name: &str, url: &str, ca_file: &Path, push: PushSettings) -> PodConfig {
    let secret = ClusterSecret::new(*b"push-api-test-cluster-secret").unwrap();
    let mut config = PodConfig::new(
        PodId::new(name).unwrap(),
        url,
        CoreConfig::fast(),
        Some(secret),
    );
    config.cluster = CLUSTER.to_string();
    config.store_timeout = STORE_TIMEOUT;
    config.api_tokens =
        Some(ApiTokens::from_env_value(&format!("acme:{ACME},bank:{BANK}")).unwrap());
    config.push = push;
    config.pos = PosSettings {
        tls: TlsFiles {
            ca_file: Some(ca_file.to_owned()),
            client: None,
        },
        dial_rate: NonZeroU32::new(2_000).unwrap(),
        ..PosSettings::default()
    };
    config
}

async fn start_configured(config: PodConfig, redis_url: &str, listener: TcpListener) -> PodHandle {
    let store = RedisStore::connect_lazy(redis_url, CLUSTER, options()).unwrap();
    Pod::start_with_terminals(config, store, listener).unwrap()
}

async fn start_pod(
    name: &str,
    redis_url: &str,
    ca_file: &Path,
    push: PushSettings,
) -> (PodHandle, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let config = pod_config(name, &url, ca_file, push);
    (start_configured(config, redis_url, listener).await, url)
}

trait Serving {
    fn serving_count(&self) -> usize;
}

impl Serving for PodHandle {
    fn serving_count(&self) -> usize {
        let now = tokio::time::Instant::now().into_std();
        (0..SHARDS)
            .filter(|&s| self.serving.serving(s, now).is_some())
            .count()
    }
}

impl Cluster {
    /// `pods` pods over `terminals` farm terminals, plus directory entries for
    /// `extra` (id, addr) terminals outside the farm; waits until every farm terminal
    /// has a session.
    async fn start(
        pods: usize,
        terminals: u64,
        extra: &[(&str, &str)],
        push: PushSettings,
    ) -> Self {
        Cluster::start_with(pods, terminals, extra, push, false).await
    }

    /// Like `start`, with a [`PeerTap`] in front of every pod: each pod advertises its
    /// tap's URL, so every forwarded push crosses a tap and is recorded there.
    async fn start_tapped(pods: usize, terminals: u64) -> Self {
        Cluster::start_with(pods, terminals, &[], PushSettings::default(), true).await
    }

    async fn start_with(
        pods: usize,
        terminals: u64,
        extra: &[(&str, &str)],
        push: PushSettings,
        tapped: bool,
    ) -> Self {
        let redis = RedisServer::start();
        let mut farm_config = FarmConfig::new(0..terminals);
        farm_config.port = 0;
        let farm = PosFarm::start(farm_config).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("pos-ca.pem");
        std::fs::write(&ca_file, farm.ca_pem()).unwrap();
        let mut entries: Vec<Terminal> = farm
            .terminals()
            .iter()
            .map(|t| Terminal::new(&t.id, &t.addr.to_string(), Some(&t.server_name)).unwrap())
            .collect();
        let ids = entries.iter().map(|t| t.id.clone()).collect();
        for (id, addr) in extra {
            entries.push(Terminal::new(id, addr, Some("nowhere.test")).unwrap());
        }
        let admin = RedisStore::connect(&redis.url(), CLUSTER, options())
            .await
            .unwrap();
        admin.upsert(SHARDS, &entries).await.unwrap();
        let mut handles = Vec::new();
        let mut urls = Vec::new();
        let mut taps = Vec::new();
        for i in 0..pods {
            let name = format!("push-pod-{i}");
            let (pod, url) = if tapped {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let url = format!("http://{}", listener.local_addr().unwrap());
                let tap = PeerTap::start(url.clone()).await;
                let config = pod_config(&name, &tap.url, &ca_file, push.clone());
                taps.push(tap);
                (start_configured(config, &redis.url(), listener).await, url)
            } else {
                start_pod(&name, &redis.url(), &ca_file, push.clone()).await
            };
            handles.push(pod);
            urls.push(url);
        }
        let cluster = Cluster {
            redis,
            ca_file,
            farm,
            pods: handles,
            urls,
            taps,
            ids,
            _dir: dir,
        };
        let started = Instant::now();
        while cluster.farm.counters().terminals_connected < terminals || !cluster.settled() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "cluster did not settle"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "[push] {pods} pods, {terminals} terminals connected in {:.2} s",
            started.elapsed().as_secs_f64()
        );
        cluster
    }

    /// Every shard served by exactly one pod.
    fn settled(&self) -> bool {
        let now = tokio::time::Instant::now().into_std();
        (0..SHARDS).all(|s| {
            self.pods
                .iter()
                .filter(|p| p.serving.serving(s, now).is_some())
                .count()
                == 1
        })
    }

    /// The pod id serving `terminal`'s shard now.
    fn owner_of(&self, terminal: &str) -> Option<String> {
        let now = tokio::time::Instant::now().into_std();
        let shard = shard_of(terminal, SHARDS);
        self.pods
            .iter()
            .find(|p| p.serving.serving(shard, now).is_some())
            .and_then(|p| p.status.borrow().pod.as_ref().map(|id| id.to_string()))
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A push request; `None` fields are left out.
struct Push<'a> {
    token: Option<&'a str>,
    key: Option<&'a str>,
    body: &'a str,
    query: &'a str,
}

impl Default for Push<'_> {
    fn default() -> Self {
        Push {
            token: Some(ACME),
            key: None,
            body: "{\"amount\": 1}",
            query: "",
        }
    }
}

async fn push(
    http: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    terminal: &str,
    p: Push<'_>,
) -> (StatusCode, HeaderMap, Value) {
    let mut request = Request::post(format!("{base}/v1/terminals/{terminal}/push{}", p.query))
        .header("content-type", "application/json");
    if let Some(token) = p.token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if let Some(key) = p.key {
        request = request.header("idempotency-key", key);
    }
    let request = request
        .body(Full::new(Bytes::from(p.body.to_string())))
        .unwrap();
    send(http, request).await
}

async fn send(
    http: &Client<HttpConnector, Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> (StatusCode, HeaderMap, Value) {
    let response = http.request(request).await.expect("pod answers");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("JSON body, got {:?}", String::from_utf8_lossy(&body)));
    (parts.status, parts.headers, json)
}

async fn get(
    http: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = Request::get(url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let (status, _, body) = send(http, request.body(Full::new(Bytes::new())).unwrap()).await;
    (status, body)
}

fn error_of(body: &Value) -> &str {
    body["error"].as_str().unwrap_or("<none>")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_documented_status_code_through_the_real_server() {
    let settings = PushSettings {
        max_push_bytes: 1024,
        max_waiting_per_terminal: 1,
        ..PushSettings::default()
    };
    // Port 1 on loopback refuses: a terminal that is never reachable.
    let c = Cluster::start(2, 100, &[("pos-offline", "127.0.0.1:1")], settings).await;
    let http = client();
    let (a, b) = (&c.urls[0], &c.urls[1]);
    let t = c.ids[0].clone();

    // 200, from either pod; `pod` is the owner.
    for base in [a, b] {
        let (status, _, body) = push(&http, base, &t, Push::default()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["terminal"], t.as_str());
        assert_eq!(body["pod"].as_str(), c.owner_of(&t).as_deref());
        assert_eq!(body["shard"], shard_of(&t, SHARDS));
        assert_eq!(body["pos_status"], 200);
        let key = body["idempotency_key"].as_str().unwrap();
        assert_eq!(key.len(), 36, "a generated UUID: {key}");
    }

    // Replay: the same key and body through the other pod -> the stored answer, one delivery.
    let keyed = Push {
        key: Some("order-1"),
        ..Push::default()
    };
    let (s1, _, first) = push(&http, a, &t, keyed).await;
    let (s2, _, second) = push(
        &http,
        b,
        &t,
        Push {
            key: Some("order-1"),
            ..Push::default()
        },
    )
    .await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(first["epoch"], second["epoch"]);
    let report = c.farm.terminal_report(&t).unwrap();
    let deliveries = report
        .recent_pushes
        .iter()
        .filter(|p| p.idempotency_key == "acme:order-1")
        .count();
    assert_eq!(deliveries, 1, "a replay must not deliver again");

    // 409: the same key with another body.
    let other = Push {
        key: Some("order-1"),
        body: "{\"amount\": 2}",
        ..Push::default()
    };
    let (status, _, body) = push(&http, b, &t, other).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::CONFLICT, "idempotency_conflict")
    );
    // Another tenant's identical key is its own.
    let bank = Push {
        token: Some(BANK),
        key: Some("order-1"),
        body: "{\"amount\": 2}",
        ..Push::default()
    };
    assert_eq!(push(&http, a, &t, bank).await.0, StatusCode::OK);

    // 400: bad id, key and timeout.
    for (terminal, p) in [
        ("bad id!", Push::default()),
        (
            t.as_str(),
            Push {
                key: Some("has space"),
                ..Push::default()
            },
        ),
        (
            t.as_str(),
            Push {
                query: "?timeout_ms=0",
                ..Push::default()
            },
        ),
        (
            t.as_str(),
            Push {
                query: "?timeout_ms=30001",
                ..Push::default()
            },
        ),
    ] {
        let terminal = terminal.replace(' ', "%20");
        let (status, _, body) = push(&http, a, &terminal, p).await;
        assert_eq!(
            (status, error_of(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{body}"
        );
    }

    // 401: no token, a wrong one; /v1/cluster needs one too; probes never do.
    for token in [None, Some("wrong-token-0123456789")] {
        let (status, headers, body) = push(
            &http,
            a,
            &t,
            Push {
                token,
                ..Push::default()
            },
        )
        .await;
        assert_eq!(
            (status, error_of(&body)),
            (StatusCode::UNAUTHORIZED, "unauthorized")
        );
        assert_eq!(headers["www-authenticate"], "Bearer");
    }
    assert_eq!(
        get(&http, &format!("{a}/v1/cluster"), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(&http, &format!("{a}/v1/cluster"), Some(ACME)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get(&http, &format!("{a}/readyz"), None).await.0,
        StatusCode::OK
    );

    // 404: valid id, not in the directory (answered by the owner, also via a forward).
    for base in [a, b] {
        let (status, _, body) = push(&http, base, "pos-nobody", Push::default()).await;
        assert_eq!(
            (status, error_of(&body)),
            (StatusCode::NOT_FOUND, "unknown_terminal")
        );
    }

    // 413: over --max-push-bytes, announced or not.
    let big = "x".repeat(2000);
    let (status, _, body) = push(
        &http,
        b,
        &t,
        Push {
            body: &big,
            ..Push::default()
        },
    )
    .await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );

    // GET /v1/terminals/{id} from both pods agrees with the owner.
    for base in [a, b] {
        let (status, view) = get(&http, &format!("{base}/v1/terminals/{t}"), Some(ACME)).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(view["owner_pod"].as_str(), c.owner_of(&t).as_deref());
        assert_eq!(view["connected"], true);
    }

    // 503 terminal_unavailable: no session by the deadline (Retry-After set).
    let (status, headers, body) = push(
        &http,
        a,
        "pos-offline",
        Push {
            query: "?timeout_ms=300",
            ..Push::default()
        },
    )
    .await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "terminal_unavailable")
    );
    assert_eq!(headers["retry-after"], "1");

    // 503 overloaded: a second push waiting for the same terminal (cap 1).
    let slow = Push {
        query: "?timeout_ms=1500",
        ..Push::default()
    };
    let quick = Push {
        query: "?timeout_ms=300",
        ..Push::default()
    };
    let (first, second) = tokio::join!(push(&http, a, "pos-offline", slow), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        push(&http, b, "pos-offline", quick).await
    });
    assert_eq!(error_of(&first.2), "terminal_unavailable");
    assert_eq!(
        (second.0, error_of(&second.2)),
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
    );

    // 502: the terminal answers non-2xx; stored, so a retry replays it.
    c.farm
        .set_faults(FaultConfig {
            push_status: 503,
            ..FaultConfig::default()
        })
        .unwrap();
    let (status, _, body) = push(
        &http,
        b,
        &t,
        Push {
            key: Some("refused-1"),
            ..Push::default()
        },
    )
    .await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::BAD_GATEWAY, "pos_rejected")
    );
    assert_eq!(body["pos_status"], 503);
    c.farm.set_faults(FaultConfig::default()).unwrap();
    let (status, _, _) = push(
        &http,
        a,
        &t,
        Push {
            key: Some("refused-1"),
            ..Push::default()
        },
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_GATEWAY,
        "the stored answer is replayed"
    );

    // 504 delivery unknown: the terminal answers after the deadline. 409 while in flight.
    c.farm
        .set_faults(FaultConfig {
            response_latency_ms: 1_500,
            ..FaultConfig::default()
        })
        .unwrap();
    let timed = Push {
        key: Some("slow-1"),
        query: "?timeout_ms=700",
        ..Push::default()
    };
    let again = Push {
        key: Some("slow-1"),
        query: "?timeout_ms=700",
        ..Push::default()
    };
    let (first, second) = tokio::join!(push(&http, a, &t, timed), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        push(&http, b, &t, again).await
    });
    assert_eq!(
        (first.0, error_of(&first.2)),
        (StatusCode::GATEWAY_TIMEOUT, "pos_timeout"),
        "{}",
        first.2
    );
    assert_eq!(first.2["delivery"], "unknown");
    assert_eq!(first.2["idempotency_key"], "slow-1");
    assert_eq!(
        (second.0, error_of(&second.2)),
        (StatusCode::CONFLICT, "idempotency_conflict")
    );
    c.farm.set_faults(FaultConfig::default()).unwrap();
    // After a 504 the caller may retry with the same key; it is delivered.
    let (status, _, _) = push(
        &http,
        b,
        &t,
        Push {
            key: Some("slow-1"),
            ..Push::default()
        },
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // An unsigned forwarded push is refused.
    let request = Request::post(format!("{a}/internal/v1/push/{t}"))
        .header("posgate-hop", "1")
        .header("posgate-tenant", "acme")
        .header("idempotency-key", "forged")
        .header("posgate-deadline-ms", "1000")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let (status, _, body) = send(&http, request).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    check_metrics(&http, a).await;

    // The cluster view with every pod's connected counts, from either pod.
    for base in [a, b] {
        let (status, view) = get(
            &http,
            &format!("{base}/v1/cluster?include=terminals"),
            Some(ACME),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let shards = view["shards"].as_array().unwrap();
        assert_eq!(shards.len(), SHARDS as usize);
        assert!(
            shards.iter().all(|s| s["terminals_connected"].is_u64()),
            "{view}"
        );
        let connected: u64 = shards
            .iter()
            .map(|s| s["terminals_connected"].as_u64().unwrap())
            .sum();
        assert_eq!(
            connected,
            c.ids.len() as u64,
            "every farm terminal, counted once"
        );
    }

    // Only the key the caller itself re-sent after its 504 may reach the terminal twice
    // (the terminal dedupes it by key); wait for the slow first attempt to land.
    let slow_deliveries = || {
        let report = c.farm.terminal_report(&t).unwrap();
        let n = report
            .recent_pushes
            .iter()
            .filter(|p| p.idempotency_key == "acme:slow-1")
            .count();
        (n, report.stats.keys_delivered_twice)
    };
    let waited = Instant::now();
    while slow_deliveries().0 < 2 && waited.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "[push] slow-1 deliveries, keys twice on {t}: {:?}",
        slow_deliveries()
    );
    assert!(slow_deliveries().0 >= 1);
    assert_eq!(
        c.farm.counters().keys_delivered_twice,
        u64::from(slow_deliveries().0 == 2),
        "no key but the one retried after a 504 reached a terminal twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn round_robin_pushes_reach_each_terminal_once_from_the_owner() {
    const PUSHES: usize = 10_000;
    const CONCURRENCY: usize = 64;
    let c = Arc::new(Cluster::start(3, 300, &[], PushSettings::default()).await);
    let http = client();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..CONCURRENCY {
        let (c, http, next) = (c.clone(), http.clone(), next.clone());
        tasks.spawn(async move {
            let mut wrong_owner = Vec::new();
            let mut failures = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= PUSHES {
                    return (wrong_owner, failures);
                }
                // A fixed pseudo-random terminal per push, so runs are repeatable.
                let t = &c.ids[(i * 7919 + 13) % c.ids.len()];
                let key = format!("rr-{i}");
                let p = Push {
                    key: Some(&key),
                    ..Push::default()
                };
                let (status, _, body) = push(&http, &c.urls[i % c.urls.len()], t, p).await;
                if status != StatusCode::OK {
                    failures.push(format!("{i}: {status} {body}"));
                } else if body["pod"].as_str() != c.owner_of(t).as_deref() {
                    wrong_owner.push(i);
                }
            }
        });
    }
    let (mut wrong_owner, mut failures) = (Vec::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (w, f) = done.unwrap();
        wrong_owner.extend(w);
        failures.extend(f);
    }
    let took = started.elapsed();
    eprintln!(
        "[push] {PUSHES} pushes round-robin over 3 pods, {CONCURRENCY} at once: {:.2} s ({:.0}/s)",
        took.as_secs_f64(),
        PUSHES as f64 / took.as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        wrong_owner.is_empty(),
        "delivered by a pod that is not the owner: {wrong_owner:?}"
    );
    let counters = c.farm.counters();
    assert_eq!(counters.pushes_accepted, PUSHES as u64, "{counters:?}");
    assert_eq!(counters.keys_delivered_twice, 0);

    // The same key at once through two pods: one delivery; the other gets it too or 409.
    let t = c.ids[1].clone();
    let (x, y) = tokio::join!(
        push(
            &http,
            &c.urls[0],
            &t,
            Push {
                key: Some("twice"),
                ..Push::default()
            }
        ),
        push(
            &http,
            &c.urls[1],
            &t,
            Push {
                key: Some("twice"),
                ..Push::default()
            }
        ),
    );
    let statuses = [x.0, y.0];
    assert!(statuses.contains(&StatusCode::OK), "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::CONFLICT),
        "{statuses:?}"
    );
    let delivered: HashMap<&str, usize> = c
        .farm
        .terminal_report(&t)
        .unwrap()
        .recent_pushes
        .iter()
        .filter(|p| p.idempotency_key == "acme:twice")
        .fold(HashMap::new(), |mut m, _| {
            *m.entry("twice").or_default() += 1;
            m
        });
    assert_eq!(delivered.get("twice"), Some(&1));
}

/// A man in the middle on the pod network holds a forwarded push back and sends it on
/// altered: with each signed part changed, to another pod, downgraded to the previous
/// protocol. Each altered copy is refused; the untouched one is delivered, once; its
/// copy after that is refused as a replay. The terminal received the push exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_captured_forwarded_push_cannot_be_replayed_or_altered() {
    let c = Cluster::start_tapped(2, 50).await;
    let http = client();
    let owner = "push-pod-1";
    let t = c
        .ids
        .iter()
        .find(|t| c.owner_of(t).as_deref() == Some(owner))
        .expect("a terminal of pod 1")
        .clone();
    c.taps[1].intercept();
    let keyed = Push {
        key: Some("captured-1"),
        query: "?timeout_ms=1000",
        ..Push::default()
    };
    let (status, _, body) = push(&http, &c.urls[0], &t, keyed).await;
    // The tap's bare 503 is not an owner's answer: the push may have arrived, so the
    // caller is told the delivery is unknown, not that it failed.
    assert_eq!(
        (status, error_of(&body), body["delivery"].as_str()),
        (StatusCode::GATEWAY_TIMEOUT, "pos_timeout", Some("unknown")),
        "held back by the tap: {body}"
    );
    let wire = c.taps[1]
        .captured()
        .into_iter()
        .find(|r| r.target.starts_with("/internal/v1/push/"))
        .expect("the forwarded push crossed pod 1's tap");
    assert_eq!(c.farm.counters().pushes_accepted, 0);

    let replay = |headers: HeaderMap, target: String, body: Bytes, base: String| {
        let http = http.clone();
        async move {
            let mut request = Request::post(format!("{base}{target}"))
                .body(Full::new(body))
                .unwrap();
            *request.headers_mut() = headers;
            send(&http, request).await
        }
    };
    let mut original = wire.headers.clone();
    original.remove("content-length");
    let owner_url = c.urls[1].clone();
    let header = |name: &'static str, value: &str| (name, value.to_string());
    let changed_headers: Vec<(&str, (&'static str, String))> = vec![
        (
            "a new idempotency key",
            header("idempotency-key", "captured-2"),
        ),
        ("another tenant", header("posgate-tenant", "bank")),
        (
            "a tenant that does not exist",
            header("posgate-tenant", "nobody"),
        ),
        ("a longer deadline", header("posgate-deadline-ms", "29000")),
        ("another content type", header("content-type", "text/plain")),
        ("a content encoding", header("content-encoding", "gzip")),
        ("no hop marker", header("posgate-hop", "0")),
        (
            "a new request id",
            header("posgate-request-id", "0123456789abcdef0123456789abcdef"),
        ),
        ("a new timestamp", header("posgate-timestamp", "1")),
        ("another sender", header("posgate-from", "push-pod-0x")),
        ("an added posgate header", header("posgate-epoch", "1")),
    ];
    let mut copies: Vec<(&str, HeaderMap, String, Bytes, String)> = Vec::new();
    for (case, (name, value)) in changed_headers {
        let mut headers = original.clone();
        headers.insert(name, value.parse().unwrap());
        copies.push((
            case,
            headers,
            wire.target.clone(),
            wire.body.clone(),
            owner_url.clone(),
        ));
    }
    let other_terminal = c.ids.iter().find(|x| **x != t).unwrap();
    copies.push((
        "another terminal's path",
        original.clone(),
        format!("/internal/v1/push/{other_terminal}"),
        wire.body.clone(),
        owner_url.clone(),
    ));
    copies.push((
        "another body",
        original.clone(),
        wire.target.clone(),
        Bytes::from_static(b"{\"amount\": 9}"),
        owner_url.clone(),
    ));
    let mut downgraded = original.clone();
    downgraded.remove("posgate-peer-version");
    copies.push((
        "downgraded to protocol 1",
        downgraded,
        wire.target.clone(),
        wire.body.clone(),
        owner_url.clone(),
    ));
    copies.push((
        "sent to the other pod",
        original.clone(),
        wire.target.clone(),
        wire.body.clone(),
        c.urls[0].clone(),
    ));
    let altered = copies.len();
    for (case, headers, target, body, base) in copies {
        let (status, _, answer) = replay(headers, target, body, base).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}: {answer}");
        assert_eq!(error_of(&answer), "unauthorized", "{case}");
    }
    assert_eq!(
        c.farm.counters().pushes_accepted,
        0,
        "no altered copy was delivered"
    );

    // The request as it was signed is good, once.
    let (status, _, answer) = replay(
        original.clone(),
        wire.target.clone(),
        wire.body.clone(),
        owner_url.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the untouched request: {answer}");
    let (status, _, answer) =
        replay(original, wire.target.clone(), wire.body.clone(), owner_url).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "its copy: {answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("replay"),
        "{answer}"
    );

    let report = c.farm.terminal_report(&t).unwrap();
    let delivered: Vec<&str> = report
        .recent_pushes
        .iter()
        .map(|p| p.idempotency_key.as_str())
        .collect();
    assert_eq!(delivered, ["acme:captured-1"], "one delivery, the original");
    assert_eq!(
        c.farm.counters().pushes_accepted,
        1,
        "no copy reached any terminal"
    );
    let refused_by = |base: &str| {
        let http = http.clone();
        let base = base.to_string();
        async move {
            metrics_text(&http, &base)
                .await
                .lines()
                .filter(|l| l.starts_with("posgate_peer_requests_refused_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as usize
        }
    };
    // All but the one sent to pod 0, plus the replay, were counted by pod 1.
    assert_eq!(refused_by(&c.urls[1]).await, altered - 1 + 1);
    assert_eq!(refused_by(&c.urls[0]).await, 1);
}

/// One tenant's key reused for a second terminal of the same owner is a second push: it
/// reaches that terminal, and never answers with the first terminal's stored result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idempotency_key_belongs_to_its_terminal() {
    let c = Cluster::start(2, 100, &[], PushSettings::default()).await;
    let http = client();
    let first = c.ids[0].clone();
    let owner = c.owner_of(&first);
    let second = c.ids[1..]
        .iter()
        .find(|t| c.owner_of(t) == owner)
        .expect("another terminal of the same owner")
        .clone();
    let keyed = || Push {
        key: Some("order-7"),
        ..Push::default()
    };
    for (base, terminal) in [(&c.urls[0], &first), (&c.urls[1], &second)] {
        let (status, _, body) = push(&http, base, terminal, keyed()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["terminal"], terminal.as_str(), "{body}");
    }
    for terminal in [&first, &second] {
        let report = c.farm.terminal_report(terminal).unwrap();
        let got = report
            .recent_pushes
            .iter()
            .filter(|p| p.idempotency_key == "acme:order-7")
            .count();
        assert_eq!(got, 1, "{terminal} received the push once");
    }
    // A deadline too short to send and hear the answer is refused as not delivered,
    // never sent as a push whose outcome would be unknown.
    let short = Push {
        key: Some("order-8"),
        query: "?timeout_ms=15",
        ..Push::default()
    };
    let (status, _, body) = push(&http, &c.urls[0], &first, short).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "terminal_unavailable"),
        "{body}"
    );
    let report = c.farm.terminal_report(&first).unwrap();
    assert!(!report
        .recent_pushes
        .iter()
        .any(|p| p.idempotency_key == "acme:order-8"));
    // And each terminal's own retry is still a replay.
    let (status, _, body) = push(&http, &c.urls[1], &first, keyed()).await;
    assert_eq!(
        (status, body["terminal"].as_str()),
        (StatusCode::OK, Some(first.as_str()))
    );
    assert_eq!(c.farm.counters().keys_delivered_twice, 0);
}

/// Callers that hang up while their push waits (here for a terminal that never answers)
/// leave nothing counted in flight once the pod notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_that_go_away_leave_no_push_in_flight() {
    use tokio::io::AsyncWriteExt;
    let c = Cluster::start(
        1,
        10,
        &[("pos-offline", "127.0.0.1:1")],
        PushSettings::default(),
    )
    .await;
    let addr = c.urls[0].trim_start_matches("http://").to_string();
    let body = "{}";
    let mut hung_up = Vec::new();
    for i in 0..5 {
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let request = format!(
            "POST /v1/terminals/pos-offline/push?timeout_ms=20000 HTTP/1.1\r\nhost: x\r\n\
             authorization: Bearer {ACME}\r\nidempotency-key: gone-{i}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        hung_up.push(tcp);
    }
    let http = client();
    let in_flight = || async {
        let text = metrics_text(&http, &c.urls[0]).await;
        gauge(&text, "posgate_pushes_in_flight")
    };
    let waited = Instant::now();
    while in_flight().await < 5.0 {
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "pushes never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(hung_up);
    let waited = Instant::now();
    while in_flight().await > 0.0 {
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "posgate_pushes_in_flight stays at {} after every caller went away",
            in_flight().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of an unlabelled gauge in a `/metrics` text.
fn gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

/// The pod's `/metrics` text.
async fn metrics_text(http: &Client<HttpConnector, Full<Bytes>>, base: &str) -> String {
    let response = http
        .request(
            Request::get(format!("{base}/metrics"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// Outcome counts of a stream of pushes.
#[derive(Debug, Default)]
struct Tally {
    by_status: HashMap<u16, u64>,
    /// Answers that came later than the caller's deadline plus a grace.
    late: u64,
    slowest_ms: u128,
}

/// Sends pushes from `workers` loops (keys `{tag}-{worker}-{n}`, random terminals,
/// round-robin over `urls`) until `stop` is set; `timeout_ms` per push.
async fn push_stream(
    c: Arc<Cluster>,
    urls: Vec<String>,
    tag: &'static str,
    workers: usize,
    timeout_ms: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Tally {
    let http = client();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (c, urls, http, stop) = (c.clone(), urls.clone(), http.clone(), stop.clone());
        tasks.spawn(async move {
            let mut tally = Tally::default();
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = &c.ids[(w * 7919 + n * 104_729) % c.ids.len()];
                let key = format!("{tag}-{w}-{n}");
                let query = format!("?timeout_ms={timeout_ms}");
                let p = Push {
                    key: Some(&key),
                    query: &query,
                    ..Push::default()
                };
                let sent = Instant::now();
                let (status, _, _) = push(&http, &urls[n % urls.len()], t, p).await;
                let took = sent.elapsed().as_millis();
                *tally.by_status.entry(status.as_u16()).or_default() += 1;
                // The answer is due by the deadline; allow scheduling slack on a busy
                // machine (the forwarder itself allows 250 ms for the owner's answer).
                if took > u128::from(timeout_ms) + 1_000 {
                    tally.late += 1;
                }
                tally.slowest_ms = tally.slowest_ms.max(took);
                n += 1;
            }
            tally
        });
    }
    let mut total = Tally::default();
    while let Some(done) = tasks.join_next().await {
        let t = done.unwrap();
        for (k, v) in t.by_status {
            *total.by_status.entry(k).or_default() += v;
        }
        total.late += t.late;
        total.slowest_ms = total.slowest_ms.max(t.slowest_ms);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pushes_survive_a_join_and_an_owner_crash() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut cluster = Cluster::start(3, 300, &[], PushSettings::default()).await;
    // A 4th pod joins while pushes flow to the first three.
    let (fourth, _) = start_pod(
        "push-pod-3",
        &cluster.redis.url(),
        &cluster.ca_file,
        PushSettings::default(),
    )
    .await;
    cluster.pods.push(fourth);
    let c = Arc::new(cluster);
    let urls = c.urls.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let stream = tokio::spawn(push_stream(
        c.clone(),
        urls,
        "join",
        16,
        5_000,
        stop.clone(),
    ));
    let joined = Instant::now();
    while !(c.settled() && c.pods[3].serving_count() > 0) {
        assert!(
            joined.elapsed() < Duration::from_secs(20),
            "the 4th pod never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Keep pushing a little past the handover.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let join = stream.await.unwrap();
    eprintln!(
        "[push] during the join ({:.2} s to settle): {join:?}",
        joined.elapsed().as_secs_f64()
    );
    assert_eq!(
        join.by_status.keys().copied().collect::<Vec<_>>(),
        [200],
        "{join:?}"
    );
    assert_eq!(join.late, 0);

    // The owner of some shards crashes (no release) while pushes are in flight, sent to
    // the survivors only: every caller gets an answer by its deadline.
    let stop = Arc::new(AtomicBool::new(false));
    let survivors = c.urls[1..].to_vec();
    let stream = tokio::spawn(push_stream(
        c.clone(),
        survivors,
        "crash",
        16,
        5_000,
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let crashed = Instant::now();
    c.pods[0].abort();
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    let crash = stream.await.unwrap();
    eprintln!(
        "[push] across the crash ({:.2} s of pushing after it): {crash:?}",
        crashed.elapsed().as_secs_f64()
    );
    assert_eq!(crash.late, 0, "every caller is answered by its deadline");
    let unexpected: Vec<u16> = crash
        .by_status
        .keys()
        .copied()
        .filter(|s| ![200, 503, 504].contains(s))
        .collect();
    assert!(unexpected.is_empty(), "{crash:?}");
    assert!(crash.by_status.get(&200).copied().unwrap_or(0) > 0);
    // No caller retried, so no key may reach a terminal twice.
    assert_eq!(c.farm.counters().keys_delivered_twice, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_waits_for_the_first_dial_of_every_terminal() {
    const TERMINALS: u64 = 100;
    let redis = RedisServer::start();
    let mut farm_config = FarmConfig::new(0..TERMINALS);
    farm_config.port = 0;
    let farm = PosFarm::start(farm_config).await.unwrap();
    // Slow handshakes and few at once: dialing everything takes seconds.
    let slow = FaultConfig {
        handshake_delay_ms: 700,
        ..FaultConfig::default()
    };
    farm.set_faults(slow).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("pos-ca.pem");
    std::fs::write(&ca_file, farm.ca_pem()).unwrap();
    let entries: Vec<Terminal> = farm
        .terminals()
        .iter()
        .map(|t| Terminal::new(&t.id, &t.addr.to_string(), Some(&t.server_name)).unwrap())
        .collect();
    let admin = RedisStore::connect(&redis.url(), CLUSTER, options())
        .await
        .unwrap();
    admin.upsert(SHARDS, &entries).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut config = pod_config("ready-pod", &url, &ca_file, PushSettings::default());
    config.pos.dial_concurrency = 10;
    let _pod = start_configured(config, &redis.url(), listener).await;
    let http = client();
    let started = Instant::now();
    let mut reasons: Vec<String> = Vec::new();
    loop {
        let (status, body) = get(&http, &format!("{url}/readyz"), None).await;
        if status == StatusCode::OK {
            break;
        }
        let reason = body["reason"].as_str().unwrap_or_default().to_string();
        // Log each kind of reason once, not every count of undialed terminals.
        let kind = |r: &str| {
            r.trim_start_matches(|c: char| c.is_ascii_digit())
                .to_string()
        };
        if reasons.last().map(|r| kind(r)) != Some(kind(&reason)) {
            eprintln!("[ready] {:.2} s: {reason}", started.elapsed().as_secs_f64());
            reasons.push(reason);
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let accepted = farm.counters().sessions_accepted;
    eprintln!(
        "[ready] ready after {:.2} s with {accepted} sessions",
        started.elapsed().as_secs_f64()
    );
    assert!(
        reasons.iter().any(|r| r.ends_with("not dialed yet")),
        "readiness never waited for dials: {reasons:?}"
    );
    assert_eq!(
        accepted, TERMINALS,
        "ready before every terminal was dialed"
    );
    // Sticky: slower dials later (a rebalance) do not take readiness back.
    assert_eq!(
        get(&http, &format!("{url}/readyz"), None).await.0,
        StatusCode::OK
    );
}

/// The pod's `/metrics` has exactly the families `docs/metrics.md` lists, and the
/// counters of what this test did moved.
async fn check_metrics(http: &Client<HttpConnector, Full<Bytes>>, base: &str) {
    let text = metrics_text(http, base).await;
    let doc = include_str!("../docs/metrics.md");
    let documented: std::collections::BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `posgate_"))
        .map(|l| format!("posgate_{}", l.split('`').next().unwrap()))
        .collect();
    let scraped: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').unwrap();
            // OpenMetrics names counter families without `_total`.
            if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            }
        })
        .collect();
    assert_eq!(documented, scraped, "docs/metrics.md vs /metrics");
    for expected in [
        "posgate_push_requests_total{path=\"local\",result=\"ok\"}",
        "posgate_push_requests_total{path=\"forwarded\",result=\"ok\"}",
        "posgate_push_requests_total{path=\"none\",result=\"invalid_request\"}",
        "posgate_push_replays_total",
        "posgate_dials_total{result=\"ok\"}",
        "posgate_dials_total{result=\"refused\"}",
        "posgate_lease_ops_total{op=\"acquire\",outcome=\"acquired\"}",
        "posgate_terminals{state=\"connected\"}",
        "posgate_store_reachable 1",
        "posgate_members 2",
    ] {
        assert!(
            text.contains(expected),
            "{expected} missing from /metrics:\n{text}"
        );
    }
    assert!(!text.contains("pos-0"), "a terminal id leaked into a label");
}
