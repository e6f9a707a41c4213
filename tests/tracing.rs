//! One push through two `posgate serve` processes is one trace at an OTLP receiver,
//! decoded with the protocol's own protobuf messages: the caller's span, then the entry
//! pod's `push`, its `forward`, the owner's `deliver` and its `terminal` send, each the
//! child of the one before; the answer's request id is in both pods' log lines.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use posgate::core::shard::shard_of;
use prost::Message;

use crate::support::binary::{self, API_TOKEN};
use crate::support::farm::{self, connect_limit, Farm};
use crate::support::pod::SHARDS;
use crate::support::wait::wait_for_async;
use crate::support::RedisServer;

/// A span as the receiver got it: who sent it and where it sits in its trace.
#[derive(Clone, Debug)]
struct Received {
    pod: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent: String,
}

/// An OTLP/HTTP trace receiver on a free port: every span of every export request.
async fn receiver() -> (u16, Arc<Mutex<Vec<Received>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let got = spans.clone();
    let app = Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let got = got.clone();
            async move {
                let request =
                    ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
                for resource in request.resource_spans {
                    let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
                    let pod = attributes
                        .iter()
                        .find(|a| a.key == "service.instance.id")
                        .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                            Value::StringValue(s) => Some(s.clone()),
                            _ => None,
                        })
                        .unwrap_or_default();
                    for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                        got.lock().unwrap().push(Received {
                            pod: pod.clone(),
                            name: span.name,
                            kind: span.kind,
                            trace_id: hex::encode(span.trace_id),
                            span_id: hex::encode(span.span_id),
                            parent: hex::encode(span.parent_span_id),
                        });
                    }
                }
                // An empty ExportTraceServiceResponse.
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                    Bytes::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_push_through_two_pods_is_one_trace() {
    let redis = RedisServer::start();
    let t = Farm::with_directory(&redis, farm::config(64)).await;
    let (otlp, spans) = receiver().await;
    let endpoint = format!("http://127.0.0.1:{otlp}/v1/traces");
    let extra = ["--otlp-endpoint", endpoint.as_str()];
    let a = binary::terminal_pod(
        "trace-pod-a",
        &redis.url(),
        &t.ca_file,
        t.dir.path(),
        &extra,
    );
    let b = binary::terminal_pod(
        "trace-pod-b",
        &redis.url(),
        &t.ca_file,
        t.dir.path(),
        &extra,
    );
    wait_for_async(
        "both pods serving, every terminal settled",
        connect_limit() + Duration::from_secs(10),
        || async {
            let (Some(sa), Some(sb)) = (a.serving().await, b.serving().await) else {
                return false;
            };
            !sa.is_empty()
                && !sb.is_empty()
                && sa.len() + sb.len() == SHARDS as usize
                && t.all_settled()
        },
    )
    .await;
    let b_shards: Vec<_> = b
        .serving()
        .await
        .expect("pod b answers")
        .iter()
        .map(|(s, _)| *s)
        .collect();
    let terminal = t
        .ids
        .iter()
        .find(|id| b_shards.contains(&shard_of(id, SHARDS)))
        .expect("a terminal of pod b")
        .clone();

    // The caller's own span, which the whole push must hang under.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let head = format!(
        "POST /v1/terminals/{terminal}/push?timeout_ms=8000 HTTP/1.1\r\n\
         Authorization: Bearer {API_TOKEN}\r\nIdempotency-Key: traced-1\r\n\
         traceparent: 00-{caller_trace}-{caller_span}-01\r\nContent-Type: application/json\r\n"
    );
    let answer = binary::exchange(a.port, &head, "{\"amount\":1}", Duration::from_secs(12))
        .await
        .expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let request_id = answer
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap_or_else(|| panic!("no x-request-id in {answer}"))
        .trim()
        .to_string();

    // Spans leave each pod in batches (the SDK's 5 s schedule).
    let chain = wait_for_async(
        "the four spans of the push",
        Duration::from_secs(20),
        || async {
            spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.trace_id == caller_trace)
                .count()
                >= 4
        },
    )
    .await;
    let _ = chain;
    let got: Vec<Received> = spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.trace_id == caller_trace)
        .cloned()
        .collect();
    let by_name: HashMap<&str, &Received> = got.iter().map(|s| (s.name.as_str(), s)).collect();
    let expect = [
        (
            "push",
            "trace-pod-a",
            SpanKind::Server,
            caller_span.to_string(),
        ),
        (
            "forward",
            "trace-pod-a",
            SpanKind::Client,
            by_name["push"].span_id.clone(),
        ),
        (
            "deliver",
            "trace-pod-b",
            SpanKind::Server,
            by_name["forward"].span_id.clone(),
        ),
        (
            "terminal",
            "trace-pod-b",
            SpanKind::Client,
            by_name["deliver"].span_id.clone(),
        ),
    ];
    assert_eq!(got.len(), expect.len(), "one span per hop: {got:#?}");
    for (name, pod, kind, parent) in expect {
        let span = by_name
            .get(name)
            .unwrap_or_else(|| panic!("no {name} span in {got:#?}"));
        assert_eq!(
            (span.pod.as_str(), span.kind, span.parent.as_str()),
            (pod, kind as i32, parent.as_str()),
            "span {name}: {got:#?}"
        );
    }

    // The request id the caller got names the push in both pods' logs.
    let entry = a.log_lines_with(&["push answered", &request_id, "\"role\":\"entry\""]);
    let owner = b.log_lines_with(&["push answered", &request_id, "\"role\":\"owner\""]);
    assert_eq!(
        (entry.len(), owner.len()),
        (1, 1),
        "request {request_id}: entry {entry:?}, owner {owner:?}"
    );
    assert!(entry[0].contains(caller_trace) && owner[0].contains(caller_trace));
}
