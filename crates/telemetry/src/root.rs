//! The root span of an execution started without a trace context.
//!
//! Its ids are derived from the execution (the trace id is the execution's
//! envelope trace id, the span id a hash of the execution id), so every
//! service parents a message that arrives without `traceparent` to the same
//! root ([`context`]) without asking anyone, and the router exports the
//! span itself, with the execution's start and end, once it ends
//! ([`export`]).

use std::time::SystemTime;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue};
use sha2::{Digest, Sha256};

/// The span id of `execution_id`'s root span.
pub fn span_id(execution_id: &str) -> SpanId {
    let h = Sha256::new()
        .chain_update(b"noetl-root-span\0")
        .chain_update(execution_id.as_bytes())
        .finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[..8]);
    if b == [0u8; 8] {
        b[7] = 1; // the all-zero id is invalid
    }
    SpanId::from_bytes(b)
}

/// The root span of `execution_id` in trace `trace_id` (32 hex digits), as a
/// remote parent; `None` when `trace_id` is not a valid trace id.
pub fn context(trace_id: &str, execution_id: &str) -> Option<Context> {
    let trace = TraceId::from_hex(trace_id).ok()?;
    let sc = SpanContext::new(
        trace,
        span_id(execution_id),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    sc.is_valid()
        .then(|| Context::new().with_remote_span_context(sc))
}

/// An ended execution, as its root span.
#[derive(Debug, Clone)]
pub struct ExecutionSpan<'a> {
    /// Execution id.
    pub execution_id: &'a str,
    /// Its trace id (32 hex digits).
    pub trace_id: &'a str,
    /// `metadata.name` of its playbook.
    pub playbook: &'a str,
    /// Final status (`completed`, `failed`, `cancelled`).
    pub status: &'a str,
    /// Why it failed (already redacted, as in its events).
    pub error: Option<&'a str>,
    /// When it started.
    pub started: SystemTime,
    /// When it ended.
    pub ended: SystemTime,
}

/// Export `s` as the root span `execution` through the global tracer
/// provider. Does nothing when this process exports no spans. Exporting it
/// twice (a redelivered end) gives a duplicate span with the same ids.
pub fn export(s: &ExecutionSpan<'_>) {
    if !crate::enabled() {
        return;
    }
    let Ok(trace) = TraceId::from_hex(s.trace_id) else {
        return;
    };
    let tracer = opentelemetry::global::tracer("noetl");
    let mut attributes = vec![
        KeyValue::new("execution_id", s.execution_id.to_string()),
        KeyValue::new("playbook", s.playbook.to_string()),
        KeyValue::new("status", s.status.to_string()),
    ];
    if let Some(e) = s.error {
        attributes.push(KeyValue::new("error", e.to_string()));
    }
    let mut span = tracer
        .span_builder("execution")
        .with_kind(SpanKind::Internal)
        .with_trace_id(trace)
        .with_span_id(span_id(s.execution_id))
        .with_start_time(s.started)
        .with_attributes(attributes)
        .start_with_context(&tracer, &Context::new());
    if s.status != "completed" {
        span.set_status(Status::error(s.error.unwrap_or(s.status).to_string()));
    }
    span.end_with_timestamp(s.ended);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_span_id_is_the_same_everywhere_and_differs_per_execution() {
        assert_eq!(span_id("e1"), span_id("e1"));
        assert_ne!(span_id("e1"), span_id("e2"));
        assert_ne!(span_id("e1"), SpanId::INVALID);
    }

    #[test]
    fn the_root_context_carries_the_execution_trace_id() {
        let trace = "0af7651916cd43dd8448eb211c80319c";
        let cx = context(trace, "e1").unwrap();
        let sc = cx.span().span_context().clone();
        assert_eq!(sc.trace_id().to_string(), trace);
        assert_eq!(sc.span_id(), span_id("e1"));
        assert!(sc.is_remote() && sc.is_sampled());
        assert!(context("not-hex", "e1").is_none());
        assert!(context("00000000000000000000000000000000", "e1").is_none());
    }

    #[test]
    fn an_ended_execution_is_exported_as_the_root_with_its_ids_and_times() {
        use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        opentelemetry::global::set_tracer_provider(provider.clone());
        crate::set_enabled(true);
        let trace = "0af7651916cd43dd8448eb211c80319c";
        let started = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let ended = started + std::time::Duration::from_millis(1_500);
        export(&ExecutionSpan {
            execution_id: "e1",
            trace_id: trace,
            playbook: "hello",
            status: "failed",
            error: Some("step `x` failed"),
            started,
            ended,
        });
        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!(s.name, "execution");
        assert_eq!(s.span_context.trace_id().to_string(), trace);
        assert_eq!(s.span_context.span_id(), span_id("e1"));
        assert_eq!(s.parent_span_id, SpanId::INVALID, "a root");
        assert_eq!((s.start_time, s.end_time), (started, ended));
        assert_eq!(s.status, Status::error("step `x` failed"));
        assert!(s
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "playbook" && kv.value.as_str() == "hello"));
    }
}
