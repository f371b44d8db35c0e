//! An iteration's checkpoint: where it is after a task that wrote `iter`
//! (the pagination pattern), so a command redelivered after a crash
//! resumes there instead of from the iteration's first task. A checkpoint
//! the loop bucket lost is folded back from the iteration's events
//! ([`from_log`]) by the redelivered command that misses it.

mod from_log;

use noetl_mesh::{keys::Keys, kv, replay, state::Checkpoint, MeshError};

use super::{Cursor, StepRun};
use from_log::{fold, FoldInput};

impl StepRun<'_> {
    /// Key of this iteration's checkpoint.
    fn checkpoint_key(&self) -> String {
        Keys::checkpoint(self.eid(), &self.cmd.step_run_id, &self.index)
    }

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
            None => match self.rebuilt_checkpoint(cur).await? {
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
    async fn rebuilt_checkpoint(&self, cur: &Cursor) -> Result<Option<Checkpoint>, MeshError> {
        let log = replay::hydrated_log(self.mesh(), self.eid(), replay::Until::End).await?;
        let log: Vec<_> = log.into_iter().map(|l| l.event).collect();
        let input = FoldInput {
            step: self.step,
            needs: self.needs,
            srid: &self.cmd.step_run_id,
            index: &self.index,
            log: &log,
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
            return kv::get::<Checkpoint>(self.mesh().loop_kv(), &key).await;
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
