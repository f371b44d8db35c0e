//! An iteration's checkpoint: where it is after a task that wrote `iter`
//! (the pagination pattern), so a command redelivered after a crash
//! resumes there instead of from the iteration's first task.

use noetl_mesh::{keys::Keys, kv, state::Checkpoint, MeshError};

use super::{Cursor, StepRun};

impl StepRun<'_> {
    /// Key of this iteration's checkpoint.
    fn checkpoint_key(&self) -> String {
        Keys::checkpoint(self.eid(), &self.cmd.step_run_id, &self.index)
    }

    /// Record where this iteration is (after a task that wrote `iter`).
    pub(super) async fn checkpoint(&self, cur: &Cursor) -> Result<(), MeshError> {
        let ck = Checkpoint {
            steps_taken: cur.steps_taken,
            pc: cur.pc,
            attempt: cur.attempt,
            prev: self.prev_by_reference(cur).await?,
            iter: cur.iter.clone(),
            reduce: cur.reduce.clone(),
            results: self.results_by_reference(cur).await?,
            handled: cur.handled.clone(),
        };
        kv::put(self.mesh().loop_kv(), &self.checkpoint_key(), &ck).await?;
        Ok(())
    }

    /// Resume from this iteration's checkpoint when it is ahead of the
    /// command (the command was redelivered after a crash).
    pub(super) async fn resume(&self, cur: &mut Cursor) -> Result<(), MeshError> {
        if self.loop_run.is_none() || !self.needs.sets_iter {
            return Ok(());
        }
        // A checkpoint that does not decode is Corrupt (dead-lettered,
        // failing the execution naming its key), never "start from task 0".
        let Some(ck) = kv::get::<Checkpoint>(self.mesh().loop_kv(), &self.checkpoint_key()).await?
        else {
            return Ok(());
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
}
