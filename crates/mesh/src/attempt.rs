//! A task attempt's start as the log records it: its own `task.started`,
//! or, for an attempt that ended within
//! [`crate::payloads::TASK_START_DEFERRAL_MS`] of its start, the `started`
//! its `task.done` carries.

use noetl_wire::Event;

use crate::event_type::EventType;
use crate::payloads::{decode, TaskDone, TaskStarted};

/// The start of a task attempt, as the log records it: a `task.started`,
/// or a `task.done` whose attempt ended before its `task.started` was
/// due ([`crate::payloads::AttemptStart`]). Readers that count or time
/// attempts read both through [`attempt_started`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptStarted {
    /// 1-based attempt.
    pub attempt: u32,
    /// The task's index in the step's pipeline.
    pub pc: usize,
    /// Its tool kind.
    pub kind: String,
    /// When it started, ms since the Unix epoch (0: unknown).
    pub at_ms: u64,
}

/// The attempt start `ev` records, if it records one: a `task.started`
/// (its time the start), or a `task.done` carrying `started`. `None` for
/// any other event, and for a `task.done` whose attempt has its own
/// `task.started`.
pub fn attempt_started(ev: &Event) -> Option<AttemptStarted> {
    match EventType::of(ev)? {
        EventType::TaskStarted => {
            let s: TaskStarted = decode(ev).ok()?;
            Some(AttemptStarted {
                attempt: s.attempt,
                pc: s.pc,
                kind: s.kind,
                at_ms: crate::events::time_ms(ev),
            })
        }
        EventType::TaskDone => {
            let d: TaskDone = decode(ev).ok()?;
            let s = d.started?;
            Some(AttemptStarted {
                attempt: d.attempt,
                pc: s.pc,
                kind: s.kind,
                at_ms: s.at_ms,
            })
        }
        _ => None,
    }
}
