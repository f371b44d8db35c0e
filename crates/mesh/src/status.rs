//! The status of an execution: a leaf module, read by the event payloads
//! and the KV records alike (`state` re-exports it).

use serde::{Deserialize, Serialize};

/// Status of an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    /// Tokens are live.
    Running,
    /// Finished with no unhandled failure.
    Completed,
    /// A step failed and no arc handled it, or the request was invalid.
    Failed,
    /// Cancelled on request (or because its parent was).
    Cancelled,
}

impl ExecStatus {
    /// The status as written (`running`, `completed`, `failed`,
    /// `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// True for completed, failed and cancelled.
    pub fn is_terminal(self) -> bool {
        !matches!(self, ExecStatus::Running)
    }
}
