//! `posgate serve` processes: one per pod, each reaching Redis through its own
//! [`RedisProxy`], with the pod's HTTP endpoints (`/readyz`, `/v1/cluster`, `/metrics`).
//! A pod runs the binary under test or, for `rolling-upgrade`, the previous release's.

use std::{
    ffi::OsString,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;
use tokio::process::Command;

use super::{
    http::{self, HttpClient},
    procs::{free_port, ChildProc, Signal},
    proxy::RedisProxy,
    LoadError,
};

/// Cluster name in Redis (key prefix).
pub const CLUSTER: &str = "load";
/// Tenant and bearer token the harness pushes with.
pub const TENANT: &str = "load";
pub const TOKEN: &str = "load-harness-token-0123456789";
/// The operator token the harness reads `/v1/cluster` with (a tenant's token may not).
pub const OPERATOR_TOKEN: &str = "load-harness-operator-0123456789";
/// `POSGATE_API_TOKENS` of the pods: the harness's tenant and operator tokens.
pub fn api_tokens() -> String {
    format!("{TENANT}:{TOKEN},operator:{OPERATOR_TOKEN}")
}
const SECRET: &str = "load-harness-cluster-secret-0123456789";

/// Which build a pod runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Release {
    /// The binary under test (`--posgate`).
    Current,
    /// The previous release (`--old-posgate`), for `rolling-upgrade`.
    Previous,
}

impl Release {
    pub fn name(self) -> &'static str {
        match self {
            Release::Current => "new",
            Release::Previous => "old",
        }
    }
}

/// How every pod of a run is started.
#[derive(Debug, Clone)]
pub struct PodPlan {
    pub posgate: PathBuf,
    /// The previous release's binary, if the run was given one.
    pub previous: Option<PathBuf>,
    pub pos_ca: PathBuf,
    /// Extra `serve` flags (timings, dial rate).
    pub flags: Vec<String>,
    /// Extra environment variables of every pod.
    pub env: Vec<(String, String)>,
    pub log_dir: PathBuf,
}

impl PodPlan {
    /// The binary pods of `release` run.
    pub fn binary(&self, release: Release) -> Result<&Path, LoadError> {
        match release {
            Release::Current => Ok(&self.posgate),
            Release::Previous => self.previous.as_deref().ok_or_else(|| {
                LoadError::Plan("a pod of the previous release needs --old-posgate PATH".into())
            }),
        }
    }

    /// The arguments of `posgate serve` for pod `id` (every flag the harness passes).
    pub fn serve_args(&self, id: &str, port: u16, redis_url: &str) -> Vec<OsString> {
        let url = format!("http://127.0.0.1:{port}");
        let mut args: Vec<OsString> = [
            "serve",
            "--pod-id",
            id,
            "--cluster",
            CLUSTER,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--advertise-url",
            &url,
            "--redis-url",
            redis_url,
        ]
        .iter()
        .map(OsString::from)
        .collect();
        args.push("--pos-ca".into());
        args.push(self.pos_ca.clone().into());
        for a in ["--log-format", "json", "--log-level", "info"] {
            args.push(a.into());
        }
        args.extend(self.flags.iter().map(OsString::from));
        args
    }
}

/// One member of `/v1/cluster`.
#[derive(Debug, Clone, Deserialize)]
pub struct MemberView {
    pub pod: String,
}

/// One shard of `/v1/cluster`.
#[derive(Debug, Clone, Deserialize)]
pub struct ShardView {
    pub shard: u32,
    #[serde(default)]
    pub assigned: Option<String>,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub epoch: Option<u64>,
    #[serde(default)]
    pub serving: bool,
    #[serde(default)]
    pub suspended: bool,
    /// Connected sessions of this shard as the answering pod counts them (only for shards
    /// it holds connections of; `null` otherwise).
    #[serde(default)]
    pub terminals_connected: Option<u64>,
}

/// The store as a pod sees it, in `/v1/cluster`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StoreView {
    #[serde(default)]
    pub verdict: String,
    /// How much longer the pod changes no ownership (a recovery hold); absent in pods of
    /// releases before it.
    #[serde(default)]
    pub recovery_hold_ms: Option<u64>,
}

/// `GET /v1/cluster`.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterView {
    pub pod: String,
    #[serde(default)]
    pub store: StoreView,
    pub members: Vec<MemberView>,
    pub shards: Vec<ShardView>,
}

/// Where a pod reaches the store.
#[derive(Debug, Clone)]
pub enum PodStore {
    /// The harness's Redis, through a cuttable proxy of the pod's own.
    Proxied(SocketAddr),
    /// A URL every pod uses as it is (the sentinels of `redis-failover`).
    At(String),
}

/// A running pod.
pub struct PodProc {
    pub id: String,
    pub url: String,
    pub release: Release,
    /// Between the pod and Redis (not for pods of [`PodStore::At`]).
    proxy: Option<RedisProxy>,
    pub proc: ChildProc,
    /// Whether `/readyz` answered 200 once (then pushes may go to it).
    pub ready: bool,
    /// Set while the harness has the pod stopped (SIGSTOP) or is taking it down.
    pub faulted: bool,
}

impl PodProc {
    /// Starts pod `pod-<index>` of `release` against `store` (through a new proxy for a
    /// proxied one).
    pub async fn start(
        plan: &PodPlan,
        release: Release,
        index: usize,
        store: &PodStore,
    ) -> Result<Self, LoadError> {
        let binary = plan.binary(release)?;
        let (proxy, store_url) = match store {
            PodStore::Proxied(redis) => {
                let proxy = RedisProxy::start(*redis).await?;
                let url = proxy.url();
                (Some(proxy), url)
            }
            PodStore::At(url) => (None, url.clone()),
        };
        let port = free_port()?;
        let id = format!("pod-{index}");
        let url = format!("http://127.0.0.1:{port}");
        let mut cmd = Command::new(binary);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("POSGATE_CLUSTER_SECRET", SECRET)
            .env("POSGATE_API_TOKENS", api_tokens())
            // Read by releases with broadcasts (the `broadcast` scenario), ignored before.
            .env("POSGATE_BROADCAST_TENANTS", TENANT)
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .args(plan.serve_args(&id, port, &store_url));
        let proc = ChildProc::spawn(&id, cmd, &plan.log_dir.join(format!("{id}.log")))?;
        Ok(PodProc {
            id,
            url,
            release,
            proxy,
            proc,
            ready: false,
            faulted: false,
        })
    }

    /// The proxy between this pod and Redis: the scenarios that cut pods off run only
    /// with proxied pods.
    pub fn proxy(&self) -> &RedisProxy {
        self.proxy
            .as_ref()
            .expect("a pod behind a proxy (not a redis-failover run)")
    }

    /// Whether `/readyz` answers 200.
    pub async fn ready(&self, client: &HttpClient) -> bool {
        let url = format!("{}/readyz", self.url);
        http::get_status(client, &url, Duration::from_secs(1)).await == Some(200)
    }

    /// This pod's `/v1/cluster`.
    pub async fn cluster(&self, client: &HttpClient) -> Result<ClusterView, LoadError> {
        let url = format!("{}/v1/cluster", self.url);
        http::get_json(client, &url, Some(OPERATOR_TOKEN), Duration::from_secs(1)).await
    }

    pub async fn signal(&self, sig: Signal) -> Result<(), LoadError> {
        self.proc.signal(sig).await
    }

    /// This pod's `/metrics` (the classic text format: no `Accept` is sent).
    pub async fn metrics(&self, client: &HttpClient) -> Result<String, LoadError> {
        let url = format!("{}/metrics", self.url);
        http::get_text(client, &url, Duration::from_secs(1)).await
    }
}

/// Runs `posgate terminals import` of `csv` into Redis at `redis`.
pub async fn import_directory(
    posgate: &Path,
    csv: &Path,
    redis: SocketAddr,
) -> Result<(), LoadError> {
    let csv = csv.as_os_str().to_owned();
    operator_command(posgate, &["terminals".into(), "import".into(), csv], redis).await
}

/// Runs `posgate init` against Redis at `redis` for pods of `member_ttl`: returns once
/// the store generation is that old, so pods started afterwards claim at once.
pub async fn init_store(
    posgate: &Path,
    redis: SocketAddr,
    member_ttl: Duration,
) -> Result<(), LoadError> {
    let ttl = format!("{}ms", member_ttl.as_millis());
    let args = ["init".into(), "--member-ttl".into(), ttl.into()];
    operator_command(posgate, &args, redis).await
}

/// Runs the operator command `posgate <args>` against this harness's cluster in Redis
/// at `redis`; an exit other than 0 is an error with its stderr.
async fn operator_command(
    posgate: &Path,
    args: &[OsString],
    redis: SocketAddr,
) -> Result<(), LoadError> {
    let what = format!("posgate {}", args[0].to_string_lossy());
    let out = Command::new(posgate)
        .args(args)
        .args([
            "--redis-url",
            &format!("redis://{redis}/"),
            "--cluster",
            CLUSTER,
        ])
        .output()
        .await
        .map_err(|source| LoadError::Spawn {
            what: what.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LoadError::Exited {
            what,
            status: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}
