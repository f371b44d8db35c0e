//! `/api/executions/*`: list, read, cancel; a step's result.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// `GET /api/executions` filters and paging.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListExecutionsQuery {
    /// Only executions of this catalog version (`<path>@v<N>`).
    pub catalog_id: Option<String>,
    /// Only executions whose catalog path contains this (any case).
    pub path: Option<String>,
    /// Only executions whose playbook name (`metadata.name`) or catalog
    /// path contains this (any case): the console's playbook filter.
    pub playbook: Option<String>,
    /// Only this status: `RUNNING`, `COMPLETED`, `FAILED`, `CANCELLED`.
    pub status: Option<String>,
    /// At most this many (default 50, at most 100).
    pub limit: Option<u32>,
    /// Skip this many of the newest first.
    pub offset: Option<u32>,
}

/// One line of `GET /api/executions`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecutionSummary {
    /// Execution id.
    pub execution_id: String,
    /// `<path>@v<N>` when started from the catalog.
    pub catalog_id: Option<String>,
    /// Catalog path, when started from the catalog.
    pub path: Option<String>,
    /// `RUNNING`, `COMPLETED`, `FAILED` or `CANCELLED`.
    pub status: String,
    /// Paused (`POST .../pause`): `RUNNING`, but no new step or iteration
    /// starts until unpaused.
    #[serde(default)]
    pub is_paused: bool,
    /// Queued: `RUNNING`, waiting in line behind its playbook's
    /// concurrency key; its first step starts when a slot frees.
    #[serde(default)]
    pub is_queued: bool,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, once ended.
    pub completed_at: Option<String>,
    /// `metadata.name` of the playbook.
    pub playbook: String,
    /// The parent execution of a child playbook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_execution_id: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One event of an execution, as NoETL's execution view shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecutionEvent {
    /// The event's id.
    pub event_id: String,
    /// Its stream sequence (what `Last-Event-ID` and `after` take).
    pub seq: u64,
    /// e.g. `step.done`.
    pub event_type: String,
    /// The step it is about.
    pub node_name: Option<String>,
    /// `RUNNING`, `COMPLETED`, `FAILED`, `CANCELLED`, `SKIPPED`, `PARTIAL`
    /// or `INFO`, from its type and payload.
    pub status: String,
    /// RFC 3339.
    pub created_at: String,
    /// The payload's `result`, if any.
    pub result: Option<Value>,
    /// The payload's `error`, as text.
    pub error: Option<String>,
}

/// `GET /api/executions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecutionDetail {
    /// Execution id.
    pub execution_id: String,
    /// `<path>@v<N>` when started from the catalog.
    pub catalog_id: Option<String>,
    /// Catalog path, when started from the catalog.
    pub path: Option<String>,
    /// `RUNNING`, `COMPLETED`, `FAILED` or `CANCELLED`.
    pub status: String,
    /// Paused (`POST .../pause`): `RUNNING`, but no new step or iteration
    /// starts until unpaused.
    #[serde(default)]
    pub is_paused: bool,
    /// Queued: `RUNNING`, waiting in line behind its playbook's
    /// concurrency key; its first step starts when a slot frees.
    #[serde(default)]
    pub is_queued: bool,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, once ended.
    pub completed_at: Option<String>,
    /// The parent execution of a child playbook.
    pub parent_execution_id: Option<String>,
    /// The merged workload.
    pub workload: Option<Value>,
    /// `ctx` now (or at its end).
    pub ctx: Value,
    /// Why it failed.
    pub error: Option<String>,
    /// Events stored for it.
    pub event_count: usize,
    /// Its last 2,000 events, oldest first.
    pub events: Vec<ExecutionEvent>,
}

/// Step counts of `GET /api/executions/{id}/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecutionProgress {
    /// Steps of the workflow.
    pub total_steps: u32,
    /// Steps whose latest run is done.
    pub completed_steps: u32,
    /// Steps with a live token.
    pub running_steps: u32,
    /// Steps whose latest run failed.
    pub failed_steps: u32,
}

/// `GET /api/executions/{id}/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecutionStatus {
    /// Execution id.
    pub execution_id: String,
    /// `RUNNING`, `COMPLETED`, `FAILED` or `CANCELLED`.
    pub status: String,
    /// A step with a live token, if any.
    pub current_step: Option<String>,
    /// Step counts.
    pub progress: ExecutionProgress,
    /// True once cancelled.
    pub is_cancelled: bool,
    /// Paused (`POST .../pause`): no new step or iteration starts.
    #[serde(default)]
    pub is_paused: bool,
    /// Why it failed.
    pub error: Option<String>,
    /// Each step: `done`, `failed`, `skipped` or `not_run`.
    pub steps: BTreeMap<String, String>,
    /// NoETL's: true once it has ended (completed, failed or cancelled).
    pub completed: bool,
    /// NoETL's: true once it has failed or been cancelled.
    pub failed: bool,
    /// NoETL's: the steps whose latest run is done, in workflow order.
    pub completed_steps: Vec<String>,
    /// NoETL's: the execution's variables (`ctx`).
    pub variables: Value,
    /// NoETL's: when it started (RFC 3339).
    pub start_time: String,
    /// NoETL's: when it ended (RFC 3339), once it has.
    pub end_time: Option<String>,
    /// NoETL's: seconds from its start to its end (or to now, while it runs).
    pub duration_seconds: Option<f64>,
    /// NoETL's: the same, as `1h 2m 3s` (`0.25s` under a second).
    pub duration_human: Option<String>,
}

/// `POST /api/executions/{id}/cancel` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CancelRequest {
    /// Why (recorded as the execution's error: `cancelled: <reason>`).
    #[serde(default)]
    pub reason: String,
}

/// What `POST /api/executions/{id}/cancel` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CancelResponse {
    /// Execution id.
    pub execution_id: String,
    /// `cancelled` (as NoETL answers: the cancellation was requested).
    pub status: String,
    /// `Execution cancellation requested`.
    pub message: String,
    /// NoETL's: the execution and its child executions, which the router
    /// cancels with it.
    pub cancelled_executions: Vec<String>,
}

/// Body of `POST /api/executions/{id}/pause` (optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PauseRequest {
    /// Why (recorded in the pause and its `execution.paused` event).
    #[serde(default)]
    pub reason: String,
}

/// What `POST /api/executions/{id}/pause` or `.../unpause` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PauseResponse {
    /// Execution id.
    pub execution_id: String,
    /// Whether it is paused now.
    pub paused: bool,
    /// Pause: false when it was paused already.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<bool>,
    /// Unpause: messages the pause held, now released.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<u64>,
}

/// Body of `POST /api/executions/{id}/resume` (optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResumeRequest {
    /// Restart at this step instead of where it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Workload values to change first.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schema(value_type = Object)]
    pub set: serde_json::Map<String, serde_json::Value>,
    /// Resume under this catalog version of the playbook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub playbook_version: Option<u32>,
}

/// What `POST /api/executions/{id}/resume` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResumeResponse {
    /// Execution id.
    pub execution_id: String,
    /// This is its n-th resume.
    pub resumes: u32,
    /// The steps that run again.
    pub steps: Vec<String>,
    /// The steps a `from` superseded.
    pub superseded: Vec<String>,
}

/// What `POST /api/executions/{id}/signals/{name}` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SignalResponse {
    /// Execution id.
    pub execution_id: String,
    /// The signal.
    pub signal: String,
    /// The step it continued.
    pub step: String,
    /// The `wait` task whose result the data is.
    pub task: String,
}

/// `GET /api/executions/{id}/results/{step}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StepResultResponse {
    /// Execution id.
    pub execution_id: String,
    /// Step name.
    pub step: String,
    /// The step's last result (read from the object store when it was
    /// stored by reference).
    pub result: Value,
    /// True when it was stored by reference (above the inline limit).
    pub by_reference: bool,
    /// True when only a preview of it was kept (`result` is then
    /// `{truncated, size, preview}`).
    pub truncated: bool,
}

/// `POST /api/executions/{id}/rerun` (the body is optional): NoETL's
/// `execute rerun`, this engine's `noetl exec retry`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerunRequest {
    /// Workload values merged over the first execution's.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub workload: serde_json::Map<String, Value>,
    /// NoETL's resource kind (`playbook`); anything else is 422.
    #[serde(default)]
    pub resource_kind: Option<String>,
}

/// What `POST /api/executions/{id}/rerun` started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerunResponse {
    /// The new execution.
    pub execution_id: String,
    /// `started` (the router took it) or `queued`.
    pub status: String,
    /// The execution it reruns.
    pub source_execution_id: String,
    /// The catalog version it runs again, when it came from the catalog.
    pub catalog_id: Option<String>,
}

/// `POST /api/executions/cleanup` (the body is optional).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CleanupRequest {
    /// Only executions that ended at least this many minutes ago
    /// (default 60).
    #[serde(default = "sixty")]
    pub older_than_minutes: u32,
    /// Say what would be removed, and remove nothing.
    #[serde(default)]
    pub dry_run: bool,
}

fn sixty() -> u32 {
    60
}

impl Default for CleanupRequest {
    fn default() -> Self {
        Self {
            older_than_minutes: sixty(),
            dry_run: false,
        }
    }
}

/// What `POST /api/executions/cleanup` removed (or would).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CleanupResponse {
    /// `success`.
    pub status: String,
    /// Nothing was removed.
    pub dry_run: bool,
    /// As asked.
    pub older_than_minutes: u32,
    /// The executions whose KV state was removed (or would be).
    pub execution_ids: Vec<String>,
    /// How many (NoETL's client prints this count).
    pub cancelled_count: usize,
    /// What was done, in one line.
    pub message: String,
}
