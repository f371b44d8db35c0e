//! Reasons, notes and an ended execution in words.

use noetl_mesh::event_type::EventType;
use noetl_mesh::events;
use noetl_mesh::pause::PauseRecord;
use noetl_mesh::served::QueueCounts;
use noetl_mesh::state::{ExecHeader, ExecStatus};
use noetl_wire::Event;
use serde_json::Value;

use super::reason::Reason;

/// A reason in words.
pub fn words(step: &str, reason: &Reason) -> String {
    match reason {
        Reason::Paused { by, since } => format!(
            "step `{step}`: held by a pause ({by}, since {since}); `noetl exec unpause` goes on"
        ),
        Reason::Scheduler => {
            format!("step `{step}`: its token waits for the scheduler to admit and start it")
        }
        Reason::ConcurrencyQueue {
            key,
            limit,
            held_by,
            position,
        } => format!(
            "step `{step}`: the execution is queued behind concurrency key `{key}` (limit {limit}) held by executions {}; position {position}",
            held_by.join(", ")
        ),
        Reason::Concurrency {
            task,
            key,
            limit,
            held_by,
        } => format!(
            "step `{step}`: task `{task}` waits: concurrency key `{key}` (limit {limit}) held by {}",
            held_by.join(", ")
        ),
        Reason::Rate { task, key, until } => {
            format!("step `{step}`: task `{task}` waits: rate limit `{key}` until {until}")
        }
        Reason::Join { arrived, inputs } => format!(
            "step `{step}`: a join waiting for {} more arc(s) ({arrived} of {inputs} arrived)",
            inputs.saturating_sub(*arrived)
        ),
        Reason::Retry { task, attempt, at } => format!(
            "step `{step}`: task `{task}` failed and is retried (attempt {attempt}) at {at}"
        ),
        Reason::Running {
            task,
            tool,
            attempt,
        } => format!("step `{step}`: task `{task}` ({tool}) is running on an executor, attempt {attempt}"),
        Reason::Signal {
            task,
            signal,
            timeout_at,
        } => format!(
            "step `{step}`: task `{task}` waits for signal `{signal}` (`noetl exec signal ID {signal} --data JSON`){}",
            timeout_at
                .as_ref()
                .map(|t| format!("; it times out at {t}"))
                .unwrap_or_default()
        ),
        Reason::Loop {
            total,
            in_flight,
            done,
            failed,
        } => format!(
            "step `{step}`: a loop with {in_flight} in flight of {total} ({done} done, {failed} failed, {} not started)",
            total.saturating_sub(in_flight + done + failed)
        ),
        Reason::Queued { task, tool, queue } => {
            format!("step `{step}`: task `{task}` is queued for kind {tool}: {}", queue_words(tool, queue.as_ref()))
        }
    }
}

/// The state of a kind's queue in words.
fn queue_words(tool: &str, queue: Option<&QueueCounts>) -> String {
    let Some(q) = queue else {
        return format!(
            "no executor of kind {tool} has ever started (start one: `noetl serve executor --kind {tool}`)"
        );
    };
    let c = &q.consumer;
    if c.waiting > 0 {
        format!(
            "{} waiting in the queue, {} executor pull(s) idle: it should start at once",
            q.pending, c.waiting
        )
    } else if c.ack_pending > 0 {
        format!(
            "executors of kind {tool} are busy ({} task(s) in progress), {} waiting in the queue",
            c.ack_pending, q.pending
        )
    } else {
        format!(
            "no executor of kind {tool} is bound now (none waiting or busy for {} s), {} waiting in the queue",
            c.idle_for.as_secs(),
            q.pending
        )
    }
}

/// A pause, time limits and a pending cancellation, in words.
pub fn notes(header: &ExecHeader, events: &[Event], paused: Option<&PauseRecord>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = paused.filter(|_| header.status == ExecStatus::Running) {
        let why = if p.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", p.reason)
        };
        out.push(format!(
            "paused by {} since {}{why}: no new step or iteration starts until `noetl exec unpause`",
            p.by, p.at
        ));
    }
    for ev in events {
        let p = events::payload(ev);
        match EventType::of(ev) {
            Some(EventType::ExecutionDeadline) => {
                if let Some(at) = p.get("at_ms").and_then(Value::as_u64) {
                    out.push(format!(
                        "the execution's deadline is at {}",
                        events::rfc3339_of_ms(at)
                    ));
                }
            }
            Some(EventType::ExecutionCancelRequested) if header.status == ExecStatus::Running => {
                out.push(format!(
                    "a cancellation was requested at {}; the router has not recorded it yet",
                    noetl_mesh::codec::event_time(ev)
                ));
            }
            _ => {}
        }
    }
    out
}

/// What `why` says of an ended execution: its end, its error, and for a
/// failed or cancelled one what `noetl exec resume` would run again.
pub fn ended(header: &ExecHeader) -> String {
    let id = &header.execution_id;
    let status = crate::commands::exec_shared::status_name(header.status);
    let mut out = format!("execution {id} has ended ({status}): nothing waits");
    if let Some(e) = header.error.as_deref().filter(|e| !e.is_empty()) {
        out.push_str(&format!("\nerror: {e}"));
    }
    if matches!(header.status, ExecStatus::Failed | ExecStatus::Cancelled) {
        let mut steps: Vec<&str> = header.stopped.iter().map(|t| t.step.as_str()).collect();
        steps.dedup();
        let again = if steps.is_empty() {
            String::new()
        } else {
            format!(" (runs again: {})", steps.join(", "))
        };
        out.push_str(&format!(
            "\nto go on where it stopped: noetl exec resume {id}{again}; `noetl exec show {id}` shows what failed"
        ));
    }
    out
}
