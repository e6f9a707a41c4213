//! A Redis Sentinel deployment on loopback, from the Debian binaries: a master, two
//! replicas and three sentinels (quorum 2, `down-after-milliseconds` 1000), each a child
//! process with a directory of its own, killed on drop.
//!
//! The links a test may cut go through [`RedisProxy`]s: each replica replicates from the
//! master through one (`cut_replication`: the master keeps accepting writes its replicas
//! never receive, until the sentinels point the replicas at the master itself: one
//! `failover-timeout` after they first saw them, see [`HaOptions::failover_timeout`]),
//! behind a [`StallProxy`] (`stall_replication`:
//! the links stay up but carry nothing, so the sentinels leave them as they are and a
//! replica promoted later lacks every write since), and, with [`HaOptions::isolable`], the sentinels watch the master
//! through one (`isolate_master`, with the replication links: a master cut off from
//! everyone but the pods that reach it directly; the sentinels then know the first master
//! by the proxy's address, so such a deployment is good for one failover). After a
//! failover the sentinels reconfigure the nodes with their real addresses, so the proxies
//! only shape the first master's links.
//!
//! The first master is handed to the caller (it may go to a `Gateway`, which writes the
//! terminal directory there and kills it as a test says); the deployment keeps the rest.
//!
//! What it does not do: run pods (the test does, with [`RedisHa::url`]), or reach
//! anything but 127.0.0.1.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use posgate_loadtest::load::sentinels;
/// The master's name and the sentinels' down-after: the load harness's own.
pub use posgate_loadtest::load::sentinels::{DOWN_AFTER, MASTER};

use super::redis_server::{free_port, program, serving_pid};
use super::stall_proxy::StallProxy;
use super::wait::wait_for;
use super::{RedisProxy, RedisServer};

/// How the deployment is set up.
#[derive(Clone, Copy, Debug, Default)]
pub struct HaOptions {
    /// Seconds every replica's clock is set off the real one (negative: behind). The
    /// promoted one then hands out `TIME` values older than the old master's.
    pub replica_clock: Option<i64>,
    /// `min-replicas-to-write 1` with this `min-replicas-max-lag` (seconds) on every node:
    /// a master that lost its replicas refuses writes after that long.
    pub min_replicas_max_lag: Option<u32>,
    /// The sentinels watch the first master through a proxy, so `isolate_master` can cut
    /// them off from it.
    pub isolable: bool,
    /// The sentinels' `failover-timeout` (10 s when `None`). They point a replica that
    /// replicates from another address than theirs for the master (the proxies) at the
    /// master itself once it is that old: the links a test stalls or cuts only shape
    /// replication until then. A longer one also delays a second failover.
    pub failover_timeout: Option<Duration>,
}

/// One `redis-sentinel` process.
struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// See the module docs.
pub struct RedisHa {
    /// The first master's port.
    first: u16,
    pub replicas: Vec<RedisServer>,
    links: Vec<RedisProxy>,
    /// In front of `links`, one each: what the replicas connect to.
    stalls: Vec<StallProxy>,
    sentinel_link: Option<RedisProxy>,
    sentinels: Vec<Sentinel>,
}

impl RedisHa {
    /// Starts the deployment and waits until every sentinel sees the master, both
    /// replicas and the other sentinels. Returns it and its first master.
    pub async fn start(opts: HaOptions) -> (RedisHa, RedisServer) {
        let lag = opts.min_replicas_max_lag.map(|lag| lag.to_string());
        // The first sync at once (Redis waits 5 s by default to batch replicas).
        let mut node_args = vec!["--repl-diskless-sync-delay", "0"];
        if let Some(lag) = &lag {
            node_args.extend([
                "--min-replicas-to-write",
                "1",
                "--min-replicas-max-lag",
                lag,
            ]);
        }
        let master = RedisServer::start_with(&node_args);
        let mut links = Vec::new();
        let mut stalls = Vec::new();
        let mut replicas = Vec::new();
        for _ in 0..2 {
            let link = RedisProxy::start(master.addr()).await.unwrap();
            let stall = StallProxy::start(([127, 0, 0, 1], link_port(&link)).into()).await;
            let port = stall.port().to_string();
            let mut replica_args = node_args.clone();
            replica_args.extend(["--replicaof", "127.0.0.1", &port]);
            let replica = match opts.replica_clock {
                Some(offset) => RedisServer::start_with_clock(offset, &replica_args),
                None => RedisServer::start_with(&replica_args),
            };
            links.push(link);
            stalls.push(stall);
            replicas.push(replica);
        }
        let sentinel_link = match opts.isolable {
            true => Some(RedisProxy::start(master.addr()).await.unwrap()),
            false => None,
        };
        let watched = sentinel_link.as_ref().map_or(master.port(), link_port);
        let timeout = opts.failover_timeout.unwrap_or(Duration::from_secs(10));
        let sentinels = (0..3)
            .map(|_| Sentinel::start(watched, timeout, ""))
            .collect();
        let ha = RedisHa {
            first: master.port(),
            replicas,
            links,
            stalls,
            sentinel_link,
            sentinels,
        };
        ha.wait_replicated(2).await;
        wait_for(
            "the sentinels see both replicas and each other",
            Duration::from_secs(20),
            || {
                ha.sentinels.iter().all(|s| {
                    let replicas = info_field(s.port, &["SENTINEL", "REPLICAS", MASTER]);
                    let peers = info_field(s.port, &["SENTINEL", "SENTINELS", MASTER]);
                    replicas.is_some_and(|n| n >= 2) && peers.is_some_and(|n| n >= 2)
                })
            },
        )
        .await;
        (ha, master)
    }

    /// `redis+sentinel://` URL of the three sentinels.
    pub fn url(&self) -> String {
        sentinels::url(self.sentinels.iter().map(|s| s.port))
    }

    /// The port of the node the sentinels name master now (the first master's own port,
    /// not that of the proxy they watch it through).
    pub async fn master_port(&self) -> u16 {
        let port = port_of(&self.master_addr().await);
        match &self.sentinel_link {
            Some(link) if port == link_port(link) => self.first,
            _ => port,
        }
    }

    /// The master's address as the sentinels name it now (`127.0.0.1:<port>`; the first
    /// master's is the proxy's the sentinels watch it through).
    pub async fn master_addr(&self) -> String {
        master_named_by(self.sentinels[0].port).await
    }

    /// Waits until the failover from `old` to `new` is over everywhere: every sentinel
    /// names `new`, and `old` answers as a replica. Until then a client that asks another
    /// sentinel may still be sent to `old`, which takes writes it loses when it is
    /// demoted (asynchronous replication: a planned failover loses them too).
    pub async fn wait_settled(&self, old: &str, new: &str, limit: Duration) {
        let started = Instant::now();
        loop {
            let mut named = Vec::new();
            for s in &self.sentinels {
                named.push(master_named_by(s.port).await);
            }
            let demoted = role(old).await.as_deref() == Some("slave");
            if demoted && named.iter().all(|n| n == new) {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "the failover to {new} not over within {limit:?}: sentinels name {named:?}, \
                 {old} demoted: {demoted}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How far the clock of the node at `addr` (`TIME`) is behind the real one.
    pub async fn clock_lag(&self, addr: &str) -> Duration {
        let client = redis::Client::open(format!("redis://{addr}/")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let (secs, _micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        Duration::from_secs(real.saturating_sub(secs))
    }

    /// Waits until the sentinels name a master other than `old` and it answers as one;
    /// returns its address and how long that took.
    pub async fn wait_failed_over(&self, old: &str, limit: Duration) -> (String, Duration) {
        let started = Instant::now();
        loop {
            let now = self.master_addr().await;
            if now != old && role(&now).await.as_deref() == Some("master") {
                return (now, started.elapsed());
            }
            assert!(
                started.elapsed() < limit,
                "no failover within {limit:?}: the sentinels still name {now}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A planned failover (`SENTINEL FAILOVER`): the old master becomes a replica.
    pub async fn failover(&self) {
        let mut conn = connect(self.sentinels[0].port).await;
        let () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER)
            .query_async(&mut conn)
            .await
            .expect("SENTINEL FAILOVER accepted");
    }

    /// Waits until the current master has `replicas` replicas, each caught up with it.
    pub async fn wait_replicated(&self, replicas: usize) {
        let master = self.master_port().await;
        wait_for("the replicas in sync", Duration::from_secs(20), || {
            let Some(ours) = info_value(master, "master_repl_offset") else {
                return false;
            };
            // `slave<i>:ip=...,port=...,state=online,offset=...,lag=...`
            let caught_up = (0..replicas)
                .filter_map(|i| info_value(master, &format!("slave{i}")))
                .filter(|line| {
                    let fields: Vec<&str> = line.split(',').collect();
                    fields.contains(&"state=online")
                        && fields.contains(&format!("offset={ours}").as_str())
                })
                .count();
            caught_up == replicas
        })
        .await;
    }

    /// Kills the replica listening on `port` (SIGKILL: nothing saved), whichever role it
    /// has now (a promoted one is the master).
    pub fn kill_replica(&mut self, port: u16) {
        let node = self
            .replicas
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("a replica of the deployment");
        node.stop();
    }

    /// Cuts both replication links: the master accepts writes its replicas never see.
    pub fn cut_replication(&self) {
        self.links.iter().for_each(RedisProxy::cut);
    }

    /// Freezes both replication links half-open: the master accepts writes its replicas
    /// never see, and neither side nor the sentinels notice for the replication timeout
    /// (60 s).
    pub fn stall_replication(&self) {
        self.stalls.iter().for_each(StallProxy::stall);
    }

    /// Cuts the master off from its replicas and the sentinels (not from the pods that
    /// reach it directly): the sentinels fail over, the master stays writable for
    /// whoever still reaches it, unless `min-replicas-to-write` stops it.
    pub fn isolate_master(&self) {
        self.cut_replication();
        self.sentinel_link.as_ref().expect("started isolable").cut();
    }
}

/// A sentinel of its own, outside any deployment, watching one node with a config epoch
/// of the test's choosing: sentinels that disagree, as one cut off from a failover
/// would. It never fails over (quorum 2, and it knows no other sentinel).
pub struct LoneSentinel(Sentinel);

impl LoneSentinel {
    /// Watches the node at `master_port` as [`MASTER`], its view at `config_epoch`.
    pub fn start(master_port: u16, config_epoch: u64) -> LoneSentinel {
        let epoch = format!("sentinel config-epoch {MASTER} {config_epoch}\n");
        LoneSentinel::start_with(master_port, &epoch)
    }

    /// Watches the node at `master_port`, with `extra` lines of configuration.
    pub fn start_with(master_port: u16, extra: &str) -> LoneSentinel {
        LoneSentinel(Sentinel::start(master_port, Duration::from_secs(60), extra))
    }

    pub fn port(&self) -> u16 {
        self.0.port
    }
}

impl Sentinel {
    /// `extra`: lines appended to the configuration (after the `monitor` line they
    /// refer to).
    fn start(master_port: u16, failover_timeout: Duration, extra: &str) -> Sentinel {
        let dir = tempfile::tempdir().expect("temp dir for redis-sentinel");
        for _ in 0..5 {
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nlogfile {}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {MASTER} {}\n\
                     sentinel failover-timeout {MASTER} {}\n\
                     sentinel parallel-syncs {MASTER} 2\n{extra}",
                    dir.path().display(),
                    dir.path().join("sentinel.log").display(),
                    DOWN_AFTER.as_millis(),
                    failover_timeout.as_millis(),
                ),
            )
            .expect("write sentinel.conf");
            let child = Command::new(program("redis-sentinel", "redis-sentinel"))
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-sentinel");
            let mut child = child;
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if let Some(pid) = serving_pid(port, None) {
                    if pid != child.id() {
                        break; // another test's process has this port: a new one
                    }
                    return Sentinel {
                        child,
                        port,
                        _dir: dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-sentinel did not start after 5 attempts");
    }
}

/// The port of a `host:port` address.
pub fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("host:port")
}

fn link_port(link: &RedisProxy) -> u16 {
    link.url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("a proxy URL ends with its port")
}

/// The master the sentinel at `port` names.
async fn master_named_by(port: u16) -> String {
    let mut conn = connect(port).await;
    let (host, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER)
        .query_async(&mut conn)
        .await
        .expect("the sentinel names a master");
    format!("{host}:{port}")
}

async fn connect(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// `ROLE` of the node at `addr` (`master`, `slave`), if it answers.
async fn role(addr: &str) -> Option<String> {
    let client = redis::Client::open(format!("redis://{addr}/")).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.ok()?;
    match role.first()? {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// `field` of `INFO` on the node at `port`.
fn info_value(port: u16, field: &str) -> Option<String> {
    let info: String = sync_query(port, &["INFO"])?;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// The number of entries a sentinel's array answer to `args` has.
fn info_field(port: u16, args: &[&str]) -> Option<usize> {
    sync_query::<Vec<redis::Value>>(port, args).map(|v| v.len())
}

fn sync_query<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn).ok()
}
