//! OpenTelemetry for the NoETL mesh (docs/observability.md).
//!
//! The `tracing` spans of every service are the source of the traces: when
//! a process exports spans ([`export`], feature `export`), each message it
//! publishes carries the W3C trace context of the span that published it
//! ([`propagation::current_headers`]), and each message it consumes is
//! handled in a span parented to that context ([`propagation::parent_from`]),
//! so one execution is one trace whatever process handles each hop. An
//! execution started without a trace context gets a root span of its own
//! ([`root`]), whose trace id is the execution's envelope trace id.
//!
//! Nothing here costs anything when no exporter is set up: [`enabled`] is
//! false and every function returns at once.

pub mod propagation;
pub mod root;

#[cfg(feature = "export")]
pub mod export;

use std::sync::atomic::{AtomicBool, Ordering};

/// The OpenTelemetry context type that [`propagation`] and [`root`] hand out.
pub use opentelemetry::Context;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether this process exports spans (an OpenTelemetry layer is installed).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Record that this process exports spans (done by [`export::init`]; tests
/// that install their own layer call it too).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}
