//! `posgate status` run as a binary against two pods with 100 simulated terminals: with
//! the operator token it draws every member, all 64 shards, every connected terminal and
//! nothing moving; a tenant's token is refused (403) and a missing one (401) with a hint,
//! exit 1; bad flags exit 2.

use std::process::Output;

use posgate_loadtest::load::pods::{OPERATOR_TOKEN, TOKEN};

use crate::support::binary::posgate;
use crate::support::farm;
use crate::support::gateway::Gateway;

/// `posgate status --url <url>` with `POSGATE_OPERATOR_TOKEN` set to `token`.
async fn status(url: &str, token: Option<&str>) -> Output {
    let (url, token) = (url.to_string(), token.map(str::to_string));
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = token
            .as_deref()
            .map(|t| ("POSGATE_OPERATOR_TOKEN", t))
            .into_iter()
            .collect();
        posgate(&["status", "--url", &url], &env)
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_draws_the_cluster_with_an_operator_token_only() {
    let test = "cli-status";
    let gw = Gateway::start(2, farm::config(100), test).await;
    let url = &gw.pods[1].url;

    let out = status(url, Some(OPERATOR_TOKEN)).await;
    let drawn = text(&out.stdout);
    assert!(out.status.success(), "{drawn}{}", text(&out.stderr));
    eprintln!("[{test}] posgate status:\n{drawn}");
    let via = format!(
        "posgate cluster, as {} sees it: store reachable\n",
        gw.pods[1].id
    );
    assert!(drawn.starts_with(&via), "{drawn}");
    assert!(drawn.contains("\nplacement version "), "{drawn}");
    for pod in &gw.pods {
        let row = drawn
            .lines()
            .find(|l| l.starts_with(pod.id.as_str()))
            .unwrap_or_else(|| panic!("no row for {}: {drawn}", pod.id));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1], cells[2], "held = assigned: {row}");
    }
    let total = drawn
        .lines()
        .find(|l| l.starts_with("2 members"))
        .expect(&drawn);
    assert_eq!(
        total.split_whitespace().collect::<Vec<_>>(),
        ["2", "members", "64", "64", "100"],
        "{drawn}"
    );
    for empty in ["moving (0): \n", "unowned (0): \n", "suspended (0): \n"] {
        assert!(drawn.contains(empty), "{drawn}");
    }

    let out = status(url, Some(TOKEN)).await;
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("answered 403 Forbidden (an operator token is needed"),
        "{said}"
    );
    let out = status(url, None).await;
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("answered 401 Unauthorized (set POSGATE_OPERATOR_TOKEN"),
        "{said}"
    );
    let out = posgate(&["status", "--url", "pod-0:8080"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
