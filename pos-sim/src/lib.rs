//! POS terminal simulator: a [`PosFarm`] plays the terminal side of
//! `docs/pos-protocol.md` for a range of terminals in one process, records what the pods do
//! to them (connection overlaps, superseded sessions, stale epochs, duplicate deliveries,
//! which it answers with the duplicate marker, and the intervals each terminal spent with
//! no connection at all), and misbehaves on request (faults).
//!
//! All terminals share a few TLS listeners and are told apart by SNI, so a farm costs about
//! one file descriptor per connection. The farm does not dial anyone, does not persist
//! anything across restarts (a new CA each start), and does not implement the pod side.
//! Used by `posgate demo`, posgate's tests and the load harness (binary `pos-sim`).
#![forbid(unsafe_code)]
// As in posgate: the API docs are the developers' (`--document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

pub mod dist;

mod admin;
mod bounded;
mod certs;
mod conn;
mod counters;
mod dark;
mod duplicates;
mod error;
mod faults;
mod layout;
mod record;
mod refusals;

use std::{
    net::{Ipv4Addr, SocketAddr},
    ops::Range,
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex, MutexGuard, RwLock,
    },
    time::Duration,
};

use rustls::{pki_types::CertificateDer, ServerConfig};
use tokio::{net::TcpListener, task::JoinHandle};
use tracing::info;

pub use admin::AdminServer;
pub use bounded::CAPACITY as LOG_KEPT;
pub use counters::FarmCounters;
pub use dark::{DarkInterval, DarkIntervals, DARK_KEPT};
pub use duplicates::{Delivery, Duplicate, Duplicates};
pub use error::SimError;
pub use faults::{DropRequest, FaultConfig};
pub use layout::{terminals_csv, Naming, TerminalInfo};
pub use posgate_terminal::DedupWindow;
pub use record::{ConnEvent, OpenConnReport, PushRecord, TerminalReport, TerminalStats};
pub use refusals::{Refusal, Refusals};

use counters::Counters;
use dark::DarkLog;
use duplicates::DuplicateLog;
use record::TerminalState;
use refusals::RefusalLog;

/// Most terminals one process may serve, whatever the open-file limit says: the limit on
/// this machine kind is 20,000, and connections need head-room during reconnects.
pub const MAX_TERMINALS_PER_PROCESS: u64 = 15_000;
/// File descriptors kept for everything that is not a terminal connection.
const FD_SLACK: u64 = 256;

/// What a farm serves and how.
#[derive(Debug, Clone)]
pub struct FarmConfig {
    /// Terminal numbers served (end exclusive).
    pub range: Range<u64>,
    /// Id and server-name spelling.
    pub naming: Naming,
    /// First listener address; listener `k` listens on `first_ip + k`.
    pub first_ip: Ipv4Addr,
    /// Number of listeners (distinct addresses, same port).
    pub listeners: usize,
    /// Listener port; 0 lets each listener pick a free port (tests).
    pub port: u16,
    /// Path pushes are posted to.
    pub push_path: String,
    /// How long a superseded session's connection may take to close after GOAWAY before the
    /// terminal drops it.
    pub supersede_grace: Duration,
    /// A superseded session still open longer than this counts as a session overlap.
    pub session_overlap_threshold: Duration,
    /// Time allowed for the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long, and how many, accepted idempotency keys each terminal remembers.
    pub dedup: DedupWindow,
}

impl FarmConfig {
    /// Defaults: ids `pos-NNNNN`, names `pos-NNNNN.pos.test`, 16 listeners from
    /// 127.0.1.1 on port 8443, pushes on `/push`, 2 s supersede grace, 1 s overlap
    /// threshold, 10 s handshake timeout, keys remembered 10 min (at most 1,000 per
    /// terminal).
    pub fn new(range: Range<u64>) -> Self {
        FarmConfig {
            range,
            naming: Naming {
                prefix: "pos-".into(),
                domain: "pos.test".into(),
            },
            first_ip: Ipv4Addr::new(127, 0, 1, 1),
            listeners: 16,
            port: 8443,
            push_path: "/push".into(),
            supersede_grace: Duration::from_secs(2),
            session_overlap_threshold: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(10),
            dedup: DedupWindow::default(),
        }
    }

    fn validate(&self) -> Result<(), SimError> {
        let (start, end) = (self.range.start, self.range.end);
        let invalid = |reason| Err(SimError::InvalidRange { start, end, reason });
        if start >= end {
            return invalid("the range is empty");
        }
        if end - start > MAX_TERMINALS_PER_PROCESS {
            return invalid("more than 15,000 terminals in one process");
        }
        if self.dedup.window.is_zero() || self.dedup.capacity == 0 {
            return Err(SimError::InvalidConfig(
                "the dedup window and capacity must be above zero".into(),
            ));
        }
        if self.listeners == 0 {
            return Err(SimError::InvalidConfig("at least one listener".into()));
        }
        if !self.push_path.starts_with('/') || self.push_path == "/hello" {
            return Err(SimError::InvalidConfig(format!(
                "push path {:?} must start with / and differ from /hello",
                self.push_path
            )));
        }
        Ok(())
    }
}

/// State shared by the listeners, connections and admin endpoint.
pub(crate) struct Shared {
    config: FarmConfig,
    terminals: Vec<Mutex<TerminalState>>,
    addrs: Vec<SocketAddr>,
    counters: Counters,
    refusals: RefusalLog,
    duplicates: DuplicateLog,
    dark: DarkLog,
    faults: RwLock<Arc<FaultConfig>>,
    tls: Arc<ServerConfig>,
    next_conn: AtomicU64,
    drop_round: AtomicU64,
}

impl Shared {
    fn terminal(&self, index: usize) -> MutexGuard<'_, TerminalState> {
        // A panic while holding the lock leaves counters consistent enough to keep going.
        self.terminals[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn faults(&self) -> Arc<FaultConfig> {
        self.faults
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Relaxed)
    }

    fn number_of_index(&self, index: usize) -> u64 {
        self.config.range.start + index as u64
    }

    fn id_of_index(&self, index: usize) -> String {
        self.config.naming.id(self.number_of_index(index))
    }

    /// Terminal number and index of a server name, if this farm serves it.
    fn route(&self, server_name: &str) -> Option<(u64, usize)> {
        let n = self.config.naming.number_of_server_name(server_name)?;
        self.config
            .range
            .contains(&n)
            .then(|| (n, (n - self.config.range.start) as usize))
    }

    fn index_of_id(&self, id: &str) -> Option<usize> {
        let n = self.config.naming.number_of_id(id)?;
        self.config
            .range
            .contains(&n)
            .then(|| (n - self.config.range.start) as usize)
    }

    fn info(&self, index: usize) -> TerminalInfo {
        let n = self.number_of_index(index);
        let id = self.config.naming.id(n);
        TerminalInfo {
            server_name: self.config.naming.server_name(&id),
            addr: self.addrs[layout::listener_index(n, self.addrs.len())],
            id,
        }
    }

    fn counters(&self) -> FarmCounters {
        self.counters.snapshot(self.terminals.len() as u64)
    }

    fn dark_intervals(&self, since_unix_ms: u64) -> DarkIntervals {
        let naming = &self.config.naming;
        self.dark
            .since(since_unix_ms, |n| naming.id(n), &self.counters())
    }

    fn report(&self, id: &str) -> Option<TerminalReport> {
        let index = self.index_of_id(id)?;
        let info = self.info(index);
        let offline = self
            .faults()
            .is_offline(self.number_of_index(index), &info.id);
        Some(
            self.terminal(index)
                .report(info.id, info.server_name, info.addr, offline),
        )
    }

    fn set_faults(&self, faults: FaultConfig) -> Result<usize, SimError> {
        faults.validate().map_err(SimError::InvalidConfig)?;
        *self
            .faults
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(faults.clone());
        // Terminals going offline lose their live connections too, as a real one would.
        let mut dropped = 0;
        for index in 0..self.terminals.len() {
            if faults.is_offline(self.number_of_index(index), &self.id_of_index(index)) {
                dropped += self.terminal(index).abort_where(|_| true);
            }
        }
        info!(?faults, dropped, "faults set");
        Ok(dropped)
    }

    fn drop_connections(&self, fraction: f64) -> Result<usize, SimError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(SimError::InvalidConfig(format!(
                "drop fraction must be within 0..=1, got {fraction}"
            )));
        }
        let round = self.drop_round.fetch_add(1, Relaxed);
        let dropped = self
            .terminals
            .iter()
            .enumerate()
            .map(|(index, _)| {
                self.terminal(index)
                    .abort_where(|conn| faults::selected(conn, round, fraction))
            })
            .sum();
        info!(fraction, dropped, "dropped live connections");
        Ok(dropped)
    }
}

/// Raises the soft open-file limit to the hard one and checks the farm fits under it.
fn ensure_fd_budget(terminals: u64, listeners: usize) -> Result<(), SimError> {
    let limit = rlimit::increase_nofile_limit(u64::MAX).map_err(SimError::Rlimit)?;
    // Reconnects briefly hold two connections for a terminal: keep a quarter in reserve.
    let needed = terminals + terminals / 4 + listeners as u64 + FD_SLACK;
    if needed > limit {
        return Err(SimError::FdLimit {
            terminals,
            needed,
            limit,
        });
    }
    Ok(())
}

/// A running farm of simulated terminals. Dropping it stops the listeners and closes all
/// connections.
pub struct PosFarm {
    shared: Arc<Shared>,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    tasks: Vec<JoinHandle<()>>,
}

impl PosFarm {
    /// Checks the file-descriptor budget, generates the CA and certificate, binds the
    /// listeners and starts accepting.
    pub async fn start(config: FarmConfig) -> Result<PosFarm, SimError> {
        config.validate()?;
        let count = config.range.end - config.range.start;
        ensure_fd_budget(count, config.listeners)?;
        let tls = certs::generate(&config.naming.domain)?;
        let mut listeners = Vec::with_capacity(config.listeners);
        for ip in layout::listener_ips(config.first_ip, config.listeners) {
            let addr = SocketAddr::from((ip, config.port));
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| SimError::Bind { addr, source })?;
            let bound = listener
                .local_addr()
                .map_err(|source| SimError::Bind { addr, source })?;
            listeners.push((bound, listener));
        }
        let shared = Arc::new(Shared {
            terminals: (0..count)
                .map(|offset| {
                    let id = config.naming.id(config.range.start + offset);
                    Mutex::new(TerminalState::new(id, config.dedup))
                })
                .collect(),
            addrs: listeners.iter().map(|(addr, _)| *addr).collect(),
            counters: Counters::default(),
            refusals: RefusalLog::default(),
            duplicates: DuplicateLog::default(),
            dark: DarkLog::new(),
            faults: RwLock::default(),
            tls: tls.server_config,
            next_conn: AtomicU64::new(1),
            drop_round: AtomicU64::new(0),
            config,
        });
        let tasks = listeners
            .into_iter()
            .map(|(_, listener)| tokio::spawn(conn::accept_loop(shared.clone(), listener)))
            .collect();
        info!(
            first = %shared.id_of_index(0),
            terminals = count,
            listeners = ?shared.addrs,
            "POS farm started"
        );
        Ok(PosFarm {
            shared,
            ca_pem: tls.ca_pem,
            ca_der: tls.ca_der,
            tasks,
        })
    }

    /// Where every terminal is reached, in terminal order.
    pub fn terminals(&self) -> Vec<TerminalInfo> {
        (0..self.shared.terminals.len())
            .map(|i| self.shared.info(i))
            .collect()
    }

    /// Where one terminal is reached.
    pub fn terminal(&self, id: &str) -> Option<TerminalInfo> {
        self.shared.index_of_id(id).map(|i| self.shared.info(i))
    }

    /// The listener addresses.
    pub fn listener_addrs(&self) -> &[SocketAddr] {
        &self.shared.addrs
    }

    /// PEM of the CA that signed the terminals' certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// DER of the CA certificate, for in-process clients.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca_der.clone()
    }

    /// Writes `ca.pem` and `terminals.csv` into `dir` (created if missing).
    pub fn write_files(&self, dir: &Path) -> Result<(), SimError> {
        let write = |name: &str, contents: &str| {
            let path = dir.join(name);
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(&path, contents))
                .map_err(|source| SimError::Write { path, source })
        };
        write("ca.pem", &self.ca_pem)?;
        write("terminals.csv", &terminals_csv(&self.terminals()))
    }

    /// The farm's counters now.
    pub fn counters(&self) -> FarmCounters {
        self.shared.counters()
    }

    /// Everything recorded about one terminal.
    pub fn terminal_report(&self, id: &str) -> Option<TerminalReport> {
        self.shared.report(id)
    }

    /// The stale-epoch refusals kept (the newest [`LOG_KEPT`]), oldest first.
    pub fn refusals(&self) -> Refusals {
        self.shared.refusals.refusals()
    }

    /// The duplicate deliveries kept (the newest [`LOG_KEPT`]), oldest first.
    pub fn duplicates(&self) -> Duplicates {
        self.shared.duplicates.duplicates()
    }

    /// The dark intervals kept (the newest [`DARK_KEPT`]) that ended at or after
    /// `since_unix_ms`, summarised, with the terminals dark and never connected now.
    pub fn dark_intervals(&self, since_unix_ms: u64) -> DarkIntervals {
        self.shared.dark_intervals(since_unix_ms)
    }

    /// The fault settings in force.
    pub fn faults(&self) -> FaultConfig {
        (*self.shared.faults()).clone()
    }

    /// Replaces the fault settings; returns how many live connections were dropped because
    /// their terminal went offline.
    pub fn set_faults(&self, faults: FaultConfig) -> Result<usize, SimError> {
        self.shared.set_faults(faults)
    }

    /// Drops about `fraction` of the live terminal connections now; returns how many.
    pub fn drop_connections(&self, fraction: f64) -> Result<usize, SimError> {
        self.shared.drop_connections(fraction)
    }

    /// Serves `GET /counters`, `GET /terminals/{id}`, `GET /refusals`, `GET /duplicates`,
    /// `GET /dark?since=<unix_ms>`, `GET|POST /faults` and `POST /drop` over plain HTTP/1
    /// on `addr`.
    pub async fn serve_admin(&self, addr: SocketAddr) -> Result<AdminServer, SimError> {
        AdminServer::start(self.shared.clone(), addr).await
    }
}

impl Drop for PosFarm {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for terminal in &self.shared.terminals {
            let state = terminal.lock().unwrap_or_else(|p| p.into_inner());
            state.abort_where(|_| true);
        }
    }
}
