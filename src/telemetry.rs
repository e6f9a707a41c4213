//! Spans of pushes, exported over OTLP/HTTP (protobuf) when `--otlp-endpoint` is set,
//! nothing at all otherwise.
//!
//! A push is one trace across pods: the entry pod's `push` span (server), its `forward`
//! (client), the owner's `deliver` (server) and its `terminal` send (client), each the
//! child of the one before. The ids are the ones [`crate::trace_context`] already puts
//! in the peer and terminal headers, so a terminal that traces joins the same trace.
//! That is why spans are recorded here as finished [`SpanData`] with those ids, handed
//! to the SDK's batch processor and OTLP exporter, rather than through
//! `tracing-opentelemetry`, whose spans get ids of the SDK's choosing (so the ids in the
//! headers would have to be read back from them) and would put a span's bookkeeping on
//! every push whether or not anything is exported.
//!
//! Bounded: the batch processor keeps at most 2,048 spans (the SDK's default,
//! `OTEL_BSP_MAX_QUEUE_SIZE`) and drops what does not fit while the collector is slow or
//! away; only sampled traces (`trace-flags` bit 0) are recorded.
//!
//! Not for: the trace context itself ([`crate::trace_context`]) or log lines.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SpanData, SpanProcessor};
use opentelemetry_sdk::Resource;

use crate::trace_context::TraceContext;

/// How long one export may take before it counts as failed (the SDK retries nothing
/// here: spans are worth less than the pod's CPU and memory).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a pod's spans go: nowhere ([`Telemetry::off`], the default), or to an OTLP
/// collector. Cloning shares the exporter.
#[derive(Clone, Default)]
pub struct Telemetry {
    exporting: Option<Arc<Exporting>>,
}

struct Exporting {
    processor: BatchSpanProcessor<Tokio>,
    scope: InstrumentationScope,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("on", &self.exporting.is_some())
            .finish()
    }
}

impl Telemetry {
    pub fn off() -> Self {
        Telemetry::default()
    }

    /// Spans to `endpoint` (OTLP/HTTP, e.g. `http://otel-collector:4318/v1/traces`), as
    /// service `posgate`, instance `pod`. Must be called on a tokio runtime, which the
    /// exports run on.
    pub fn otlp(endpoint: &str, pod: &str) -> Result<Self, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(
                opentelemetry_http::hyper::HyperClient::with_default_connector(
                    EXPORT_TIMEOUT,
                    None,
                ),
            )
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("OTLP exporter for {endpoint}: {e}"))?;
        let mut processor = BatchSpanProcessor::builder(exporter, Tokio).build();
        processor.set_resource(
            &Resource::builder()
                .with_service_name("posgate")
                .with_attribute(KeyValue::new("service.instance.id", pod.to_string()))
                .build(),
        );
        let scope = InstrumentationScope::builder("posgate")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Ok(Telemetry {
            exporting: Some(Arc::new(Exporting { processor, scope })),
        })
    }

    pub fn is_on(&self) -> bool {
        self.exporting.is_some()
    }

    /// Records `context`'s span, named `name`, from `start` until now, under its parent.
    /// `attributes` are only built when the span is exported.
    pub fn record(
        &self,
        name: &'static str,
        kind: SpanKind,
        context: Option<&TraceContext>,
        start: SystemTime,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) {
        let (Some(exporting), Some(context)) = (&self.exporting, context) else {
            return;
        };
        if !context.sampled() {
            return;
        }
        let state = context
            .state
            .as_ref()
            .and_then(|s| s.to_str().ok())
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let span_context = SpanContext::new(
            TraceId::from_bytes(context.trace_id.to_be_bytes()),
            SpanId::from_bytes(context.span_id.to_be_bytes()),
            TraceFlags::SAMPLED,
            false,
            state,
        );
        exporting.processor.on_end(SpanData {
            span_context,
            parent_span_id: context
                .parent_id
                .map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.to_be_bytes())),
            parent_span_is_remote: false,
            span_kind: kind,
            name: Cow::Borrowed(name),
            start_time: start,
            end_time: SystemTime::now(),
            attributes: attributes(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: exporting.scope.clone(),
        });
    }

    /// Sends what is still queued, for a pod that is about to exit; gives up after
    /// one export's timeout.
    pub async fn flush(&self) {
        let Some(exporting) = self.exporting.clone() else {
            return;
        };
        // The SDK waits for the export by blocking its thread: not a runtime thread,
        // which the export itself runs on.
        let flushed = tokio::task::spawn_blocking(move || exporting.processor.force_flush());
        match tokio::time::timeout(EXPORT_TIMEOUT, flushed).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::debug!(error = %e, "could not flush the last spans"),
            Ok(Err(_)) | Err(_) => tracing::debug!("gave up flushing the last spans"),
        }
    }
}
