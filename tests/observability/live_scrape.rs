//! A live pod serves every metric the dashboard and the rules use, in a scrape promtool
//! accepts, classic or OpenMetrics as the `Accept` header asks.

use super::*;

/// Metric families in a classic-format scrape, by their `# TYPE` lines (counters named
/// with `_total`, like their series and docs/metrics.md).
fn scraped_families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').expect("`# TYPE name kind`").0.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_scrape_has_every_metric_the_dashboard_and_rules_use() {
    let redis = RedisServer::start();
    let (listener, base) = pod::listen().await;
    let config = pod::config("obs-pod-0", &base);
    let mut pod = pod::start_with_terminals(config, &redis.url(), listener);

    let http = api::client();
    let scrape = || api::metrics(&http, &base);
    // Wait until the pod is a member and serves every shard (the sampler runs every
    // 500 ms), so the per-shard and state series are there too.
    let started = Instant::now();
    let text = loop {
        let text = scrape().await;
        if text.contains("posgate_members 1\n") && text.contains("posgate_shards_served 64\n") {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "pod did not serve all shards within 30 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "[observability] pod serves 64 shards after {:.2} s; scrape: {} bytes",
        started.elapsed().as_secs_f64(),
        text.len()
    );

    let documented = documented();
    let scraped = scraped_families(&text);
    let missing: Vec<_> = used_by_artefacts(&documented)
        .into_iter()
        .filter(|(_, f)| !scraped.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "used by dashboard/rules but not in a live /metrics scrape: {missing:?}\n{text}"
    );
    // The series the rules aggregate over exist with the labels the rules expect.
    for series in [
        "posgate_shard_served{shard=\"0\"} 1",
        "posgate_shard_served{shard=\"63\"} 1",
        "posgate_terminals{state=\"connected\"}",
        "posgate_lease_ops_total{op=\"renew\",outcome=\"held_by_other\"}",
        "posgate_lease_ops_total{op=\"renew\",outcome=\"missing\"}",
        "posgate_store_errors_total{op=\"renew\"}",
        "posgate_store_reachable 1",
        "posgate_store_verdict{verdict=\"reachable\"} 1",
        "posgate_store_verdict{verdict=\"cluster_wide\"} 0",
        "posgate_store_unreachable_seconds 0",
        "posgate_shards_suspended{delivery=\"delivering\"} 0",
        "posgate_shards_suspended{delivery=\"parked\"} 0",
        "posgate_pushes_on_suspended_shards_total 0",
        "posgate_push_requests_total{path=\"local\",result=\"ok\"}",
    ] {
        assert!(
            text.contains(series),
            "{series} missing from /metrics:\n{text}"
        );
    }
    assert!(
        text.lines().any(
            |l| l.starts_with("posgate_store_op_duration_seconds_bucket{")
                && l.contains("op=\"renew\"")
                && l.contains("le=")
        ),
        "no renew latency buckets in /metrics:\n{text}"
    );

    check_metrics_with_promtool(&text);
    check_content_negotiation(&http, &base).await;

    pod.shutdown();
    tokio::time::timeout(Duration::from_secs(10), pod.wait())
        .await
        .expect("pod stops within 10 s")
        .expect("pod stops cleanly");
}

/// `promtool check metrics` on a scrape in the classic text format (what `/metrics`
/// answers a client that does not ask for OpenMetrics): clean, no exception.
fn check_metrics_with_promtool(classic: &str) {
    let unchecked = "the scrape not checked";
    let Some(out) = promtool(&["check", "metrics"], Some(classic.as_bytes()), unchecked) else {
        return;
    };
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics (classic text format): {}",
        describe(&out)
    );
    eprintln!("[observability] promtool check metrics on the classic scrape: clean");
}

/// What Prometheus 2.x sends as `Accept` on a scrape.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// The same pod scraped as Prometheus does and as curl does: OpenMetrics (counter
/// families without `_total`, `# EOF` last) and the classic format (counters named like
/// their samples, no `# EOF`), with the same sample lines.
async fn check_content_negotiation(http: &api::Http, base: &str) {
    let (om_type, om) = api::metrics_as(http, base, Some(PROMETHEUS_ACCEPT)).await;
    let (classic_type, classic) = api::metrics_as(http, base, Some("text/plain")).await;
    assert!(
        om_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{om_type}"
    );
    assert!(
        classic_type.starts_with("text/plain; version=0.0.4"),
        "{classic_type}"
    );
    assert!(om.ends_with("# EOF\n") && !classic.contains("# EOF"));
    assert!(om.contains("# TYPE posgate_dials counter\n"), "{om}");
    assert!(
        classic.contains("# TYPE posgate_dials_total counter\n"),
        "{classic}"
    );
    // Samples equal, apart from the gauges that moved between the two scrapes.
    let samples = |text: &str| -> BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once(' ').map(|(series, _)| series.to_string()))
            .collect()
    };
    assert_eq!(samples(&om), samples(&classic));
    eprintln!(
        "[observability] /metrics: OpenMetrics for Prometheus' Accept, classic for text/plain"
    );
}
