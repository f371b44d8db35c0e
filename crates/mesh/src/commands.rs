//! The first command of a step-run or of one loop iteration: built and
//! published in one place (the scheduler starts steps, the
//! loop-supervisor starts iterations; the executor builds the commands
//! that continue a pipeline).

use noetl_wire::{IterationRef, TaskCommand, Token};
use serde_json::Value;

use crate::{codec, ids::derive_id, plan::PlanRecord, Mesh, MeshError, PendingAck};

// Pure ids, in the leaf `ids` so the event readers name them without
// depending on this module.
pub use crate::ids::{batch_key, iteration_command_id};

/// What the command running task 0 (attempt 1) needs.
pub struct FirstTask<'a> {
    /// Execution.
    pub execution_id: &'a str,
    /// Step name.
    pub step: &'a str,
    /// The step-run (for an iteration: the loop run).
    pub step_run_id: &'a str,
    /// The step's args.
    pub args: &'a Value,
    /// Trace correlation.
    pub trace_id: &'a str,
    /// The step-run's deadline (epoch ms, 0: none) and what set it.
    pub deadline: (u64, &'a str),
    /// For a loop iteration: its index and `iter`.
    pub iteration: Option<(u64, &'a Value)>,
    /// For a loop iteration: the items of the loop's collection
    /// (`loop.length`).
    pub total: u64,
}

/// The command that runs task 0 of a step-run or iteration, attempt 1. Its
/// id is derived from the step-run (and index), so a redelivered start
/// publishes the same command and JetStream drops the copy.
pub fn first_task(p: FirstTask<'_>) -> TaskCommand {
    let (command_id, iteration) = match p.iteration {
        None => (derive_id(&[p.step_run_id, "task", "0", "1"]), None),
        Some((index, iter)) => (
            iteration_command_id(p.step_run_id, index),
            Some(iteration_ref(&p, index, iter)),
        ),
    };
    TaskCommand {
        command_id,
        execution_id: p.execution_id.to_string(),
        step: p.step.to_string(),
        step_run_id: p.step_run_id.to_string(),
        pc: 0,
        attempt: 1,
        args_json: codec::json_bytes(p.args),
        prev_json: Vec::new(),
        iteration,
        not_before_ms: 0,
        trace_id: p.trace_id.to_string(),
        steps_taken: 0,
        resume_outcome_json: Vec::new(),
        deadline_ms: p.deadline.0,
        deadline_of: p.deadline.1.to_string(),
        results_json: Vec::new(),
        claim: None,
        handled_json: Vec::new(),
        batch: Vec::new(),
    }
}

fn iteration_ref(p: &FirstTask<'_>, index: u64, iter: &Value) -> IterationRef {
    IterationRef {
        loop_run_id: p.step_run_id.to_string(),
        index,
        iter_json: codec::json_bytes(iter),
        reduce_json: Vec::new(),
        total: p.total,
    }
}

/// The command that runs iterations `items` (index and `iter`) of the loop
/// run `p` names as one batch (`p.iteration` is ignored): each as
/// [`first_task`] would run it alone.
pub fn first_batch(p: FirstTask<'_>, items: &[(u64, &Value)]) -> TaskCommand {
    let key = batch_key(items.iter().map(|(i, _)| *i));
    let batch = items
        .iter()
        .map(|(i, iter)| iteration_ref(&p, *i, iter))
        .collect();
    TaskCommand {
        command_id: derive_id(&[p.step_run_id, "batch", &key]),
        batch,
        ..first_task(FirstTask {
            iteration: None,
            ..p
        })
    }
}

/// A task command set aside in KV until its task can go on (a child
/// execution's continuation of its parent task, a `wait` task's waiter):
/// its protobuf, base64.
pub fn park_command(cmd: &TaskCommand) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(codec::encode(cmd))
}

/// The command [`park_command`] set aside under `key` (bucket exec, for
/// the error): `Corrupt` when it does not decode.
pub fn unpark_command(mesh: &Mesh, key: &str, parked: &str) -> Result<TaskCommand, MeshError> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(parked.as_bytes())
        .map_err(|e| MeshError::Corrupt {
            bucket: mesh.exec_kv().name.clone(),
            key: key.to_string(),
            message: format!("the parked task command is not base64: {e}"),
        })?;
    Ok(codec::decode("parked task command", &bytes)?)
}

/// A parked task command to continue with its task's outcome.
pub struct Continue<'a> {
    /// The parked command ([`park_command`]).
    pub parked: &'a str,
    /// The key it was parked under (bucket exec), for errors.
    pub key: &'a str,
    /// The kind whose executors continue the pipeline (`playbook`,
    /// `wait`).
    pub kind: &'a str,
    /// The task's outcome.
    pub outcome: serde_json::Value,
    /// The continuation's command (and message) id: the same for every
    /// publish of one continuation, so JetStream keeps one.
    pub command_id: String,
}

impl Mesh {
    /// Publish a parked command again with its task's outcome: the
    /// executors of `c.kind` continue its pipeline at that task.
    pub async fn continue_parked(&self, c: Continue<'_>) -> Result<(), MeshError> {
        let mut cmd = unpark_command(self, c.key, c.parked)?;
        cmd.resume_outcome_json = codec::json_bytes(&c.outcome);
        cmd.command_id = c.command_id;
        self.publish_command(c.kind, &cmd).await?.wait().await
    }

    /// Publish `cmd` for `task` of `plan` on its kind's subject (the
    /// workbook may give the kind), naming the execution in a header so a
    /// dead-lettered command still fails it. When no executor serves the
    /// kind, its `task.unserved` timer is emitted too
    /// ([`Mesh::watch_dispatch`]).
    pub async fn publish_task(
        &self,
        plan: &PlanRecord,
        task: &noetl_core::Task,
        cmd: &TaskCommand,
    ) -> Result<PendingAck, MeshError> {
        let kind = noetl_core::workbook::effective_kind(plan.playbook.workbook.as_ref(), task);
        self.publish_task_of_kind(&kind, &task.name, cmd).await
    }

    /// [`Mesh::publish_task`] for a task whose kind is already resolved.
    pub async fn publish_task_of_kind(
        &self,
        kind: &str,
        task: &str,
        cmd: &TaskCommand,
    ) -> Result<PendingAck, MeshError> {
        let ack = self.publish_command(kind, cmd).await?;
        if let Some(timer) = self.watch_dispatch(kind, task, cmd).await? {
            timer.wait().await?;
        }
        Ok(ack)
    }

    /// Publish `cmd` on `kind`'s task subject, naming the execution in a
    /// header, without a `task.unserved` timer (a delayed retry, a cursor
    /// loop's claim; [`Mesh::publish_task_of_kind`] adds the timer).
    pub async fn publish_command(
        &self,
        kind: &str,
        cmd: &TaskCommand,
    ) -> Result<PendingAck, MeshError> {
        self.publish_for_execution(
            self.subjects().task(kind),
            &cmd.command_id,
            &cmd.execution_id,
            codec::encode(cmd),
        )
        .await
    }

    /// Publish a token on its execution's token subject (its id is the
    /// message id: a repeated publish is dropped by JetStream).
    pub async fn publish_token(&self, token: &Token) -> Result<PendingAck, MeshError> {
        self.publish(
            self.subjects().token(&token.execution_id),
            &token.token_id,
            codec::encode(token),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params<'a>(args: &'a Value, iteration: Option<(u64, &'a Value)>) -> FirstTask<'a> {
        FirstTask {
            execution_id: "e1",
            step: "fetch",
            step_run_id: "sr1",
            args,
            trace_id: "t1",
            deadline: (5_000, "step \"fetch\" lifecycle.timeout_s: 5"),
            iteration,
            total: 9,
        }
    }

    #[test]
    fn a_step_run_s_first_command_runs_task_0_attempt_1_with_a_stable_id() {
        let args = json!({"a": 1});
        let cmd = first_task(params(&args, None));
        assert_eq!(cmd.command_id, derive_id(&["sr1", "task", "0", "1"]));
        assert_eq!(
            cmd,
            first_task(params(&args, None)),
            "same input, same command"
        );
        assert_eq!((cmd.pc, cmd.attempt, cmd.steps_taken), (0, 1, 0));
        assert_eq!(codec::json_value(&cmd.args_json).unwrap(), args);
        assert_eq!((cmd.deadline_ms, cmd.iteration.is_none()), (5_000, true));
        assert_eq!(cmd.deadline_of, "step \"fetch\" lifecycle.timeout_s: 5");
    }

    #[test]
    fn an_iteration_s_first_command_carries_its_index_and_iter() {
        let args = json!({});
        let iter = json!({"city": "Oslo", "index": 3});
        let cmd = first_task(params(&args, Some((3, &iter))));
        assert_eq!(cmd.command_id, derive_id(&["sr1", "iter", "3"]));
        let it = cmd.iteration.expect("an iteration");
        assert_eq!((it.loop_run_id.as_str(), it.index, it.total), ("sr1", 3, 9));
        assert_eq!(codec::json_value(&it.iter_json).unwrap(), iter);
        assert!(it.reduce_json.is_empty());
    }
}
