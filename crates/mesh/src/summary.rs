//! An execution's summary (status, `ctx`, each step's status), as
//! `noetl exec status` and the API show it. Its own module: it writes back
//! the missing records of an ended execution from the events first
//! ([`crate::rebuild`]), which the state records themselves do not use.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::keys::Keys;
use crate::state::{ExecStatus, ExecSummary, StepRecord, StepStatus};

impl crate::Mesh {
    /// Build the summary of an execution (`None` if unknown).
    pub async fn exec_summary(&self, eid: &str) -> Result<Option<ExecSummary>, crate::MeshError> {
        let Some(header) = self.exec_header(eid).await? else {
            return Ok(None);
        };
        let mut plan = self.plans().get(self, eid).await;
        if header.status.is_terminal()
            && (plan.is_err() || crate::kv::get::<Value>(self.ctx_kv(), eid).await?.is_none())
        {
            // Lost after the services last needed them (a purge, a storage
            // fault): written back from the events, as `noetl admin
            // rebuild` does (docs/operations.md "Rebuild").
            match crate::rebuild::rebuild(self, eid, crate::rebuild::Mode::Missing).await {
                Ok(_) => plan = self.plans().get(self, eid).await,
                Err(e) => {
                    tracing::warn!(execution_id = %eid, error = %e, "records of an ended execution are missing and could not be rebuilt")
                }
            }
        }
        let mut steps = BTreeMap::new();
        if let Ok(plan) = plan {
            for step in &plan.playbook.workflow {
                let rec: Option<StepRecord> =
                    crate::kv::get(self.exec_kv(), &Keys::step(eid, &step.step)).await?;
                let s = match rec.map(|r| r.status) {
                    Some(StepStatus::Done) => "done",
                    Some(StepStatus::Failed) => "failed",
                    Some(StepStatus::Skipped) => "skipped",
                    None => "not_run",
                };
                steps.insert(step.step.clone(), s.to_string());
            }
        }
        Ok(Some(ExecSummary {
            execution_id: header.execution_id.clone(),
            status: header.status,
            playbook: header.playbook.clone(),
            ctx: self.exec_ctx(eid).await?,
            steps,
            error: header.error.clone(),
            started_at: header.started_at.clone(),
            ended_at: header.ended_at.clone(),
            paused: match header.status {
                ExecStatus::Running => self.pause_record(eid).await?,
                _ => None,
            },
            queued: header.status == ExecStatus::Running && self.is_queued(eid).await?,
        }))
    }
}
