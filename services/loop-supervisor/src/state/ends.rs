//! What a loop run folded from its events is ([`FromLog`]), and how its
//! iterations' ends and its `loop.done` are folded ([`Ends`]): the same
//! for a loop over `in` ([`super::from_log`]) and a cursor loop
//! ([`super::cursor_log`]).

use noetl_core::{reduce::ReducerOp, FailureMode, Step};
use noetl_mesh::{
    event_type::EventType,
    payloads::{self, IterationEnded, LoopDone},
};
use noetl_wire::Event;

use super::{count_in_place, grows, reducers_of, Arrival, Claim, LoopRun};

/// A loop run rebuilt from its events.
#[derive(Debug, Clone)]
pub(crate) struct FromLog {
    /// The run's record.
    pub run: LoopRun,
    /// How each counted iteration counted (index, claim), for a loop with
    /// growing reducers (their contributions are read from the claims at
    /// the end); empty otherwise.
    pub claims: Vec<(u64, Claim)>,
    /// A cursor loop's claimed rows its record still places (claim
    /// sequence number, the rows as `loop.claimed` carried them: a list or
    /// a reference), for `<run>.frame.<seq>`; empty otherwise.
    pub frames: Vec<(u64, serde_json::Value)>,
    /// A cursor loop's frames that place the rows a run continuing this
    /// one runs again (its failed, unfinished and waiting iterations'),
    /// with their rows ([`super::resumed`]); empty otherwise.
    pub again: Vec<(super::cursor::Frame, serde_json::Value)>,
}

/// How a loop's iteration ends and its `loop.done` are folded: the live
/// counting ([`count_in_place`]) with the step's failure mode and
/// reducers.
pub(crate) struct Ends<'a> {
    step: &'a Step,
    reducers: Vec<(String, ReducerOp)>,
    keep_claims: bool,
    fail_fast: bool,
}

impl<'a> Ends<'a> {
    /// The folding of loop step `step`'s ends.
    pub(crate) fn of(step: &'a Step) -> Self {
        let reducers = reducers_of(step);
        Ends {
            step,
            keep_claims: reducers.iter().any(|(_, op)| grows(*op)),
            reducers,
            fail_fast: step.failure_mode() == FailureMode::FailFast,
        }
    }

    /// Fold `ev` into `f` when it is an iteration's end (counted once, as
    /// live) or the run's `loop.done`; false for any other event.
    pub(crate) fn take(&self, f: &mut FromLog, ev: &Event) -> Result<bool, String> {
        match EventType::of(ev) {
            Some(k @ (EventType::LoopIterationDone | EventType::LoopIterationFailed)) => {
                let report: IterationEnded = payloads::decode(ev).map_err(|e| e.to_string())?;
                let failed = k == EventType::LoopIterationFailed;
                let claim = Claim {
                    failed,
                    reduce: if failed {
                        Default::default()
                    } else {
                        report.reduce
                    },
                    handled: report.handled,
                };
                let arrival = Arrival {
                    index: report.index,
                    claim: &claim,
                    fail_fast: self.fail_fast,
                    reducers: &self.reducers,
                    step: &self.step.step,
                    viewed: false,
                };
                if count_in_place(&mut f.run, &arrival).is_some() && self.keep_claims {
                    f.claims.push((report.index, claim));
                }
                Ok(true)
            }
            Some(EventType::LoopDone) => {
                let done: LoopDone = payloads::decode(ev).map_err(|e| e.to_string())?;
                f.run.done_emitted = true;
                if f.run.error.is_none() {
                    f.run.error = done.error;
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
