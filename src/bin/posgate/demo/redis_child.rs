//! A private `redis-server` for the demo: started on a free loopback port when the
//! binary is on `PATH`, killed when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The running server; dropping it stops it.
pub struct RedisChild {
    child: Child,
    port: u16,
}

impl RedisChild {
    /// `None` when no `redis-server` is on `PATH`.
    pub fn start() -> anyhow::Result<Option<RedisChild>> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Ok(None);
        }
        // Ask the OS for a free port, then hand it to redis-server.
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?;
        let server = RedisChild { child, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(5) {
                bail!("redis-server did not listen on port {port} within 5 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Some(server))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
