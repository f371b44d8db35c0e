//! The payloads that name an execution's plan: `playbook.initialized` at
//! its start and `execution.resumed` at each resume (docs/architecture.md
//! "The event log": a fold of the log reads the plan back from them).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `playbook.initialized`, the first event of an execution (router).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlaybookInitialized {
    /// `metadata.name`.
    pub playbook: String,
    /// `metadata.path`.
    #[serde(default)]
    pub path: Option<String>,
    /// Where it came from (file name or catalog path).
    pub source: String,
    /// The parent execution of a child playbook (empty otherwise).
    #[serde(default)]
    pub parent_execution_id: String,
    /// The plan's identity: the normalised playbook's digest, where it is
    /// stored, and the catalog entry it came from (absent in events
    /// written before the log was complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanIdentity>,
    /// The merged workload the execution runs with.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub workload: Value,
    /// The workload stored whole in the object store, when it is too large
    /// to ride in the event ([`crate::patches`]; `workload` is then absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_ref: Option<Value>,
    /// A child's continuation of its parent: the parent's `playbook` task
    /// command, parked as `<child>.resume` keeps it, so the parent still
    /// goes on when that record is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_command: Option<String>,
    /// [`Self::parent_command`] stored whole in the object store, when too
    /// large to ride in the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_command_ref: Option<Value>,
}

/// Which plan an execution runs (`playbook.initialized`): enough to read
/// it back whole, whatever was registered since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanIdentity {
    /// `sha256:<hex>` of the normalised playbook's JSON.
    pub digest: String,
    /// The normalised playbook in the object store (content-addressed by
    /// its digest), as a reference.
    pub playbook_ref: Value,
    /// The catalog path, when it came from the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_path: Option<String>,
    /// The catalog version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_version: Option<u32>,
    /// When the execution started (Unix epoch ms): limits counted from the
    /// start use it.
    #[serde(default)]
    pub started_ms: u64,
    /// The parent task's `iter` (child playbooks).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub parent_iter: Value,
    /// The step whose last result answers the parent task.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub return_step: String,
}

/// `execution.resumed`: what the router did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resumed {
    /// This is the execution's n-th resume.
    pub resumes: u32,
    /// The steps that run again (one per token), in token order.
    pub steps: Vec<String>,
    /// The loop steps among them that continue their stopped run (only
    /// the iterations that did not finish run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub continued_loops: Vec<String>,
    /// The step it restarted at (`--from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The workload keys `--set` changed (names only: values may be
    /// secrets; the merged workload is in [`Self::workload_ref`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<String>,
    /// The catalog version it runs under from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub playbook_version: Option<u32>,
    /// Who asked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
    /// When the header was resumed (Unix epoch ms; the header's
    /// `resumed_at_ms`).
    #[serde(default)]
    pub resumed_at_ms: u64,
    /// The plan it runs under from now on: its start (from which the
    /// execution's deadline counts) is the resume's, and a
    /// `--playbook-version` names another playbook. Absent in events
    /// written before resumes named their plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanIdentity>,
    /// The merged workload from now on, when the resume changed it (`--set`,
    /// `--playbook-version`): always stored in the object store, so the
    /// values `--set` gave stay out of the event stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_ref: Option<Value>,
    /// [`Self::workload_ref`] read back (`crate::replay::hydrate`): never
    /// written, present only in a hydrated event.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub workload: Value,
}
