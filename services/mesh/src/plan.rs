//! The immutable plan of one execution (normalised playbook + merged
//! workload), stored once in KV by the router and cached by every service so
//! no message re-parses the playbook.

use std::sync::Arc;

use noetl_core::Playbook;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Mesh, MeshError};

/// What is stored under `<eid>.plan`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanRecord {
    /// Execution id.
    pub execution_id: String,
    /// File name or catalog path the playbook came from.
    pub source_name: String,
    /// The normalised playbook.
    pub playbook: Playbook,
    /// The merged, immutable workload.
    pub workload: Value,
    /// Parent execution (child playbooks).
    #[serde(default)]
    pub parent_execution_id: String,
    /// Trace id of the execution.
    #[serde(default)]
    pub trace_id: String,
    /// When the execution started (Unix epoch ms; 0 in plans stored before
    /// this field existed): deadlines counted from the start use it.
    #[serde(default)]
    pub started_ms: u64,
    /// The parent task's `iter` (child playbooks): `iter.parent` here.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub parent_iter: Value,
    /// Step names some template reads by name (computed once, on demand).
    #[serde(skip)]
    referenced: std::sync::OnceLock<std::collections::BTreeSet<String>>,
}

impl PlanRecord {
    /// A plan record.
    pub fn new(
        execution_id: String,
        source_name: String,
        playbook: Playbook,
        workload: Value,
    ) -> Self {
        Self {
            execution_id,
            source_name,
            playbook,
            workload,
            parent_execution_id: String::new(),
            trace_id: String::new(),
            started_ms: 0,
            parent_iter: Value::Null,
            referenced: Default::default(),
        }
    }

    /// Results above this many bytes travel by reference:
    /// `executor.spec.limits.max_payload_bytes`, else `default`.
    pub fn max_payload_bytes(&self, default: usize) -> usize {
        self.playbook
            .executor
            .as_ref()
            .and_then(|e| e.spec.get("limits"))
            .and_then(|l| l.get("max_payload_bytes"))
            .and_then(Value::as_u64)
            .map(|n| n as usize)
            .unwrap_or(default)
    }

    /// The names of the playbook's steps, in workflow order.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.playbook.workflow.iter().map(|s| s.step.as_str())
    }

    /// True when some template of the playbook reads `step`'s result by
    /// name (`{{ step.x }}`): only then is the result worth storing in KV.
    pub fn is_result_referenced(&self, step: &str) -> bool {
        self.referenced
            .get_or_init(|| {
                let names: std::collections::BTreeSet<&str> = self.step_names().collect();
                let json = serde_json::to_value(&self.playbook).unwrap_or(Value::Null);
                let roots = crate::scope::roots(crate::scope::strings(&json));
                roots
                    .into_iter()
                    .filter(|r| names.contains(r.as_str()))
                    .collect()
            })
            .contains(step)
    }
}

/// A bounded cache of plans by execution id.
pub struct PlanCache {
    inner: crate::cache::Bounded<String, Arc<PlanRecord>>,
}

impl PlanCache {
    /// A cache holding at most `capacity` plans.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: crate::cache::Bounded::new(capacity),
        }
    }

    /// Insert a plan (the router does this when it stores one).
    pub fn insert(&self, plan: Arc<PlanRecord>) {
        self.inner.insert(plan.execution_id.clone(), plan);
    }

    /// The plan of `eid`, from the cache or KV.
    pub async fn get(&self, mesh: &Mesh, eid: &str) -> Result<Arc<PlanRecord>, MeshError> {
        if let Some(p) = self.inner.get(eid) {
            return Ok(p);
        }
        let key = crate::keys::Keys::plan(eid);
        let rec: PlanRecord =
            crate::kv::get(mesh.exec_kv(), &key)
                .await?
                .ok_or_else(|| MeshError::NoPlan {
                    execution_id: eid.to_string(),
                })?;
        let plan = Arc::new(rec);
        self.insert(plan.clone());
        Ok(plan)
    }
}
