//! A private Prometheus (Debian's `prometheus`, found on `PATH`) for one run: it scrapes
//! every pod's `/metrics` every second, evaluates the rules every second (the scaled copy
//! of `k8s/observability/alerts.yaml` that [`super::rules`] writes) and answers
//! `/api/v1/query` and `/api/v1/query_range` for the alert timeline ([`super::alerts`]) and
//! the dashboard check ([`super::panels`]).
//!
//! Targets come from a `file_sd_configs` file that [`Prometheus::set_targets`] rewrites
//! whenever the cluster's pods change (Prometheus watches the file), each with a `pod`
//! label as the Kubernetes scrape gives it. Like the pods and Redis it is a child process
//! killed when dropped; its TSDB lives in the results directory, kept for a look after
//! the run and wiped at the next start.
//!
//! Not for: deciding what an alert means for a scenario (that is [`super::alerts`]).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use ::http::Method;
use bytes::Bytes;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::Deserialize;
use tokio::process::Command;

use super::{
    http::{self, HttpClient},
    procs::{free_port, ChildProc},
    rules::{self, Rule, ALERTS_YAML},
    LoadError,
};

/// Scrape and rule evaluation interval: the rules' `for` (scaled down to seconds in the
/// quick profile) needs several evaluations, and a 1-s step keeps the timeline's times
/// accurate to a second.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// How a run without Prometheus is told to get it.
pub const INSTALL: &str = "Debian/Ubuntu: apt-get install prometheus; scripts/test installs it";

/// The running Prometheus.
pub struct Prometheus {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The loaded rules' `for` and range windows are the project's divided by this.
    pub rules_scale: u32,
    /// The loaded rules (scaled).
    pub rules: Vec<Rule>,
    targets: PathBuf,
    _proc: ChildProc,
}

/// Whether this run is CI: `CI` is `true` (any case) or `1` (the policy of
/// tests/support/tools.rs: under CI a missing tool fails instead of skipping).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The run's Prometheus with the project's rules scaled by `scale`, in `dir`; `None`
/// (said on stderr) when `prometheus` is not installed, an error instead under CI.
pub async fn for_run(
    scale: u32,
    dir: &Path,
    log_dir: &Path,
) -> Result<Option<Prometheus>, LoadError> {
    let Some(binary) = find() else {
        let unchecked = "the alert timeline, the expected-alert gates and the dashboard check";
        if in_ci() {
            return Err(LoadError::Plan(format!(
                "prometheus is not on PATH, and CI=true does not allow skipping {unchecked} \
                 ({INSTALL})"
            )));
        }
        eprintln!("prometheus is not on PATH: skipped: {unchecked} ({INSTALL})");
        return Ok(None);
    };
    Prometheus::start(&binary, dir, log_dir, scale)
        .await
        .map(Some)
}

/// `prometheus` on `PATH`, if any.
pub fn find() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
}

/// The configuration: one job, targets from `targets`, rules from `rules`.
fn config(targets: &Path, rules: &Path) -> String {
    let s = INTERVAL.as_secs();
    format!(
        "global:\n  scrape_interval: {s}s\n  scrape_timeout: {s}s\n  evaluation_interval: {s}s\n\
         rule_files:\n  - {rules:?}\n\
         scrape_configs:\n  - job_name: posgate\n    file_sd_configs:\n      - files: [{targets:?}]\n        refresh_interval: {s}s\n"
    )
}

/// The `file_sd_configs` document for `pods` (`(pod id, base URL)`).
pub fn targets_json(pods: &[(String, String)]) -> String {
    let groups: Vec<serde_json::Value> = pods
        .iter()
        .map(|(id, url)| {
            let host = url.trim_start_matches("http://");
            serde_json::json!({"targets": [host], "labels": {"pod": id}})
        })
        .collect();
    serde_json::Value::Array(groups).to_string()
}

impl Prometheus {
    /// Starts `binary` with its data, configuration and the project's rules scaled by
    /// `scale` ([`rules::scaled`]) in `dir` (wiped first) and waits until it is ready.
    pub async fn start(
        binary: &Path,
        dir: &Path,
        log_dir: &Path,
        scale: u32,
    ) -> Result<Self, LoadError> {
        let rules_yaml = rules::scaled(ALERTS_YAML, scale);
        let _ = std::fs::remove_dir_all(dir);
        let io = |what: &str, e| LoadError::io(format!("{what} in {}", dir.display()), e);
        std::fs::create_dir_all(dir.join("data")).map_err(|e| io("creating", e))?;
        // Absolute: Prometheus reads the paths in its config relative to the config's own
        // directory, so a relative `--results` named files that did not exist.
        let dir = &dir.canonicalize().map_err(|e| io("resolving", e))?;
        let (rules, targets, conf) = (
            dir.join("alerts.yaml"),
            dir.join("targets.json"),
            dir.join("prometheus.yml"),
        );
        std::fs::write(&rules, &rules_yaml).map_err(|e| io("writing alerts.yaml", e))?;
        std::fs::write(&targets, "[]").map_err(|e| io("writing targets.json", e))?;
        std::fs::write(&conf, config(&targets, &rules))
            .map_err(|e| io("writing prometheus.yml", e))?;
        let port = free_port()?;
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg("--storage.tsdb.retention.time=1d")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn");
        let mut proc = ChildProc::spawn("prometheus", cmd, &log_dir.join("prometheus.log"))?;
        let url = format!("http://127.0.0.1:{port}");
        let client = http::client();
        let limit = Duration::from_secs(30);
        let started = Instant::now();
        while http::get_status(&client, &format!("{url}/-/ready"), INTERVAL).await != Some(200) {
            if let Some(status) = proc.try_exited() {
                return Err(LoadError::Exited {
                    what: "prometheus (see logs/prometheus.log)".into(),
                    status: status.to_string(),
                });
            }
            if started.elapsed() > limit {
                return Err(LoadError::Timeout {
                    what: "prometheus ready".into(),
                    limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Prometheus {
            url,
            rules_scale: scale,
            rules: rules::rules(&rules_yaml),
            targets,
            _proc: proc,
        })
    }

    /// The longest `for` of the loaded rules.
    pub fn longest_for(&self) -> Duration {
        self.rules.iter().map(|r| r.for_).max().unwrap_or_default()
    }

    /// Makes `pods` (`(pod id, base URL)`) the scrape targets. Written to a temporary
    /// file and renamed, so Prometheus never reads half a file.
    pub fn set_targets(&self, pods: &[(String, String)]) -> Result<(), LoadError> {
        let tmp = self.targets.with_extension("json.tmp");
        std::fs::write(&tmp, targets_json(pods))
            .and_then(|()| std::fs::rename(&tmp, &self.targets))
            .map_err(|e| LoadError::io(format!("writing {}", self.targets.display()), e))
    }

    /// `query` evaluated at every `step` from `from_ms` to `to_ms` (unix ms). A query
    /// Prometheus refuses is an `Err` with its message.
    pub async fn query_range(
        &self,
        client: &HttpClient,
        query: &str,
        from_ms: u64,
        to_ms: u64,
        step: Duration,
    ) -> Result<Vec<Series>, LoadError> {
        let args = format!(
            "query={}&start={:.3}&end={:.3}&step={}",
            utf8_percent_encode(query, NON_ALPHANUMERIC),
            from_ms as f64 / 1000.0,
            to_ms as f64 / 1000.0,
            step.as_secs_f64()
        );
        self.api(client, "query_range", &args).await
    }

    /// `query` evaluated now.
    pub async fn query(&self, client: &HttpClient, query: &str) -> Result<Vec<Series>, LoadError> {
        let args = format!("query={}", utf8_percent_encode(query, NON_ALPHANUMERIC));
        self.api(client, "query", &args).await
    }

    async fn api(
        &self,
        client: &HttpClient,
        endpoint: &str,
        args: &str,
    ) -> Result<Vec<Series>, LoadError> {
        let url = format!("{}/api/v1/{endpoint}?{args}", self.url);
        let err = |message: String| LoadError::Http {
            url: format!("{}/api/v1/{endpoint}", self.url),
            message,
        };
        let limit = Duration::from_secs(10);
        let answer = http::exchange(client, Method::GET, &url, &[], Bytes::new(), limit)
            .await
            .map_err(|e| err(e.to_string()))?;
        // Errors come with a JSON body too (400 for a query that does not parse).
        let body: Answer = serde_json::from_slice(&answer.body)
            .map_err(|e| err(format!("status {}: {e}", answer.status)))?;
        match (body.status.as_str(), body.data) {
            ("success", Some(d)) => Ok(d.result),
            _ => Err(err(body.error.unwrap_or_else(|| body.status.clone()))),
        }
    }
}

/// One series of a query answer: its labels and, from a range query, its samples
/// `(unix s, value)` (an instant query's single `value` is not read: only whether there
/// are series at all).
#[derive(Debug, Clone, Deserialize)]
pub struct Series {
    pub metric: BTreeMap<String, String>,
    #[serde(default)]
    pub values: Vec<(f64, String)>,
}

#[derive(Debug, Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Data {
    result: Vec<Series>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_carry_the_pod_label_and_a_bare_host() {
        let pods = [("pod-0".to_owned(), "http://127.0.0.1:4000".to_owned())];
        let v: serde_json::Value = serde_json::from_str(&targets_json(&pods)).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"targets": ["127.0.0.1:4000"], "labels": {"pod": "pod-0"}}])
        );
        assert_eq!(targets_json(&[]), "[]");
    }

    #[test]
    fn config_scrapes_and_evaluates_every_second() {
        let c = config(Path::new("/r/targets.json"), Path::new("/r/alerts.yaml"));
        assert!(c.contains("scrape_interval: 1s\n"), "{c}");
        assert!(c.contains("evaluation_interval: 1s\n"), "{c}");
        assert!(c.contains("  - \"/r/alerts.yaml\"\n"), "{c}");
        assert!(c.contains("files: [\"/r/targets.json\"]"), "{c}");
    }
}
