//! [`explain`]: what each open token waits for, as a plain function of
//! what `run` read ([`Situation`]).

use noetl_mesh::event_type::EventType;
use std::collections::BTreeMap;

use noetl_core::Playbook;
use noetl_mesh::events;
use noetl_mesh::pause::PauseRecord;
use noetl_mesh::served::QueueCounts;
use noetl_mesh::signal::Waiter;
use noetl_mesh::state::ExecHeader;
use noetl_wire::Event;
use serde_json::Value;

use super::gates::GateWait;
use super::reason::{Reason, Wait};
use super::words::words;
use crate::commands::tree::{RunNode, Tree};

/// What [`explain`] reads.
pub struct Situation<'a> {
    /// The execution's header.
    pub header: &'a ExecHeader,
    /// Its events as a tree.
    pub tree: &'a Tree,
    /// Its events (joins and time limits).
    pub events: &'a [Event],
    /// Its playbook (each step's tasks and their kinds).
    pub playbook: Option<&'a Playbook>,
    /// The queue of each tool kind involved (`None`: no consumer).
    pub queues: &'a BTreeMap<String, Option<QueueCounts>>,
    /// The pause, if the execution is paused.
    pub paused: Option<&'a PauseRecord>,
    /// The `wait` tasks waiting for a signal.
    pub waiters: &'a [Waiter],
    /// The places it waits in behind concurrency keys and rate limits.
    pub gates: &'a [GateWait],
    /// Now (Unix epoch ms): a retry's delay may still run.
    pub now_ms: u64,
}

/// The tool kinds whose queues [`explain`] may name: those of every
/// step with a live token.
pub fn kinds_involved(header: &ExecHeader, playbook: Option<&Playbook>) -> Vec<String> {
    let mut kinds: Vec<String> = header
        .live
        .iter()
        .filter_map(|t| step_of(playbook, &t.step))
        .flat_map(|s| s.tool.iter().map(|task| task.kind.clone()))
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

fn step_of<'a>(playbook: Option<&'a Playbook>, step: &str) -> Option<&'a noetl_core::Step> {
    playbook?.workflow.iter().find(|s| s.step == step)
}

/// What each open token of the execution waits for, and the joins
/// waiting for more arrivals.
pub fn explain(s: &Situation<'_>) -> Vec<Wait> {
    let mut out: Vec<Wait> = s
        .header
        .live
        .iter()
        .map(|t| {
            let run = s
                .tree
                .steps
                .iter()
                .filter(|n| n.step == t.step)
                .flat_map(|n| n.runs.iter())
                .find(|r| r.step_run_id == t.token_id);
            let reason = match (run, s.paused) {
                (None, Some(p)) => Reason::Paused {
                    by: p.by.clone(),
                    since: p.at.clone(),
                },
                (None, None) => queued_execution(s.gates).unwrap_or(Reason::Scheduler),
                (Some(run), _) => reason_of_run(s, &t.step, run),
            };
            wait(&t.step, &t.token_id, reason)
        })
        .collect();
    out.extend(
        waiting_joins(s.events)
            .into_iter()
            .map(|(step, reason)| wait(&step, "", reason)),
    );
    out
}

fn wait(step: &str, token_id: &str, reason: Reason) -> Wait {
    Wait {
        step: step.to_string(),
        token_id: token_id.to_string(),
        text: words(step, &reason),
        reason,
    }
}

/// A started step-run: its loop, its running task, or the task queued.
fn reason_of_run(s: &Situation<'_>, step: &str, run: &RunNode) -> Reason {
    if let Some(l) = run.loop_.as_ref().filter(|l| !l.finished) {
        return Reason::Loop {
            total: l.total,
            in_flight: l.started.saturating_sub(l.done + l.failed),
            done: l.done,
            failed: l.failed,
        };
    }
    let tasks = step_of(s.playbook, step)
        .map(|st| st.tool.as_slice())
        .unwrap_or(&[]);
    let kind_of = |name: &str| {
        tasks
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.kind.clone())
            .unwrap_or_default()
    };
    if let Some(w) = s.waiters.iter().find(|w| w.step_run_id == run.step_run_id) {
        return Reason::Signal {
            task: w.task.clone(),
            signal: w.signal.clone(),
            timeout_at: w.timeout_at_ms.map(events::rfc3339_of_ms),
        };
    }
    if let Some(t) = run.tasks.iter().find(|t| t.running > 0) {
        return Reason::Running {
            task: t.task.clone(),
            tool: kind_of(&t.task),
            attempt: t.attempt.max(1),
        };
    }
    if let Some(retry) = retry_pending(s, run) {
        return retry;
    }
    // The next task: the one after the last reported, or (a failed last
    // attempt) the same one again; the first before any report.
    let last = run.tasks.last();
    let next = match last {
        None => tasks.first(),
        Some(t) if t.failed > 0 && t.failed == t.runs => tasks.iter().find(|x| x.name == t.task),
        Some(t) => tasks
            .iter()
            .position(|x| x.name == t.task)
            .and_then(|i| tasks.get(i + 1)),
    };
    match next {
        Some(task) => {
            gated_task(s.gates, &run.step_run_id, &task.name).unwrap_or_else(|| Reason::Queued {
                task: task.name.clone(),
                tool: task.kind.clone(),
                queue: s.queues.get(&task.kind).copied().flatten(),
            })
        }
        None => Reason::Scheduler,
    }
}

/// The execution's place behind its concurrency key, if it is queued.
fn queued_execution(gates: &[GateWait]) -> Option<Reason> {
    gates.iter().find_map(|g| match g {
        GateWait::Execution {
            key,
            limit,
            held_by,
            position,
        } => Some(Reason::ConcurrencyQueue {
            key: key.clone(),
            limit: *limit,
            held_by: held_by.clone(),
            position: *position,
        }),
        _ => None,
    })
}

/// The step-run's task waiting for a concurrency slot or a rate token.
fn gated_task(gates: &[GateWait], step_run_id: &str, task: &str) -> Option<Reason> {
    gates.iter().find_map(|g| match g {
        GateWait::Task {
            step_run_id: r,
            key,
            limit,
            held_by,
        } if r == step_run_id => Some(Reason::Concurrency {
            task: task.to_string(),
            key: key.clone(),
            limit: *limit,
            held_by: held_by.clone(),
        }),
        GateWait::Rate {
            step_run_id: r,
            key,
            due_ms,
        } if r == step_run_id => Some(Reason::Rate {
            task: task.to_string(),
            key: key.clone(),
            until: events::rfc3339_of_ms(*due_ms),
        }),
        _ => None,
    })
}

/// The step-run's last `task.done`, when it scheduled a delayed retry
/// that is not due yet.
fn retry_pending(s: &Situation<'_>, run: &RunNode) -> Option<Reason> {
    let last = s.events.iter().rev().find(|e| {
        e.event_type == EventType::TaskDone.wire_name() && e.step_run_id == run.step_run_id
    })?;
    let p = events::payload(last);
    if p.get("action").and_then(Value::as_str) != Some("retry") {
        return None;
    }
    let delay = p.pointer("/retry/delay_ms").and_then(Value::as_u64)?;
    let attempt = p
        .pointer("/retry/next_attempt")
        .and_then(Value::as_u64)
        .unwrap_or(0) as u32;
    let done_ms = match last.ts_ms {
        0 => events::ms_of_rfc3339(&last.ts)?,
        ms => ms,
    };
    let at = done_ms.saturating_add(delay);
    (at > s.now_ms).then(|| Reason::Retry {
        task: last.task.clone(),
        attempt,
        at: events::rfc3339_of_ms(at),
    })
}

/// Joins whose last arrival (`step.skipped`, reason `join.waiting`) was
/// not followed by the join starting: the steps arrived and missing.
fn waiting_joins(events: &[Event]) -> Vec<(String, Reason)> {
    let mut open: BTreeMap<String, Reason> = BTreeMap::new();
    for ev in events {
        match EventType::of(ev) {
            Some(EventType::StepSkipped) => {
                let p = events::payload(ev);
                if p.get("reason").and_then(Value::as_str) != Some("join.waiting") {
                    continue;
                }
                let num = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(0);
                let (arrived, inputs) = (num("arrived"), num("inputs"));
                open.insert(ev.step.clone(), Reason::Join { arrived, inputs });
            }
            Some(EventType::StepStarted) | Some(EventType::StepScheduled) => {
                open.remove(&ev.step);
            }
            _ => {}
        }
    }
    open.into_iter().collect()
}
