//! The directory API on three `posgate serve` processes over a real `redis-server`,
//! with `pos-sim`'s terminals: a terminal removed through the API is closed, added
//! back it is dialed, without a restart; labels set through it are in the export; a
//! bad import changes nothing and names its lines; only a directory token may change
//! the directory; each change is one audit line of the pod that made it.

use std::time::Duration;

use serde_json::Value;

use crate::cli_terminals::ok;
use crate::support::binary::{
    request, terminal_pod, BinPod, API_TOKEN, DIRECTORY_TOKEN, OPERATOR_TOKEN,
};
use crate::support::farm::{self, connect_limit, Farm};
use crate::support::pod::CLUSTER;
use crate::support::wait::wait_for;
use crate::support::RedisServer;

/// `method path` with `token` and a JSON or CSV `body` to the pod on `port`.
async fn call(port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    let head = format!("{method} {path} HTTP/1.1\r\nAuthorization: Bearer {token}\r\n");
    let (status, body) = request(port, &head, body, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("{method} {path}: no answer"));
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// `posgate terminals <args>` on the pods' cluster.
fn cli(redis: &RedisServer, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--cluster", CLUSTER]);
    ok(&redis.url(), &all)
}

fn count(redis: &RedisServer) -> u64 {
    cli(redis, &["count"]).trim().parse().unwrap()
}

fn audit_lines(pod: &BinPod, action: &str) -> Vec<String> {
    pod.log_lines_with(&["posgate::audit", &format!("\"action\":\"{action}\"")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminals_come_and_go_through_the_api_without_a_restart() {
    let redis = RedisServer::start();
    let farm = Farm::with_directory(&redis, farm::config(50)).await;
    let pods: Vec<BinPod> = (0..3)
        .map(|i| {
            let id = format!("dir-pod-{i}");
            terminal_pod(&id, &redis.url(), &farm.ca_file, farm.dir.path(), &[])
        })
        .collect();
    let farm = &farm;
    let connected = |n| move || farm.counters().terminals_connected == n;
    wait_for("every terminal connected", connect_limit(), connected(50)).await;
    let victim = &farm.ids[7];
    let entry = farm
        .entries()
        .into_iter()
        .find(|t| &t.id == victim)
        .unwrap();
    let path = format!("/v1/terminals/{victim}");

    // Removed: closed by its owner, whichever pod was asked.
    let (status, body) = call(pods[0].port, "DELETE", &path, DIRECTORY_TOKEN, "").await;
    assert_eq!(
        (status, &body["result"]),
        (200, &Value::from("removed")),
        "{body}"
    );
    wait_for(
        "the removed terminal closed",
        connect_limit(),
        connected(49),
    )
    .await;
    let (status, body) = call(pods[0].port, "DELETE", &path, DIRECTORY_TOKEN, "").await;
    assert_eq!(
        (status, &body["result"]),
        (200, &Value::from("absent")),
        "{body}"
    );

    // Added back through another pod, with labels: dialed.
    let put = serde_json::json!({
        "addr": entry.addr,
        "server_name": entry.server_name,
        "labels": {"store": "17", "region": "eu"},
    })
    .to_string();
    let (status, body) = call(pods[1].port, "PUT", &path, DIRECTORY_TOKEN, &put).await;
    assert_eq!(
        (status, &body["result"]),
        (201, &Value::from("added")),
        "{body}"
    );
    assert_eq!(body["terminal"]["labels"]["store"], "17", "{body}");
    wait_for("the added terminal dialed", connect_limit(), connected(50)).await;
    // The same again is unchanged; without labels, the stored ones stay.
    let (status, body) = call(pods[1].port, "PUT", &path, DIRECTORY_TOKEN, &put).await;
    assert_eq!(
        (status, &body["result"]),
        (200, &Value::from("unchanged")),
        "{body}"
    );
    let bare = serde_json::json!({"addr": entry.addr, "server_name": entry.server_name});
    let (status, _) = call(
        pods[2].port,
        "PUT",
        &path,
        DIRECTORY_TOKEN,
        &bare.to_string(),
    )
    .await;
    assert_eq!(status, 200);
    let exported = cli(&redis, &["export"]);
    assert!(
        exported.contains(",region=eu;store=17\n")
            && exported.starts_with("id,addr,server_name,labels\n"),
        "{exported}"
    );

    // Other tokens may not; bad entries are 400 and change nothing.
    for token in [API_TOKEN, OPERATOR_TOKEN] {
        let (status, body) = call(pods[0].port, "DELETE", &path, token, "").await;
        assert_eq!(
            (status, &body["error"]),
            (403, &Value::from("forbidden")),
            "{body}"
        );
        let (status, _) = call(
            pods[0].port,
            "POST",
            "/v1/terminals",
            token,
            "id,addr,server_name\n",
        )
        .await;
        assert_eq!(status, 403);
    }
    for bad in [
        r#"{"addr":"no-port"}"#,
        r#"{"addr":"h:1","labels":{"store":"a/b"}}"#,
        r#"{"addr":"h:1","other":1}"#,
        "not json",
    ] {
        let (status, body) = call(pods[0].port, "PUT", &path, DIRECTORY_TOKEN, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }

    // An import: a bad line names itself and nothing is written; a good one is safe to
    // run again.
    let before = count(&redis);
    let bad = "id,addr,server_name,labels\n\
               new-1,10.9.0.1:443,,store=1\n\
               new-2,no-port,,\n\
               new-3,10.9.0.3:443,,store\n";
    let (status, body) = call(pods[2].port, "POST", "/v1/terminals", DIRECTORY_TOKEN, bad).await;
    assert_eq!(status, 400, "{body}");
    let lines: Vec<u64> = body["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [3, 4], "{body}");
    assert_eq!(count(&redis), before, "a bad import wrote nothing");
    let good = "id,addr,server_name\nnew-1,10.9.0.1:443,\nnew-2,10.9.0.2:443,\n";
    let (status, body) = call(pods[2].port, "POST", "/v1/terminals", DIRECTORY_TOKEN, good).await;
    assert_eq!((status, &body["added"]), (200, &Value::from(2)), "{body}");
    let (status, body) = call(pods[2].port, "POST", "/v1/terminals", DIRECTORY_TOKEN, good).await;
    assert_eq!(
        (status, &body["unchanged"]),
        (200, &Value::from(2)),
        "{body}"
    );
    assert_eq!(count(&redis), before + 2);

    // One audit line per change, by the pod that made it, naming the token by its id.
    let token_id = posgate::credentials::ApiTokens::token_id(DIRECTORY_TOKEN);
    let deletes = audit_lines(&pods[0], "delete");
    assert_eq!(deletes.len(), 2, "{deletes:?}");
    assert!(
        deletes[0].contains(&token_id) && deletes[0].contains(victim),
        "{deletes:?}"
    );
    assert_eq!(audit_lines(&pods[1], "put").len(), 2);
    assert_eq!(audit_lines(&pods[2], "put").len(), 1);
    assert_eq!(audit_lines(&pods[2], "import").len(), 2);
    assert!(
        audit_lines(&pods[0], "put").is_empty(),
        "refused calls are not changes"
    );
}
