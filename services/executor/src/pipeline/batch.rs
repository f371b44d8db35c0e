//! A batch of loop iterations in one command (docs/architecture.md "Loop
//! windows in batches"): each iteration runs its pipeline as the command
//! of its own would, one in the batch's own slot and one more in each slot
//! of the replica that is free (`--concurrency` bounds them all), and the
//! ends of those that end here are reported together in
//! `batch.completed` instead of one event each.
//!
//! A batch runs only the iterations its loop run has not counted (one read
//! of the run per batch), so a redelivered one runs what is left; the ends
//! it reports again are the same event when they are the same iterations
//! (the event's id is derived from their indices).

use std::sync::{Mutex, PoisonError};

use futures::StreamExt;
use noetl_core::Step;
use noetl_mesh::{
    commands,
    effects::{self, Effect},
    events::{self, BatchedEnd, EventDraft},
    handler::{Handled, StepOf},
    keys::Keys,
    kv,
    state::LoopProgress,
};
use noetl_wire::TaskCommand;
use tokio::sync::OwnedSemaphorePermit;

use super::{Executor, HandlerError};

/// The ends of a batch's iterations, collected as they end, in the
/// compact form the batch's report carries.
#[derive(Default)]
pub(super) struct Ends(Mutex<Vec<BatchedEnd>>);

impl Ends {
    /// Keep an iteration's `end`.
    pub(super) fn push(&self, end: BatchedEnd) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(end);
    }

    fn take(&self) -> Vec<BatchedEnd> {
        let mut ends = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        ends.sort_by_key(|e| e.index);
        ends
    }
}

impl Executor {
    /// Run the iterations of batch command `cmd` of the step `at` names
    /// (those its loop run has not counted), then report the ends of
    /// those that ended here in `batch.completed`. Ends are reported even
    /// when another iteration's run failed; the failure is then the
    /// handler's, and the batch comes again.
    pub(super) async fn run_batch(
        &self,
        mut cmd: TaskCommand,
        at: &StepOf,
        redelivered: bool,
    ) -> Result<Handled, HandlerError> {
        let (plan, step) = (&at.plan, at.step());
        let items = std::mem::take(&mut cmd.batch);
        // Read once per batch, whatever its delivery: a window sent again
        // after a loop-supervisor's crash may name iterations counted since.
        let progress = match items.first() {
            Some(first) => {
                let key = Keys::loop_run(&cmd.execution_id, &first.loop_run_id);
                kv::get::<LoopProgress>(self.mesh.loop_kv(), &key).await?
            }
            None => None,
        };
        let mut waiting: std::collections::VecDeque<TaskCommand> = items
            .into_iter()
            .filter(|it| !progress.as_ref().is_some_and(|p| p.counted(it.index)))
            .map(|it| TaskCommand {
                command_id: commands::iteration_command_id(&it.loop_run_id, it.index),
                iteration: Some(it),
                ..cmd.clone()
            })
            .collect();
        // The batch's own slot runs one iteration at a time; each free slot
        // of the replica runs one more, taken as soon as it frees (another
        // batch or command ending), not only when one of ours ends. Never
        // waiting for a slot before it runs one, a batch cannot starve
        // others that hold the rest.
        let ends = Ends::default();
        // Each run boxed: `running` moves small futures (docs/performance.md).
        let start = |one: TaskCommand, slot: Option<OwnedSemaphorePermit>| {
            let ends = &ends;
            async move {
                let handled = Box::pin(self.run(plan, step, &one, redelivered, Some(ends))).await;
                (one, handled, slot)
            }
        };
        let mut running = futures::stream::FuturesUnordered::new();
        let mut own_free = true;
        let mut ran = Vec::with_capacity(waiting.len());
        loop {
            while !waiting.is_empty() {
                let slot = if own_free {
                    own_free = false;
                    None
                } else {
                    match self.slots.clone().try_acquire_owned() {
                        Ok(permit) => Some(permit),
                        Err(_) => break,
                    }
                };
                running.push(start(waiting.pop_front().expect("not empty"), slot));
            }
            // Nothing runs: the own slot is free, so nothing waits either.
            if running.is_empty() {
                break;
            }
            let freed = tokio::select! {
                biased;
                done = running.next() => Freed::Ended(done.expect("some run")),
                permit = self.slots.clone().acquire_owned(), if !waiting.is_empty() => {
                    Freed::Slot(permit.expect("the slots are never closed"))
                }
            };
            match freed {
                Freed::Ended((one, handled, slot)) => {
                    own_free |= slot.is_none();
                    ran.push((one, handled));
                }
                Freed::Slot(permit) => {
                    running.push(start(waiting.pop_front().expect("some wait"), Some(permit)));
                }
            }
        }
        let ends = ends.take();
        if !ends.is_empty() {
            let draft = EventDraft {
                execution_id: &cmd.execution_id,
                step_run_id: &cmd.step_run_id,
                step: &step.step,
                trace_id: &cmd.trace_id,
                parent_id: &cmd.command_id,
                ..Default::default()
            };
            let reports = events::batch_completed(draft, &ends);
            effects::apply(&self.mesh, reports.into_iter().map(Effect::Emit).collect()).await?;
        }
        let mut waiting = Vec::new();
        for (one, handled) in ran {
            if let Handled::NotYet(wait) = handled? {
                waiting.push(later(plan, step, one, wait));
            }
        }
        effects::apply(&self.mesh, waiting).await?;
        Ok(Handled::Done)
    }
}

/// What a batch waiting to run more iterations woke for.
enum Freed<T> {
    /// One of its iterations ended (its slot with it).
    Ended(T),
    /// A slot of the replica freed, now the batch's.
    Slot(OwnedSemaphorePermit),
}

/// An iteration that must wait (its step limits its task calls, which the
/// loop-supervisor does not batch; a batch of an older plan): its command
/// on its own, due after `wait`.
fn later(
    plan: &noetl_mesh::plan::PlanRecord,
    step: &Step,
    mut cmd: TaskCommand,
    wait: std::time::Duration,
) -> Effect {
    cmd.not_before_ms = events::now_ms() + wait.as_millis() as u64;
    let kind = step.tool.first().map_or_else(String::new, |t| {
        noetl_core::workbook::effective_kind(plan.playbook.workbook.as_ref(), t)
    });
    Effect::Command { kind, cmd }
}
