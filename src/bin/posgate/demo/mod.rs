//! `posgate demo`: a whole cluster in one process, to watch posgate work with no setup.
//!
//! N pods (`Pod::start_with_directory`), a simulated POS farm on loopback (the same
//! simulator as `loadtest/`), steady push traffic, a live table every second and the
//! status page. The store is a private `redis-server` when one is on `PATH` (started on a
//! free port, stopped at exit), else the embedded in-memory store; the demo says which.
//! Tokens and the cluster secret are generated. Lease timings are short
//! (`CoreConfig::fast()`) so takeovers show within the run, and redials back off 2 s at
//! most so a terminal back online is reached soon. The script: a broadcast to the 40
//! terminals labeled `store=17` at 5 s, its progress printed until it completes
//! (`broadcast`), a pod joins at 10 s, pod
//! 1 is killed without releasing at 20 s, five terminals go offline at 25 s with a push
//! with a TTL waiting for each, and are back 2 s later (`offline`); the run ends at 35 s
//! with a summary.
//!
//! Not for: production (everything is in one process, secrets are throwaway).

mod broadcast;
mod offline;
mod redis_child;
mod traffic;

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::distr::{Alphanumeric, SampleString};

use self::redis_child::RedisChild;
use self::traffic::{Traffic, TrafficCounts};
use posgate::config::{LogFormat, PodConfig, PosConfig};
use posgate::core::{CoreConfig, PodId};
use posgate::credentials::ApiTokens;
use posgate::credentials::ClusterSecret;
use posgate::pod::{Pod, PodHandle};
use posgate::pos::backoff::BackoffPolicy;
use posgate::pos::tls::TlsFiles;
use posgate::store::directory::{DirectoryAdmin, MemoryDirectory, Terminal};
use posgate::store::memory::MemoryStore;
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate_pos_sim::{FarmConfig, FarmCounters, FaultConfig, PosFarm};
use tokio::task::JoinHandle;
use tracing_subscriber::EnvFilter;

const CLUSTER: &str = "demo";
/// When the script's steps happen.
const BROADCAST_AT: Duration = Duration::from_secs(5);
const JOIN_AT: Duration = Duration::from_secs(10);
const KILL_AT: Duration = Duration::from_secs(20);
const OFFLINE_AT: Duration = Duration::from_secs(25);

/// Flags of `posgate demo`.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Pods at the start
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub pods: u32,
    /// Simulated terminals
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub terminals: u64,
    /// How long the demo runs
    #[arg(long, default_value = "35s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Pushes per second
    #[arg(long, default_value_t = 50)]
    pub push_rate: u32,
    /// Do not add a pod at 10 s, kill one at 20 s, or take terminals offline at 25 s
    #[arg(long)]
    pub no_script: bool,
}

/// Where the demo keeps coordination state.
enum Backing {
    Redis {
        child: RedisChild,
        store: Arc<RedisStore>,
    },
    Embedded {
        store: Arc<MemoryStore>,
        directory: Arc<MemoryDirectory>,
    },
}

struct Demo {
    args: DemoArgs,
    backing: Backing,
    farm: Arc<PosFarm>,
    ca_file: std::path::PathBuf,
    /// The tenant `demo`'s token (pushes).
    token: String,
    /// The operator's token (the status page).
    operator_token: String,
    secret: ClusterSecret,
    pods: Vec<(String, String, Option<PodHandle>)>,
    /// How the offline phase went, once the script ran it.
    offline: Option<offline::Outcome>,
    /// How the broadcast went, once the script sent it.
    broadcast: Option<broadcast::Outcome>,
}

/// Runs `posgate demo` to its end or Ctrl-C: exit 0, or 1 after saying what failed.
pub fn main(args: DemoArgs) -> ExitCode {
    // Warnings only: the live table is the demo's output. RUST_LOG overrides.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    crate::init_tracing(LogFormat::Text, filter);
    let runtime = match crate::runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match runtime.block_on(run(args, interrupt)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the demo until its duration passes or `interrupt` resolves.
pub async fn run(
    args: DemoArgs,
    interrupt: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let dir = tempfile_dir()?;
    let farm = Arc::new(start_farm(args.terminals).await?);
    let ca_file = dir.join("pos-ca.pem");
    std::fs::write(&ca_file, farm.ca_pem()).context("writing the demo CA")?;
    let entries: Vec<Terminal> = farm
        .terminals()
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut entry = Terminal::new(&t.id, &t.addr.to_string(), Some(&t.server_name))?;
            let store = format!("store={}", i % broadcast::STORES);
            entry.labels = posgate::api::Labels::parse(&store).expect("a valid label");
            Ok(entry)
        })
        .collect::<Result<_, posgate::store::directory::InvalidTerminal>>()
        .context("simulated terminals")?;
    let backing = match RedisChild::start()? {
        Some(child) => {
            let store = RedisStore::connect(&child.url(), CLUSTER, RedisOptions::default())
                .await
                .context("connecting to the private redis-server")?;
            store
                .upsert(64, &entries)
                .await
                .context("importing terminals")?;
            println!(
                "store: private redis-server at {} (stopped at exit)",
                child.url()
            );
            Backing::Redis {
                child,
                store: Arc::new(store),
            }
        }
        None => {
            let directory = Arc::new(MemoryDirectory::new());
            directory
                .upsert(64, &entries)
                .await
                .context("importing terminals")?;
            println!("store: embedded in-memory store (no redis-server on PATH)");
            Backing::Embedded {
                store: Arc::new(MemoryStore::new()),
                directory,
            }
        }
    };
    let token = Alphanumeric.sample_string(&mut rand::rng(), 32);
    let operator_token = Alphanumeric.sample_string(&mut rand::rng(), 32);
    let secret = ClusterSecret::new(Alphanumeric.sample_string(&mut rand::rng(), 32))
        .expect("32 characters is long enough");
    let mut demo = Demo {
        args,
        backing,
        farm,
        ca_file,
        token,
        operator_token,
        secret,
        pods: Vec::new(),
        offline: None,
        broadcast: None,
    };
    for _ in 0..demo.args.pods {
        demo.add_pod().await?;
    }
    let first = demo.pods[0].1.clone();
    println!("status page: {first}/#token={}", demo.operator_token);
    println!(
        "push: curl -H 'Authorization: Bearer {}' -d '{{\"amount\":1}}' {first}/v1/terminals/pos-00042/push",
        demo.token
    );
    let traffic = Traffic::start(
        demo.urls(),
        demo.farm.terminals().into_iter().map(|t| t.id).collect(),
        demo.token.clone(),
        demo.args.push_rate,
    );
    let outcome = tokio::select! {
        r = demo.script(&traffic) => r,
        () = interrupt => { println!("interrupted"); Ok(()) }
    };
    let counts = traffic.stop().await;
    demo.summary(&counts);
    demo.shutdown().await;
    if let Backing::Redis { child, .. } = demo.backing {
        drop(child);
    }
    outcome
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("posgate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("creating a temporary directory")?;
    Ok(dir)
}

async fn start_farm(terminals: u64) -> anyhow::Result<PosFarm> {
    let mut config = FarmConfig::new(0..terminals);
    config.port = 0;
    config.first_ip = Ipv4Addr::new(127, 0, 2, 1);
    config.listeners = 4;
    PosFarm::start(config)
        .await
        .context("starting the simulated terminals")
}

impl Demo {
    fn urls(&self) -> Vec<String> {
        self.pods.iter().map(|p| p.1.clone()).collect()
    }

    fn pod_config(&self, id: &str, url: &str) -> anyhow::Result<PodConfig> {
        let mut config = PodConfig::new(
            PodId::new(id)?,
            url,
            CoreConfig::fast(),
            Some(self.secret.clone()),
        );
        config.cluster = CLUSTER.to_string();
        let tokens = format!("demo:{},operator:{}", self.token, self.operator_token);
        config.api_tokens = Some(ApiTokens::from_env_value(&tokens)?);
        config.push.broadcast.tenants = ["demo".to_string()].into();
        config.pos = PosConfig {
            tls: TlsFiles {
                ca_file: Some(self.ca_file.clone()),
                client: None,
            },
            dial_rate: std::num::NonZeroU32::new(1_000).expect("non-zero"),
            backoff: BackoffPolicy {
                base: Duration::from_millis(500),
                cap: Duration::from_secs(2),
            },
            ..PosConfig::default()
        };
        Ok(config)
    }

    async fn add_pod(&mut self) -> anyhow::Result<()> {
        let listener = posgate::http::bind(([127, 0, 0, 1], 0).into())?;
        let url = format!("http://{}", listener.local_addr()?);
        let id = format!("demo-pod-{}", self.pods.len());
        let config = self.pod_config(&id, &url)?;
        let handle = match &self.backing {
            Backing::Redis { store, .. } => {
                Pod::start_with_directory(config, store.clone(), store.clone(), listener)?
            }
            Backing::Embedded { store, directory } => {
                Pod::start_with_directory(config, store.clone(), directory.clone(), listener)?
            }
        };
        println!("+ {id} started at {url}");
        self.pods.push((id, url, Some(handle)));
        Ok(())
    }

    /// The timeline: table every second, a join at 10 s, a crash at 20 s, terminals
    /// offline at 25 s.
    async fn script(&mut self, traffic: &Traffic) -> anyhow::Result<()> {
        let started = Instant::now();
        let (mut joined, mut killed) = (self.args.no_script, self.args.no_script);
        // The offline phase and the broadcast once started.
        let mut phase: Option<JoinHandle<offline::Outcome>> = None;
        let mut sent: Option<JoinHandle<Option<broadcast::Outcome>>> = None;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while started.elapsed() < self.args.duration {
            tick.tick().await;
            let t = started.elapsed();
            if sent.is_none() && !self.args.no_script && t >= BROADCAST_AT {
                let url = self.live_urls()[0].clone();
                sent = Some(tokio::spawn(broadcast::run(url, self.token.clone())));
            }
            if !joined && t >= JOIN_AT {
                joined = true;
                self.add_pod().await?;
                traffic.set_urls(self.live_urls());
            }
            if !killed && t >= KILL_AT && self.pods.len() > 1 {
                killed = true;
                let (id, _, handle) = &mut self.pods[1];
                if let Some(h) = handle.take() {
                    h.abort();
                    println!(
                        "x {id} killed (no release): its shards come back after the lease TTL"
                    );
                }
                traffic.set_urls(self.live_urls());
            }
            if phase.is_none() && !self.args.no_script && t >= OFFLINE_AT {
                let ids: Vec<String> = self.farm.terminals().into_iter().map(|t| t.id).collect();
                phase = Some(tokio::spawn(offline::run(
                    self.farm.clone(),
                    self.live_urls(),
                    offline::pick(&ids),
                    self.token.clone(),
                )));
            }
            self.print_table(t, &traffic.counts());
        }
        if let Some(sent) = sent {
            if sent.is_finished() {
                self.broadcast = sent.await?;
            } else {
                sent.abort();
            }
        }
        if let Some(phase) = phase {
            self.offline = Some(if phase.is_finished() {
                phase.await?
            } else {
                phase.abort();
                // Its terminals back, if it was cut short before that.
                self.farm.set_faults(FaultConfig::default())?;
                offline::Outcome::CutShort
            });
        }
        Ok(())
    }

    fn live_urls(&self) -> Vec<String> {
        self.pods
            .iter()
            .filter(|p| p.2.is_some())
            .map(|p| p.1.clone())
            .collect()
    }

    fn print_table(&self, t: Duration, counts: &TrafficCounts) {
        let now = tokio::time::Instant::now().into_std();
        let mut line = format!("{:>5.1}s", t.as_secs_f64());
        for (i, (_, url, handle)) in self.pods.iter().enumerate() {
            let Some(h) = handle else {
                line.push_str(&format!(" | pod{i}: dead"));
                continue;
            };
            let shards = (0..64)
                .filter(|&s| h.serving.serving(s, now).is_some())
                .count();
            let connected = h
                .metrics
                .terminals
                .get_or_create(&[("state", "connected")])
                .get();
            let (ok, failed) = counts.of(url);
            line.push_str(&format!(
                " | pod{i}: {shards:>2} shards {connected:>5} conn {ok:>5} ok {failed:>3} err"
            ));
        }
        let farm = self.farm.counters();
        line.push_str(&format!(
            " | terminals connected {}",
            farm.terminals_connected
        ));
        println!("{line}");
    }

    fn summary(&self, counts: &TrafficCounts) {
        let farm: FarmCounters = self.farm.counters();
        let moved = self
            .farm
            .terminals()
            .iter()
            .filter_map(|t| self.farm.terminal_report(&t.id))
            .filter(|r| r.stats.sessions_accepted > 1)
            .count();
        let (ok, failed) = counts.total();
        println!("--- summary ---");
        println!(
            "terminals with a new session during the run (moved or redialed): {moved} of {}",
            self.args.terminals
        );
        println!(
            "terminals connected at the end: {}",
            farm.terminals_connected
        );
        println!(
            "raw overlaps (two connections to one terminal): {}",
            farm.raw_overlaps
        );
        println!(
            "session overlaps (two accepted sessions > 1 s): {}",
            farm.session_overlaps
        );
        println!("keys delivered twice: {}", farm.keys_delivered_twice);
        println!("pushes: {ok} ok, {failed} failed");
        if let Some(outcome) = &self.offline {
            println!("{}", offline::summary_line(outcome));
        }
        if !self.args.no_script {
            println!("{}", broadcast::summary_line(&self.broadcast));
        }
    }

    async fn shutdown(&mut self) {
        for (_, _, handle) in &mut self.pods {
            if let Some(h) = handle.as_mut() {
                h.shutdown();
            }
        }
        for (id, _, handle) in &mut self.pods {
            if let Some(h) = handle.as_mut() {
                if tokio::time::timeout(Duration::from_secs(15), h.wait())
                    .await
                    .is_err()
                {
                    eprintln!("{id} did not stop in time");
                }
            }
        }
    }
}
