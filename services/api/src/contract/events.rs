//! Server-Sent Events of `/api/executions/{id}/events` and `/api/events`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// Query of the event streams.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Keep the stream open for new events (an execution's stream ends
    /// after its terminal event); false: the events so far, then the end.
    #[serde(default)]
    pub follow: bool,
    /// Start after this stream sequence (the `Last-Event-ID` header wins).
    pub after: Option<u64>,
    /// Only these event types: a type (`step.done`), or dotted tokens
    /// where `*` is one token and a final `*` the rest (`step.*`).
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// Stop after this many events (`/api/events` without `follow`:
    /// default 1,000, at most 10,000); 0: none (the stream ends at once).
    pub limit: Option<u64>,
}

/// The `data:` of each Server-Sent Event (its `id:` is `seq`, its
/// `event:` the event type).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamedEvent {
    /// Stream sequence.
    pub seq: u64,
    /// Event id.
    pub event_id: String,
    /// e.g. `execution.completed`.
    pub event_type: String,
    /// RFC 3339.
    pub ts: String,
    /// Execution id.
    pub execution_id: String,
    /// Step name, if any.
    pub step: String,
    /// Task name, if any.
    pub task: String,
    /// Step-run id, if any.
    pub step_run_id: String,
    /// Task-run id, if any.
    pub task_run_id: String,
    /// W3C trace id.
    pub trace_id: String,
    /// The payload (JSON).
    pub payload: Value,
}
