//! The harness's Redis made highly available for `redis-failover`: two replicas of the
//! harness's `redis-server` and three `redis-sentinel`s (quorum 2,
//! `down-after-milliseconds` 1000, hostnames as given: loopback), each a child process
//! logging into the run's log directory. The pods of such a run reach the store at
//! [`Sentinels::url`] (no per-pod proxy).
//!
//! The scenario's event is [`fail_over`]. What it does not do: reach anything but
//! 127.0.0.1.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::process::Command;

use super::{
    cluster::Cluster,
    procs::{free_port, ChildProc},
    redis::{command, loopback_args, RedisServer},
    scenarios::{Action, Cut},
    unix_ms, LoadError,
};

/// The name the sentinels monitor the master under.
pub const MASTER: &str = "posgate";
/// How long the sentinels wait before they call an unanswering master down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// `redis+sentinel://` URL of the sentinels on loopback `ports`, for [`MASTER`].
pub fn url(ports: impl IntoIterator<Item = u16>) -> String {
    let hosts: Vec<String> = ports
        .into_iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
}

/// One process of the deployment: a replica or a sentinel.
struct Node {
    port: u16,
    _proc: ChildProc,
}

/// See the module docs.
pub struct Sentinels {
    replicas: Vec<Node>,
    sentinels: Vec<Node>,
}

async fn spawn(
    program: &str,
    args: Vec<String>,
    log: &Path,
    name: &str,
) -> Result<ChildProc, LoadError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    ChildProc::spawn(name, cmd, log)
}

/// Waits until the node at `port` answers `PING`.
async fn answering(port: u16, what: &str) -> Result<(), LoadError> {
    let limit = Duration::from_secs(10);
    let started = Instant::now();
    while started.elapsed() < limit {
        if command(port, "PING")
            .await
            .is_ok_and(|r| r.contains("PONG"))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(LoadError::Timeout {
        what: format!("{what} answering PING"),
        limit,
    })
}

impl Sentinels {
    /// Starts two replicas of `master` and three sentinels watching it, and waits until
    /// both replicas are in sync and every sentinel knows them and the other sentinels.
    pub async fn start(master: &RedisServer, logs: &Path) -> Result<Self, LoadError> {
        let master_port = master.addr().port();
        let mut replicas = Vec::new();
        for i in 0..2 {
            let port = free_port()?;
            let mut args = loopback_args(port).to_vec();
            let replica = [
                "--repl-diskless-sync-delay",
                "0",
                "--replicaof",
                "127.0.0.1",
            ];
            args.extend(replica.map(String::from));
            args.push(master_port.to_string());
            let name = format!("redis-replica-{i}");
            // A replica writes the master's snapshot to its directory before loading
            // it: into the logs, not the working directory (a dump.rdb was committed).
            args.extend(["--dir".to_string(), logs.display().to_string()]);
            args.extend(["--dbfilename".to_string(), format!("{name}.rdb")]);
            let log = logs.join(format!("{name}.log"));
            let proc = spawn("redis-server", args, &log, &name).await?;
            answering(port, &name).await?;
            replicas.push(Node { port, _proc: proc });
        }
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port()?;
            let name = format!("redis-sentinel-{i}");
            let conf = logs.join(format!("{name}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER} {}\n\
                 sentinel failover-timeout {MASTER} 10000\n\
                 sentinel parallel-syncs {MASTER} 2\n",
                logs.display(),
                DOWN_AFTER.as_millis()
            );
            std::fs::write(&conf, text)
                .map_err(|e| LoadError::io(format!("writing {}", conf.display()), e))?;
            let log = logs.join(format!("{name}.log"));
            let args = vec![conf.display().to_string()];
            let proc = spawn("redis-sentinel", args, &log, &name).await?;
            answering(port, &name).await?;
            sentinels.push(Node { port, _proc: proc });
        }
        let set = Sentinels {
            replicas,
            sentinels,
        };
        set.wait_known(master_port).await?;
        Ok(set)
    }

    /// Waits until the master has both replicas online and every sentinel counts two
    /// replicas and two other sentinels.
    async fn wait_known(&self, master_port: u16) -> Result<(), LoadError> {
        let limit = Duration::from_secs(30);
        let started = Instant::now();
        loop {
            let info = command(master_port, "INFO replication")
                .await
                .unwrap_or_default();
            let online = info.matches("state=online").count() >= self.replicas.len();
            let mut known = true;
            for s in &self.sentinels {
                let master = command(s.port, &format!("SENTINEL MASTER {MASTER}"))
                    .await
                    .unwrap_or_default();
                known &= field(&master, "num-slaves").is_some_and(|n| n >= 2)
                    && field(&master, "num-other-sentinels").is_some_and(|n| n >= 2);
            }
            if online && known {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(LoadError::Timeout {
                    what: "the sentinels see both replicas and each other".into(),
                    limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `redis+sentinel://` URL of the three sentinels.
    pub fn url(&self) -> String {
        url(self.sentinels.iter().map(|s| s.port))
    }

    /// The master's port as the first sentinel that answers names it.
    pub async fn master_port(&self) -> Option<u16> {
        for s in &self.sentinels {
            let reply = command(
                s.port,
                &format!("SENTINEL GET-MASTER-ADDR-BY-NAME {MASTER}"),
            )
            .await
            .unwrap_or_default();
            // *2 $9 127.0.0.1 $<n> <port>
            if let Some(port) = reply.lines().filter_map(|l| l.trim().parse().ok()).next() {
                return Some(port);
            }
        }
        None
    }

    /// Waits until the sentinels name a master other than the one on `old` and it answers
    /// `ROLE` as one; returns its port.
    pub async fn wait_promoted(&self, old: u16, limit: Duration) -> Result<u16, LoadError> {
        let started = Instant::now();
        loop {
            if let Some(port) = self.master_port().await.filter(|&p| p != old) {
                let role = command(port, "ROLE").await.unwrap_or_default();
                if role.contains("master") {
                    return Ok(port);
                }
            }
            if started.elapsed() > limit {
                return Err(LoadError::Timeout {
                    what: "a replica promoted by the sentinels".into(),
                    limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A numeric field of a sentinel's flat `SENTINEL MASTER` array reply (name and value on
/// consecutive bulk strings).
fn field(reply: &str, name: &str) -> Option<u64> {
    let lines: Vec<&str> = reply.lines().map(str::trim).collect();
    let at = lines.iter().position(|l| *l == name)?;
    lines[at + 1..]
        .iter()
        .find(|l| !l.starts_with('$'))
        .and_then(|l| l.parse().ok())
}

/// redis-failover: kills the master (SIGKILL), waits for the sentinels to promote a
/// replica and for every pod to reach the store again with no recovery hold (ownership
/// may change again). The window is the "outage" its gates count pushes in.
pub async fn fail_over(c: &mut Cluster, a: &mut Action) -> Result<Cut, LoadError> {
    let limit = Duration::from_secs(60);
    let sentinels = c
        .sentinels
        .as_ref()
        .ok_or_else(|| LoadError::Plan("redis-failover needs the sentinels".into()))?;
    let old = c.redis.addr().port();
    let from_unix_ms = unix_ms();
    c.redis.kill().await;
    let new = sentinels.wait_promoted(old, limit).await?;
    let promoted_ms = unix_ms() - from_unix_ms;
    let started = Instant::now();
    loop {
        let mut back = true;
        for pod in c.pods.iter().filter(|p| !p.faulted) {
            back &= pod.cluster(&c.client).await.is_ok_and(|v| {
                v.store.verdict == "reachable" && v.store.recovery_hold_ms.is_none()
            });
        }
        if back {
            break;
        }
        if started.elapsed() > limit {
            return Err(LoadError::Timeout {
                what: "every pod reaching the promoted master with no recovery hold".into(),
                limit,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let to_unix_ms = unix_ms();
    a.notes.push(format!(
        "master on port {old} killed (SIGKILL); the sentinels promoted the replica on port \
         {new} after {promoted_ms} ms; every pod reached it with no recovery hold (ownership \
         may change again) {} ms after the kill",
        to_unix_ms - from_unix_ms
    ));
    Ok(Cut {
        pods: c.pods.iter().map(|p| p.id.clone()).collect(),
        from_unix_ms,
        to_unix_ms,
    })
}
