//! The `pos-sim` processes of a run: as many as the open-file limit needs (at most
//! 12,500 terminals each, on distinct listener addresses), their merged terminal CSV and
//! CA bundle, summed counters, merged logs (refusals, duplicates, dark intervals),
//! per-terminal reports, and their faults (terminals taken offline).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use serde::Deserialize;
use tokio::{process::Command, sync::Semaphore, task::JoinSet};

use posgate_pos_sim::{
    dist::dist,
    {DarkIntervals, Duplicates, FaultConfig, Refusals},
};

use super::{
    http::{self, HttpClient},
    procs::{free_port, ChildProc},
    LoadError,
};

/// Terminals per `pos-sim` process: below the 15,000 cap, leaving head-room for the
/// reconnect overlap within the 20,000 open files of one process.
pub const PER_PROCESS: u64 = 12_500;

/// Summed farm counters (`max_session_overlap_ms` is a max, the rest are sums).
pub type Counters = BTreeMap<String, u64>;

/// A connection event of a terminal report (`opened` / `closed`).
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    pub conn: u64,
    pub event: String,
    pub at_unix_ms: u64,
}

/// A connection open now, from a terminal report.
#[derive(Debug, Clone, Deserialize)]
pub struct OpenConn {
    pub conn: u64,
    pub opened_unix_ms: u64,
    pub session_epoch: Option<u64>,
    pub superseded: bool,
}

/// An accepted push, from a terminal report.
#[derive(Debug, Clone, Deserialize)]
pub struct AcceptedPush {
    pub epoch: u64,
    pub at_unix_ms: u64,
    /// `tenant:key`, as the terminal deduplicates it.
    #[serde(default)]
    pub idempotency_key: String,
}

/// The fields of `GET /terminals/{id}` the harness uses.
#[derive(Debug, Clone, Deserialize)]
pub struct TerminalView {
    pub id: String,
    pub highest_epoch: Option<u64>,
    pub open_connections: Vec<OpenConn>,
    pub recent_connections: Vec<Event>,
    #[serde(default)]
    pub recent_pushes: Vec<AcceptedPush>,
}

struct Sim {
    range: std::ops::Range<u64>,
    admin: SocketAddr,
    _proc: ChildProc,
}

/// All simulator processes of a run.
pub struct SimFarm {
    sims: Vec<Sim>,
    prefix: String,
    pub csv: PathBuf,
    pub ca: PathBuf,
    client: HttpClient,
}

impl SimFarm {
    /// Starts `ceil(terminals / 12,500)` processes of `bin` and merges their files into
    /// `dir/terminals.csv` and `dir/ca.pem`.
    pub async fn start(bin: &Path, terminals: u64, dir: &Path) -> Result<Self, LoadError> {
        Self::start_at(bin, terminals, dir, 10).await
    }

    /// [`SimFarm::start`] with the terminals' addresses from `127.0.<net>.1` on (the k-th
    /// process at `127.0.<net + k>.1`): a second farm on the machine needs another `net`.
    pub async fn start_at(
        bin: &Path,
        terminals: u64,
        dir: &Path,
        net: u8,
    ) -> Result<Self, LoadError> {
        let count = terminals.div_ceil(PER_PROCESS);
        if count > u64::from(255 - net) {
            return Err(LoadError::Plan(format!(
                "{terminals} terminals is too many"
            )));
        }
        let client = http::client();
        let mut sims = Vec::new();
        for k in 0..count {
            let range = k * PER_PROCESS..((k + 1) * PER_PROCESS).min(terminals);
            let out = dir.join(format!("sim-{k}"));
            std::fs::create_dir_all(&out)
                .map_err(|e| LoadError::io(format!("creating {}", out.display()), e))?;
            let _ = std::fs::remove_file(out.join("terminals.csv"));
            let admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            let mut cmd = Command::new(bin);
            cmd.arg("--range")
                .arg(format!("{}..{}", range.start, range.end))
                .arg("--out")
                .arg(&out)
                .arg("--admin")
                .arg(admin.to_string())
                .arg("--first-ip")
                .arg(format!("127.0.{}.1", u64::from(net) + k))
                .env("RUST_LOG", "warn");
            let name = format!("pos-sim-{k}");
            let proc = ChildProc::spawn(&name, cmd, &dir.join(format!("{name}.log")))?;
            sims.push(Sim {
                range,
                admin,
                _proc: proc,
            });
        }
        let farm = SimFarm {
            sims,
            prefix: "pos-".into(),
            csv: dir.join("terminals.csv"),
            ca: dir.join("ca.pem"),
            client,
        };
        farm.wait_ready(dir).await?;
        farm.merge_files(dir)?;
        Ok(farm)
    }

    async fn wait_ready(&self, dir: &Path) -> Result<(), LoadError> {
        let limit = Duration::from_secs(60);
        let deadline = Instant::now() + limit;
        for (k, sim) in self.sims.iter().enumerate() {
            let csv = dir.join(format!("sim-{k}/terminals.csv"));
            let url = format!("http://{}/counters", sim.admin);
            loop {
                let up = csv.exists()
                    && http::get_status(&self.client, &url, Duration::from_secs(1)).await
                        == Some(200);
                if up {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(LoadError::Timeout {
                        what: format!("pos-sim-{k} ready"),
                        limit,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    fn merge_files(&self, dir: &Path) -> Result<(), LoadError> {
        let (mut csv, mut ca) = (String::from("id,addr,server_name\n"), String::new());
        for k in 0..self.sims.len() {
            let read = |name: &str| {
                let p = dir.join(format!("sim-{k}/{name}"));
                std::fs::read_to_string(&p)
                    .map_err(|e| LoadError::io(format!("reading {}", p.display()), e))
            };
            for line in read("terminals.csv")?.lines().skip(1) {
                csv.push_str(line);
                csv.push('\n');
            }
            ca.push_str(&read("ca.pem")?);
        }
        let write = |p: &Path, s: &str| {
            std::fs::write(p, s).map_err(|e| LoadError::io(format!("writing {}", p.display()), e))
        };
        write(&self.csv, &csv)?;
        write(&self.ca, &ca)
    }

    /// Counters summed over all simulators.
    pub async fn counters(&self) -> Result<Counters, LoadError> {
        let mut sum = Counters::new();
        for sim in &self.sims {
            let url = format!("http://{}/counters", sim.admin);
            let one: BTreeMap<String, serde_json::Value> =
                http::get_json(&self.client, &url, None, Duration::from_secs(5)).await?;
            for (k, v) in one {
                let v = v.as_u64().unwrap_or(0);
                let slot = sum.entry(k.clone()).or_insert(0);
                *slot = if k == "max_session_overlap_ms" {
                    (*slot).max(v)
                } else {
                    *slot + v
                };
            }
        }
        Ok(sum)
    }

    /// Stale-epoch refusals of every simulator (each keeps its newest
    /// [`posgate_pos_sim::LOG_KEPT`]), merged oldest first; `dropped` is summed.
    pub async fn refusals(&self) -> Result<Refusals, LoadError> {
        let mut all = Refusals::default();
        for sim in &self.sims {
            let url = format!("http://{}/refusals", sim.admin);
            let one: Refusals =
                http::get_json(&self.client, &url, None, Duration::from_secs(10)).await?;
            all.refusals.extend(one.refusals);
            all.dropped += one.dropped;
        }
        all.refusals.sort_by_key(|r| r.at_unix_ms);
        Ok(all)
    }

    /// Duplicate deliveries of every simulator (each keeps its newest
    /// [`posgate_pos_sim::LOG_KEPT`]), merged oldest first; `dropped` is summed.
    pub async fn duplicates(&self) -> Result<Duplicates, LoadError> {
        let mut all = Duplicates::default();
        for sim in &self.sims {
            let url = format!("http://{}/duplicates", sim.admin);
            let one: Duplicates =
                http::get_json(&self.client, &url, None, Duration::from_secs(10)).await?;
            all.duplicates.extend(one.duplicates);
            all.dropped += one.dropped;
        }
        all.duplicates.sort_by_key(|d| d.this.at_unix_ms);
        Ok(all)
    }

    /// Dark intervals of every simulator that ended at or after `since` (each keeps its
    /// newest [`posgate_pos_sim::DARK_KEPT`]), merged in the order they ended, summarised
    /// again; `dropped` and the gauges are summed, `incomplete` if any one is.
    pub async fn dark_intervals(&self, since: u64) -> Result<DarkIntervals, LoadError> {
        let mut all = DarkIntervals {
            since_unix_ms: since,
            ..DarkIntervals::default()
        };
        for sim in &self.sims {
            let url = format!("http://{}/dark?since={since}", sim.admin);
            let one: DarkIntervals =
                http::get_json(&self.client, &url, None, Duration::from_secs(30)).await?;
            all.intervals.extend(one.intervals);
            all.dropped += one.dropped;
            all.incomplete |= one.incomplete;
            all.dark_now += one.dark_now;
            all.not_yet_dialed += one.not_yet_dialed;
        }
        all.intervals.sort_by_key(|i| i.end_unix_ms);
        all.summary = dist(all.intervals.iter().map(|i| i.ms()).collect());
        Ok(all)
    }

    /// Sets `faults` on every simulator: a whole state, so what it leaves out is off
    /// (`FaultConfig::default()` brings offline terminals back).
    pub async fn set_faults(&self, faults: &FaultConfig) -> Result<(), LoadError> {
        let body = serde_json::to_vec(faults).map_err(|e| LoadError::Plan(e.to_string()))?;
        for sim in &self.sims {
            let url = format!("http://{}/faults", sim.admin);
            let err = |message: String| LoadError::Http {
                url: url.clone(),
                message,
            };
            let headers = [("content-type", "application/json")];
            let limit = Duration::from_secs(10);
            let answer = http::exchange(
                &self.client,
                ::http::Method::POST,
                &url,
                &headers,
                body.clone().into(),
                limit,
            )
            .await
            .map_err(|e| err(e.to_string()))?;
            if answer.status != 200 {
                return Err(err(format!("status {}", answer.status)));
            }
        }
        Ok(())
    }

    /// Terminal id of number `n`.
    pub fn id(&self, n: u64) -> String {
        format!("{}{n:05}", self.prefix)
    }

    /// Reports of the given terminal numbers (32 requests in flight); a failed fetch is
    /// left out.
    pub async fn reports(&self, numbers: &[u64]) -> Vec<TerminalView> {
        let gate = Arc::new(Semaphore::new(32));
        let mut tasks = JoinSet::new();
        for &n in numbers {
            let Some(sim) = self.sims.iter().find(|s| s.range.contains(&n)) else {
                continue;
            };
            let url = format!("http://{}/terminals/{}", sim.admin, self.id(n));
            let (client, gate) = (self.client.clone(), gate.clone());
            tasks.spawn(async move {
                let _permit = gate.acquire_owned().await.ok()?;
                http::get_json::<TerminalView>(&client, &url, None, Duration::from_secs(10))
                    .await
                    .ok()
            });
        }
        let mut out = Vec::with_capacity(numbers.len());
        while let Some(done) = tasks.join_next().await {
            if let Ok(Some(view)) = done {
                out.push(view);
            }
        }
        out
    }
}
