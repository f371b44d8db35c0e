//! What the log says a loop's iterations and claims reported, read on the
//! rare paths of a command whose loop run is missing from the loop bucket
//! (a purge) or that came again: work whose report is stored does not run
//! again.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use crate::event_type::EventType;
use crate::events::ReadFrom;

impl crate::Mesh {
    /// Whether claim `seq` of loop run `loop_run_id` of execution `eid` has
    /// its `loop.claimed` stored (read on the rare paths of a claim command
    /// that is redelivered or whose loop run is missing from the loop
    /// bucket: a claim that ran must not run its SQL again, which could
    /// take other rows under the same claim).
    pub async fn claim_reported(
        &self,
        eid: &str,
        loop_run_id: &str,
        seq: u64,
    ) -> Result<bool, crate::MeshError> {
        let subject = self
            .subjects()
            .event(eid, EventType::LoopClaimed.wire_name());
        self.any_stored_event(&subject, |ev| {
            ev.step_run_id == loop_run_id
                && crate::payloads::decode_typed::<crate::payloads::ClaimEnded>(ev)
                    .is_ok_and(|c| c.seq == seq)
        })
        .await
    }

    /// The iterations of loop run `loop_run_id` of execution `eid` whose
    /// end is stored (`loop.iteration.done` / `.failed`, alone or in a
    /// `batch.completed`): counted or about to be, so their commands are
    /// stale. Read when an iteration's command finds its loop run missing
    /// from the loop bucket (a purge): without it the iteration ran its
    /// tool calls again. Reads every stored end of the execution.
    pub async fn iterations_ended(
        &self,
        eid: &str,
        loop_run_id: &str,
    ) -> Result<BTreeSet<u64>, crate::MeshError> {
        use EventType as T;
        let mut ended = BTreeSet::new();
        for kind in [
            T::LoopIterationDone,
            T::LoopIterationFailed,
            T::BatchCompleted,
        ] {
            let subject = self.subjects().event(eid, kind.wire_name());
            self.visit_stored_events(&subject, ReadFrom::Start, |_, ev| {
                let ends = ev.into_iter().flat_map(super::unfold).filter(|e| {
                    matches!(
                        EventType::of(e),
                        Some(T::LoopIterationDone | T::LoopIterationFailed)
                    )
                });
                for end in ends {
                    match crate::payloads::decode::<crate::payloads::IterationNamed>(&end) {
                        Ok(n) if n.loop_run_id == loop_run_id => {
                            ended.insert(n.index);
                        }
                        _ => {}
                    }
                }
                ControlFlow::Continue(())
            })
            .await?;
        }
        Ok(ended)
    }
}
