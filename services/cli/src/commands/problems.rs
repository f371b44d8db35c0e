//! What went wrong in an execution, told from its events alone (a plain
//! function): the task error that failed a step-run (with the python
//! traceback's last lines), the first loop iterations that failed, and the
//! task errors a policy rule handled (`continue`, `jump` or `break` on an
//! error outcome): those leave their step `done`, and must not vanish;
//! and the joins that never started before the execution ended (a step
//! shown `not_run` though a token reached it). `noetl run` prints them
//! under its summary, `noetl exec show` beside its tree.

use std::collections::{BTreeMap, HashMap};

use noetl_mesh::event_type::EventType;
use noetl_mesh::events;
use noetl_wire::Event;
use serde::Serialize;
use serde_json::Value;

/// Failed loop iterations shown, the first by index.
pub const ITERATIONS_SHOWN: usize = 3;

/// One task error.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TaskError {
    /// Its step.
    pub step: String,
    /// Its task (empty when no one task is to blame).
    pub task: String,
    /// The error's kind (`python.exception`, `http.status`...).
    pub kind: String,
    /// What went wrong.
    pub message: String,
    /// The python traceback's last lines, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceback: Option<String>,
    /// What the task's policy did about it (`continue`, `jump`, `break`
    /// for a handled error; `fail` otherwise).
    pub action: String,
    /// How many task runs ended with this same error (a loop's iterations).
    pub times: u64,
}

/// One failed loop iteration.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IterationError {
    /// The loop step.
    pub step: String,
    /// The iteration's index.
    pub index: u64,
    /// The task that failed it.
    pub task: String,
    /// The error's kind.
    pub kind: String,
    /// What went wrong.
    pub message: String,
}

/// A join that waited for more of its inputs when its execution ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct JoinUnfired {
    /// The join step.
    pub step: String,
    /// Its inputs arrived.
    pub arrived: u64,
    /// Its inputs in all.
    pub inputs: u64,
    /// The steps whose tokens arrived, in order (a name is missing when
    /// the events do not say which step-run routed the token).
    pub from: Vec<String>,
    /// The inputs no token came from, when the playbook is known
    /// ([`Problems::name_missing`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

/// What went wrong in one execution.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Problems {
    /// Step-runs that failed, with the task error that failed them.
    pub failed: Vec<TaskError>,
    /// The first [`ITERATIONS_SHOWN`] failed iterations of each loop, by
    /// index.
    pub iterations: Vec<IterationError>,
    /// Failed iterations in all.
    pub iterations_failed: u64,
    /// Task errors a policy rule handled.
    pub handled: Vec<TaskError>,
    /// Joins that never started: they waited for more inputs when the
    /// execution ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub joins: Vec<JoinUnfired>,
}

/// [`Problems`] told event by event ([`Self::apply`]), for a reader that
/// does not hold the log.
#[derive(Debug, Default)]
pub struct ProblemsFold {
    problems: Problems,
    /// The last task error of each step-run, for the traceback of the
    /// failure that follows it.
    last_error: Vec<(String, String, Value)>,
    /// The step of each step-run seen (the steps a join's tokens came
    /// from).
    runs: HashMap<String, String>,
    /// Joins waiting for more inputs now, by step.
    waiting: BTreeMap<String, JoinUnfired>,
}

impl ProblemsFold {
    /// Take the next event of the execution, in order.
    pub fn apply(&mut self, ev: &Event) {
        let (p, last_error) = (&mut self.problems, &mut self.last_error);
        let payload = events::payload(ev);
        let Some(t) = EventType::of(ev) else {
            return;
        };
        match t {
            EventType::TaskDone if payload["status"] == "error" => {
                let action = payload["action"].as_str().unwrap_or("").to_string();
                let error = &payload["error"];
                if matches!(action.as_str(), "continue" | "jump" | "break") {
                    p.handle(task_error(ev, error, &action));
                }
                last_error.retain(|(srid, task, _)| (srid, task) != (&ev.step_run_id, &ev.task));
                last_error.push((ev.step_run_id.clone(), ev.task.clone(), error.clone()));
            }
            EventType::StepFailed => {
                let error = &payload["error"];
                let mut failed = task_error(ev, error, "fail");
                failed.task = error["task"].as_str().unwrap_or("").to_string();
                failed.traceback = last_error
                    .iter()
                    .rev()
                    .find(|(srid, task, _)| srid == &ev.step_run_id && task == &failed.task)
                    .and_then(|(_, _, e)| e["traceback"].as_str())
                    .map(str::to_string);
                p.failed.push(failed);
            }
            EventType::LoopIterationFailed => p.iteration(ev, &payload),
            _ => {}
        }
        self.joins(t, ev, &payload);
    }

    /// The joins' side of `ev`: an arrival that waits, a join that
    /// starts, the execution's end (the joins still waiting never
    /// started) or its resume (its next end says).
    fn joins(&mut self, t: EventType, ev: &Event, payload: &Value) {
        match t {
            EventType::StepStarted | EventType::StepScheduled => {
                self.runs.insert(ev.step_run_id.clone(), ev.step.clone());
                self.waiting.remove(&ev.step);
            }
            EventType::StepDone | EventType::StepFailed => {
                self.runs.insert(ev.step_run_id.clone(), ev.step.clone());
            }
            EventType::StepSkipped if payload["reason"] == "join.waiting" => {
                let num = |k: &str| payload[k].as_u64().unwrap_or(0);
                let w = self
                    .waiting
                    .entry(ev.step.clone())
                    .or_insert_with(|| JoinUnfired {
                        step: ev.step.clone(),
                        ..Default::default()
                    });
                (w.arrived, w.inputs) = (num("arrived"), num("inputs"));
                if let Some(from) = self.runs.get(&ev.parent_id) {
                    w.from.push(from.clone());
                }
            }
            EventType::ExecutionResumed => self.problems.joins.clear(),
            t if t.ends_execution() => {
                self.problems.joins = self.waiting.values().cloned().collect();
            }
            _ => {}
        }
    }

    /// The problems the events taken tell of.
    pub fn finish(self) -> Problems {
        self.problems
    }
}

impl Problems {
    /// The problems `events` (one execution's, in order) tell of.
    #[cfg(test)]
    pub fn from_events(events: &[Event]) -> Self {
        let mut fold = ProblemsFold::default();
        for ev in events {
            fold.apply(ev);
        }
        fold.finish()
    }

    /// Name each waiting join's inputs that no token came from, from the
    /// playbook the execution ran (the events say only how many).
    pub fn name_missing(&mut self, playbook: &noetl_core::Playbook) {
        for j in &mut self.joins {
            let Some(step) = playbook.step(&j.step) else {
                continue;
            };
            let inputs = noetl_mesh::dispatch::join_inputs(playbook, step).unwrap_or_default();
            j.missing = inputs.into_iter().filter(|i| !j.from.contains(i)).collect();
        }
    }

    /// [`Self::name_missing`] from execution `eid`'s stored plan, when a
    /// join never started and the plan is still there (read only then).
    pub async fn name_missing_of(&mut self, mesh: &noetl_mesh::Mesh, eid: &str) {
        if self.joins.is_empty() {
            return;
        }
        if let Ok(plan) = mesh.plans().get(mesh, eid).await {
            self.name_missing(&plan.playbook);
        }
    }

    /// Nothing went wrong.
    pub fn is_empty(&self) -> bool {
        self.failed.is_empty()
            && self.iterations.is_empty()
            && self.handled.is_empty()
            && self.joins.is_empty()
    }

    /// A handled error: counted with the same one seen before.
    fn handle(&mut self, e: TaskError) {
        match self.handled.iter_mut().find(|h| {
            (&h.step, &h.task, &h.kind, &h.message) == (&e.step, &e.task, &e.kind, &e.message)
        }) {
            Some(h) => h.times += 1,
            None => self.handled.push(e),
        }
    }

    /// A failed iteration: kept when among the first of its loop.
    fn iteration(&mut self, ev: &Event, payload: &Value) {
        self.iterations_failed += 1;
        let error = &payload["error"];
        let it = IterationError {
            step: ev.step.clone(),
            index: payload["index"].as_u64().unwrap_or(0),
            task: error["task"].as_str().unwrap_or("").to_string(),
            kind: error["kind"].as_str().unwrap_or("").to_string(),
            message: error["message"].as_str().unwrap_or("").to_string(),
        };
        self.iterations.push(it);
        self.iterations.sort_by_key(|i| (i.step.clone(), i.index));
        let mut kept = 0usize;
        let mut step = String::new();
        self.iterations.retain(|i| {
            if i.step != step {
                step = i.step.clone();
                kept = 0;
            }
            kept += 1;
            kept <= ITERATIONS_SHOWN
        });
    }

    /// The problems for people under a `what went wrong:` line, indented
    /// by two, one line each but the traceback's; empty when there are
    /// none.
    pub fn render(&self) -> String {
        if self.is_empty() {
            return String::new();
        }
        let mut out = String::from("what went wrong:\n");
        for f in &self.failed {
            out.push_str(&format!("  failed: {}\n", place(f)));
            if let Some(tb) = &f.traceback {
                for line in tb.lines() {
                    out.push_str(&format!("      {line}\n"));
                }
            }
        }
        if !self.iterations.is_empty() {
            out.push_str(&format!(
                "  {} iteration(s) failed; the first:\n",
                self.iterations_failed
            ));
            for i in &self.iterations {
                out.push_str(&format!(
                    "    {}[{}].{}: {}: {}\n",
                    i.step, i.index, i.task, i.kind, i.message
                ));
            }
        }
        for h in &self.handled {
            let times = if h.times > 1 {
                format!(" ({} times)", h.times)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "  handled error{times}: {} (the policy's `{}` went on; test `outcome.status` in a rule to stop it)\n",
                place(h),
                h.action
            ));
        }
        for j in &self.joins {
            out.push_str(&format!("  {}\n", unfired(j)));
        }
        out
    }
}

/// A join that never started, in one line: what arrived, and what a join
/// waits for.
fn unfired(j: &JoinUnfired) -> String {
    let mut said = Vec::new();
    if !j.from.is_empty() {
        said.push(format!("from {}", j.from.join(", ")));
    }
    if !j.missing.is_empty() {
        said.push(format!("none from {}", j.missing.join(", ")));
    }
    let from = match said.is_empty() {
        true => String::new(),
        false => format!(" ({})", said.join("; ")),
    };
    format!(
        "join never started: step {} had {} of its {} inputs{from} when the execution ended; \
         a join starts once a token has come from each step whose arcs target it",
        j.step, j.arrived, j.inputs
    )
}

/// `step.task: kind: message`.
fn place(e: &TaskError) -> String {
    let at = if e.task.is_empty() {
        format!("step {}", e.step)
    } else {
        format!("{}.{}", e.step, e.task)
    };
    if e.kind.is_empty() || e.message.starts_with(&e.kind) {
        format!("{at}: {}", e.message)
    } else {
        format!("{at}: {}: {}", e.kind, e.message)
    }
}

/// A task error of `ev` from its `error` object.
fn task_error(ev: &Event, error: &Value, action: &str) -> TaskError {
    TaskError {
        step: ev.step.clone(),
        task: ev.task.clone(),
        kind: error["kind"].as_str().unwrap_or("").to_string(),
        message: error["message"].as_str().unwrap_or("").to_string(),
        traceback: error["traceback"].as_str().map(str::to_string),
        action: action.to_string(),
        times: 1,
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

    fn name_error() -> Value {
        json!({"kind": "python.exception", "message": "NameError: name 'totl' is not defined",
               "traceback": "NameError: name 'totl' is not defined"})
    }

    #[test]
    fn an_error_a_catch_all_rule_continued_on_is_a_handled_error() {
        let events = vec![
            ev(
                "task.done",
                "compute",
                "r1",
                "calc",
                json!({"status": "error", "action": "continue", "error": name_error()}),
            ),
            ev("step.done", "compute", "r1", "", json!({"status": "ok"})),
        ];
        let p = Problems::from_events(&events);
        assert!(p.failed.is_empty());
        assert_eq!(p.handled.len(), 1);
        assert_eq!(p.handled[0].action, "continue");
        let text = p.render();
        assert!(
            text.contains("handled error: compute.calc: python.exception: NameError: name 'totl' is not defined"),
            "{text}"
        );
    }

    #[test]
    fn a_failed_step_shows_its_task_error_and_traceback() {
        let events = vec![
            ev(
                "task.done",
                "compute",
                "r1",
                "calc",
                json!({"status": "error", "action": "fail", "error": name_error()}),
            ),
            ev(
                "step.failed",
                "compute",
                "r1",
                "",
                json!({"error": {"kind": "python.exception", "message": "NameError: name 'totl' is not defined", "task": "calc"}}),
            ),
        ];
        let p = Problems::from_events(&events);
        assert!(p.handled.is_empty(), "a failing error is not handled");
        assert_eq!(p.failed[0].task, "calc");
        let text = p.render();
        assert!(text.starts_with("what went wrong:\n"), "{text}");
        assert!(
            text.contains("failed: compute.calc: python.exception: NameError"),
            "{text}"
        );
        assert_eq!(Problems::default().render(), "", "nothing went wrong");
        assert!(text.contains("      NameError: name 'totl'"), "{text}");
    }

    /// The execution's end, `execution.<status>`.
    fn ended(status: &str) -> Event {
        ev(
            &format!("execution.{status}"),
            "",
            "",
            "",
            json!({"status": status}),
        )
    }

    /// `left` and `right` ran; `left`'s token reached join `merge`.
    fn one_arrival_of_two() -> Vec<Event> {
        let mut arrival = ev(
            "step.skipped",
            "merge",
            "r3",
            "",
            json!({"reason": "join.waiting", "arrived": 1, "inputs": 2, "join": true}),
        );
        arrival.parent_id = "r1".into();
        vec![
            ev("step.started", "left", "r1", "", json!({})),
            ev("step.started", "right", "r2", "", json!({})),
            ev("step.done", "left", "r1", "", json!({"status": "ok"})),
            arrival,
            ev("step.done", "right", "r2", "", json!({"status": "ok"})),
        ]
    }

    #[test]
    fn a_join_still_waiting_when_the_execution_ends_is_named_with_what_arrived() {
        let mut events = one_arrival_of_two();
        assert!(
            Problems::from_events(&events).is_empty(),
            "a join waiting in a running execution is no problem"
        );
        events.push(ended("completed"));
        let mut p = Problems::from_events(&events);
        assert_eq!(
            p.joins,
            [JoinUnfired {
                step: "merge".into(),
                arrived: 1,
                inputs: 2,
                from: vec!["left".into()],
                missing: Vec::new(),
            }]
        );
        let text = p.render();
        assert!(
            text.contains("join never started: step merge had 1 of its 2 inputs (from left) when the execution ended"),
            "{text}"
        );
        let playbook: noetl_core::Playbook = serde_json::from_value(json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "join"},
            "workflow": [
                {"step": "left", "next": {"arcs": [{"step": "merge"}]}},
                {"step": "right", "next": {"arcs": [{"step": "merge", "when": "{{ false }}"}]}},
                {"step": "merge", "spec": {"join": "all"}},
            ],
        }))
        .unwrap();
        p.name_missing(&playbook);
        assert_eq!(p.joins[0].missing, ["right"]);
        assert!(
            p.render()
                .contains("1 of its 2 inputs (from left; none from right)"),
            "{}",
            p.render()
        );
    }

    #[test]
    fn a_join_that_started_before_the_end_is_no_problem() {
        let mut events = one_arrival_of_two();
        events.push(ev("step.started", "merge", "r4", "", json!({})));
        events.push(ended("completed"));
        assert!(Problems::from_events(&events).is_empty());
        let mut resumed = one_arrival_of_two();
        resumed.push(ended("failed"));
        resumed.push(ev("execution.resumed", "", "", "", json!({})));
        assert!(
            Problems::from_events(&resumed).joins.is_empty(),
            "a resumed execution's next end says"
        );
    }

    #[test]
    fn a_failed_loop_shows_its_first_failed_iterations() {
        let mut events = Vec::new();
        for i in (0..5u64).rev() {
            events.push(ev(
                "loop.iteration.failed",
                "each",
                "r2",
                "",
                json!({"index": i, "status": "error",
                       "error": {"kind": "python.exception", "message": format!("ValueError: item {i}"), "task": "work"}}),
            ));
        }
        let p = Problems::from_events(&events);
        assert_eq!(p.iterations_failed, 5);
        let shown: Vec<u64> = p.iterations.iter().map(|i| i.index).collect();
        assert_eq!(shown, [0, 1, 2]);
        let text = p.render();
        assert!(text.contains("5 iteration(s) failed; the first:"), "{text}");
        assert!(
            text.contains("each[0].work: python.exception: ValueError: item 0"),
            "{text}"
        );
    }
}
