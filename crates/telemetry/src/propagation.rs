//! W3C trace context (`traceparent`, `tracestate`) in and out of message
//! headers, whatever the carrier (NATS headers, HTTP headers).

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C `traceparent` header name.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C `tracestate` header name.
pub const TRACESTATE: &str = "tracestate";

struct Headers(Vec<(&'static str, String)>);

impl Injector for Headers {
    fn set(&mut self, key: &str, value: String) {
        let name = match key {
            TRACEPARENT => TRACEPARENT,
            TRACESTATE => TRACESTATE,
            _ => return,
        };
        if !value.is_empty() {
            self.0.push((name, value));
        }
    }
}

/// The trace context headers of the current span, to add to a message it
/// publishes: `traceparent`, and `tracestate` when there is one. Empty when
/// this process exports no spans or no span is current.
pub fn current_headers() -> Vec<(&'static str, String)> {
    if !crate::enabled() {
        return Vec::new();
    }
    headers_of(&tracing::Span::current().context())
}

/// The trace id (32 hex digits) of the current span, when this process
/// exports spans and one is current.
pub fn current_trace_id() -> Option<String> {
    if !crate::enabled() {
        return None;
    }
    let cx = tracing::Span::current().context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// The trace context headers of `cx` (empty when it holds no valid span).
pub fn headers_of(cx: &Context) -> Vec<(&'static str, String)> {
    if !cx.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut h = Headers(Vec::with_capacity(2));
    TraceContextPropagator::new().inject_context(cx, &mut h);
    h.0
}

struct Received<'a> {
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

impl Extractor for Received<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.traceparent,
            TRACESTATE => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// The remote parent a received message names in its `traceparent` (and
/// `tracestate`) headers; `None` when it names none or an invalid one.
pub fn parent_from(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Context> {
    traceparent?;
    let cx = TraceContextPropagator::new().extract(&Received {
        traceparent,
        tracestate,
    });
    cx.span().span_context().is_valid().then_some(cx)
}

/// Make `cx` the parent of `span`, which must be new (no child span made,
/// not yet entered). Does nothing when this process exports no spans.
pub fn set_parent(span: &tracing::Span, cx: Context) {
    if crate::enabled() {
        // Fails only when the span is disabled or already started; then it
        // keeps the parent it has.
        let _ = span.set_parent(cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    fn remote(trace: &str, span: &str) -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_hex(trace).unwrap(),
            SpanId::from_hex(span).unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }

    #[test]
    fn a_context_goes_out_as_traceparent_and_comes_back_the_same() {
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let cx = remote(trace, "00f067aa0ba902b7");
        let headers = headers_of(&cx);
        assert_eq!(
            headers,
            vec![(TRACEPARENT, format!("00-{trace}-00f067aa0ba902b7-01"))]
        );
        let back = parent_from(Some(&headers[0].1), None).expect("a valid parent");
        let sc = back.span().span_context().clone();
        assert_eq!(sc.trace_id().to_string(), trace);
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_remote() && sc.is_sampled());
    }

    #[test]
    fn no_header_or_a_malformed_one_names_no_parent() {
        assert!(parent_from(None, None).is_none());
        assert!(parent_from(Some("garbage"), None).is_none());
        assert!(parent_from(
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            None
        )
        .is_none());
        assert!(headers_of(&Context::new()).is_empty(), "no span, no header");
    }

    #[test]
    fn outside_any_span_nothing_is_injected() {
        assert!(current_headers().is_empty());
        assert!(current_trace_id().is_none());
    }
}
