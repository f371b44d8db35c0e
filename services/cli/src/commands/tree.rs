//! `noetl exec show`: an execution as a tree of steps, their runs, loop
//! counts and tasks, built from its events alone (a plain function).

use noetl_mesh::event_type::EventType;
use noetl_mesh::events;
use noetl_mesh::payloads;
use noetl_wire::Event;
use serde::Serialize;
use serde_json::Value;

use super::problems::{Problems, ProblemsFold};

/// An execution as its events tell it.
#[derive(Debug, Default, Serialize)]
pub struct Tree {
    pub execution_id: String,
    /// `running`, or the terminal event's status.
    pub status: String,
    /// The steps in the order they first appear.
    pub steps: Vec<StepNode>,
    /// What went wrong: failures with their task errors, failed
    /// iterations, errors a policy rule handled.
    #[serde(skip_serializing_if = "Problems::is_empty")]
    pub problems: Problems,
}

/// One step and its runs.
#[derive(Debug, Default, Serialize)]
pub struct StepNode {
    pub step: String,
    pub runs: Vec<RunNode>,
}

/// One step-run.
#[derive(Debug, Default, Serialize)]
pub struct RunNode {
    pub step_run_id: String,
    /// `scheduled`, `running`, `done`, `failed` or `skipped`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(rename = "loop", skip_serializing_if = "Option::is_none")]
    pub loop_: Option<LoopNode>,
    pub tasks: Vec<TaskNode>,
}

/// A loop run's counts.
#[derive(Debug, Default, Serialize)]
pub struct LoopNode {
    pub total: u64,
    pub started: u64,
    pub done: u64,
    pub failed: u64,
    pub finished: bool,
}

/// One task of a step-run (all its iterations together in a loop).
#[derive(Debug, Default, Serialize)]
pub struct TaskNode {
    pub task: String,
    /// Runs reported done (each attempt of each iteration).
    pub runs: u64,
    /// Of those, failed.
    pub failed: u64,
    /// The highest attempt seen.
    pub attempt: u64,
    /// Time in the tool, all runs together.
    pub duration_ms: u64,
    /// Runs started and not reported yet.
    pub running: u64,
}

/// A [`Tree`] built event by event ([`Self::apply`]), for a reader that
/// does not hold the log (a loop of 100,000 iterations is 300,000 events).
#[derive(Debug)]
pub struct TreeFold {
    tree: Tree,
    problems: ProblemsFold,
}

impl TreeFold {
    /// An execution's tree before its first event.
    pub fn new(execution_id: &str) -> Self {
        Self {
            tree: Tree {
                execution_id: execution_id.to_string(),
                status: "running".into(),
                steps: Vec::new(),
                problems: Problems::default(),
            },
            problems: ProblemsFold::default(),
        }
    }

    /// Take the next event of the execution, in order.
    pub fn apply(&mut self, ev: &Event) {
        self.problems.apply(ev);
        let t = &mut self.tree;
        let p = events::payload(ev);
        let status = match EventType::of(ev) {
            Some(EventType::ExecutionCompleted) => Some("completed"),
            Some(EventType::ExecutionFailed) => Some("failed"),
            Some(EventType::ExecutionCancelled) => Some("cancelled"),
            _ => None,
        };
        if let Some(s) = status {
            t.status = s.into();
            return;
        }
        if ev.step.is_empty() || ev.step_run_id.is_empty() {
            return;
        }
        // A token (a `token.created`, or one a `next.selected` fired)
        // names the step it is for and carries the run id of the
        // step-run that fired it: its own id is the run it starts.
        for token in payloads::tokens_created(ev).unwrap_or_default() {
            t.run(&token.step, &token.token_id);
        }
        if EventType::of(ev) == Some(EventType::TokenCreated) {
            return;
        }
        let run = t.run(&ev.step, &ev.step_run_id);
        apply(run, ev, &p);
    }

    /// The tree of the events taken.
    pub fn finish(self) -> Tree {
        let mut t = self.tree;
        t.problems = self.problems.finish();
        if t.status != "running" {
            // Scheduled when the execution ended: it never started.
            for r in t.steps.iter_mut().flat_map(|s| s.runs.iter_mut()) {
                if r.status == "scheduled" {
                    r.status = "not started".into();
                }
            }
        }
        t
    }
}

impl Tree {
    /// The tree of `events` (one execution's, in order); readers of a log
    /// fold it as they read ([`TreeFold`]).
    #[cfg(test)]
    pub fn from_events(execution_id: &str, events: &[Event]) -> Self {
        let mut fold = TreeFold::new(execution_id);
        for ev in events {
            fold.apply(ev);
        }
        fold.finish()
    }

    fn run(&mut self, step: &str, srid: &str) -> &mut RunNode {
        let i = match self.steps.iter().position(|s| s.step == step) {
            Some(i) => i,
            None => {
                self.steps.push(StepNode {
                    step: step.to_string(),
                    runs: Vec::new(),
                });
                self.steps.len() - 1
            }
        };
        let runs = &mut self.steps[i].runs;
        let j = match runs.iter().position(|r| r.step_run_id == srid) {
            Some(j) => j,
            None => {
                runs.push(RunNode {
                    step_run_id: srid.to_string(),
                    status: "scheduled".into(),
                    ..Default::default()
                });
                runs.len() - 1
            }
        };
        &mut runs[j]
    }

    /// The tree for people, one line per node.
    pub fn render(&self) -> String {
        let mut out = format!("execution {}  {}\n", self.execution_id, self.status);
        for s in &self.steps {
            for r in &s.runs {
                let short: String = r.step_run_id.chars().take(12).collect();
                out.push_str(&format!("  step {}  {}  (run {short})", s.step, r.status));
                if let Some(e) = &r.error {
                    out.push_str(&format!("  error: {e}"));
                }
                out.push('\n');
                if let Some(l) = &r.loop_ {
                    let in_flight = l.started.saturating_sub(l.done + l.failed);
                    out.push_str(&format!(
                        "    loop  {}/{} done, {} failed, {in_flight} in flight{}\n",
                        l.done,
                        l.total,
                        l.failed,
                        if l.finished { ", finished" } else { "" }
                    ));
                }
                for task in &r.tasks {
                    out.push_str(&format!(
                        "    task {}  {} run(s), {} failed, attempt {}, {} ms{}\n",
                        task.task,
                        task.runs,
                        task.failed,
                        task.attempt,
                        task.duration_ms,
                        if task.running > 0 {
                            format!(", {} running", task.running)
                        } else {
                            String::new()
                        }
                    ));
                }
            }
        }
        out.push_str(&self.problems.render());
        out
    }
}

fn apply(run: &mut RunNode, ev: &Event, p: &Value) {
    let num = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(0);
    match EventType::of(ev) {
        Some(EventType::StepStarted) => run.status = "running".into(),
        Some(EventType::StepDone) => run.status = "done".into(),
        Some(EventType::StepSkipped) => run.status = "skipped".into(),
        Some(EventType::StepFailed) => {
            run.status = "failed".into();
            run.error = p
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        Some(EventType::LoopStarted) => {
            run.status = "running".into();
            run.loop_.get_or_insert_with(Default::default).total = num("total");
        }
        Some(EventType::LoopIterationStarted) => {
            run.loop_.get_or_insert_with(Default::default).started += 1
        }
        Some(EventType::LoopIterationDone) => {
            run.loop_.get_or_insert_with(Default::default).done += 1
        }
        Some(EventType::LoopIterationFailed) => {
            run.loop_.get_or_insert_with(Default::default).failed += 1
        }
        Some(EventType::LoopDone) => run.loop_.get_or_insert_with(Default::default).finished = true,
        Some(EventType::TaskStarted) | Some(EventType::TaskDone) => {
            let task = match run.tasks.iter().position(|t| t.task == ev.task) {
                Some(i) => &mut run.tasks[i],
                None => {
                    run.tasks.push(TaskNode {
                        task: ev.task.clone(),
                        ..Default::default()
                    });
                    run.tasks.last_mut().expect("just pushed")
                }
            };
            task.attempt = task.attempt.max(num("attempt"));
            if EventType::of(ev) == Some(EventType::TaskStarted) {
                task.running += 1;
            } else {
                task.running = task.running.saturating_sub(1);
                task.runs += 1;
                task.duration_ms += num("duration_ms");
                if p.get("status").and_then(Value::as_str) == Some("error") {
                    task.failed += 1;
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(t: &str, step: &str, srid: &str, task: &str, payload: Value) -> Event {
        Event {
            event_type: t.into(),
            execution_id: "e1".into(),
            step: step.into(),
            step_run_id: srid.into(),
            task: task.into(),
            payload_json: serde_json::to_vec(&payload).unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn a_tree_of_steps_runs_loops_and_tasks_from_events() {
        let events = vec![
            ev("step.started", "start", "r1", "", json!({})),
            ev(
                "task.started",
                "start",
                "r1",
                "fetch",
                json!({"attempt": 1}),
            ),
            ev(
                "task.done",
                "start",
                "r1",
                "fetch",
                json!({"status": "error", "attempt": 1, "duration_ms": 5}),
            ),
            ev(
                "task.started",
                "start",
                "r1",
                "fetch",
                json!({"attempt": 2}),
            ),
            ev(
                "task.done",
                "start",
                "r1",
                "fetch",
                json!({"status": "ok", "attempt": 2, "duration_ms": 7}),
            ),
            ev("step.done", "start", "r1", "", json!({"status": "ok"})),
            ev("loop.started", "each", "r2", "", json!({"total": 3})),
            ev(
                "loop.iteration.started",
                "each",
                "r2",
                "",
                json!({"index": 0}),
            ),
            ev(
                "loop.iteration.started",
                "each",
                "r2",
                "",
                json!({"index": 1}),
            ),
            ev("task.started", "each", "r2", "one", json!({"attempt": 1})),
            ev("loop.iteration.done", "each", "r2", "", json!({"index": 0})),
            ev(
                "step.failed",
                "other",
                "r3",
                "",
                json!({"error": {"kind": "x", "message": "boom"}}),
            ),
            ev("execution.failed", "", "", "", json!({})),
        ];
        let t = Tree::from_events("e1", &events);
        assert_eq!(t.status, "failed");
        let names: Vec<&str> = t.steps.iter().map(|s| s.step.as_str()).collect();
        assert_eq!(names, ["start", "each", "other"]);
        let fetch = &t.steps[0].runs[0].tasks[0];
        assert_eq!(
            (fetch.runs, fetch.failed, fetch.attempt, fetch.duration_ms),
            (2, 1, 2, 12)
        );
        assert_eq!(t.steps[0].runs[0].status, "done");
        let l = t.steps[1].runs[0].loop_.as_ref().unwrap();
        assert_eq!(
            (l.total, l.started, l.done, l.failed, l.finished),
            (3, 2, 1, 0, false)
        );
        assert_eq!(t.steps[1].runs[0].tasks[0].running, 1);
        assert_eq!(t.steps[2].runs[0].error.as_deref(), Some("boom"));
        let text = t.render();
        assert!(
            text.contains("loop  1/3 done, 0 failed, 1 in flight"),
            "{text}"
        );
        assert!(
            text.contains("task fetch  2 run(s), 1 failed, attempt 2, 12 ms"),
            "{text}"
        );
        assert!(text.contains("failed: step other: x: boom"), "{text}");
    }

    #[test]
    fn a_token_is_the_run_of_its_own_step_and_one_never_started_says_so() {
        let events = vec![
            ev("step.started", "start", "r1", "", json!({})),
            ev(
                "step.failed",
                "start",
                "r1",
                "",
                json!({"error": {"kind": "x", "message": "boom"}}),
            ),
            ev(
                "token.created",
                "cleanup",
                "r1",
                "",
                json!({"token_id": "t9", "step": "cleanup"}),
            ),
            // The tokens a boundary's arcs fire ride in its answer.
            ev(
                "next.selected",
                "start",
                "r1",
                "",
                json!({"on": "step.failed", "mode": "inclusive",
                       "arcs": [{"arc": 1, "step": "notify", "token_id": "t10"}]}),
            ),
            ev("execution.failed", "", "", "", json!({})),
        ];
        let t = Tree::from_events("e1", &events);
        let cleanup = &t.steps[1];
        assert_eq!(
            cleanup.runs[0].step_run_id, "t9",
            "not the run that fired it"
        );
        assert_eq!(cleanup.runs[0].status, "not started");
        let notify = &t.steps[2];
        assert_eq!(notify.step, "notify");
        assert_eq!(notify.runs[0].step_run_id, "t10");
        assert_eq!(notify.runs[0].status, "not started");
        assert_eq!(t.steps[0].runs.len(), 1, "the answer is of the run r1");
        assert!(!t.render().contains("scheduled"), "{}", t.render());
    }
}
