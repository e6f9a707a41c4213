//! `posgate status`: the cluster in a terminal, for an operator without a browser (an
//! SSH session, a runbook step). One pod's `GET /v1/cluster?include=terminals`, read
//! with an operator token, drawn as text: the store as that pod sees it, the placement
//! version and when it last changed, the members, shards and connected terminals per
//! pod, and every shard that is moving, waiting for a move slot, unowned or suspended.
//! `--watch` draws again every interval.
//!
//! Not for: the flags (`posgate::config::status_args`) or the view itself
//! (`posgate::http`'s `/v1/cluster`, documented in `docs/openapi.yaml`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use posgate::config::status_args::{StatusArgs, StatusConfig};
use posgate::peer::tls::{h2_client_config, PeerConnector, PeerTls, PeerVerify};
use serde::Deserialize;

use crate::{or_usage, runtime};

/// The largest `/v1/cluster` answer read (4096 shards fit many times over).
const MAX_VIEW: usize = 4 << 20;

/// `posgate status [--watch]`: exit 0 when drawn, 1 when the pod could not be read
/// (without `--watch`), 2 for bad flags.
pub fn main(args: StatusArgs) -> ExitCode {
    run(args).unwrap_or_else(|code| code)
}

fn run(args: StatusArgs) -> Result<ExitCode, ExitCode> {
    let settings = or_usage(args.resolve())?;
    // `{:#}`: the error with its causes, on one line.
    let client = or_usage(client(&settings).map_err(|err| format!("{err:#}")))?;
    let runtime = runtime()?;
    Ok(runtime.block_on(async {
        let Some(every) = settings.watch else {
            return match fetch(&client, &settings).await {
                Ok(view) => {
                    print!("{}", render(&view, &settings));
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("error: {err:#}");
                    ExitCode::FAILURE
                }
            };
        };
        loop {
            let drawn = match fetch(&client, &settings).await {
                Ok(view) => render(&view, &settings),
                Err(err) => format!("error: {err:#}\n"),
            };
            // Clear the screen, then draw from its top.
            print!("\x1b[2J\x1b[H{drawn}\nevery {every:?}; Ctrl-C to stop\n");
            tokio::time::sleep(every).await;
        }
    }))
}

type Http = Client<PeerConnector, Empty<Bytes>>;

/// An HTTP/2 client (as pods talk to each other: cleartext with prior knowledge, or TLS
/// with ALPN `h2`), verifying an `https://` pod against `--ca-file` or the system roots.
fn client(settings: &StatusConfig) -> anyhow::Result<Http> {
    // No CA read here (`ca_file: None`): only the name to verify.
    let tls = PeerTls::new(&PeerVerify {
        ca_file: None,
        name: settings.tls_name.clone(),
    })?;
    if settings.cluster_url.scheme_str() == Some("https") {
        tls.set(h2_client_config("--ca-file", settings.ca_file.as_deref())?);
    }
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(settings.timeout));
    Ok(Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(PeerConnector::new(http, tls)))
}

/// `/v1/cluster` as `posgate status` reads it (`docs/openapi.yaml`, `ClusterView`).
#[derive(Debug, Deserialize)]
struct ClusterView {
    pod: Option<String>,
    store: StoreView,
    /// Absent from pods of releases before it.
    #[serde(default)]
    placement: Option<PlacementView>,
    members: Vec<MemberView>,
    shards: Vec<ShardView>,
    /// Absent from pods of releases before broadcasts.
    #[serde(default)]
    broadcasts: Vec<BroadcastView>,
}

/// A running broadcast as `/v1/cluster` lists it (the fields shown).
#[derive(Debug, Deserialize)]
struct BroadcastView {
    id: String,
    tenant: String,
    selector: String,
    state: String,
    expires_ms: u64,
    counts: BroadcastCounts,
    shards_walked: usize,
    shards: usize,
}

#[derive(Debug, Deserialize)]
struct BroadcastCounts {
    matched: u64,
    delivered: u64,
    failed: u64,
    queued: u64,
    remaining: u64,
}

#[derive(Debug, Deserialize)]
struct StoreView {
    verdict: String,
    unreachable_ms: Option<u64>,
    recovery_hold_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct PlacementView {
    version: u64,
    changed_ms_ago: u64,
}

#[derive(Debug, Deserialize)]
struct MemberView {
    pod: String,
}

#[derive(Debug, Deserialize)]
struct ShardView {
    shard: u32,
    assigned: Option<String>,
    owner: Option<String>,
    suspended: bool,
    /// Absent in views of earlier releases.
    #[serde(default)]
    next_owner: Option<String>,
    terminals_connected: Option<u64>,
}

/// One request for the view; a refusal says what the pod answered.
async fn fetch(client: &Http, settings: &StatusConfig) -> anyhow::Result<ClusterView> {
    let url = &settings.cluster_url;
    let mut request = Request::get(url.clone());
    if let Some(token) = &settings.token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Empty::new()).context("building the request")?;
    let exchange = async {
        let response = client.request(request).await?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_VIEW)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
            .to_bytes();
        anyhow::Ok((status, body))
    };
    let (status, body) = tokio::time::timeout(settings.timeout, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("{url}: no answer within {:?}", settings.timeout))?
        .with_context(|| format!("{url}: request failed"))?;
    if !status.is_success() {
        let said = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        let hint = match status.as_u16() {
            401 => " (set POSGATE_OPERATOR_TOKEN or --token-file)",
            403 => " (an operator token is needed: a tenant's token cannot see the cluster)",
            _ => "",
        };
        bail!("{url} answered {status}{hint}: {}", said.trim());
    }
    serde_json::from_slice(&body).with_context(|| format!("{url}: not a cluster view"))
}

/// Per pod: shards assigned, shards held, terminals connected (and whether some count
/// was unknown).
#[derive(Default)]
struct PodRow {
    member: bool,
    assigned: usize,
    owned: usize,
    terminals: u64,
    unknown: bool,
}

/// The view as text; `settings` for where it came from.
fn render(view: &ClusterView, settings: &StatusConfig) -> String {
    let mut out = String::new();
    let via = view.pod.as_deref().unwrap_or("a pod not yet named");
    let _ = write!(
        out,
        "posgate cluster, as {via} sees it: store {}",
        view.store.verdict
    );
    if let Some(ms) = view.store.unreachable_ms {
        let _ = write!(out, " (unreachable for {})", seconds(ms));
    }
    if let Some(ms) = view.store.recovery_hold_ms {
        let _ = write!(out, "; recovery hold, {} left", seconds(ms));
    }
    out.push('\n');
    match &view.placement {
        Some(p) => {
            let _ = writeln!(
                out,
                "placement version {}, changed {} ago",
                p.version,
                seconds(p.changed_ms_ago)
            );
        }
        None => out.push_str("no placement yet\n"),
    }
    let _ = writeln!(out, "source {}\n", settings.cluster_url);

    let mut pods: BTreeMap<&str, PodRow> = BTreeMap::new();
    for m in &view.members {
        pods.entry(&m.pod).or_default().member = true;
    }
    let (mut moving, mut waiting, mut unowned, mut suspended) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in &view.shards {
        if let Some(pod) = &s.assigned {
            pods.entry(pod).or_default().assigned += 1;
        }
        if let Some(pod) = &s.owner {
            let row = pods.entry(pod).or_default();
            row.owned += 1;
            match s.terminals_connected {
                Some(n) => row.terminals += n,
                None => row.unknown = true,
            }
        }
        let name = |p: &Option<String>| p.clone().unwrap_or_else(|| "nobody".into());
        if s.owner != s.assigned {
            moving.push(format!(
                "{} {} -> {}",
                s.shard,
                name(&s.owner),
                name(&s.assigned)
            ));
        }
        if let Some(next) = &s.next_owner {
            waiting.push(format!("{} {} -> {next}", s.shard, name(&s.assigned)));
        }
        if s.owner.is_none() {
            unowned.push(s.shard.to_string());
        }
        if s.suspended {
            suspended.push(s.shard.to_string());
        }
    }
    let _ = writeln!(
        out,
        "{:<24} {:>6} {:>8} {:>10}",
        "POD", "SHARDS", "ASSIGNED", "TERMINALS"
    );
    let mut total = PodRow::default();
    for (pod, row) in &pods {
        let terminals = format!("{}{}", row.terminals, if row.unknown { "+?" } else { "" });
        let note = if row.member { "" } else { "  (not a member)" };
        let _ = writeln!(
            out,
            "{pod:<24} {:>6} {:>8} {terminals:>10}{note}",
            row.owned, row.assigned
        );
        total.owned += row.owned;
        total.assigned += row.assigned;
        total.terminals += row.terminals;
        total.unknown |= row.unknown;
    }
    let terminals = format!(
        "{}{}",
        total.terminals,
        if total.unknown { "+?" } else { "" }
    );
    let _ = writeln!(
        out,
        "{:<24} {:>6} {:>8} {terminals:>10}\n",
        format!("{} members", view.members.len()),
        total.owned,
        total.assigned
    );
    for (what, list) in [
        ("moving", &moving),
        ("waiting for a move slot", &waiting),
        ("unowned", &unowned),
        ("suspended", &suspended),
    ] {
        let _ = writeln!(out, "{what} ({}): {}", list.len(), list.join(", "));
    }
    if total.unknown {
        out.push_str("+?: a pod did not report its terminal counts in time\n");
    }
    let _ = writeln!(out, "\nbroadcasts running ({}):", view.broadcasts.len());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for b in &view.broadcasts {
        let c = &b.counts;
        let _ = writeln!(
            out,
            "  {} {} [{}] {}: {}/{} delivered, {} failed, {} remaining ({} queued), \
             {}/{} shards walked, expires in {}",
            b.id,
            b.tenant,
            b.selector,
            b.state,
            c.delivered,
            c.matched,
            c.failed,
            c.remaining,
            c.queued,
            b.shards_walked,
            b.shards,
            seconds(b.expires_ms.saturating_sub(now_ms))
        );
    }
    out
}

/// `1234` ms as `1.2 s`.
fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_mid_move_names_what_moves() {
        let json = r#"{"pod":"pod-a","store":{"verdict":"reachable","unreachable_ms":null,
            "recovery_hold_ms":null},"placement":{"version":4,"changed_ms_ago":1500},
            "members":[{"pod":"pod-a","url":"u"},{"pod":"pod-b","url":"u"}],
            "shards":[
             {"shard":0,"assigned":"pod-a","owner":"pod-a","epoch":1,"serving":true,"suspended":false,"next_owner":"pod-b","terminals_connected":5},
             {"shard":1,"assigned":"pod-b","owner":"pod-a","epoch":1,"serving":true,"suspended":false,"terminals_connected":3},
             {"shard":2,"assigned":"pod-b","owner":null,"epoch":null,"serving":false,"suspended":false,"terminals_connected":null},
             {"shard":3,"assigned":"pod-b","owner":"pod-c","epoch":2,"serving":false,"suspended":true,"terminals_connected":null}],
            "broadcasts":[{"id":"0a1b","tenant":"acme","selector":"store=17","state":"running",
             "expires_ms":1,"shards_walked":3,"shards":4,"counts":{"matched":40,"delivered":31,
             "failed":1,"queued":6,"remaining":8}}]}"#;
        let view: ClusterView = serde_json::from_str(json).unwrap();
        let settings = StatusArgs {
            url: "http://pod-a:8080".into(),
            token_file: None,
            ca_file: None,
            tls_name: None,
            watch: false,
            interval: std::time::Duration::from_secs(2),
            timeout: std::time::Duration::from_secs(5),
        }
        .resolve_with(|_| None)
        .unwrap();
        let text = render(&view, &settings);
        assert!(
            text.starts_with("posgate cluster, as pod-a sees it: store reachable\n"),
            "{text}"
        );
        assert!(
            text.contains("placement version 4, changed 1.5 s ago\n"),
            "{text}"
        );
        assert!(
            text.contains("\npod-a                         2        1          8\n"),
            "{text}"
        );
        assert!(
            text.contains("\npod-b                         0        3          0\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\npod-c                         1        0        0+?  (not a member)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("\nmoving (3): 1 pod-a -> pod-b, 2 nobody -> pod-b, 3 pod-c -> pod-b\n"),
            "{text}"
        );
        assert!(
            text.contains("\nwaiting for a move slot (1): 0 pod-a -> pod-b\n"),
            "{text}"
        );
        assert!(text.contains("\nunowned (1): 2\n"), "{text}");
        assert!(text.contains("\nsuspended (1): 3\n"), "{text}");
        assert!(
            text.contains(
                "\nbroadcasts running (1):\n  0a1b acme [store=17] running: 31/40 delivered, \
                 1 failed, 8 remaining (6 queued), 3/4 shards walked, expires in 0.0 s\n"
            ),
            "{text}"
        );
    }
}
