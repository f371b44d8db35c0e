//! The payloads of a loop window sent in batches (docs/architecture.md
//! "Loop windows in batches"): `batch.accepted`, the loop-supervisor's
//! record of the iterations it sent as one command, and `batch.completed`,
//! an executor's report of the iterations that ended in it. Readers of the
//! log get each unfolded into the per-iteration events it stands for
//! ([`crate::events::unfold`]).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// `batch.accepted`, written by the loop-supervisor before the batch's
/// command goes out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchAccepted {
    /// The loop run (its step-run id).
    pub loop_run_id: String,
    /// The iterations the command runs, each a `loop.iteration.started`.
    pub items: Vec<BatchItem>,
}

/// One iteration of a batch: what its `loop.iteration.started` says
/// besides the loop run ([`super::IterationStarted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItem {
    /// The iteration.
    pub index: u64,
    /// A cursor loop's iteration: the claim whose rows it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<u64>,
}

/// `batch.completed`, written by the executor that ran a batch: the ends
/// of its iterations that ended in it (an iteration handed off to another
/// kind, or waiting for a child execution, reports its end on its own
/// later), read live by the loop-supervisor.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchCompleted {
    /// The loop run (its step-run id).
    pub loop_run_id: String,
    /// Each iteration's end.
    pub ends: Vec<BatchEnd>,
}

/// One iteration's end inside a `batch.completed`.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchEnd {
    /// When it ended (Unix epoch ms): its `loop.iteration.done`'s time.
    pub at: u64,
    /// The payload of its `loop.iteration.done` / `.failed`
    /// ([`super::IterationEnded`], with the last task's `task.done` it
    /// carries), as written.
    pub end: Box<RawValue>,
}

super::payload_of! {
    BatchAccepted => BatchAccepted,
    BatchCompleted => BatchCompleted,
}
