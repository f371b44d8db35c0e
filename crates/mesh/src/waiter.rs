//! What a wait is made of and what the log says of it: the waiter
//! stored under `<eid>.wait.<signal>`, the payloads of `wait.started`,
//! `wait.timeout` and `signal.received`, and [`Waits`], the fold that says
//! which waiters the events owe. Apart from [`crate::signal`] (which
//! stores, delivers and continues waiters) so the event fold
//! ([`crate::fold`]) reads it without reaching the command publishing a
//! delivery does.

use std::collections::BTreeMap;

use noetl_wire::Event;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event_type::EventType;
use crate::id_set::IdSet;
use crate::{payloads, MeshError};

/// A step-run waiting for a signal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waiter {
    /// The signal's name.
    pub signal: String,
    /// The step.
    pub step: String,
    /// The step-run.
    pub step_run_id: String,
    /// The `wait` task.
    pub task: String,
    /// Its task-run.
    pub task_run_id: String,
    /// Since when (RFC 3339).
    pub since: String,
    /// When it times out (epoch ms), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_at_ms: Option<u64>,
    /// The JSON Schema the data must fit, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// The task command that continues the step-run
    /// ([`crate::commands::park_command`]).
    pub command: String,
    /// The outcome a signal or the timeout gave it, once one did (the
    /// waiter is removed once its continuation is published; one left
    /// with an outcome is published again by the next signal or timer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<Value>,
}

/// The `wait.timeout` timer: the router acts on it when due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitTimeout {
    /// When (epoch ms).
    pub at_ms: u64,
    /// The signal waited for.
    pub signal: String,
    /// The `wait` task-run it is for (a later wait for the same signal is
    /// not timed out by an earlier timer).
    pub task_run_id: String,
}

/// The payload of `signal.received`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalReceived {
    /// The signal.
    pub signal: String,
    /// Who sent it.
    pub by: String,
    /// The `wait` task-run it continued.
    pub task_run_id: String,
}

/// The payload of `wait.started`: the waiter, besides what the event's
/// envelope names (step, step-run, task, task-run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitStarted {
    /// The signal waited for.
    pub signal: String,
    /// Since when (RFC 3339).
    pub since: String,
    /// When it times out (epoch ms), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_at_ms: Option<u64>,
    /// The JSON Schema the data must fit, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// The parked command, when it fits inline ([`crate::patches`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The parked command's reference in the object store, when it does
    /// not ([`crate::replay::hydrate`] reads it back into `command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_ref: Option<Value>,
}

payloads::payload_of! {
    WaitStarted => WaitStarted,
    WaitTimeout => WaitTimeout,
    SignalReceived => SignalReceived,
}

/// The waiters an execution's events say are owed, folded one event at a
/// time in stream order: per signal, the last `wait.started` whose wait
/// has not gone on (no `signal.received` and no `task.done` of its
/// task-run, no end of its step-run, no end of the execution).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waits {
    /// The owed waiters, by signal.
    open: BTreeMap<String, Waiter>,
    /// Task-runs whose wait went on.
    went_on: IdSet,
    /// Step-runs that ended.
    ended: IdSet,
}

impl Waits {
    /// Fold every event of `log` (stream order).
    pub fn of<'a>(log: impl IntoIterator<Item = &'a Event>) -> Result<Self, MeshError> {
        let mut waits = Self::default();
        for ev in log {
            waits.apply(ev)?;
        }
        Ok(waits)
    }

    /// Apply one event; a `wait.started` whose payload does not decode is
    /// an error naming it.
    pub fn apply(&mut self, ev: &Event) -> Result<(), MeshError> {
        use EventType as T;
        match EventType::of(ev) {
            Some(T::WaitStarted) => {
                let p: WaitStarted = payloads::decode_typed(ev)?;
                if self.went_on.contains(&ev.task_run_id) || self.ended.contains(&ev.step_run_id) {
                    return Ok(()); // it went on before its event was written
                }
                let waiter = Waiter {
                    signal: p.signal.clone(),
                    step: ev.step.clone(),
                    step_run_id: ev.step_run_id.clone(),
                    task: ev.task.clone(),
                    task_run_id: ev.task_run_id.clone(),
                    since: p.since,
                    timeout_at_ms: p.timeout_at_ms,
                    schema: p.schema,
                    command: p.command.unwrap_or_default(),
                    delivered: None,
                };
                self.open.insert(p.signal, waiter);
            }
            Some(T::SignalReceived | T::TaskDone) if !ev.task_run_id.is_empty() => {
                self.went_on.insert(&ev.task_run_id);
                self.open.retain(|_, w| w.task_run_id != ev.task_run_id);
            }
            Some(T::StepDone | T::StepFailed | T::StepSuperseded) if !ev.step_run_id.is_empty() => {
                self.ended.insert(&ev.step_run_id);
                self.open.retain(|_, w| w.step_run_id != ev.step_run_id);
            }
            Some(T::ExecutionCompleted | T::ExecutionFailed | T::ExecutionCancelled) => {
                self.open.clear();
            }
            _ => {}
        }
        Ok(())
    }

    /// The waiter owed for `signal`, if one is.
    pub fn owed(&self, signal: &str) -> Option<&Waiter> {
        self.open.get(signal)
    }

    /// Every owed waiter, by signal.
    pub fn all(&self) -> &BTreeMap<String, Waiter> {
        &self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventDraft;
    use serde_json::json;

    fn event(kind: EventType, step_run: &str, task_run: &str, payload: Value) -> Event {
        EventDraft {
            execution_id: "e1",
            step_run_id: step_run,
            task_run_id: task_run,
            step: "approve",
            task: "ask",
            ..EventDraft::default()
        }
        .build_raw(kind, payload)
    }

    fn started(signal: &str, step_run: &str, task_run: &str) -> Event {
        let p = WaitStarted {
            signal: signal.into(),
            since: "2026-11-28T10:00:00.000Z".into(),
            timeout_at_ms: Some(9),
            schema: None,
            command: Some(format!("cmd-{task_run}")),
            command_ref: None,
        };
        event(
            EventType::WaitStarted,
            step_run,
            task_run,
            payloads::to_value(&p),
        )
    }

    fn owed(log: &[Event], signal: &str) -> Option<String> {
        Waits::of(log)
            .unwrap()
            .owed(signal)
            .map(|w| w.task_run_id.clone())
    }

    #[test]
    fn the_owed_waiter_is_the_last_wait_that_has_not_gone_on() {
        let w1 = started("go", "s1", "t1");
        // Waiting: owed, as its event says.
        let log = vec![w1.clone()];
        let waits = Waits::of(&log).unwrap();
        let w = waits.owed("go").unwrap();
        assert_eq!(
            (w.step.as_str(), w.step_run_id.as_str(), w.task.as_str()),
            ("approve", "s1", "ask")
        );
        assert_eq!((w.command.as_str(), w.timeout_at_ms), ("cmd-t1", Some(9)));
        assert_eq!(w.delivered, None);
        assert_eq!(owed(&log, "other"), None);
        // A signal continued it, or its task ended (the timeout), or its
        // step-run or the execution ended: nothing is owed.
        let signalled = json!({"signal": "go", "by": "op", "task_run_id": "t1"});
        for end in [
            event(EventType::SignalReceived, "s1", "t1", signalled.clone()),
            event(EventType::TaskDone, "s1", "t1", json!({"status": "error"})),
            event(EventType::StepFailed, "s1", "", json!({})),
            event(EventType::StepSuperseded, "s1", "", json!({})),
            event(EventType::ExecutionCancelled, "", "", json!({})),
        ] {
            assert_eq!(owed(&[w1.clone(), end.clone()], "go"), None, "{end:?}");
        }
        // Another task's end leaves it owed.
        let other = event(EventType::TaskDone, "s1", "t0", json!({"status": "ok"}));
        assert_eq!(owed(&[w1.clone(), other], "go"), Some("t1".into()));
        // A later wait for the same signal is the one owed; the signal
        // received before its event was written (the waiter is stored
        // first) still counts.
        let w2 = started("go", "s2", "t2");
        assert_eq!(owed(&[w1.clone(), w2.clone()], "go"), Some("t2".into()));
        let early = event(EventType::SignalReceived, "s2", "t2", signalled);
        assert_eq!(owed(&[early, w1, w2], "go"), Some("t1".into()));
    }
}
