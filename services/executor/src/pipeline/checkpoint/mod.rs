//! An iteration's checkpoint: where it is after a task that wrote `iter`
//! (the pagination pattern), so a command redelivered after a crash
//! resumes there instead of from the iteration's first task. A checkpoint
//! the loop bucket lost is folded back from the iteration's events
//! ([`from_log`]) by the redelivered command that misses it.

mod from_log;

use std::collections::BTreeSet;

use noetl_core::Step;
use noetl_mesh::{
    keys::Keys, kv, plan::PlanRecord, replay, runtime::HandlerError, state::Checkpoint, Mesh,
    MeshError,
};
use noetl_wire::{Event, TaskCommand};
use serde_json::Value;

use super::command::decode_command;
use super::reference::Spill;
use super::{Cursor, StepRun};
use crate::analysis::StepNeeds;
use from_log::{fold, FoldInput, Wanted};

impl Spill<'_> {
    /// The checkpoint record of `cur` (large values by reference).
    async fn checkpoint_record(&self, cur: &Cursor) -> Result<Checkpoint, MeshError> {
        Ok(Checkpoint {
            steps_taken: cur.steps_taken,
            pc: cur.pc,
            attempt: cur.attempt,
            prev: self.prev_by_reference(cur).await?,
            iter: cur.iter.clone(),
            reduce: cur.reduce.clone(),
            results: self.results_by_reference(cur).await?,
            handled: cur.handled.clone(),
        })
    }
}

/// What [`rebuild_checkpoint`] did with an iteration's checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointRebuilt {
    /// Written back from the events.
    Written,
    /// The loop bucket holds one: left as it is.
    Present,
    /// None is owed: no task of the iteration has changed `iter` yet, or
    /// the step's tasks never do (the live pipeline wrote none either).
    NotOwed,
    /// The events cannot give it, and why: a redelivered command starts
    /// the iteration over, as when no checkpoint was written.
    NotFolded(String),
}

/// For `noetl admin rebuild`: the events [`rebuild_checkpoint`] folds the
/// checkpoints of iterations `indices` of loop run `srid` (of step
/// `step`) from, hydrated: the log read a chunk at a time, keeping only
/// what those folds take (none when the step's tasks never change
/// `iter`: no checkpoint is owed).
pub async fn checkpoints_log(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    srid: &str,
    indices: &BTreeSet<u64>,
) -> Result<Vec<Event>, MeshError> {
    if !StepNeeds::of(plan, step).sets_iter {
        return Ok(Vec::new());
    }
    let mut wanted = Wanted::new(srid, indices);
    replay::hydrated_where(mesh, &plan.execution_id, |e| wanted.keeps(e)).await
}

/// For `noetl admin rebuild`: the checkpoint of the loop iteration whose
/// first command is `cmd` (as the loop-supervisor dispatches it), folded
/// from `log` (the execution's events, hydrated, in stream order) the way
/// a redelivered command folds it, and created where the loop bucket has
/// none.
pub async fn rebuild_checkpoint(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    cmd: &TaskCommand,
    log: &[Event],
) -> Result<CheckpointRebuilt, HandlerError> {
    let needs = StepNeeds::of(plan, step);
    let d = decode_command(cmd, &step.step)?;
    let Some((_, index)) = d.loop_run else {
        return Ok(CheckpointRebuilt::NotOwed);
    };
    if !needs.sets_iter {
        return Ok(CheckpointRebuilt::NotOwed);
    }
    let index = index.to_string();
    let key = Keys::checkpoint(&cmd.execution_id, &cmd.step_run_id, &index);
    if kv::get::<Value>(mesh.loop_kv(), &key).await?.is_some() {
        return Ok(CheckpointRebuilt::Present);
    }
    let input = FoldInput {
        step,
        needs: &needs,
        srid: &cmd.step_run_id,
        index: &index,
        log,
    };
    // As a redelivered command folds it: from its cursor without `ctx`
    // or a child's outcome.
    let folded = match fold(input, d.cursor.fork()) {
        Ok(Some(folded)) => folded,
        Ok(None) => return Ok(CheckpointRebuilt::NotOwed),
        Err(why) => return Ok(CheckpointRebuilt::NotFolded(why.to_string())),
    };
    let spill = Spill {
        mesh,
        eid: &cmd.execution_id,
        step: &step.step,
        srid: &cmd.step_run_id,
        index: &index,
        limit: plan.max_payload_bytes(mesh.config().inline_limit),
    };
    let ck = spill.checkpoint_record(&folded).await?;
    Ok(if kv::create(mesh.loop_kv(), &key, &ck).await? {
        CheckpointRebuilt::Written
    } else {
        CheckpointRebuilt::Present
    })
}

/// The events the iterations of one command rebuild their lost
/// checkpoints from ([`Wanted`]), read once, by the first that needs
/// them: a redelivered batch of 64 iterations whose checkpoints were
/// purged read the whole log 64 times, each holding it whole. The read
/// holds what it keeps, and a replica reads one log at a time
/// ([`super::Executor::log_reads`]).
pub(super) struct IterationsLog {
    indices: BTreeSet<u64>,
    read: tokio::sync::OnceCell<Vec<Event>>,
}

impl IterationsLog {
    /// For the iterations `indices` (of the command's step-run).
    pub(super) fn of(indices: BTreeSet<u64>) -> Self {
        Self {
            indices,
            read: Default::default(),
        }
    }

    /// The events, read from the log of `sr`'s execution the first time.
    async fn events(&self, sr: &StepRun<'_>) -> Result<&[Event], MeshError> {
        let read = self.read.get_or_try_init(|| async {
            let _one = sr.exec.log_reads.acquire().await;
            let mut wanted = Wanted::new(&sr.cmd.step_run_id, &self.indices);
            replay::hydrated_where(sr.mesh(), sr.eid(), |e| wanted.keeps(e)).await
        });
        Ok(read.await?)
    }
}

impl StepRun<'_> {
    /// Key of this iteration's checkpoint.
    fn checkpoint_key(&self) -> String {
        Keys::checkpoint(self.eid(), &self.cmd.step_run_id, &self.index)
    }

    /// The checkpoint record of `cur` (large values by reference).
    async fn checkpoint_record(&self, cur: &Cursor) -> Result<Checkpoint, MeshError> {
        self.spill().checkpoint_record(cur).await
    }

    /// Record where this iteration is (after a task that wrote `iter`).
    pub(super) async fn checkpoint(&self, cur: &Cursor) -> Result<(), MeshError> {
        let ck = self.checkpoint_record(cur).await?;
        kv::put(self.mesh().loop_kv(), &self.checkpoint_key(), &ck).await?;
        Ok(())
    }

    /// Resume from this iteration's checkpoint when it is ahead of the
    /// command (the command was redelivered after a crash). A redelivered
    /// command that finds none asks the log ([`Self::rebuilt_checkpoint`]).
    pub(super) async fn resume(&self, cur: &mut Cursor) -> Result<(), MeshError> {
        if self.loop_run.is_none() || !self.needs.sets_iter {
            return Ok(());
        }
        // A checkpoint that does not decode is Corrupt (dead-lettered,
        // failing the execution naming its key), never "start from task 0".
        let stored = kv::get::<Checkpoint>(self.mesh().loop_kv(), &self.checkpoint_key()).await?;
        let ck = match stored {
            Some(ck) => ck,
            // A first delivery has nothing to resume: the log is not read.
            None if !self.redelivered => return Ok(()),
            // Boxed: the log's fold is a large future, and rare.
            None => match Box::pin(self.rebuilt_checkpoint(cur)).await? {
                Some(ck) => ck,
                None => return Ok(()),
            },
        };
        let taken = ck.steps_taken;
        if taken <= cur.steps_taken {
            return Ok(());
        }
        tracing::info!(
            execution_id = %self.eid(),
            step = %self.step.step,
            iteration = %self.index,
            from = cur.steps_taken,
            to = taken,
            "resuming iteration from its checkpoint"
        );
        cur.steps_taken = taken;
        cur.pc = ck.pc;
        cur.attempt = ck.attempt;
        cur.prev = ck.prev;
        cur.iter = ck.iter;
        cur.reduce = ck.reduce;
        cur.results = ck.results;
        cur.handled = ck.handled;
        Ok(())
    }

    /// The checkpoint the loop bucket lost, folded from the iteration's
    /// events from the cursor this command carries and written back
    /// (create-only: one written meanwhile stands, and is the one used).
    /// `None` when the events give none (no task after this command's
    /// start changed `iter`) or cannot give it (logged at `warn`: the
    /// iteration starts over from the command, as before).
    pub(super) async fn rebuilt_checkpoint(
        &self,
        cur: &Cursor,
    ) -> Result<Option<Checkpoint>, MeshError> {
        let own;
        let read = match self.batch {
            Some(batch) => &batch.log,
            None => {
                let index = self.loop_run.as_ref().map_or(0, |(_, i)| *i);
                own = IterationsLog::of(BTreeSet::from([index]));
                &own
            }
        };
        let input = FoldInput {
            step: self.step,
            needs: self.needs,
            srid: &self.cmd.step_run_id,
            index: &self.index,
            log: read.events(self).await?,
        };
        let folded = match fold(input, cur.fork()) {
            Ok(Some(folded)) => folded,
            Ok(None) => return Ok(None),
            Err(why) => {
                tracing::warn!(
                    execution_id = %self.eid(),
                    step = %self.step.step,
                    iteration = %self.index,
                    %why,
                    "checkpoint missing from the loop bucket and not rebuilt from its events: the iteration starts over"
                );
                return Ok(None);
            }
        };
        let ck = self.checkpoint_record(&folded).await?;
        let key = self.checkpoint_key();
        if !kv::create(self.mesh().loop_kv(), &key, &ck).await? {
            // Written meanwhile: that one, unless purged again since (then
            // the one folded from the events, not a start over).
            let stored = kv::get::<Checkpoint>(self.mesh().loop_kv(), &key).await?;
            return Ok(Some(stored.unwrap_or(ck)));
        }
        tracing::warn!(
            execution_id = %self.eid(),
            step = %self.step.step,
            iteration = %self.index,
            steps_taken = ck.steps_taken,
            pc = ck.pc,
            "checkpoint was missing from the loop bucket: rebuilt from its events"
        );
        Ok(Some(ck))
    }
}
