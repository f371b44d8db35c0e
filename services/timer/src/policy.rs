//! What a schedule does now: which ticks are due, which missed ticks are
//! caught up, what overlapping a running execution means, and the firing
//! state that results. Plain functions over the record, the clock and the
//! previous run's status; `fire` reads, calls [`decide`], publishes and
//! writes.

use std::time::Duration;

use crate::cron::{tick_text, CronSpec};
pub use crate::modes::{CatchUp, Overlap};
use crate::record::{FiringState, ScheduleRecord};
use chrono::{DateTime, Utc};

/// The schedule's previous run, as far as overlap is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Previous {
    /// No run yet (or it ended).
    Idle,
    /// Still running (or requested and not yet taken by the router).
    Running,
}

/// How long a run that was requested but has no execution header yet
/// counts as running (the router has not taken the request yet).
pub const START_WAIT: Duration = Duration::from_secs(60);

/// Whether the previous run is running: from its header's status
/// (`Some(true)`: running), or, with no header yet, from how long ago it
/// was requested.
pub fn previous_of(
    header_running: Option<bool>,
    requested_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Previous {
    match (header_running, requested_at) {
        (Some(true), _) => Previous::Running,
        (Some(false), _) | (None, None) => Previous::Idle,
        (None, Some(at)) => {
            let wait = chrono::Duration::from_std(START_WAIT).unwrap_or_default();
            if now - at < wait {
                Previous::Running
            } else {
                Previous::Idle
            }
        }
    }
}

/// What one due tick does, given the previous run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Start it.
    Start,
    /// Do not start it.
    Skip,
    /// Keep it until the previous run ends.
    Hold,
    /// Cancel the previous run, then start it.
    CancelThenStart,
}

/// The overlap policy's answer for one tick.
pub fn overlap_outcome(policy: Overlap, previous: Previous) -> Outcome {
    match (policy, previous) {
        (_, Previous::Idle) | (Overlap::Allow, _) => Outcome::Start,
        (Overlap::Skip, Previous::Running) => Outcome::Skip,
        (Overlap::Queue, Previous::Running) => Outcome::Hold,
        (Overlap::CancelRunning, Previous::Running) => Outcome::CancelThenStart,
    }
}

/// Due ticks: after `after`, at or before `now`. Those at most `grace`
/// old are on time; older ones were missed (no timer ran, or one was
/// late) and only the `catch_up.limit()` most recent of them are kept.
/// Returns the ticks to handle, oldest first.
pub fn due_ticks(
    spec: &CronSpec,
    after: DateTime<Utc>,
    now: DateTime<Utc>,
    grace: Duration,
    catch_up: CatchUp,
) -> Vec<DateTime<Utc>> {
    let grace = chrono::Duration::from_std(grace).unwrap_or_default();
    let on_time_from = (now - grace).max(after);
    let mut ticks = if on_time_from > after {
        spec.recent_ticks(after, on_time_from, catch_up.limit())
    } else {
        Vec::new()
    };
    ticks.extend(spec.recent_ticks(on_time_from, now, crate::cron::MAX_TICKS));
    ticks
}

/// One thing a decision asks to be done, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask this execution to cancel.
    Cancel {
        /// The previous run.
        execution_id: String,
    },
    /// Request the run of this tick (canonical text).
    Start {
        /// The tick.
        tick: String,
    },
}

/// What a decision returns: the actions, then the state to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Done in order, before the state is written.
    pub actions: Vec<Action>,
    /// The firing state afterwards.
    pub state: FiringState,
}

/// What [`decide`] looks at.
pub struct Situation<'a> {
    /// The schedule as read.
    pub record: &'a ScheduleRecord,
    /// Its parsed expression.
    pub spec: &'a CronSpec,
    /// The clock.
    pub now: DateTime<Utc>,
    /// How late a tick may be and still be on time.
    pub grace: Duration,
    /// Its previous run.
    pub previous: Previous,
}

/// Parse a stored instant (RFC 3339).
pub fn instant(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The instant up to which the schedule's ticks are handled: its last
/// tick, its creation or its resumption, whichever is latest.
pub fn handled_until(r: &ScheduleRecord, now: DateTime<Utc>) -> DateTime<Utc> {
    [
        Some(r.created_at.as_str()),
        r.resumed_at.as_deref(),
        r.state.last_tick.as_deref(),
    ]
    .into_iter()
    .flatten()
    .filter_map(instant)
    .max()
    .unwrap_or(now)
}

/// Which ticks of the schedule fire now, and how: a held tick first
/// (started once the previous run has ended), then each due tick under
/// the overlap policy, the previous run being the one just started.
pub fn decide(s: &Situation<'_>) -> Plan {
    let r = s.record;
    let mut plan = Plan {
        actions: Vec::new(),
        state: r.state.clone(),
    };
    if r.paused {
        return plan;
    }
    let after = handled_until(r, s.now);
    let mut previous = s.previous;
    if let Some(held) = plan.state.held_tick.clone() {
        if previous == Previous::Idle {
            plan.state.held_tick = None;
            start(&mut plan, r, held, s.now);
            previous = Previous::Running;
        }
    }
    for t in due_ticks(s.spec, after, s.now, s.grace, r.catch_up) {
        let tick = tick_text(t);
        plan.state.last_tick = Some(tick.clone());
        let outcome = if plan.state.held_tick.is_some() {
            Outcome::Skip
        } else {
            overlap_outcome(r.overlap, previous)
        };
        match outcome {
            Outcome::Start => start(&mut plan, r, tick, s.now),
            Outcome::Skip => {
                plan.state.skipped += 1;
                plan.state.last_skipped_tick = Some(tick);
                continue;
            }
            Outcome::Hold => {
                plan.state.held_tick = Some(tick);
                continue;
            }
            Outcome::CancelThenStart => {
                if let Some(eid) = plan.state.last_execution_id.clone() {
                    plan.actions.push(Action::Cancel { execution_id: eid });
                }
                start(&mut plan, r, tick, s.now);
            }
        }
        previous = Previous::Running;
    }
    pass_over_missed(&mut plan.state, s, after);
    plan
}

/// Ticks missed beyond the catch-up limit are passed over: the state
/// moves past the last tick older than the grace, whether it ran or not.
fn pass_over_missed(state: &mut FiringState, s: &Situation<'_>, after: DateTime<Utc>) {
    let grace = chrono::Duration::from_std(s.grace).unwrap_or_default();
    let Some(missed) = s.spec.last_at_or_before(s.now - grace) else {
        return;
    };
    let handled = state.last_tick.as_deref().and_then(instant);
    if missed > after && handled.is_none_or(|h| h < missed) {
        state.last_tick = Some(tick_text(missed));
    }
}

fn start(plan: &mut Plan, r: &ScheduleRecord, tick: String, now: DateTime<Utc>) {
    plan.state.last_execution_id = Some(r.execution_id(&tick));
    plan.state.last_started_at = Some(tick_text(now));
    plan.state.last_started_tick = Some(tick.clone());
    plan.state.started += 1;
    plan.actions.push(Action::Start { tick });
}

/// When the schedule next needs a look: its next tick after both `now`
/// and what it has handled (`None`: never again, or paused).
pub fn next_wake(
    record: &ScheduleRecord,
    spec: &CronSpec,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    if record.paused {
        return None;
    }
    spec.next_after(handled_until(record, now).max(now))
}

#[cfg(test)]
mod tests;
