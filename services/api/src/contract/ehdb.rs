//! `/api/ehdb/*`: NoETL's read-only views of executions and their events
//! (what `noetl ehdb query` reads), answered from what the mesh holds.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::executions::ExecutionEvent;

/// `GET /api/ehdb/executions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EhdbExecutions {
    /// Newest first.
    pub executions: Vec<EhdbExecution>,
}

/// One execution as NoETL's read model shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EhdbExecution {
    /// Execution id.
    pub execution_id: String,
    /// `RUNNING`, `COMPLETED`, `FAILED` or `CANCELLED`.
    pub status: String,
    /// True once it has ended.
    pub terminal: bool,
    /// A step with a live token, if any.
    pub current_node: Option<String>,
    /// Catalog path, when started from the catalog.
    pub path: Option<String>,
    /// `<path>@v<N>`, when started from the catalog.
    pub catalog_id: Option<String>,
    /// The parent execution of a child playbook.
    pub parent_execution_id: Option<String>,
    /// Events stored for it (only in `GET /api/ehdb/executions/{id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_count: Option<u64>,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, once ended.
    pub completed_at: Option<String>,
}

/// `GET /api/ehdb/executions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EhdbExecutionState {
    /// Always true (an unknown execution is 404).
    pub exists: bool,
    /// Execution id.
    pub execution_id: String,
    /// Its state.
    pub state: EhdbExecution,
}

/// `GET /api/ehdb/executions/{id}/events` query.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EhdbEventsQuery {
    /// At most this many (default 100, at most 1,000): the newest.
    pub limit: Option<u32>,
    /// Only events after this stream sequence (`seq`).
    pub after: Option<u64>,
}

/// `GET /api/ehdb/executions/{id}/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EhdbEvents {
    /// Execution id.
    pub execution_id: String,
    /// Newest first.
    pub events: Vec<ExecutionEvent>,
}
