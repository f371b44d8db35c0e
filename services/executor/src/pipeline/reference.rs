//! What travels by reference (reference-first): a large `_prev` or task
//! result goes to object storage before it rides in a command or a
//! checkpoint, and is read back once when a command starts.

use noetl_core::StepError;
use noetl_mesh::{ids::derive_id, objects, Mesh, MeshError};
use serde_json::{Map, Value};

use super::next::End;
use super::{Cursor, HandlerError, StepRun};

impl StepRun<'_> {
    /// Results above this many bytes travel by reference.
    fn payload_limit(&self) -> usize {
        self.plan
            .max_payload_bytes(self.mesh().config().inline_limit)
    }

    /// `_prev` and task results handed over by reference are read back
    /// once, here. `Some` (the step-run fails; its arcs may handle that)
    /// when one is gone for good.
    pub(super) async fn hydrate_prev(&self, cur: &mut Cursor) -> Result<Option<End>, HandlerError> {
        let names: Vec<String> = cur.results.keys().cloned().collect();
        for name in std::iter::once(None).chain(names.into_iter().map(Some)) {
            let slot = match &name {
                None => &mut cur.prev,
                Some(n) => match cur.results.get_mut(n) {
                    Some(v) => v,
                    None => continue,
                },
            };
            match self.mesh().results().hydrate(std::mem::take(slot)).await {
                Ok(v) => *slot = v,
                Err(e) if e.is_permanent() => {
                    let task = self.needs.tasks.get(cur.pc).map(|t| t.name.as_str());
                    let error = StepError::new("result.unavailable", e.to_string(), task);
                    return Ok(Some(End::Failed(error.to_value())));
                }
                Err(e) => return Err(MeshError::from(e).into()),
            }
        }
        Ok(None)
    }

    /// Move a large `_prev` (and large task results) to object storage
    /// before it rides in a command or a checkpoint (the next command
    /// hydrates it).
    pub(super) async fn spill_prev(&self, cur: &mut Cursor) -> Result<(), MeshError> {
        let spill = self.spill();
        cur.prev = spill.prev_by_reference(cur).await?;
        cur.results = spill.results_by_reference(cur).await?;
        Ok(())
    }

    /// What offloading this step-run's values needs.
    pub(super) fn spill(&self) -> Spill<'_> {
        Spill {
            mesh: self.mesh(),
            eid: self.eid(),
            step: &self.step.step,
            srid: &self.cmd.step_run_id,
            index: &self.index,
            limit: self.payload_limit(),
        }
    }

    /// `value`, or its reference under `id` in object storage when it is
    /// above the payload limit (reference-first).
    pub(super) async fn offload(&self, id: &str, value: &Value) -> Result<Value, MeshError> {
        self.spill().offload(id, value).await
    }
}

/// Where a step-run's large values go, and what naming them needs: a
/// step-run's own (`StepRun::spill`), or an iteration's rebuilt by
/// `noetl admin rebuild` without a command to run.
pub(super) struct Spill<'a> {
    pub mesh: &'a Mesh,
    pub eid: &'a str,
    pub step: &'a str,
    pub srid: &'a str,
    /// The iteration index as text (`""` outside loops), for ids.
    pub index: &'a str,
    /// Values above this many bytes travel by reference.
    pub limit: usize,
}

impl Spill<'_> {
    /// `cur.results`, each one above the limit as its reference.
    pub(super) async fn results_by_reference(
        &self,
        cur: &Cursor,
    ) -> Result<Map<String, Value>, MeshError> {
        let mut out = Map::with_capacity(cur.results.len());
        for (name, v) in &cur.results {
            let v = if objects::is_small(v, self.limit) {
                v.clone()
            } else {
                let id = derive_id(&[
                    self.srid,
                    self.index,
                    "task",
                    name,
                    &cur.steps_taken.to_string(),
                ]);
                self.offload(&id, v).await?
            };
            out.insert(name.clone(), v);
        }
        Ok(out)
    }

    /// `cur.prev`, or its reference when it is above the limit.
    pub(super) async fn prev_by_reference(&self, cur: &Cursor) -> Result<Value, MeshError> {
        if objects::is_small(&cur.prev, self.limit) {
            return Ok(cur.prev.clone());
        }
        let id = format!("{}.{}.prev.{}", self.srid, self.index, cur.steps_taken);
        self.offload(&id, &cur.prev).await
    }

    /// `value`, or its reference under `id` in object storage when it is
    /// above the limit (reference-first).
    pub(super) async fn offload(&self, id: &str, value: &Value) -> Result<Value, MeshError> {
        let put = objects::PutParams {
            execution_id: self.eid,
            step: self.step,
            id,
            value,
        };
        Ok(self.mesh.results().offload(put, self.limit).await?)
    }
}
