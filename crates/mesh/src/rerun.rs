//! Running an execution again as a new one (`noetl exec retry`, the API's
//! `POST /api/executions/{id}/rerun`): the same playbook (the catalog
//! version it last ran, or the normalised playbook its plan kept) with the
//! merged workload it ran with. What it starts from is read from KV, or,
//! when its KV state was compacted or purged, folded from its events
//! (docs/operations.md "Run it again"), read only: nothing is written back.

use std::sync::Arc;

use noetl_wire::ExecutionRequest;
use serde_json::{Map, Value};

use crate::plan::PlanRecord;
use crate::replay::{fold_log, Until};
use crate::state::ExecHeader;
use crate::{Mesh, MeshError};

/// What running an execution again starts from.
#[derive(Debug, Clone)]
pub struct RunAgain {
    /// Its header (its source names the catalog version it last ran).
    pub header: ExecHeader,
    /// Its plan; `None` when it was refused before it started.
    pub plan: Option<Arc<PlanRecord>>,
}

impl Mesh {
    /// What running `eid` again starts from: its header and plan as
    /// stored, or those its events give when either is missing (KV state
    /// compacted or purged). `None` when neither KV nor the log knows it.
    pub async fn run_again_of(&self, eid: &str) -> Result<Option<RunAgain>, MeshError> {
        let header = self.exec_header(eid).await?;
        let plan = match self.plans().get(self, eid).await {
            Ok(plan) => Some(plan),
            Err(MeshError::NoPlan { .. }) => None,
            Err(e) => return Err(e),
        };
        if let (Some(header), Some(plan)) = (&header, &plan) {
            return Ok(Some(RunAgain {
                header: header.clone(),
                plan: Some(plan.clone()),
            }));
        }
        let folded = fold_log(self, eid, Until::End).await?;
        let Some(header) = header.or_else(|| folded.header.clone()) else {
            return Ok(None);
        };
        let plan = match plan {
            Some(plan) => Some(plan),
            None => crate::rebuild::plan_of(self, eid, &folded)
                .await?
                .ok()
                .map(Arc::new),
        };
        Ok(Some(RunAgain { header, plan }))
    }
}

/// The request that runs `again`'s playbook as `new_id`: the catalog
/// version its source names (or, for a playbook sent inline, the
/// normalised playbook of `plan`), with `plan`'s merged workload and
/// `overrides` over it.
pub fn request(
    header: &ExecHeader,
    plan: &PlanRecord,
    overrides: &Map<String, Value>,
    new_id: String,
) -> Result<ExecutionRequest, MeshError> {
    let mut workload = match &plan.workload {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    workload.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut req = ExecutionRequest {
        execution_id: new_id,
        workload_json: crate::codec::json_bytes(&Value::Object(workload)),
        ..Default::default()
    };
    match crate::catalog::parse_catalog_id(&header.source) {
        Some((path, version)) => {
            req.path = path;
            req.version = version;
        }
        None => {
            req.playbook_yaml = serde_json::to_string(&plan.playbook).map_err(|e| {
                MeshError::Invalid(format!(
                    "the plan of execution {}: {e}",
                    header.execution_id
                ))
            })?;
            req.source_name = plan.source_name.clone();
        }
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(source: &str) -> PlanRecord {
        let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: p }\nworkflow:\n  - step: start\n    tool: { kind: noop }\n";
        let playbook = noetl_core::load::load_playbook(yaml, "p.yaml")
            .unwrap()
            .playbook;
        PlanRecord::new(
            "e1".into(),
            source.into(),
            playbook,
            json!({"a": 1, "b": 2}),
        )
    }

    #[test]
    fn a_catalog_playbook_runs_its_version_again_an_inline_one_its_plan_s_playbook() {
        let overrides = json!({"b": 3}).as_object().cloned().unwrap();
        let mut header = ExecHeader::running("e1", Vec::new());
        header.source = "demo/p@v2".into();
        let req = request(&header, &plan("demo/p@v2"), &overrides, "e2".into()).unwrap();
        assert_eq!((req.path.as_str(), req.version), ("demo/p", 2));
        assert!(req.playbook_yaml.is_empty());
        assert_eq!(req.execution_id, "e2");
        let workload: Value = serde_json::from_slice(&req.workload_json).unwrap();
        assert_eq!(workload, json!({"a": 1, "b": 3}));

        header.source = "p.yaml".into();
        let req = request(&header, &plan("p.yaml"), &Map::new(), "e3".into()).unwrap();
        assert!(req.path.is_empty());
        assert_eq!(req.source_name, "p.yaml");
        assert!(
            req.playbook_yaml.contains("\"start\""),
            "{}",
            req.playbook_yaml
        );
    }
}
