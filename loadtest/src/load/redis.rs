//! A private `redis-server` on a free loopback port (no persistence), which can be killed
//! and started again empty on the same port, and its `INFO commandstats`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::Command,
};

use super::{
    procs::{free_port, ChildProc},
    LoadError,
};

/// Calls per command name, from `INFO commandstats`.
pub type CommandStats = BTreeMap<String, u64>;

/// The harness's Redis.
pub struct RedisServer {
    port: u16,
    log: PathBuf,
    proc: Option<ChildProc>,
    starts: u32,
}

/// `redis-server` arguments for a throwaway node on loopback `port`: no snapshots, no
/// append-only file (a test or a run starts from nothing and leaves nothing behind).
pub fn loopback_args(port: u16) -> [String; 8] {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(String::from)
}

impl RedisServer {
    /// Starts `redis-server` on a free port and waits until it answers.
    pub async fn start(log_dir: &Path) -> Result<Self, LoadError> {
        let mut server = RedisServer {
            port: free_port()?,
            log: log_dir.join("redis.log"),
            proc: None,
            starts: 0,
        };
        server.spawn().await?;
        Ok(server)
    }

    async fn spawn(&mut self) -> Result<(), LoadError> {
        let mut cmd = Command::new("redis-server");
        cmd.args(loopback_args(self.port));
        self.starts += 1;
        let name = format!("redis-server #{}", self.starts);
        self.proc = Some(ChildProc::spawn(&name, cmd, &self.log)?);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(reply) = self.command("PING").await {
                if reply.contains("PONG") {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(LoadError::Timeout {
            what: format!("{name} answering PING"),
            limit: Duration::from_secs(10),
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// kill -9, and nothing more (a master lost for good; `redis-failover`).
    pub async fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill().await;
        }
    }

    /// kill -9, then start again empty on the same port.
    pub async fn restart_empty(&mut self) -> Result<Duration, LoadError> {
        let started = Instant::now();
        if let Some(mut p) = self.proc.take() {
            p.kill().await;
        }
        self.spawn().await?;
        Ok(started.elapsed())
    }

    pub fn process(&self) -> Option<&ChildProc> {
        self.proc.as_ref()
    }

    async fn command(&self, line: &str) -> Result<String, LoadError> {
        command(self.port, line).await
    }

    /// `INFO commandstats` as calls per command.
    pub async fn command_stats(&self) -> Result<CommandStats, LoadError> {
        Ok(parse_commandstats(
            &self.command("INFO commandstats").await?,
        ))
    }
}

/// Sends one inline command to the Redis (or sentinel) on loopback `port` and returns the
/// raw reply, read until it is a whole RESP value.
pub async fn command(port: u16, line: &str) -> Result<String, LoadError> {
    let io = |e| LoadError::io("talking to redis", e);
    let fut = async {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.map_err(io)?;
        tcp.write_all(format!("{line}\r\n").as_bytes())
            .await
            .map_err(io)?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let n = tcp.read(&mut chunk).await.map_err(io)?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if value_end(&buf, 0).is_some() {
                break;
            }
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .map_err(|_| LoadError::Timeout {
            what: format!("redis {line}"),
            limit: Duration::from_secs(2),
        })?
}

/// Where the RESP value starting at `at` in `buf` ends, if it is complete there (a simple
/// string, error or integer, a bulk string, or an array of those).
fn value_end(buf: &[u8], at: usize) -> Option<usize> {
    let nl = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let header = std::str::from_utf8(&buf[at + 1..nl]).ok()?;
    let next = nl + 2;
    match buf[at] {
        b'$' => {
            let len: i64 = header.parse().ok()?;
            let end = if len < 0 {
                next
            } else {
                next + len as usize + 2
            };
            (buf.len() >= end).then_some(end)
        }
        b'*' => {
            let count: i64 = header.parse().ok()?;
            (0..count.max(0)).try_fold(next, |pos, _| value_end(buf, pos))
        }
        _ => Some(next),
    }
}

/// Parses `cmdstat_<name>:calls=N,...` lines.
pub fn parse_commandstats(text: &str) -> CommandStats {
    text.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// `after - before` per command (a restarted Redis counts from zero: then `after` alone).
pub fn stats_delta(before: &CommandStats, after: &CommandStats) -> CommandStats {
    after
        .iter()
        .map(|(k, &v)| {
            let b = before.get(k).copied().unwrap_or(0);
            (k.clone(), if v >= b { v - b } else { v })
        })
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// Commands a client sends itself (the rest run inside scripts): an estimate of round
/// trips, since `INFO commandstats` also counts every command a script runs.
pub const TOP_LEVEL: &[&str] = &[
    "evalsha",
    "eval",
    "ping",
    "subscribe",
    "unsubscribe",
    "script",
    "hello",
    "client",
    "auth",
    "select",
    "info",
];

#[cfg(test)]
mod tests {
    #[test]
    fn parses_commandstats() {
        let s = "# Commandstats\r\ncmdstat_get:calls=12,usec=3,usec_per_call=0.25\r\n\
                 cmdstat_evalsha:calls=7,usec=1\r\n";
        let m = super::parse_commandstats(s);
        assert_eq!(m["get"], 12);
        assert_eq!(m["evalsha"], 7);
    }
}
