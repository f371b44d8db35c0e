//! The end of a step-run (`step.done` / `step.failed`) or of a loop
//! iteration (`loop.iteration.done` / `loop.iteration.failed`): a step's
//! result is stored (by reference when large, and under its step when
//! another step reads it), then [`boundary`] builds the one event, which
//! is published.

use noetl_core::limits::compact;
use noetl_mesh::{
    effects::{self, Effect},
    events::{self, BatchedEnd, EventDraft},
    handled::HandledError,
    keys::Keys,
    kv,
    payloads::{self, EventPayload, IterationEnded, LastTask, Status, StepEnded},
    MeshError,
};
use noetl_wire::{Event, TaskCommand};
use serde_json::{Map, Value};

use super::next::End;
use super::{Cursor, HandlerError, Held, StepRun};

impl StepRun<'_> {
    /// Publish the boundary of the step-run (or iteration), with the last
    /// task's `task.done` inside it when there is one and it fits.
    pub(super) async fn finish(
        &self,
        cur: &Cursor,
        end: End,
        last: Option<Held>,
    ) -> Result<(), HandlerError> {
        let end = match (&self.loop_run, end) {
            // Boxed, like the publishes below: an iteration's end awaits
            // neither, and its future would carry them (docs/performance.md
            // "Futures that move").
            (None, End::Done(result)) => End::Done(Box::pin(self.store_result(result)).await?),
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
        let (held_at, last) = match last {
            Some(Held { at_ms, last }) => (Some(at_ms), Some(Box::new(last))),
            None => (None, None),
        };
        let ended = ended(Boundary {
            end,
            args: &self.event_args,
            handled: &cur.handled,
            last,
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
        // An iteration of a batch: its end is reported with the batch's,
        // unless it is too large to ride in one.
        let ended = match (self.batch.map(|b| &b.ends), ended) {
            (Some(ends), Ended::Iteration(it)) => {
                // The batch names its loop run as its command's step-run.
                let batch_run = &self.cmd.step_run_id;
                let at_ms = events::now_ms();
                let end = payloads::compact_end(batch_run, at_ms, &it);
                if events::fits_a_batch(end.len(), batch_run) {
                    ends.push(BatchedEnd {
                        index: it.index,
                        at_ms,
                        end,
                    });
                    return Ok(());
                }
                Ended::Iteration(it)
            }
            (_, ended) => ended,
        };
        let built = publishable(self.cmd, &self.step.step, ended);
        if let (Some(at_ms), Some(left)) = (held_at, built.left) {
            // Too large to ride along: stored on its own, before the end.
            let event = self.held_event(&left, at_ms);
            Box::pin(self.mesh().emit(&event)).await?.wait().await?;
        }
        Box::pin(effects::apply(self.mesh(), vec![Effect::Emit(built.event)])).await?;
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
    /// How it ended (a step's result already stored).
    pub end: End,
    /// The step's args as they came on the wire, for a step's event.
    pub args: &'a Value,
    /// Task errors a policy rule handled in the step-run (or iteration).
    pub handled: &'a [HandledError],
    /// The last task's `task.done`, to carry inside the end.
    pub last: Option<Box<LastTask>>,
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

/// The end event [`boundary`] built.
pub(super) struct Built {
    /// The event.
    pub event: Event,
    /// The last task's `task.done` when carrying it would not leave the
    /// event whole: it is stored on its own, before the end.
    pub left: Option<Box<LastTask>>,
}

/// What ends a step-run or an iteration, before it is an event.
pub(super) enum Ended {
    /// `step.done` / `step.failed`.
    Step(StepEnded),
    /// `loop.iteration.done` / `loop.iteration.failed`.
    Iteration(IterationEnded),
}

/// What ends a step-run (`step.done` / `step.failed`) or an iteration
/// (`loop.iteration.done` / `loop.iteration.failed`).
pub(super) fn ended(b: Boundary<'_>) -> Ended {
    match (b.iteration, b.end) {
        (None, end) => {
            let ended = match end {
                End::Done(r) => StepEnded::done(r, b.args.clone()),
                End::Failed(e) => StepEnded::failed(e, b.args.clone()),
            };
            Ended::Step(StepEnded {
                handled: b.handled.to_vec(),
                last_task: b.last,
                ..ended
            })
        }
        (Some(it), end) => {
            let (status, result, error) = match end {
                End::Done(r) => (Status::Ok, r, Value::Null),
                End::Failed(e) => (Status::Error, Value::Null, e),
            };
            Ended::Iteration(IterationEnded {
                loop_run_id: it.loop_run_id.to_string(),
                index: it.index,
                status,
                result: compact(&result, it.limit),
                iter: compact(&Value::Object(it.iter.clone()), it.limit),
                reduce: it.reduce.clone(),
                error,
                handled: b.handled.to_vec(),
                last_task: b.last,
            })
        }
    }
}

/// The event of `ended`, the end of command `cmd`'s step-run (or
/// iteration, one event per index) of `step`.
pub(super) fn publishable(cmd: &TaskCommand, step: &str, ended: Ended) -> Built {
    let draft = EventDraft {
        execution_id: &cmd.execution_id,
        step_run_id: &cmd.step_run_id,
        step,
        trace_id: &cmd.trace_id,
        parent_id: &cmd.command_id,
        ..Default::default()
    };
    match ended {
        Ended::Step(ended) => carrying(draft, ended, |p| p.last_task.take()),
        Ended::Iteration(ended) => {
            let index = ended.index.to_string();
            let draft = EventDraft {
                discriminator: &index,
                ..draft
            };
            carrying(draft, ended, |p| p.last_task.take())
        }
    }
}

/// The event of `payload`, whole with the last task's `task.done` it
/// carries; without it (`strip` takes it out) when the two together would
/// not fit an event whole.
fn carrying<P: EventPayload>(
    draft: EventDraft<'_>,
    mut payload: P,
    strip: impl Fn(&mut P) -> Option<Box<LastTask>>,
) -> Built {
    if let Some(event) = draft.clone().build_whole(&payload) {
        return Built { event, left: None };
    }
    let left = strip(&mut payload);
    Built {
        event: draft.build(&payload),
        left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boundary(cmd: &TaskCommand, b: Boundary<'_>) -> Built {
        publishable(cmd, "s", ended(b))
    }
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
        let done = boundary(
            &c,
            Boundary {
                end: End::Done(json!([1, 2])),
                args: &args,
                handled: &[],
                last: None,
                iteration: None,
            },
        )
        .event;
        assert_eq!(done.event_type, EventType::StepDone.wire_name());
        assert_eq!(
            (done.step_run_id.as_str(), done.parent_id.as_str()),
            ("sr1", "c1")
        );
        assert_eq!(payload(&done)["result"], json!([1, 2]));
        assert_eq!(payload(&done)["args"], args);
        let failed = boundary(
            &c,
            Boundary {
                end: End::Failed(json!({"kind": "http", "message": "503"})),
                args: &args,
                handled: &[],
                last: None,
                iteration: None,
            },
        )
        .event;
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
            boundary(
                &c,
                Boundary {
                    end,
                    args: &Value::Null,
                    handled: &[],
                    last: None,
                    iteration: Some(Iteration {
                        loop_run_id: "sr1",
                        index,
                        iter: &iter,
                        reduce: &reduce,
                        limit: 1 << 20,
                    }),
                },
            )
            .event
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

    fn task_done(result: Value) -> LastTask {
        LastTask {
            task: "t".into(),
            task_run_id: "tr1".into(),
            done: noetl_mesh::payloads::TaskDone {
                duration_ms: 2,
                set_ctx: Some(Map::from_iter([("k".to_string(), json!(1))])),
                ..noetl_mesh::payloads::TaskDone::ok(result, "continue")
            },
        }
    }

    #[test]
    fn the_last_task_rides_inside_the_end_and_unfolds_as_the_task_done_it_stands_for() {
        let c = cmd();
        let end = |last: LastTask| {
            boundary(
                &c,
                Boundary {
                    end: End::Done(json!("r")),
                    args: &Value::Null,
                    handled: &[],
                    last: Some(Box::new(last)),
                    iteration: None,
                },
            )
        };
        let built = end(task_done(json!("r")));
        assert!(built.left.is_none());
        // What the task's own event would have been.
        let alone = EventDraft {
            execution_id: "e1",
            step_run_id: "sr1",
            task_run_id: "tr1",
            step: "s",
            task: "t",
            trace_id: "tr",
            parent_id: "c1",
            ..Default::default()
        }
        .build(&task_done(json!("r")).done);
        let read: Vec<Event> = noetl_mesh::events::unfold(built.event.clone()).collect();
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].event_type, EventType::TaskDone.wire_name());
        assert_eq!(
            (
                read[0].event_id.as_str(),
                read[0].task.as_str(),
                read[0].task_run_id.as_str()
            ),
            (alone.event_id.as_str(), "t", "tr1")
        );
        assert_eq!(payload(&read[0]), payload(&alone));
        assert_eq!(read[1].event_id, built.event.event_id);
        assert!(payload(&read[1]).get("last_task").is_none());
        assert_eq!(payload(&read[1])["result"], "r");
        // A task whose end would not leave the step's whole rides alone.
        let big = "x".repeat(noetl_core::limits::MAX_EVENT_PAYLOAD_BYTES);
        let built = end(task_done(json!(big)));
        assert_eq!(built.left.map(|l| l.task), Some("t".to_string()));
        assert!(payload(&built.event).get("last_task").is_none());
        assert_eq!(noetl_mesh::events::unfold(built.event).count(), 1);
    }
}
