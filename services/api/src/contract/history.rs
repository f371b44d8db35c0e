//! `GET /api/executions/{id}/state?at=SEQ|TIME`: an execution as its
//! events give it, as of any of them (docs/api.md "Time travel").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

/// Where to stop folding the events.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StateQuery {
    /// A stream sequence number (an event's `seq`) or an RFC 3339 time;
    /// left out, every event.
    pub at: Option<String>,
}

/// The state the events up to `at` give.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecutionState {
    /// Execution id.
    pub execution_id: String,
    /// Sequence number of the last event folded.
    pub at_seq: u64,
    /// Events folded.
    pub events: usize,
    /// `RUNNING`, `COMPLETED`, `FAILED` or `CANCELLED` (`null` before the
    /// first event that starts the execution).
    pub status: Option<String>,
    /// The execution's error, when it has one.
    pub error: Option<String>,
    /// Steps with a token waiting or running, by name.
    pub live: Vec<String>,
    /// Each step's record, by name.
    pub steps: Map<String, Value>,
    /// `ctx` as of that event.
    #[schema(value_type = Object)]
    pub ctx: Map<String, Value>,
    /// Every event of the execution (the last 2,000 when it has more), a
    /// position each for a scrubber: `{seq, event_type, step, ts}`.
    pub timeline: Vec<TimelineEntry>,
    /// True when `timeline` holds only the last events.
    pub timeline_truncated: bool,
}

/// One event of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TimelineEntry {
    /// Its stream sequence number (`at` takes it).
    pub seq: u64,
    /// Its type.
    pub event_type: String,
    /// Its step (empty for the execution's own events).
    pub step: String,
    /// When it was emitted (RFC 3339).
    pub ts: String,
}
