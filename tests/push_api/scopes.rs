//! What each kind of token may reach, through the real server: a tenant's token with
//! terminal patterns pushes to and looks up the terminals they match and gets `403`
//! for every other id, known or not, with nothing delivered; an operator's token sees
//! the cluster and cannot push; a tenant's cannot see the cluster.

use http::StatusCode;
use posgate::push::PushConfig;

use super::{error_of, Cluster, OPERATOR, SHOP};
use crate::support::api::{client, get, push, Push};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_reach_only_what_they_are_granted() {
    let c = Cluster::start(2, 20, &[], PushConfig::default()).await;
    let http = client();
    let a = &c.urls[0];
    let shop = |key| Push {
        key: Some(key),
        ..Push::new(SHOP)
    };
    // Inside the patterns (`pos-0000?`): delivered.
    let (status, _, body) = push(&http, a, "pos-00003", shop("shop-in")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Outside: a known terminal and an unknown id alike are 403, nothing delivered.
    for terminal in ["pos-00013", "no-such-terminal"] {
        let (status, _, body) = push(&http, a, terminal, shop("shop-out")).await;
        assert_eq!(
            (status, error_of(&body)),
            (StatusCode::FORBIDDEN, "forbidden"),
            "{terminal}: {body}"
        );
        let (status, body) = get(&http, &format!("{a}/v1/terminals/{terminal}"), Some(SHOP)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{terminal}: {body}");
    }
    let report = c.farm.terminal_report("pos-00013").unwrap();
    assert!(
        report
            .recent_pushes
            .iter()
            .all(|p| p.idempotency_key != "shop:shop-out"),
        "nothing delivered outside the token's patterns"
    );
    let (status, _) = get(&http, &format!("{a}/v1/terminals/pos-00003"), Some(SHOP)).await;
    assert_eq!(status, StatusCode::OK);
    // The operator sees the cluster and cannot push; the tenant cannot see the cluster.
    let (status, _, body) = push(&http, a, "pos-00003", Push::new(OPERATOR)).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::FORBIDDEN, "forbidden"),
        "{body}"
    );
    let cluster = format!("{a}/v1/cluster");
    assert_eq!(get(&http, &cluster, Some(OPERATOR)).await.0, StatusCode::OK);
    let (status, body) = get(&http, &cluster, Some(SHOP)).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::FORBIDDEN, "forbidden"),
        "{body}"
    );
}
