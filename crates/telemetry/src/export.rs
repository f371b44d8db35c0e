//! Set-up of a process's `tracing` subscriber: its log layer, and an
//! OpenTelemetry layer exporting spans over OTLP when the standard
//! `OTEL_*` variables ask for it ([`plan`]).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// Why spans cannot be exported as configured.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// An unknown OTLP protocol.
    #[error("{var}={value:?} is not an OTLP protocol: use grpc, http/protobuf or http/json")]
    Protocol {
        /// The variable that set it.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The exporter could not be built (e.g. a malformed endpoint).
    #[error("cannot set up the OTLP span exporter ({protocol}): {message}")]
    Build {
        /// The protocol chosen.
        protocol: &'static str,
        /// The cause.
        message: String,
    },
}

/// Whether and how this process exports spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// No endpoint set, or export disabled: no OpenTelemetry layer at all.
    Off,
    /// Export over OTLP with this protocol.
    Otlp(Protocol),
}

/// The export plan from the standard variables (read through `var`):
/// off unless `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and off when `OTEL_SDK_DISABLED`
/// is `true` or `OTEL_TRACES_EXPORTER` is `none`; the protocol from
/// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`,
/// else `http/protobuf` (the specification's default).
pub fn plan(var: impl Fn(&str) -> Option<String>) -> Result<Plan, ExportError> {
    let set = |k: &str| {
        var(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        || (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
            && set("OTEL_EXPORTER_OTLP_ENDPOINT").is_none())
    {
        return Ok(Plan::Off);
    }
    let chosen = [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]
    .into_iter()
    .find_map(|k| set(k).map(|v| (k, v)));
    let Some((var, value)) = chosen else {
        return Ok(Plan::Otlp(Protocol::HttpBinary));
    };
    match value.as_str() {
        "grpc" => Ok(Plan::Otlp(Protocol::Grpc)),
        "http/protobuf" => Ok(Plan::Otlp(Protocol::HttpBinary)),
        "http/json" => Ok(Plan::Otlp(Protocol::HttpJson)),
        _ => Err(ExportError::Protocol { var, value }),
    }
}

/// The `service.name` to report: `default` unless `OTEL_SERVICE_NAME` or a
/// `service.name` in `OTEL_RESOURCE_ATTRIBUTES` names one (the SDK reads
/// those itself).
pub fn service_name_override(
    var: impl Fn(&str) -> Option<String>,
    default: &str,
) -> Option<String> {
    let named = var("OTEL_SERVICE_NAME").is_some_and(|v| !v.trim().is_empty())
        || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|v| {
            v.split(',')
                .any(|kv| kv.trim_start().starts_with("service.name="))
        });
    (!named).then(|| default.to_string())
}

/// What a process sets up.
pub struct Setup {
    /// Its `service.name` unless the environment names one
    /// (`noetl-router`, `noetl-executor`...).
    pub service: String,
    /// Its log layer, with its own filter.
    pub logs: Box<dyn Layer<Registry> + Send + Sync>,
}

/// Flushes and stops span export when dropped (at the end of `main`).
#[must_use = "spans are flushed when the guard is dropped"]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
}

impl Guard {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown_with_timeout(Duration::from_secs(5)) {
                eprintln!("warning: flushing spans at exit: {e}");
            }
        }
    }
}

/// Install the process's subscriber: `s.logs`, plus an OpenTelemetry layer
/// when [`plan`] says so, fed by the spans of the `noetl*` crates (debug
/// level and up, whatever the log level). Call once, inside the tokio
/// runtime (the gRPC exporter needs it). A subscriber already installed
/// (tests) is left alone.
pub fn init(s: Setup) -> Result<Guard, ExportError> {
    let plan = plan(|k| std::env::var(k).ok())?;
    let Plan::Otlp(protocol) = plan else {
        let _ = tracing_subscriber::registry().with(s.logs).try_init();
        return Ok(Guard { provider: None });
    };
    let exporter = exporter(protocol)?;
    let mut resource = Resource::builder();
    if let Some(name) = service_name_override(|k| std::env::var(k).ok(), &s.service) {
        resource = resource.with_service_name(name);
    }
    let provider = SdkTracerProvider::builder()
        .with_resource(resource.build())
        .with_batch_exporter(exporter)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let tracer = provider.tracer("noetl");
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(Targets::new().with_target("noetl", LevelFilter::DEBUG));
    let installed = tracing_subscriber::registry()
        .with(s.logs)
        .with(spans)
        .try_init()
        .is_ok();
    crate::set_enabled(installed);
    Ok(Guard {
        provider: Some(provider),
    })
}

fn exporter(protocol: Protocol) -> Result<SpanExporter, ExportError> {
    let (name, built) = match protocol {
        Protocol::Grpc => ("grpc", SpanExporter::builder().with_tonic().build()),
        Protocol::HttpBinary => (
            "http/protobuf",
            SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build(),
        ),
        Protocol::HttpJson => (
            "http/json",
            SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpJson)
                .build(),
        ),
    };
    built.map_err(|e| ExportError::Build {
        protocol: name,
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn nothing_is_exported_without_an_endpoint_or_when_disabled() {
        assert_eq!(plan(env(&[])).unwrap(), Plan::Off);
        assert_eq!(
            plan(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).unwrap(),
            Plan::Off,
            "a protocol alone exports nothing"
        );
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        assert_eq!(
            plan(env(&[endpoint, ("OTEL_SDK_DISABLED", "true")])).unwrap(),
            Plan::Off
        );
        assert_eq!(
            plan(env(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")])).unwrap(),
            Plan::Off
        );
    }

    #[test]
    fn the_protocol_follows_the_standard_variables() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        assert_eq!(
            plan(env(&[endpoint])).unwrap(),
            Plan::Otlp(Protocol::HttpBinary),
            "http/protobuf by default"
        );
        assert_eq!(
            plan(env(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).unwrap(),
            Plan::Otlp(Protocol::Grpc)
        );
        assert_eq!(
            plan(env(&[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://c:4318/v1/traces"
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
            ]))
            .unwrap(),
            Plan::Otlp(Protocol::HttpJson),
            "the traces variable wins"
        );
        let err = plan(env(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"thrift\" is not an OTLP protocol"),
            "{err}"
        );
    }

    #[test]
    fn the_environment_names_the_service_before_the_default() {
        assert_eq!(
            service_name_override(env(&[]), "noetl-router").as_deref(),
            Some("noetl-router")
        );
        assert_eq!(
            service_name_override(env(&[("OTEL_SERVICE_NAME", "edge-router")]), "noetl-router"),
            None
        );
        assert_eq!(
            service_name_override(
                env(&[("OTEL_RESOURCE_ATTRIBUTES", "team=data, service.name=x")]),
                "noetl-router"
            ),
            None
        );
    }
}
