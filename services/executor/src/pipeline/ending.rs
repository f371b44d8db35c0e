//! The end of a step-run (`step.done` / `step.failed`) or of a loop
//! iteration (`loop.iteration.done` / `loop.iteration.failed`): a step's
//! result is stored (by reference when large, and under its step when
//! another step reads it), then [`boundary`] builds the one event, which
//! is published.

use noetl_core::limits::compact;
use noetl_mesh::{
    effects::{self, Effect},
    events::EventDraft,
    handled::HandledError,
    keys::Keys,
    kv,
    payloads::{IterationEnded, Status, StepEnded},
    MeshError,
};
use noetl_wire::{Event, TaskCommand};
use serde_json::{Map, Value};

use super::next::End;
use super::{Cursor, HandlerError, StepRun};

impl StepRun<'_> {
    /// Publish the boundary of the step-run (or iteration).
    pub(super) async fn finish(&self, cur: &Cursor, end: End) -> Result<(), HandlerError> {
        let end = match (&self.loop_run, end) {
            (None, End::Done(result)) => End::Done(self.store_result(result).await?),
            (None, End::Failed(error)) => {
                tracing::info!(
                    execution_id = %self.eid(),
                    step = %self.step.step,
                    task = %error["task"].as_str().unwrap_or(""),
                    kind = %error["kind"].as_str().unwrap_or(""),
                    "step failed"
                );
                End::Failed(error)
            }
            (Some(_), end) => end,
        };
        let ev = boundary(Boundary {
            cmd: self.cmd,
            step: &self.step.step,
            end,
            args: &self.event_args,
            handled: &cur.handled,
            iteration: self
                .loop_run
                .as_ref()
                .map(|(loop_run_id, index)| Iteration {
                    loop_run_id,
                    index: *index,
                    iter: &cur.iter,
                    reduce: &cur.reduce,
                    limit: self.mesh().config().inline_limit,
                }),
        });
        effects::apply(self.mesh(), vec![Effect::Emit(ev)]).await?;
        Ok(())
    }

    /// Reference-first: a step's result above the limit is stored in
    /// object storage and travels (event, KV) as its reference; a result
    /// another step reads is kept under the step's name.
    async fn store_result(&self, result: Value) -> Result<Value, MeshError> {
        let result = self.offload(&self.cmd.step_run_id, &result).await?;
        if self.plan.is_result_referenced(&self.step.step) {
            kv::put(
                self.mesh().exec_kv(),
                &Keys::result(self.eid(), &self.step.step),
                &result,
            )
            .await?;
        }
        Ok(result)
    }
}

/// What the end event of a step-run (or iteration) says.
pub(super) struct Boundary<'a> {
    /// The command it ends in (ids, trace, the event's parent).
    pub cmd: &'a TaskCommand,
    /// The step.
    pub step: &'a str,
    /// How it ended (a step's result already stored).
    pub end: End,
    /// The step's args as they came on the wire, for a step's event.
    pub args: &'a Value,
    /// Task errors a policy rule handled in the step-run (or iteration).
    pub handled: &'a [HandledError],
    /// The loop iteration, when it is one.
    pub iteration: Option<Iteration<'a>>,
}

/// The loop iteration a step-run's command runs.
pub(super) struct Iteration<'a> {
    /// The loop run.
    pub loop_run_id: &'a str,
    /// The iteration's index.
    pub index: u64,
    /// Its `iter` at the end.
    pub iter: &'a Map<String, Value>,
    /// Its reducer contributions.
    pub reduce: &'a Map<String, Value>,
    /// Values above this many bytes are compacted.
    pub limit: usize,
}

/// The event that ends a step-run (`step.done` / `step.failed`) or an
/// iteration (`loop.iteration.done` / `loop.iteration.failed`, one per
/// index).
pub(super) fn boundary(b: Boundary<'_>) -> Event {
    let draft = EventDraft {
        execution_id: &b.cmd.execution_id,
        step_run_id: &b.cmd.step_run_id,
        step: b.step,
        trace_id: &b.cmd.trace_id,
        parent_id: &b.cmd.command_id,
        ..Default::default()
    };
    match (b.iteration, b.end) {
        (None, End::Done(result)) => draft.build(&StepEnded {
            handled: b.handled.to_vec(),
            ..StepEnded::done(result, b.args.clone())
        }),
        (None, End::Failed(error)) => draft.build(&StepEnded {
            handled: b.handled.to_vec(),
            ..StepEnded::failed(error, b.args.clone())
        }),
        (Some(it), end) => {
            let (status, result, error) = match end {
                End::Done(r) => (Status::Ok, r, Value::Null),
                End::Failed(e) => (Status::Error, Value::Null, e),
            };
            let ended = IterationEnded {
                loop_run_id: it.loop_run_id.to_string(),
                index: it.index,
                status,
                result: compact(&result, it.limit),
                iter: compact(&Value::Object(it.iter.clone()), it.limit),
                reduce: it.reduce.clone(),
                error,
                handled: b.handled.to_vec(),
            };
            let index = it.index.to_string();
            EventDraft {
                discriminator: &index,
                ..draft
            }
            .build(&ended)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_mesh::event_type::EventType;
    use noetl_mesh::events::payload;
    use serde_json::json;

    fn cmd() -> TaskCommand {
        TaskCommand {
            command_id: "c1".into(),
            execution_id: "e1".into(),
            step: "s".into(),
            step_run_id: "sr1".into(),
            trace_id: "tr".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_step_run_ends_with_step_done_or_step_failed_carrying_its_args() {
        let c = cmd();
        let args = json!({"n": 1});
        let done = boundary(Boundary {
            cmd: &c,
            step: "s",
            end: End::Done(json!([1, 2])),
            args: &args,
            handled: &[],
            iteration: None,
        });
        assert_eq!(done.event_type, EventType::StepDone.wire_name());
        assert_eq!(
            (done.step_run_id.as_str(), done.parent_id.as_str()),
            ("sr1", "c1")
        );
        assert_eq!(payload(&done)["result"], json!([1, 2]));
        assert_eq!(payload(&done)["args"], args);
        let failed = boundary(Boundary {
            cmd: &c,
            step: "s",
            end: End::Failed(json!({"kind": "http", "message": "503"})),
            args: &args,
            handled: &[],
            iteration: None,
        });
        assert_eq!(failed.event_type, EventType::StepFailed.wire_name());
        assert_eq!(payload(&failed)["error"]["kind"], "http");
        assert_ne!(done.event_id, failed.event_id);
    }

    #[test]
    fn an_iteration_ends_once_per_index_with_its_iter_and_contributions() {
        let c = cmd();
        let iter = Map::from_iter([("page".to_string(), json!(3))]);
        let reduce = Map::from_iter([("total".to_string(), json!(7))]);
        let ended = |index: u64, end: End| {
            boundary(Boundary {
                cmd: &c,
                step: "s",
                end,
                args: &Value::Null,
                handled: &[],
                iteration: Some(Iteration {
                    loop_run_id: "sr1",
                    index,
                    iter: &iter,
                    reduce: &reduce,
                    limit: 1 << 20,
                }),
            })
        };
        let done = ended(4, End::Done(json!("ok")));
        assert_eq!(done.event_type, EventType::LoopIterationDone.wire_name());
        let p = payload(&done);
        assert_eq!(
            (p["index"].clone(), p["result"].clone()),
            (json!(4), json!("ok"))
        );
        assert_eq!(
            (p["iter"]["page"].clone(), p["reduce"]["total"].clone()),
            (json!(3), json!(7))
        );
        assert_ne!(ended(5, End::Done(json!("ok"))).event_id, done.event_id);
        let failed = ended(4, End::Failed(json!({"kind": "x"})));
        assert_eq!(
            failed.event_type,
            EventType::LoopIterationFailed.wire_name()
        );
        assert_eq!(payload(&failed)["status"], "error");
        assert_eq!(payload(&failed)["error"]["kind"], "x");
    }
}
