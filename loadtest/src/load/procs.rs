//! Child processes owned by the runner: spawn with output to a log file, send signals,
//! read RSS and CPU time from `/proc`. A [`ChildProc`] kills its process (SIGKILL) when it
//! is dropped, so every exit path of the runner cleans up.

use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use tokio::process::{Child, Command};

use super::LoadError;

/// A running child process; killed (SIGKILL) on drop if still running.
pub struct ChildProc {
    name: String,
    pid: u32,
    child: Child,
}

/// Signals the harness sends (via `kill(1)`, keeping this crate free of `unsafe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
    Stop,
    Cont,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
            Signal::Stop => "STOP",
            Signal::Cont => "CONT",
        }
    }
}

impl ChildProc {
    /// Spawns `cmd`, stdout and stderr appended to `log`, stdin closed.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Self, LoadError> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| LoadError::io(format!("opening {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| LoadError::io("cloning a log file handle", e))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|source| LoadError::Spawn {
            what: name.to_owned(),
            source,
        })?;
        let pid = child.id().ok_or_else(|| LoadError::Exited {
            what: name.to_owned(),
            status: "at once".into(),
        })?;
        Ok(ChildProc {
            name: name.to_owned(),
            pid,
            child,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `sig` to the process.
    pub async fn signal(&self, sig: Signal) -> Result<(), LoadError> {
        let status = Command::new("kill")
            .arg("-s")
            .arg(sig.name())
            .arg(self.pid.to_string())
            .status()
            .await
            .map_err(|e| LoadError::io("running kill(1)", e))?;
        if status.success() {
            Ok(())
        } else {
            Err(LoadError::Exited {
                what: self.name.clone(),
                status: format!("kill -{} failed ({status})", sig.name()),
            })
        }
    }

    /// Exit status if the process has ended.
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for the process to end.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// SIGKILL now and reap.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Resident set size in KiB (`VmRSS` of `/proc/PID/status`).
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }

    /// User + system CPU time in clock ticks (`/proc/PID/stat` fields 14 and 15).
    pub fn cpu_ticks(&self) -> Option<u64> {
        cpu_ticks_of(&self.pid.to_string())
    }
}

/// User + system CPU time, all threads, in clock ticks of process `pid` (a number, or
/// `self`): `/proc/PID/stat` fields 14 and 15.
pub fn cpu_ticks_of(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it follow the ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `name` in the running binary's directory: where cargo puts the workspace's other
/// binaries (`pos-sim` beside `posgate-load` and `wire-dial`).
pub fn beside_this_binary(name: &str) -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} has no directory", exe.display()),
        )
    })?;
    Ok(dir.join(name))
}

/// CPU clock ticks per second (`getconf CLK_TCK` is 100 on Linux).
pub const CLOCK_TICKS: f64 = 100.0;

/// A free loopback TCP port for a child to listen on: bound then released, and taken
/// below the kernel's ephemeral range (`ip_local_port_range`), so that no outgoing
/// connection of the 20 pods and the simulators gets it as its local port before the
/// child binds it ("Address already in use" at a pod's start, seen in CI). Never the
/// same port twice in one process: a port handed to a child that has not bound it yet
/// still probes free (two pods of one full run got the same port, 2026-12-03).
pub fn free_port() -> Result<u16, LoadError> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    // A random start (std's hasher keys are random per process), so concurrent runs
    // rarely probe the same ports.
    let random =
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
    let start = low + (random % u64::from(high - low)) as u16;
    let listen = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    let port = (start..high)
        .chain(low..start)
        .find(|&port| !handed_out.contains(&port) && listen(port))
        .ok_or_else(|| {
            LoadError::io(
                "finding a free port",
                std::io::Error::other(format!("none free in {low}..{high}")),
            )
        })?;
    handed_out.insert(port);
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_never_handed_out_twice() {
        // 2,000 draws from ~22,000 ports: with a random start and nothing remembered,
        // two of them coincide all but always (birthday bound, ~1 - e^-88).
        let ports: Vec<u16> = (0..2_000).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
    }

    #[test]
    fn a_process_reads_its_own_cpu_time_in_ticks() {
        // Burn a little CPU so the figure is at least one tick (10 ms).
        let (mut x, start) = (0u64, std::time::Instant::now());
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        assert!(x != 1);
        assert!(cpu_ticks_of("self").unwrap() > 0);
        assert_eq!(cpu_ticks_of("no-such-process"), None);
    }
}
