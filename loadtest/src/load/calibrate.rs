//! The machine's TLS handshake rate H, measured apart from the cold start it judges.
//!
//! The cold-start bound is `1.2 x T + 5 s` with `T = max(terminals / (pods x dial
//! rate), terminals / H)`. Estimated from the judged run itself (its steepest 1-s rise
//! of open connections), H came out between 1,954 and 2,886/s over five runs of the same
//! code: the maximum of noisy samples, taken from the very curve it is meant to bound.
//! Here H is a calibration instead, run before the pods start: a dedicated `pos-sim`
//! process (its own terminals, on its own addresses, so nothing it records mixes with
//! the run's farm) and this process as the client, with the pods' TLS client settings
//! (ring, the farm's CA as the only root, ALPN `h2`, certificate and name checked), as
//! many handshakes in flight as keep both cores busy, for a fixed window. Both sides of
//! every handshake run on the machine's cores, as in the cold start.
//!
//! What it leaves out, on purpose: the HTTP/2 preface, the hello and everything the pods
//! do besides TLS. Those are what the bound's 20 % and 5 s are for; H is the part the
//! cold start cannot go faster than, whatever posgate does.
//!
//! Not for: the scenario's own figures (`measure`), or the single pod's dial rate
//! (`conn-bench`).

use std::{
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use rustls::{
    pki_types::{pem::PemObject, CertificateDer, ServerName},
    ClientConfig, RootCertStore,
};
use serde::Serialize;
use tokio::{net::TcpStream, task::JoinSet};
use tokio_rustls::TlsConnector;

use super::{
    host::{CpuShares, CpuTimes},
    sims::SimFarm,
    LoadError,
};

/// Terminals of the calibration farm: enough distinct names and addresses that the
/// handshakes are not to one listener.
const TERMINALS: u64 = 2_000;
/// The second octet of the calibration farm's addresses (`127.0.250.1`...): apart from
/// the run's farm (`127.0.10.1`...).
const NET: u8 = 250;
/// Bound of one handshake: a calibration that stalls is an error, not a low figure.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// How the handshakes are counted.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Handshakes in flight.
    pub in_flight: usize,
    /// Handshakes that end before this are not counted (connection set-up, caches).
    pub warm_up: Duration,
    /// The span counted.
    pub span: Duration,
}

impl Window {
    /// The cold start's calibration: 128 in flight (enough to keep both cores busy with
    /// the two processes' crypto), 0.5 s of warm-up, 5 s counted.
    pub const COLD_START: Window = Window {
        in_flight: 128,
        warm_up: Duration::from_millis(500),
        span: Duration::from_secs(5),
    };
}

/// The measured handshake rate.
#[derive(Debug, Clone, Serialize)]
pub struct HandshakeRate {
    /// TLS handshakes completed within the window.
    pub handshakes: u64,
    /// Handshakes that failed (any, in or out of the window).
    pub failed: u64,
    pub window_s: f64,
    pub in_flight: usize,
    pub terminals: u64,
    /// The machine's CPU over the calibration (`None` without `/proc/stat`).
    pub host: Option<CpuShares>,
}

impl HandshakeRate {
    /// Handshakes per second: H.
    pub fn per_s(&self) -> u64 {
        (self.handshakes as f64 / self.window_s).round() as u64
    }

    /// How it was measured, for the report.
    pub fn describe(&self) -> String {
        format!(
            "{}/s: {} TLS handshakes in {:.1} s (calibration before the pods: posgate-load's \
             rustls client with the pods' settings, {} in flight, against a pos-sim of {} \
             terminals; {} failed; the machine meanwhile: {})",
            self.per_s(),
            self.handshakes,
            self.window_s,
            self.in_flight,
            self.terminals,
            self.failed,
            self.host.map_or("not read".into(), |h| h.describe())
        )
    }
}

/// Starts the calibration farm (`pos_sim`, files under `dir`), measures over `window`,
/// and stops it.
pub async fn handshake_rate(
    pos_sim: &Path,
    dir: &Path,
    window: Window,
) -> Result<HandshakeRate, LoadError> {
    let farm = SimFarm::start_at(pos_sim, TERMINALS, dir, NET).await?;
    let terminals = terminal_addrs(&farm.csv)?;
    let config = client_config(&farm.ca)?;
    let rate = measure(config, terminals, window).await;
    drop(farm);
    rate
}

/// One terminal of a farm's CSV.
#[derive(Debug, Clone)]
pub struct FarmTerminal {
    pub id: String,
    /// `ip:port` to dial.
    pub addr: String,
    /// The name its certificate is for (SNI).
    pub name: ServerName<'static>,
}

/// The terminals to dial.
pub type TerminalAddrs = Arc<Vec<FarmTerminal>>;

/// The terminals of a farm's CSV (`id,addr,server_name`).
pub fn terminal_addrs(csv: &Path) -> Result<TerminalAddrs, LoadError> {
    let text = std::fs::read_to_string(csv)
        .map_err(|e| LoadError::io(format!("reading {}", csv.display()), e))?;
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let mut fields = line.split(',');
        let (Some(id), Some(addr), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(LoadError::Plan(format!(
                "malformed line in {}: {line}",
                csv.display()
            )));
        };
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| LoadError::Plan(format!("server name {name}: {e}")))?;
        out.push(FarmTerminal {
            id: id.to_string(),
            addr: addr.to_string(),
            name,
        });
    }
    if out.is_empty() {
        return Err(LoadError::Plan(format!(
            "no terminals in {}",
            csv.display()
        )));
    }
    Ok(Arc::new(out))
}

/// The pods' client settings (`src/pos/tls.rs`): ring, the CA as the only root, ALPN
/// `h2`, no client certificate, rustls's defaults otherwise.
pub fn client_config(ca: &Path) -> Result<Arc<ClientConfig>, LoadError> {
    let plan = |e: String| LoadError::Plan(format!("calibration CA {}: {e}", ca.display()));
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| plan(e.to_string()))? {
        roots
            .add(cert.map_err(|e| plan(e.to_string()))?)
            .map_err(|e| plan(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| plan(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Runs `window.in_flight` dialers over `terminals` in turn and counts the handshakes
/// completed within the window's span after its warm-up. An error when none completed.
pub async fn measure(
    config: Arc<ClientConfig>,
    terminals: TerminalAddrs,
    window: Window,
) -> Result<HandshakeRate, LoadError> {
    let connector = TlsConnector::from(config);
    let next = Arc::new(AtomicU64::new(0));
    let (counted, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (start, host0) = (Instant::now(), CpuTimes::now());
    let (from, until) = (start + window.warm_up, start + window.warm_up + window.span);
    let mut dialers = JoinSet::new();
    for _ in 0..window.in_flight {
        let (connector, terminals) = (connector.clone(), terminals.clone());
        let (next, counted, failed) = (next.clone(), counted.clone(), failed.clone());
        dialers.spawn(async move {
            while Instant::now() < until {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize % terminals.len();
                let terminal = &terminals[i];
                let dial = async {
                    let tcp = TcpStream::connect(terminal.addr.as_str()).await?;
                    tcp.set_nodelay(true)?;
                    connector.connect(terminal.name.clone(), tcp).await
                };
                match tokio::time::timeout(HANDSHAKE_LIMIT, dial).await {
                    Ok(Ok(_tls)) => {
                        let done = Instant::now();
                        if done >= from && done < until {
                            counted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    while dialers.join_next().await.is_some() {}
    let host = host0
        .zip(CpuTimes::now())
        .and_then(|(a, b)| CpuShares::between(a, b));
    let rate = HandshakeRate {
        handshakes: counted.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        window_s: window.span.as_secs_f64(),
        in_flight: window.in_flight,
        terminals: terminals.len() as u64,
        host,
    };
    if rate.handshakes == 0 {
        return Err(LoadError::Plan(format!(
            "handshake calibration: no TLS handshake completed ({} failed)",
            rate.failed
        )));
    }
    Ok(rate)
}
