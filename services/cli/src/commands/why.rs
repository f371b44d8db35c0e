//! `noetl exec why ID`: for a running execution, what each open token
//! waits for, in words. [`explain`] is a plain function of what was read:
//! the header's live tokens, the execution's events (as a [`Tree`], and
//! the joins and time limits they record), each step's tasks and kinds
//! from the plan, and the work queue of each kind; [`run`] only reads.

use std::collections::BTreeMap;
use std::process::ExitCode;

use noetl_core::Playbook;
use noetl_mesh::events::{self, types};
use noetl_mesh::pause::PauseRecord;
use noetl_mesh::served::QueueCounts;
use noetl_mesh::signal::Waiter;
use noetl_mesh::state::{ExecHeader, ExecStatus};
use noetl_wire::Event;
use serde::Serialize;
use serde_json::Value;

use super::common::MeshArgs;
use super::tree::{RunNode, Tree};
use super::why_gates::GateWait;

/// Arguments of `noetl exec why`.
#[derive(clap::Args)]
pub struct WhyArgs {
    /// Execution id.
    pub id: String,
    /// Print `{"execution_id", "status", "waits": [...]}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// What one open token waits for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Wait {
    /// The step.
    pub step: String,
    /// The token (also its step-run id); empty for a join's arrivals.
    pub token_id: String,
    /// The reason, for tools.
    pub reason: Reason,
    /// The reason, in words.
    pub text: String,
}

/// Why a token has not moved on.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// The execution is paused: the token waits for the unpause.
    Paused {
        /// Who paused it.
        by: String,
        /// Since when (RFC 3339).
        since: String,
    },
    /// The scheduler has not taken the token yet.
    Scheduler,
    /// The execution waits in line behind its playbook's concurrency key
    /// (`executor.spec.policy.concurrency`): its entry step starts when a
    /// slot frees.
    ConcurrencyQueue {
        /// The key.
        key: String,
        /// Its limit.
        limit: u32,
        /// The executions holding its slots.
        held_by: Vec<String>,
        /// 1-based place in line.
        position: usize,
    },
    /// A task waits for a slot of its step's concurrency key.
    Concurrency {
        /// The task.
        task: String,
        /// The key.
        key: String,
        /// Its limit.
        limit: u32,
        /// Who holds its slots.
        held_by: Vec<String>,
    },
    /// A task waits for its step's rate limit.
    Rate {
        /// The task.
        task: String,
        /// The key.
        key: String,
        /// When its token is due (RFC 3339).
        until: String,
    },
    /// A join waits for more of its inputs.
    Join {
        /// Inputs arrived so far.
        arrived: u64,
        /// Inputs it waits for in all.
        inputs: u64,
    },
    /// A task was sent to an executor of its kind and waits in the queue.
    Queued {
        /// The task.
        task: String,
        /// Its tool kind.
        tool: String,
        /// The kind's queue, when its consumer exists.
        queue: Option<QueueCounts>,
    },
    /// A task failed and its policy retries it after a delay.
    Retry {
        /// The task.
        task: String,
        /// The next attempt.
        attempt: u32,
        /// When it is sent again (RFC 3339).
        at: String,
    },
    /// A task runs on an executor.
    Running {
        /// The task.
        task: String,
        /// Its tool kind.
        tool: String,
        /// The attempt.
        attempt: u64,
    },
    /// A `wait` task waits for a signal.
    Signal {
        /// The task.
        task: String,
        /// The signal it waits for.
        signal: String,
        /// When it times out (RFC 3339), if it does.
        timeout_at: Option<String>,
    },
    /// A loop: iterations in flight.
    Loop {
        /// Iterations in all.
        total: u64,
        /// Dispatched and not reported.
        in_flight: u64,
        /// Reported done.
        done: u64,
        /// Reported failed.
        failed: u64,
    },
}

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
    let last = s
        .events
        .iter()
        .rev()
        .find(|e| e.event_type == types::TASK_DONE && e.step_run_id == run.step_run_id)?;
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
        0 => events::parse_rfc3339(&last.ts)?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_millis() as u64,
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
        match ev.event_type.as_str() {
            types::STEP_SKIPPED => {
                let p = events::payload(ev);
                if p.get("reason").and_then(Value::as_str) != Some("join.waiting") {
                    continue;
                }
                let num = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(0);
                let (arrived, inputs) = (num("arrived"), num("inputs"));
                open.insert(ev.step.clone(), Reason::Join { arrived, inputs });
            }
            types::STEP_STARTED | types::STEP_SCHEDULED => {
                open.remove(&ev.step);
            }
            _ => {}
        }
    }
    open.into_iter().collect()
}

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
        match ev.event_type.as_str() {
            types::EXECUTION_DEADLINE => {
                if let Some(at) = p.get("at_ms").and_then(Value::as_u64) {
                    out.push(format!(
                        "the execution's deadline is at {}",
                        events::rfc3339_of_ms(at)
                    ));
                }
            }
            types::EXECUTION_CANCEL_REQUESTED if header.status == ExecStatus::Running => {
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
    let status = super::exec::status_name(header.status);
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

/// `noetl exec why`.
pub async fn run(a: WhyArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let Some(header) = mesh.exec_header(&a.id).await? else {
        return Ok(super::exec::no_execution(&mesh, &a.id));
    };
    let stored = mesh
        .stored_events(&mesh.subjects().events_of(&a.id))
        .await?;
    let events: Vec<Event> = stored.into_iter().filter_map(Result::ok).collect();
    let tree = Tree::from_events(&a.id, &events);
    let plan = mesh.plans().get(&mesh, &a.id).await.ok();
    let playbook = plan.as_ref().map(|p| &p.playbook);
    let paused = mesh.pause_record(&a.id).await?;
    let waiters = mesh.waiters(&a.id).await?;
    let mut queues = BTreeMap::new();
    let mut gates = Vec::new();
    if header.status == ExecStatus::Running {
        gates = super::why_gates::read(&mesh, &a.id, events::now_ms()).await?;
        for kind in kinds_involved(&header, playbook) {
            let q = mesh.queue_of(&kind).await?;
            queues.insert(kind, q);
        }
    }
    let waits = if header.status == ExecStatus::Running {
        explain(&Situation {
            header: &header,
            tree: &tree,
            events: &events,
            playbook,
            queues: &queues,
            paused: paused.as_ref(),
            waiters: &waiters,
            gates: &gates,
            now_ms: events::now_ms(),
        })
    } else {
        Vec::new()
    };
    let notes = notes(&header, &events, paused.as_ref());
    let status = super::exec::status_name(header.status);
    if a.json {
        let out = serde_json::json!({
            "execution_id": a.id, "status": status, "waits": waits, "notes": notes,
        });
        println!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    if header.status != ExecStatus::Running {
        println!("{}", ended(&header));
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "execution {} is running ({} open token(s))",
        a.id,
        header.live.len()
    );
    for w in &waits {
        println!("- {}", w.text);
    }
    for n in &notes {
        println!("note: {n}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_mesh::events::EventDraft;
    use noetl_mesh::served::ConsumerCounts;
    use noetl_mesh::state::TokenRecord;
    use serde_json::json;
    use std::time::Duration;

    const PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: why}
workflow:
  - step: start
    tool:
      - {name: fetch, kind: http, url: "http://x"}
      - {name: store, kind: postgres, command: "select 1"}
    next: {arcs: [{step: merge}]}
  - step: side
    tool: [{name: n, kind: noop}]
    next: {arcs: [{step: merge}]}
  - step: merge
    spec: {join: all}
    tool: [{name: m, kind: noop}]
"#;

    fn ev(kind: &str, step: &str, run: &str, payload: Value) -> Event {
        let task = payload
            .get("task")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        EventDraft {
            event_type: kind,
            execution_id: "e1",
            step,
            step_run_id: run,
            task: &task,
            payload,
            ..Default::default()
        }
        .build()
    }

    fn header(live: &[(&str, &str)]) -> ExecHeader {
        ExecHeader::running(
            "e1",
            live.iter().map(|(t, s)| TokenRecord::new(*t, *s)).collect(),
        )
    }

    fn explain_of(
        live: &[(&str, &str)],
        events: &[Event],
        queues: &BTreeMap<String, Option<QueueCounts>>,
    ) -> Vec<Wait> {
        let pb = noetl_core::load::load_playbook(PLAYBOOK, "why.yaml")
            .expect("the playbook loads")
            .playbook;
        let h = header(live);
        let tree = Tree::from_events("e1", events);
        explain(&Situation {
            header: &h,
            tree: &tree,
            events,
            playbook: Some(&pb),
            queues,
            paused: None,
            waiters: &[],
            gates: &[],
            now_ms: 0,
        })
    }

    fn queue(waiting: usize, busy: usize, pending: u64) -> Option<QueueCounts> {
        Some(QueueCounts {
            consumer: ConsumerCounts {
                waiting,
                ack_pending: busy,
                idle_for: Duration::from_secs(42),
            },
            pending,
        })
    }

    #[test]
    fn a_token_not_yet_started_waits_for_the_scheduler() {
        let w = explain_of(&[("t1", "start")], &[], &BTreeMap::new());
        assert_eq!(w[0].reason, Reason::Scheduler);
        assert!(w[0].text.contains("scheduler"), "{}", w[0].text);
    }

    #[test]
    fn a_failed_execution_names_its_error_and_exec_resume() {
        let mut h = header(&[("t2", "total")]);
        h.end(
            ExecStatus::Failed,
            "step total failed: boom",
            "2026-11-28T00:00:00Z",
        );
        let text = ended(&h);
        assert!(text.contains("has ended (failed)"), "{text}");
        assert!(text.contains("error: step total failed: boom"), "{text}");
        assert!(
            text.contains("noetl exec resume e1 (runs again: total)"),
            "{text}"
        );
        let mut done = header(&[]);
        done.end(ExecStatus::Completed, "", "2026-11-28T00:00:00Z");
        assert!(
            !ended(&done).contains("resume"),
            "a completed one has nothing to resume"
        );
    }

    #[test]
    fn a_paused_execution_holds_tokens_not_yet_started_and_says_so() {
        let pb = noetl_core::load::load_playbook(PLAYBOOK, "why.yaml")
            .unwrap()
            .playbook;
        let h = header(&[("t1", "start")]);
        let tree = Tree::from_events("e1", &[]);
        let pause = PauseRecord {
            by: "cli:ann".into(),
            reason: "db maintenance".into(),
            at: "2026-11-26T10:00:00Z".into(),
        };
        let w = explain(&Situation {
            header: &h,
            tree: &tree,
            events: &[],
            playbook: Some(&pb),
            queues: &BTreeMap::new(),
            paused: Some(&pause),
            waiters: &[],
            gates: &[],
            now_ms: 0,
        });
        assert!(matches!(&w[0].reason, Reason::Paused { by, .. } if by == "cli:ann"));
        assert!(w[0].text.contains("held by a pause"), "{}", w[0].text);
        let n = notes(&h, &[], Some(&pause));
        assert!(
            n[0].contains("paused by cli:ann") && n[0].contains("db maintenance"),
            "{n:?}"
        );
    }

    #[test]
    fn a_started_step_waits_for_its_next_task_in_the_kind_queue() {
        let started = ev(types::STEP_STARTED, "start", "t1", json!({}));
        let none = explain_of(
            &[("t1", "start")],
            std::slice::from_ref(&started),
            &BTreeMap::new(),
        );
        assert!(
            matches!(&none[0].reason, Reason::Queued { task, tool, queue: None } if task == "fetch" && tool == "http")
        );
        assert!(
            none[0]
                .text
                .contains("no executor of kind http has ever started"),
            "{}",
            none[0].text
        );

        let fetched = ev(
            types::TASK_DONE,
            "start",
            "t1",
            json!({"task": "fetch", "status": "ok", "attempt": 1}),
        );
        let busy: BTreeMap<_, _> = [("postgres".to_string(), queue(0, 4, 7))].into();
        let w = explain_of(&[("t1", "start")], &[started.clone(), fetched], &busy);
        assert!(
            matches!(&w[0].reason, Reason::Queued { task, tool, .. } if task == "store" && tool == "postgres")
        );
        assert!(
            w[0].text
                .contains("busy (4 task(s) in progress), 7 waiting"),
            "{}",
            w[0].text
        );

        let unbound: BTreeMap<_, _> = [("http".to_string(), queue(0, 0, 1))].into();
        let w = explain_of(&[("t1", "start")], &[started], &unbound);
        assert!(
            w[0].text.contains("no executor of kind http is bound now"),
            "{}",
            w[0].text
        );
    }

    #[test]
    fn a_running_task_and_a_loop_say_so() {
        let started = ev(types::STEP_STARTED, "start", "t1", json!({}));
        let task = ev(
            types::TASK_STARTED,
            "start",
            "t1",
            json!({"task": "fetch", "attempt": 2}),
        );
        let w = explain_of(&[("t1", "start")], &[started, task], &BTreeMap::new());
        assert!(
            matches!(&w[0].reason, Reason::Running { task, tool, .. } if task == "fetch" && tool == "http"),
            "{:?}",
            w[0]
        );

        let looped = vec![
            ev(types::STEP_STARTED, "side", "t2", json!({})),
            ev(
                types::LOOP_STARTED,
                "side",
                "t2",
                json!({"total": 10, "max_in_flight": 3, "mode": "parallel"}),
            ),
        ];
        let mut events = looped;
        for i in 0..5u64 {
            events.push(ev(
                types::LOOP_ITERATION_STARTED,
                "side",
                "t2",
                json!({"loop_run_id": "lr", "index": i}),
            ));
        }
        events.push(ev(
            types::LOOP_ITERATION_DONE,
            "side",
            "t2",
            json!({"loop_run_id": "lr", "index": 0, "status": "ok"}),
        ));
        let w = explain_of(&[("t2", "side")], &events, &BTreeMap::new());
        assert_eq!(
            w[0].reason,
            Reason::Loop {
                total: 10,
                in_flight: 4,
                done: 1,
                failed: 0
            },
            "{}",
            w[0].text
        );
        assert!(w[0].text.contains("4 in flight of 10"), "{}", w[0].text);
    }

    #[test]
    fn a_wait_task_names_its_signal_and_timeout() {
        let pb = noetl_core::load::load_playbook(PLAYBOOK, "why.yaml")
            .unwrap()
            .playbook;
        let h = header(&[("t1", "start")]);
        let events = [
            ev(types::STEP_STARTED, "start", "t1", json!({})),
            ev(
                types::TASK_STARTED,
                "start",
                "t1",
                json!({"task": "fetch", "attempt": 1}),
            ),
        ];
        let tree = Tree::from_events("e1", &events);
        let waiter = Waiter {
            signal: "approval".into(),
            step: "start".into(),
            step_run_id: "t1".into(),
            task: "fetch".into(),
            task_run_id: "tr1".into(),
            since: "2026-11-26T10:00:00Z".into(),
            timeout_at_ms: Some(0),
            schema: None,
            command: String::new(),
            delivered: None,
        };
        let w = explain(&Situation {
            header: &h,
            tree: &tree,
            events: &events,
            playbook: Some(&pb),
            queues: &BTreeMap::new(),
            paused: None,
            waiters: std::slice::from_ref(&waiter),
            gates: &[],
            now_ms: 0,
        });
        assert!(matches!(&w[0].reason, Reason::Signal { signal, .. } if signal == "approval"));
        assert!(
            w[0].text.contains("waits for signal `approval`")
                && w[0].text.contains("times out at 1970-01-01"),
            "{}",
            w[0].text
        );
    }

    #[test]
    fn a_delayed_retry_says_when_until_it_is_due() {
        let started = ev(types::STEP_STARTED, "start", "t1", json!({}));
        let failed = ev(
            types::TASK_DONE,
            "start",
            "t1",
            json!({"task": "fetch", "status": "error", "attempt": 1, "action": "retry",
                   "retry": {"delay_ms": 60_000, "next_attempt": 2}}),
        );
        let w = explain_of(
            &[("t1", "start")],
            &[started.clone(), failed.clone()],
            &BTreeMap::new(),
        );
        assert!(
            matches!(&w[0].reason, Reason::Retry { task, attempt: 2, .. } if task == "fetch"),
            "{:?}",
            w[0]
        );
        assert!(
            w[0].text.contains("retried (attempt 2) at"),
            "{}",
            w[0].text
        );
    }

    #[test]
    fn a_join_waiting_names_the_arcs_it_misses_until_it_starts() {
        let arrival = ev(
            types::STEP_SKIPPED,
            "merge",
            "t3",
            json!({"reason": "join.waiting", "arrived": 1, "inputs": 2}),
        );
        let w = explain_of(&[], std::slice::from_ref(&arrival), &BTreeMap::new());
        assert_eq!(
            w[0].reason,
            Reason::Join {
                arrived: 1,
                inputs: 2
            }
        );
        assert!(
            w[0].text.contains("1 more arc(s) (1 of 2 arrived)"),
            "{}",
            w[0].text
        );
        let fired = ev(types::STEP_SCHEDULED, "merge", "t4", json!({}));
        assert!(explain_of(&[], &[arrival, fired], &BTreeMap::new()).is_empty());
    }

    #[test]
    fn a_queued_execution_and_a_task_behind_a_key_or_a_rate_say_so() {
        let pb = noetl_core::load::load_playbook(PLAYBOOK, "why.yaml")
            .expect("the playbook loads")
            .playbook;
        let queued = [GateWait::Execution {
            key: "cust-a".into(),
            limit: 2,
            held_by: vec!["e7".into(), "e8".into()],
            position: 3,
        }];
        let h = header(&[("t1", "start")]);
        let tree = Tree::from_events("e1", &[]);
        let queues = BTreeMap::new();
        let situation = |gates| Situation {
            header: &h,
            tree: &tree,
            events: &[],
            playbook: Some(&pb),
            queues: &queues,
            paused: None,
            waiters: &[],
            gates,
            now_ms: 0,
        };
        let w = explain(&situation(&queued));
        assert!(matches!(
            &w[0].reason,
            Reason::ConcurrencyQueue { position: 3, .. }
        ));
        assert_eq!(
            w[0].text,
            "step `start`: the execution is queued behind concurrency key `cust-a` (limit 2) held by executions e7, e8; position 3"
        );
        let json = serde_json::to_value(&w[0]).unwrap();
        assert_eq!(json["reason"]["kind"], "concurrency_queue");
        assert_eq!(json["reason"]["held_by"], json!(["e7", "e8"]));

        let events = [
            ev("step.scheduled", "start", "t1", json!({})),
            ev("step.started", "start", "t1", json!({})),
        ];
        let tree = Tree::from_events("e1", &events);
        let gates = [GateWait::Task {
            step_run_id: "t1".into(),
            key: "api".into(),
            limit: 1,
            held_by: vec!["e9 (step start)".into()],
        }];
        let mut s = situation(&gates);
        s.tree = &tree;
        s.events = &events;
        let w = explain(&s);
        assert_eq!(
            w[0].text,
            "step `start`: task `fetch` waits: concurrency key `api` (limit 1) held by e9 (step start)"
        );
        let gates = [GateWait::Rate {
            step_run_id: "t1".into(),
            key: "api".into(),
            due_ms: 1_000,
        }];
        s.gates = &gates;
        let w = explain(&s);
        assert!(matches!(&w[0].reason, Reason::Rate { .. }));
        assert_eq!(
            w[0].text,
            "step `start`: task `fetch` waits: rate limit `api` until 1970-01-01T00:00:01.000Z"
        );
    }
}
