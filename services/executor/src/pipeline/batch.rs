//! A batch of loop iterations in one command (docs/architecture.md "Loop
//! windows in batches"): each iteration runs its pipeline as the command
//! of its own would, one in the batch's own slot and one more in each slot
//! of the replica that is free (`--concurrency` bounds them all), and the
//! ends of those that end here are reported together in
//! `batch.completed` instead of one event each. A slot an iteration frees
//! passes to the batch's next one: the replica pulls new messages only
//! for slots no batch of its own still waits for. A batch of slow
//! iterations may also report the ends it has once its last iteration
//! started ([`reports_early`]), so the loop-supervisor refills the window
//! while the batch's last round runs.
//!
//! A batch runs only the iterations its loop run has not counted (one read
//! of the run per batch), so a redelivered one runs what is left; the ends
//! it reports again are the same event when they are the same iterations
//! (the event's id is derived from their indices).

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

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
    MeshError,
};
use noetl_wire::TaskCommand;
use tokio::sync::OwnedSemaphorePermit;

use super::checkpoint::IterationsLog;
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

    /// How many ends are kept (not reported yet).
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    fn take(&self) -> Vec<BatchedEnd> {
        let mut ends = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        ends.sort_by_key(|e| e.index);
        ends
    }
}

/// What the iterations of a batch share as they run: their ends, kept to
/// be reported together, and the events a redelivered one rebuilds a lost
/// checkpoint from, read once for them all.
pub(super) struct Shared {
    /// The ends not reported yet.
    pub(super) ends: Ends,
    /// The batch's events for lost checkpoints.
    pub(super) log: IterationsLog,
}

impl Shared {
    /// For the iterations `waiting` to run, none ended yet.
    fn of(waiting: &Waiting<'_>) -> Self {
        Self {
            ends: Ends::default(),
            log: IterationsLog::of(waiting.indices()),
        }
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
        let mut waiting = self.uncounted(&mut cmd).await?;
        // The batch's own slot runs one iteration at a time; each free slot
        // of the replica runs one more, taken as soon as it frees (another
        // batch or command ending), not only when one of ours ends. Never
        // waiting for a slot before it runs one, a batch cannot starve
        // others that hold the rest.
        let shared = Shared::of(&waiting);
        // Each run boxed: `running` moves small futures (docs/performance.md).
        let start = |one: TaskCommand, slot: Option<OwnedSemaphorePermit>| {
            let shared = &shared;
            async move {
                let handled = Box::pin(self.run(plan, step, &one, redelivered, Some(shared))).await;
                (one, handled, slot)
            }
        };
        let mut running = futures::stream::FuturesUnordered::new();
        let mut own_free = true;
        let mut ran = Vec::with_capacity(waiting.len());
        let started = std::time::Instant::now();
        // How long the batch's first iteration took (until it reports early).
        let mut first_end = None;
        let mut early = Early::NotYet;
        let mut failed = None;
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
                sent = early.sent(), if matches!(early, Early::Sending(_)) => Freed::Reported(sent),
                permit = self.slots.clone().acquire_owned(), if !waiting.is_empty() => {
                    Freed::Slot(permit.expect("the slots are never closed"))
                }
            };
            match freed {
                Freed::Ended((one, handled, slot)) => {
                    ran.push((one, handled));
                    // The slot goes on to the batch's next iteration, not
                    // back to the replica, whose consumer loop would take
                    // it first and pull a message it has no slot for.
                    match waiting.pop_front() {
                        Some(next) => running.push(start(next, slot)),
                        None => own_free |= slot.is_none(),
                    }
                    if matches!(early, Early::NotYet)
                        && reports_early(&Now {
                            first_end: *first_end.get_or_insert_with(|| started.elapsed()),
                            ended: shared.ends.len(),
                            waiting: waiting.len(),
                            running: running.len(),
                            queued: self.queued.load(Ordering::Relaxed),
                        })
                    {
                        let report = self.report(&cmd, step, shared.ends.take());
                        early = Early::Sending(Box::pin(report));
                    }
                }
                Freed::Reported(sent) => {
                    // Failed: the iterations running still end (a handler
                    // error mid-call would cut them off), then the batch
                    // comes again for those the report did not count.
                    failed = sent.err();
                    early = Early::Sent;
                }
                Freed::Slot(permit) => {
                    running.push(start(waiting.pop_front().expect("some wait"), Some(permit)));
                }
            }
        }
        if let Early::Sending(report) = early {
            failed = report.await.err();
        }
        self.report(&cmd, step, shared.ends.take()).await?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        effects::apply(&self.mesh, later_all(plan, step, ran)?).await?;
        Ok(Handled::Done)
    }

    /// The iterations of batch command `cmd` (taken out of it) its loop run
    /// has not counted, each as its own command, waiting to start. The run
    /// is read once per batch, whatever its delivery: a window sent again
    /// after a loop-supervisor's crash may name iterations counted since.
    /// A run missing from the loop bucket (a purge) is asked of the log:
    /// an iteration whose end is stored does not run again.
    async fn uncounted(&self, cmd: &mut TaskCommand) -> Result<Waiting<'_>, HandlerError> {
        let items = std::mem::take(&mut cmd.batch);
        let eid = cmd.execution_id.as_str();
        let (progress, ended) = match items.first() {
            Some(first) => {
                let key = Keys::loop_run(eid, &first.loop_run_id);
                match kv::get::<LoopProgress>(self.mesh.loop_kv(), &key).await? {
                    Some(p) => (Some(p), BTreeSet::new()),
                    None => {
                        let run = &first.loop_run_id;
                        (None, self.mesh.iterations_ended(eid, run).await?)
                    }
                }
            }
            None => (None, BTreeSet::new()),
        };
        let commands = items
            .into_iter()
            .filter(|it| !progress.as_ref().is_some_and(|p| p.counted(it.index)))
            .filter(|it| !ended.contains(&it.index))
            .map(|it| TaskCommand {
                command_id: commands::iteration_command_id(&it.loop_run_id, it.index),
                iteration: Some(it),
                ..cmd.clone()
            })
            .collect();
        Ok(Waiting::new(commands, &self.queued))
    }

    /// Report `ends` of batch `cmd` (of `step`) in `batch.completed`, if
    /// there are any.
    async fn report(
        &self,
        cmd: &TaskCommand,
        step: &Step,
        ends: Vec<BatchedEnd>,
    ) -> Result<(), MeshError> {
        if ends.is_empty() {
            return Ok(());
        }
        let draft = EventDraft {
            execution_id: &cmd.execution_id,
            step_run_id: &cmd.step_run_id,
            step: &step.step,
            trace_id: &cmd.trace_id,
            parent_id: &cmd.command_id,
            ..Default::default()
        };
        let reports = events::batch_completed(draft, &ends);
        effects::apply(&self.mesh, reports.into_iter().map(Effect::Emit).collect()).await
    }
}

/// How long a batch's first iteration must have run for the batch to
/// report early ([`reports_early`]).
const EARLY_AFTER: Duration = Duration::from_millis(5);

/// The fewest ends an early report carries ([`reports_early`]).
const EARLY_ENDS: usize = 8;

/// Where a batch stands as one of its iterations ends.
struct Now {
    /// How long its first iteration took.
    first_end: Duration,
    /// Its iterations' ends kept, not reported yet.
    ended: usize,
    /// Its iterations still to start.
    waiting: usize,
    /// Its iterations running.
    running: usize,
    /// Iterations of the replica's batches waiting for a slot.
    queued: usize,
}

/// Whether a batch reports the ends it has now, before its last: once it
/// started its last iteration, no batch of the replica waits for the slot
/// that freed, its iterations are slow (the first took at least
/// [`EARLY_AFTER`]), and it has at least [`EARLY_ENDS`] ends and as many
/// as still run. The slots its ended iterations free would otherwise idle
/// until the loop-supervisor, told of their ends only with the last,
/// sends more. Where another batch takes them, or the rest end at once
/// (noop, a short python call), a report now would only cut the window's
/// next batches smaller: the loop-supervisor sends the iterations a
/// report frees as one batch, so the floor keeps batches of 8 or more
/// from being cut into ever smaller ones.
fn reports_early(now: &Now) -> bool {
    now.waiting == 0
        && now.running > 0
        && now.queued == 0
        && now.first_end >= EARLY_AFTER
        && now.ended >= EARLY_ENDS.max(now.running)
}

/// A batch's iterations still to start, counted in the replica's
/// [`Executor::queued`] until they start or the batch is dropped.
struct Waiting<'a> {
    commands: VecDeque<TaskCommand>,
    queued: &'a AtomicUsize,
}

impl<'a> Waiting<'a> {
    fn new(commands: VecDeque<TaskCommand>, queued: &'a AtomicUsize) -> Self {
        queued.fetch_add(commands.len(), Ordering::Relaxed);
        Self { commands, queued }
    }

    fn pop_front(&mut self) -> Option<TaskCommand> {
        let next = self.commands.pop_front()?;
        self.queued.fetch_sub(1, Ordering::Relaxed);
        Some(next)
    }

    fn len(&self) -> usize {
        self.commands.len()
    }

    /// The iterations' indices.
    fn indices(&self) -> BTreeSet<u64> {
        self.commands
            .iter()
            .filter_map(|c| c.iteration.as_ref().map(|it| it.index))
            .collect()
    }

    fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.queued
            .fetch_sub(self.commands.len(), Ordering::Relaxed);
    }
}

/// The commands of the iterations in `ran` that must wait ([`later`]),
/// or the first of their runs' errors.
fn later_all(
    plan: &noetl_mesh::plan::PlanRecord,
    step: &Step,
    ran: Vec<(TaskCommand, Result<Handled, HandlerError>)>,
) -> Result<Vec<Effect>, HandlerError> {
    let mut waiting = Vec::new();
    for (one, handled) in ran {
        if let Handled::NotYet(wait) = handled? {
            waiting.push(later(plan, step, one, wait));
        }
    }
    Ok(waiting)
}

impl Early<'_> {
    /// Wait for the report being sent (only while [`Early::Sending`]).
    async fn sent(&mut self) -> Result<(), MeshError> {
        match self {
            Early::Sending(report) => report.await,
            _ => unreachable!("waited for only while sending"),
        }
    }
}

/// A batch's early report ([`reports_early`]).
enum Early<'a> {
    /// Not due (yet).
    NotYet,
    /// Being published, beside the iterations still running.
    Sending(Pin<Box<dyn Future<Output = Result<(), MeshError>> + Send + 'a>>),
    /// Published.
    Sent,
}

/// What a batch waiting to run more iterations woke for.
enum Freed<T> {
    /// One of its iterations ended (its slot with it).
    Ended(T),
    /// A slot of the replica freed, now the batch's.
    Slot(OwnedSemaphorePermit),
    /// Its early report was published (or failed to be).
    Reported(Result<(), MeshError>),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch whose first iteration took `first_ms`, with `ended` ends
    /// kept, `waiting` and `running` iterations, on a replica whose other
    /// batches wait with `queued`.
    fn now(first_ms: u64, ended: usize, waiting: usize, running: usize, queued: usize) -> Now {
        Now {
            first_end: Duration::from_millis(first_ms),
            ended,
            waiting,
            running,
            queued,
        }
    }

    #[test]
    fn a_slow_batch_reports_early_when_the_slots_it_frees_would_idle() {
        // A batch of 64 on 16 slots: its last round started.
        assert!(reports_early(&now(20, 48, 0, 16, 0)));
        // Iterations still to start: the slots pass on, nothing idles.
        assert!(!reports_early(&now(20, 47, 1, 16, 0)));
        // Another batch of the replica takes the slots.
        assert!(!reports_early(&now(20, 48, 0, 16, 7)));
        // The last one ended: the final report says it all.
        assert!(!reports_early(&now(20, 64, 0, 0, 0)));
        // Quick iterations: the rest end before a report would matter.
        assert!(!reports_early(&now(0, 48, 0, 16, 0)));
        assert!(reports_early(&Now {
            first_end: EARLY_AFTER,
            ..now(0, 48, 0, 16, 0)
        }));
        // A batch that started at once: only once half of it ended, and
        // never fewer than eight ends (a batch of four never splits).
        assert!(!reports_early(&now(20, 7, 0, 9, 0)));
        assert!(reports_early(&now(20, 8, 0, 8, 0)));
        assert!(!reports_early(&now(20, 3, 0, 1, 0)));
    }

    #[test]
    fn a_batch_s_waiting_iterations_count_in_the_replica_until_they_start() {
        let queued = AtomicUsize::new(2);
        let mut w = Waiting::new((0..3).map(|_| TaskCommand::default()).collect(), &queued);
        assert_eq!(queued.load(Ordering::Relaxed), 5);
        w.pop_front().unwrap();
        assert_eq!((w.len(), queued.load(Ordering::Relaxed)), (2, 4));
        // A batch that stops (its handler failed) gives back the rest.
        drop(w);
        assert_eq!(queued.load(Ordering::Relaxed), 2);
    }
}
