//! `RedisServer`: one `redis-server` child process on a free loopback port, with no
//! persistence (a test may still `SAVE` and restart it), killed on drop; optionally also
//! serving TLS on a second port; it can be frozen (SIGSTOP) and thawed, restarted empty,
//! or restarted with its saved data.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use posgate_loadtest::load::redis::loopback_args;

use super::tls::TestPki;

/// A running `redis-server` in its own temporary directory.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// The TLS port, if any; the plain port stays open for readiness checks and `command`.
    tls_port: Option<u16>,
    args: Vec<String>,
    /// Seconds its clock is set off by (`faketime`), if at all.
    clock_offset: Option<i64>,
    dir: tempfile::TempDir,
}

/// The program `name` on `PATH` (or in /usr/bin, /usr/local/bin); panics naming the
/// Debian `package` to install when it is missing. `scripts/test` installs them all.
pub fn program(name: &str, package: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file());
    found.unwrap_or_else(|| {
        panic!("{name} not found on PATH: run `scripts/test`, which installs it (apt-get install {package})")
    })
}

fn binary() -> PathBuf {
    program("redis-server", "redis-server")
}

/// A loopback port nothing listens on right now. It is free when we look; a rare race
/// with another process (another test's server taking the same port first) is handled by
/// `start_with` checking who answers ([`serving_pid`]) and retrying on a new port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// The pid of the Redis process (server or sentinel) answering on `port`, if one does.
/// A reply to `PING` alone does not prove that the child we spawned is serving: when
/// another test's server took the same free port first, ours exits on the failed bind,
/// but the other one answers until its test ends, and a test bound to it fails later
/// with "connection refused".
pub fn serving_pid(port: u16, password: Option<&str>) -> Option<u32> {
    let auth = password.map(|p| format!(":{p}@")).unwrap_or_default();
    let client = redis::Client::open(format!("redis://{auth}127.0.0.1:{port}/")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(200))
        .ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    let pid = info.lines().find_map(|l| l.strip_prefix("process_id:"))?;
    pid.trim().parse().ok()
}

/// Sends one command in RESP and returns the raw first reply line (e.g. `+PONG`).
fn raw_command(port: u16, args: &[&str], timeout: Duration) -> std::io::Result<String> {
    let mut stream =
        TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    let mut req = format!("*{}\r\n", args.len());
    for arg in args {
        req.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(req.as_bytes())?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        reply.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&reply).trim_end().to_string())
}

impl RedisServer {
    /// Starts a plain server (no password).
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments, e.g.
    /// `["--requirepass", "secret"]`.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::start_attempts(None, || (args.clone(), None))
    }

    /// Like [`Self::start_with`], with the server's wall clock `offset_secs` off the real
    /// one (negative: behind; `super::clock_shift`): its `TIME`, key expiry and Lua clock
    /// all run on it.
    pub fn start_with_clock(offset_secs: i64, extra: &[&str]) -> RedisServer {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::start_attempts(Some(offset_secs), || (args.clone(), None))
    }

    /// Starts a server that also serves TLS on [`Self::tls_port`] with `pki`'s server
    /// certificate. With `client_auth`, TLS clients must present a certificate issued
    /// by `pki`'s CA (`tls-auth-clients yes`).
    pub fn start_tls(pki: &TestPki, client_auth: bool) -> RedisServer {
        let path = |name: &str| pki.path(name).to_str().expect("UTF-8 path").to_string();
        Self::start_attempts(None, || {
            let tls_port = free_port();
            let args = [
                "--tls-port",
                &tls_port.to_string(),
                "--tls-cert-file",
                &path("server"),
                "--tls-key-file",
                &path("server-key"),
                "--tls-ca-cert-file",
                &path("ca"),
                "--tls-auth-clients",
                if client_auth { "yes" } else { "no" },
            ];
            (args.map(String::from).to_vec(), Some(tls_port))
        })
    }

    /// Tries a few times with fresh ports from `setup` (arguments and TLS port), in
    /// case another process takes a port between `free_port` and the bind.
    fn start_attempts(
        clock_offset: Option<i64>,
        mut setup: impl FnMut() -> (Vec<String>, Option<u16>),
    ) -> RedisServer {
        for _ in 0..5 {
            let (args, tls_port) = setup();
            let mut server = RedisServer {
                child: None,
                port: free_port(),
                tls_port,
                args,
                clock_offset,
                dir: tempfile::tempdir().expect("temp dir for redis-server"),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start after 5 attempts");
    }

    /// Starts a plain server on `port`, e.g. one a client was pointed at before Redis
    /// was up (see [`free_port`]). Panics if it cannot start there.
    pub fn start_on(port: u16) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            port,
            tls_port: None,
            args: Vec::new(),
            clock_offset: None,
            dir: tempfile::tempdir().expect("temp dir for redis-server"),
        };
        assert!(server.spawn(), "redis-server did not start on port {port}");
        server
    }

    /// Spawns the child on `self.port` and waits until it answers; false if it failed.
    fn spawn(&mut self) -> bool {
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(binary());
        if let Some(offset) = self.clock_offset {
            super::clock_shift::shift(&mut cmd, offset);
        }
        cmd.args(loopback_args(self.port))
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                eprintln!(
                    "redis-server exited early: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                return false;
            }
            if let Some(pid) = serving_pid(self.port, self.password()) {
                if pid != child.id() {
                    eprintln!("port {} taken by another redis (pid {pid})", self.port);
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `--requirepass` it was started with, if any.
    fn password(&self) -> Option<&str> {
        let at = self.args.iter().position(|a| a == "--requirepass")?;
        self.args.get(at + 1).map(String::as_str)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TLS port of a server from [`Self::start_tls`].
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("started with start_tls")
    }

    /// Runs one command on a fresh connection (servers without a password only) and
    /// returns the first reply line, e.g. `+OK`.
    pub fn command(&self, args: &[&str]) -> String {
        raw_command(self.port, args, Duration::from_secs(2)).expect("redis command")
    }

    /// Kills the server and starts an empty one on the same port: like a Redis that
    /// restarted without persistence. Clients see their connections drop.
    pub fn restart_empty(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the server and starts it again on the same port and in the same directory,
    /// with `extra` arguments added for this run: it loads the data a `SAVE` wrote there.
    /// Returns as soon as the server answers, which may be `-LOADING`.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.stop();
        self.args.extend(extra.iter().map(|s| s.to_string()));
        assert!(
            self.spawn(),
            "redis-server did not restart on port {}",
            self.port
        );
    }

    /// Freezes the server with SIGSTOP until [`Self::thaw`]: its connections stay open
    /// and nothing is answered, like a Redis whose host stalls. Clients see timeouts,
    /// not errors.
    /// Keys still expire by the wall clock meanwhile, so leases are gone when it wakes.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server run again (SIGCONT); it answers what was sent meanwhile.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let child = self.child.as_ref().expect("redis-server is running");
        super::binary::signal(child.id(), sig);
    }

    /// Kills the server (SIGKILL: nothing is saved). Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
