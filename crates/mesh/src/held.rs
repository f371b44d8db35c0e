//! Tokens a pause held, as the log tells them: a token the scheduler held
//! while its execution was paused waits under `<eid>.held.token.<id>`
//! ([`crate::pause`]); should that record be lost (a purge, a storage
//! fault), the unpause would release nothing and the execution would wait
//! forever. The log says which tokens are owed without the records: a
//! token live in the header whose step-run has no event of its own
//! (`step.started`, `step.skipped`, ...) was never started.
//! [`owed_tokens`] decides it (a plain function); the unpause publishes
//! what it returns ([`crate::Mesh::release_owed_tokens`]).
//!
//! A loop run's window held by a pause waits under
//! `<eid>.held.loop.<step_run_id>` as the loop command that releases it;
//! the run's own record lists the iterations held (`held`). Lost, the
//! record still says so: [`owed_windows`] makes the release command again
//! from every run record with iterations held
//! ([`crate::Mesh::release_owed_windows`]).

use std::collections::{BTreeMap, BTreeSet};

use noetl_wire::{Event, LoopCommand, Token};
use serde_json::Value;

use crate::keys::Keys;
use crate::state::{ExecHeader, ExecStatus};
use crate::{codec, kv, Mesh, MeshError};

/// Where the `step.*` events of an execution are stored: under their own
/// subjects, and carried, read back unfolded, in the router's answers
/// (`next.selected`: the `step.started` of a step-run the router started
/// itself) and in the entry's `token.created` (its step-run's): a reader
/// that looks for a step-run's start under `step.>` alone misses those.
const STEP_EVENTS_AT: [&str; 3] = ["step.>", "next.selected", "token.created"];

/// The tokens of `header` to publish again at an unpause: live, never
/// started (no event in `step_events`, the execution's `step.*` events,
/// those carried in other events included, is of their step-run) and not
/// released from a held record already (`released`: the held records'
/// keys). Each comes with the step of the step-run that fired it (a join
/// reads it), as those events name it.
pub fn owed_tokens(
    header: &ExecHeader,
    step_events: &[Event],
    released: &BTreeSet<String>,
) -> Vec<Token> {
    if header.status != ExecStatus::Running {
        return Vec::new();
    }
    let mut step_of: BTreeMap<&str, &str> = BTreeMap::new();
    for ev in step_events {
        step_of.insert(ev.step_run_id.as_str(), ev.step.as_str());
    }
    header
        .live
        .iter()
        .filter(|t| {
            !step_of.contains_key(t.token_id.as_str())
                && !released.contains(&Keys::held_token(&header.execution_id, &t.token_id))
        })
        .map(|t| Token {
            token_id: t.token_id.clone(),
            execution_id: header.execution_id.clone(),
            step: t.step.clone(),
            args_json: codec::json_bytes(&t.args),
            trace_id: String::new(),
            parent_step_run_id: t.parent.clone(),
            parent_step: step_of
                .get(t.parent.as_str())
                .map(|s| s.to_string())
                .unwrap_or_default(),
        })
        .collect()
}

/// The id of the loop command that releases loop run `srid`'s held
/// iterations: the loop-supervisor knows the release by it.
pub fn loop_release_command_id(srid: &str) -> String {
    format!("{srid}-unpaused")
}

/// The release commands owed for execution `eid`'s loop runs (`runs`: each
/// run's step-run id and its record, as the loop bucket keeps it): one per
/// run with iterations held (`held` not empty) whose held record was not
/// released (`released`: the held records' keys).
pub fn owed_windows(
    eid: &str,
    runs: &[(String, Value)],
    released: &BTreeSet<String>,
) -> Vec<LoopCommand> {
    runs.iter()
        .filter(|(srid, run)| {
            run["held"].as_array().is_some_and(|h| !h.is_empty())
                && !released.contains(&Keys::held_loop(eid, srid))
        })
        .map(|(srid, run)| LoopCommand {
            command_id: loop_release_command_id(srid),
            execution_id: eid.to_string(),
            step: run["step"].as_str().unwrap_or_default().to_string(),
            step_run_id: srid.clone(),
            trace_id: run["trace_id"].as_str().unwrap_or_default().to_string(),
            ..Default::default()
        })
        .collect()
}

/// The keys of the held-token records of `eid` whose step-run the log
/// shows acted on (`step_events`: an event of its own): their tokens
/// were published and handled, and a record of one is what a release cut
/// short between its publish and its delete left behind. Publishing it
/// again later than the duplicate window would start the step-run twice.
pub fn handled_held_tokens(eid: &str, step_events: &[Event]) -> BTreeSet<String> {
    step_events
        .iter()
        .map(|ev| Keys::held_token(eid, &ev.step_run_id))
        .collect()
}

impl Mesh {
    /// The keys of `eid`'s held-token records whose step-run the log shows
    /// acted on ([`handled_held_tokens`]).
    pub(crate) async fn handled_held_tokens_of(
        &self,
        eid: &str,
    ) -> Result<BTreeSet<String>, MeshError> {
        Ok(handled_held_tokens(eid, &self.step_events(eid).await?))
    }

    /// The `step.*` events of `eid`, those carried in other events
    /// included ([`STEP_EVENTS_AT`]).
    pub(crate) async fn step_events(&self, eid: &str) -> Result<Vec<Event>, MeshError> {
        let mut step_events: Vec<Event> = Vec::new();
        for types in STEP_EVENTS_AT {
            let filter = self.subjects().events_matching(Some(eid), types);
            step_events.extend(
                self.stored_events_from(&filter, None)
                    .await?
                    .into_iter()
                    .filter_map(|(_, ev)| ev.ok())
                    .filter(|ev| ev.event_type.starts_with("step.")),
            );
        }
        Ok(step_events)
    }

    /// Publish again the release of every loop run of `eid` whose held
    /// iterations no released record covers ([`owed_windows`]; `released`:
    /// the keys of the held records this unpause released). Returns how
    /// many were published; a release that finds nothing held does
    /// nothing.
    pub async fn release_owed_windows(
        &self,
        eid: &str,
        released: &BTreeSet<String>,
    ) -> Result<u64, MeshError> {
        let mut runs = Vec::new();
        for key in kv::keys_under(self.loop_kv(), eid).await? {
            let srid = &key[eid.len() + 1..];
            if srid.contains('.') {
                continue; // chunks, claims, checkpoints: not a run record
            }
            if let Some(run) = kv::get::<Value>(self.loop_kv(), &key).await? {
                runs.push((srid.to_string(), run));
            }
        }
        let owed = owed_windows(eid, &runs, released);
        for cmd in &owed {
            let msg_id = format!("{}@unpaused", Keys::held_loop(eid, &cmd.step_run_id));
            self.publish(self.subjects().loop_cmd(eid), &msg_id, codec::encode(cmd))
                .await?
                .wait()
                .await?;
            tracing::warn!(execution_id = %eid, step_run_id = %cmd.step_run_id, step = %cmd.step,
                "a held loop window's record was missing: its release made again from the loop run");
        }
        Ok(owed.len() as u64)
    }

    /// Publish again the tokens of `eid` the log says a pause held
    /// ([`owed_tokens`]) whose held records are gone; `released` are the
    /// keys of the held records this unpause released. Returns how
    /// many were published. A token still on its way to the scheduler is
    /// published twice: the scheduler handles a token again as it handles
    /// a redelivery (same step-run, same ids).
    pub async fn release_owed_tokens(
        &self,
        eid: &str,
        released: &BTreeSet<String>,
    ) -> Result<u64, MeshError> {
        let Some(header) = kv::get::<ExecHeader>(self.exec_kv(), &Keys::header(eid)).await? else {
            return Ok(0);
        };
        if header.status != ExecStatus::Running
            || header
                .live
                .iter()
                .all(|t| released.contains(&Keys::held_token(eid, &t.token_id)))
        {
            return Ok(0);
        }
        let step_events = self.step_events(eid).await?;
        let owed = owed_tokens(&header, &step_events, released);
        let trace_id = self
            .plans()
            .get(self, eid)
            .await
            .map(|p| p.trace_id.clone())
            .unwrap_or_default();
        let mut published = 0;
        for mut token in owed {
            token.trace_id = trace_id.clone();
            // Not the token's own id: JetStream would drop it as a copy of
            // the publish the pause held, within its duplicate window.
            let msg_id = format!("{}@unpaused", Keys::held_token(eid, &token.token_id));
            self.publish(self.subjects().token(eid), &msg_id, codec::encode(&token))
                .await?
                .wait()
                .await?;
            tracing::warn!(execution_id = %eid, token_id = %token.token_id, step = %token.step,
                "a held token's record was missing: published again from the log");
            published += 1;
        }
        Ok(published)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_type::EventType;
    use crate::events::EventDraft;
    use crate::token::TokenRecord;
    use serde_json::json;

    fn step_event(kind: EventType, step: &str, srid: &str) -> Event {
        EventDraft {
            execution_id: "e1",
            step_run_id: srid,
            step,
            ..Default::default()
        }
        .build_raw(kind, json!({}))
    }

    #[test]
    fn a_live_token_never_started_is_owed_with_its_parent_step_and_others_are_not() {
        let mut header = ExecHeader::running("e1", Vec::new());
        let fired = |id: &str, step: &str| TokenRecord {
            args: json!({"n": 1}),
            parent: "r0".into(),
            ..TokenRecord::new(id, step)
        };
        header.live = vec![
            fired("held", "second"),
            fired("running", "third"),
            fired("released", "fourth"),
        ];
        let events = [
            step_event(EventType::StepScheduled, "start", "r0"),
            step_event(EventType::StepDone, "start", "r0"),
            step_event(EventType::StepScheduled, "third", "running"),
        ];
        let released = BTreeSet::from([Keys::held_token("e1", "released")]);
        let owed = owed_tokens(&header, &events, &released);
        assert_eq!(owed.len(), 1, "{owed:?}");
        let t = &owed[0];
        assert_eq!((t.token_id.as_str(), t.step.as_str()), ("held", "second"));
        assert_eq!(
            (t.parent_step_run_id.as_str(), t.parent_step.as_str()),
            ("r0", "start")
        );
        assert_eq!(codec::args(&t.args_json).unwrap(), json!({"n": 1}));
        header.status = ExecStatus::Completed;
        assert!(owed_tokens(&header, &events, &released).is_empty());
    }

    #[test]
    fn a_held_token_whose_step_run_has_an_event_is_handled_and_others_are_not() {
        let events = [
            step_event(EventType::StepStarted, "second", "went-out"),
            step_event(EventType::StepSkipped, "join", "absorbed"),
        ];
        let handled = handled_held_tokens("e1", &events);
        assert!(handled.contains(&Keys::held_token("e1", "went-out")));
        assert!(handled.contains(&Keys::held_token("e1", "absorbed")));
        assert!(!handled.contains(&Keys::held_token("e1", "held")));
        assert!(!handled.contains(&Keys::held_loop("e1", "went-out")));
    }

    #[test]
    fn a_loop_run_with_iterations_held_and_no_released_record_owes_its_release() {
        let runs = [
            (
                "held".to_string(),
                json!({"step": "lp", "trace_id": "tr", "held": [3, 4]}),
            ),
            ("none".to_string(), json!({"step": "lp", "held": []})),
            ("released".to_string(), json!({"step": "lp", "held": [1]})),
        ];
        let released = BTreeSet::from([Keys::held_loop("e1", "released")]);
        let owed = owed_windows("e1", &runs, &released);
        assert_eq!(owed.len(), 1, "{owed:?}");
        let c = &owed[0];
        assert_eq!(c.command_id, "held-unpaused");
        assert_eq!(
            (c.step.as_str(), c.step_run_id.as_str(), c.trace_id.as_str()),
            ("lp", "held", "tr")
        );
        assert_eq!(c.execution_id, "e1");
    }
}
