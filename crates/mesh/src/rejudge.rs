//! Replay against a changed playbook (`noetl exec replay ID --playbook
//! FILE`, docs/operations.md "Replay against a changed playbook"): walk an
//! execution's events, and at each decision the engine took, take it again
//! with the new playbook against the state the events give at that point
//! and the outcomes they record. The scopes are built by the functions the
//! services use ([`crate::scope`], through [`StateSource`]) and the
//! decisions are the core's ([`routing::admit`], [`routing::select_arcs`],
//! a loop's `in`), so a replay runs the code that ran live.
//!
//! Re-taken: admission (the admitting `step.started` — `step.scheduled`
//! in older logs — / `step.skipped` "admission denied"), the arcs each
//! step-run's boundary fired (targets and their args), the length of each loop's collection (`loop.started`), and each
//! task's policy (`task.done`: the rule that matched, its action and its
//! `set_ctx`) against the outcome the event records, in the scope the log
//! gives: workload, `ctx` as of the event, the step's args, the results
//! of the step-run's earlier tasks, the attempt. A policy whose templates
//! read what the log does not keep (`iter`, `_prev`, `loop`, a tool's
//! helpers such as `outcome.http`), or whose recorded result is a preview,
//! is not taken again: the report counts them in its notes.

use std::collections::BTreeMap;

use noetl_core::{routing, template::render_value, Playbook};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::decision_scope;
use crate::event_type::EventType;
use crate::fold::{Folded, Origin};
use crate::plan::PlanRecord;
use crate::replay;
use crate::scope::{self, StateSource};
use crate::{Mesh, MeshError};

/// The state a decision reads, as the events up to it give it.
struct AsOf<'a> {
    mesh: &'a Mesh,
    folded: &'a Folded,
}

impl StateSource for AsOf<'_> {
    async fn ctx(&self, _eid: &str) -> Result<Value, MeshError> {
        Ok(Value::Object(self.folded.ctx.clone()))
    }

    async fn step_result(&self, _eid: &str, name: &str) -> Result<Option<Value>, MeshError> {
        match self.folded.results.get(name) {
            Some(v) => Ok(Some(self.mesh.results().hydrate(v.clone()).await?)),
            None => Ok(None),
        }
    }

    async fn args(&self, args: &Value) -> Result<Value, MeshError> {
        scope::hydrate_args(self.mesh, args).await
    }
}

/// A decision the new playbook takes otherwise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    /// The step it is about.
    pub step: String,
    /// `admission`, `arcs`, `loop collection`, `task policy`, `task` or
    /// `step`.
    pub decision: String,
    /// The event that recorded the old decision.
    pub event: Origin,
    /// What the execution did.
    pub recorded: Value,
    /// What the new playbook decides.
    pub now: Value,
}

/// What [`rejudge`] reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Rejudged {
    /// The execution.
    pub execution_id: String,
    /// Events read.
    pub events: usize,
    /// Decisions taken again (up to the first divergence).
    pub decisions: usize,
    /// The first decision the new playbook takes otherwise.
    pub divergence: Option<Divergence>,
    /// What was not compared, and why.
    pub notes: Vec<String>,
}

/// What an execution's events recorded of its decisions, gathered before
/// the walk (a boundary's tokens come after it in the log).
#[derive(Default)]
struct Recorded {
    /// Tokens by the step-run that fired them: `(step, args)`.
    fired: BTreeMap<String, Vec<(String, Value)>>,
    /// Each token's args, by token id (its step-run id).
    args: BTreeMap<String, Value>,
}

impl Recorded {
    /// Take the tokens `ev` records.
    fn apply(&mut self, ev: &noetl_wire::Event) -> Result<(), MeshError> {
        for p in crate::payloads::tokens_created(ev)? {
            self.args.insert(p.token_id.clone(), p.args.clone());
            if p.arc.is_some() {
                self.fired
                    .entry(p.parent)
                    .or_default()
                    .push((p.step, p.args));
            }
        }
        Ok(())
    }
}

/// The tokens recorded in the log of `eid`, how many events it holds and
/// the sequence of its last: a first read, a chunk at a time (a token's
/// args are never stored by reference, so nothing is hydrated).
async fn recorded(mesh: &Mesh, eid: &str) -> Result<(Recorded, usize, u64), MeshError> {
    let mut r = Recorded::default();
    let mut events = 0;
    let mut log = replay::LogReader::of(mesh, eid);
    while let Some(l) = log.next().await? {
        events += 1;
        r.apply(&l.event)?;
    }
    Ok((r, events, log.read_through()))
}

/// Walk the log of `eid` and take its decisions again with `playbook`;
/// stop at the first that differs. The log is read twice, a chunk at a
/// time (first for the tokens it records, then walked up to where the
/// first read ended), never held whole.
pub async fn rejudge(mesh: &Mesh, eid: &str, playbook: &Playbook) -> Result<Rejudged, MeshError> {
    let (rec, events, last) = recorded(mesh, eid).await?;
    let mut out = Rejudged {
        execution_id: eid.to_string(),
        events,
        ..Default::default()
    };
    let mut skipped = Skipped::default();
    let mut folded = Folded::default();
    let mut plan: Option<PlanRecord> = None;
    let mut log = replay::LogReader::of(mesh, eid).through(last);
    while let Some(mut l) = log.next().await? {
        if replay::carries_reference(&l.event) {
            replay::hydrate(mesh, &mut l.event).await?;
        }
        let ev = &l.event;
        let kind = EventType::of(ev);
        // Live, and no earlier boundary of the step-run waits for the
        // router's answer (that one is the step-run's end, not this).
        let live = folded
            .header
            .as_ref()
            .is_some_and(|h| h.is_live(&ev.step_run_id))
            && !folded.awaits_answer(&ev.step_run_id);
        folded.apply(l.seq, ev)?;
        if kind == Some(EventType::PlaybookInitialized) {
            let mut p = PlanRecord::new(
                eid.to_string(),
                folded
                    .header
                    .as_ref()
                    .map(|h| h.source.clone())
                    .unwrap_or_default(),
                playbook.clone(),
                folded.workload.clone(),
            );
            p.trace_id = folded.trace_id.clone();
            plan = Some(p);
            continue;
        }
        let (Some(kind), Some(plan)) = (kind, plan.as_ref()) else {
            continue;
        };
        let d = Decide {
            mesh,
            plan,
            folded: &folded,
            rec: &rec,
            seq: l.seq,
            ev,
            live,
        };
        let found = if kind == EventType::TaskDone {
            let found = task_policy(&d, &mut skipped).await?;
            skipped.remember(ev);
            found
        } else {
            decide(d, kind).await?
        };
        let Some(found) = found else {
            continue;
        };
        out.decisions += 1;
        if let Err(d) = found {
            out.divergence = Some(d);
            break;
        }
    }
    out.notes = skipped.notes();
    Ok(out)
}

/// Task policies not taken again, and what earlier tasks of each step-run
/// returned (their results are in the scope of later tasks' policies).
#[derive(Default)]
struct Skipped {
    /// Policies whose templates read what the log does not keep.
    unread: usize,
    /// Outcomes whose result the event carries as a preview.
    previews: usize,
    /// Each step-run's tasks' last results, by task name.
    results: BTreeMap<String, Map<String, Value>>,
}

impl Skipped {
    fn remember(&mut self, ev: &noetl_wire::Event) {
        let p = crate::events::payload(ev);
        self.results
            .entry(ev.step_run_id.clone())
            .or_default()
            .insert(ev.task.clone(), p["result"].clone());
    }

    fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.unread > 0 {
            out.push(format!(
                "{} task policy decisions not taken again: their templates read iter, _prev, loop or a tool's helpers, which the log does not keep",
                self.unread
            ));
        }
        if self.previews > 0 {
            out.push(format!(
                "{} task policy decisions not taken again: the recorded result is a preview",
                self.previews
            ));
        }
        out
    }
}

/// The roots of templates that the log cannot give a policy: `iter`,
/// `_prev`, `loop`, and `outcome.<helper>` other than `status`, `result`,
/// `error` and `meta`.
fn reads_unlogged(templates: &[&str]) -> bool {
    let roots = scope::roots(templates.iter().copied());
    if ["iter", "_prev", "loop"].iter().any(|r| roots.contains(*r)) {
        return true;
    }
    templates.iter().any(|t| {
        t.match_indices("outcome.").any(|(i, m)| {
            let rest = &t[i + m.len()..];
            let field: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            !matches!(field.as_str(), "status" | "result" | "error" | "meta")
        })
    })
}

/// A task's policy, taken again against the outcome its `task.done`
/// records: the rule that matches, its action and its `set_ctx`.
async fn task_policy(
    d: &Decide<'_>,
    skipped: &mut Skipped,
) -> Result<Option<Result<(), Divergence>>, MeshError> {
    let ev = d.ev;
    let done: crate::payloads::TaskDone = crate::payloads::decode_typed(ev)?;
    let Some(step) = d.plan.step(&ev.step) else {
        return Ok(Some(Err(d.differ(
            "step",
            Value::from(format!("step {:?} ran", ev.step)),
            Value::from(format!("the playbook has no step {:?}", ev.step)),
        ))));
    };
    // The step as the executor ran it, and what its templates read: the
    // scopes below are built by the executor's own functions.
    let (step, _) = decision_scope::as_it_runs(d.plan, step);
    let Some(task) = step.tool.iter().find(|t| t.name == ev.task) else {
        return Ok(Some(Err(d.differ(
            "task",
            Value::from(format!("task {:?} ran", ev.task)),
            Value::from(format!("step {:?} has no task {:?}", ev.step, ev.task)),
        ))));
    };
    let templates: Vec<&str> = task
        .spec
        .policy
        .as_ref()
        .map(|p| {
            p.rules
                .iter()
                .flat_map(noetl_core::policy::rule_templates)
                .collect()
        })
        .unwrap_or_default();
    if reads_unlogged(&templates) {
        skipped.unread += 1;
        return Ok(None);
    }
    if is_preview(&done.result) {
        skipped.previews += 1;
        return Ok(None);
    }
    let outcome = recorded_outcome(&done, ev);
    let reads = decision_scope::StepReads::of(d.plan, &step);
    let source = d.source();
    let args = source.args(&d.args()).await?;
    let (base, ctx) = decision_scope::step_scope(&source, d.plan, &reads, &args).await?;
    let no_results = Map::new();
    let sc = decision_scope::task_scope(
        &base,
        d.plan,
        &reads,
        decision_scope::TaskView {
            task: &task.name,
            attempt: done.attempt,
            ctx: &ctx,
            // What the log does not keep: a policy reading these is not
            // re-taken (`reads_unlogged`).
            iter: &Map::new(),
            prev: &Value::Null,
            loop_info: None,
            results: skipped.results.get(&ev.step_run_id).unwrap_or(&no_results),
        },
    );
    let sc = decision_scope::policy_scope(sc, &reads, &task.name, &outcome);
    let now = noetl_core::policy::decide(&noetl_core::policy::PolicyInput {
        policy: task.spec.policy.as_ref(),
        outcome: &outcome,
        attempt: done.attempt,
        scope: &sc,
        retry_after: None,
    });
    let was = serde_json::json!({
        "rule": done.rule,
        "action": done.action,
        "set_ctx": done.set_ctx.clone().map(Value::Object).unwrap_or(Value::Null),
    });
    let now = match now {
        Ok(dir) => serde_json::json!({
            "rule": dir.rule,
            "action": dir.decision.action(),
            "set_ctx": dir.set_ctx.map(Value::Object).unwrap_or(Value::Null),
        }),
        Err(e) => Value::from(format!("fails: {e}")),
    };
    Ok(Some(if same_policy(&was, &now) {
        Ok(())
    } else {
        Err(d.differ("task policy", was, now))
    }))
}

/// The outcome a `task.done` records.
fn recorded_outcome(
    done: &crate::payloads::TaskDone,
    ev: &noetl_wire::Event,
) -> noetl_core::Outcome {
    noetl_core::Outcome {
        status: done.status,
        result: done.result.clone(),
        error: done.error.clone(),
        meta: noetl_core::outcome::OutcomeMeta {
            attempt: done.attempt,
            duration_ms: done.duration_ms,
            trace_id: ev.trace_id.clone(),
            ..Default::default()
        },
        helpers: Map::new(),
    }
}

/// The same rule, action and `set_ctx` (numbers by value; a recorded value
/// redacted or by reference matches any value).
fn same_policy(was: &Value, now: &Value) -> bool {
    if was["rule"] != now["rule"] || was["action"] != now["action"] {
        return false;
    }
    match (was["set_ctx"].as_object(), now["set_ctx"].as_object()) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.len() == b.len()
                && a.iter().all(|(k, v)| {
                    b.get(k).is_some_and(|w| {
                        crate::replay::same_json(Some(v), Some(w))
                            || crate::objects::is_ref(v)
                            || v.as_str().is_some_and(|s| s.contains("REDACTED"))
                    })
                })
        }
        _ => false,
    }
}

/// True when `v` holds a preview (`{truncated: true, preview, size}`) of
/// a value too large for its event.
fn is_preview(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            (m.get("truncated") == Some(&Value::Bool(true)) && m.contains_key("preview"))
                || m.values().any(is_preview)
        }
        Value::Array(a) => a.iter().any(is_preview),
        _ => false,
    }
}

/// One event's decision to take again.
struct Decide<'a> {
    mesh: &'a Mesh,
    plan: &'a PlanRecord,
    folded: &'a Folded,
    rec: &'a Recorded,
    seq: u64,
    ev: &'a noetl_wire::Event,
    /// Its step-run's token was live before it (a boundary the router
    /// routed, not a late copy).
    live: bool,
}

/// `None`: no decision at this event; `Some(Ok)`: taken again, the same;
/// `Some(Err)`: the new playbook decides otherwise.
async fn decide(
    d: Decide<'_>,
    kind: EventType,
) -> Result<Option<Result<(), Divergence>>, MeshError> {
    let ev = d.ev;
    let p = crate::events::payload(ev);
    let is_decision = match kind {
        EventType::StepScheduled | EventType::StepStarted => crate::payloads::is_admission(ev),
        EventType::StepSkipped => p["reason"] == "admission denied",
        EventType::StepDone | EventType::StepFailed => d.live && p["join"] != true,
        EventType::LoopDone => d.live && p["boundary"] != false && p["join"] != true,
        EventType::LoopStarted => true,
        _ => false,
    };
    if !is_decision {
        return Ok(None);
    }
    let Some(step) = d.plan.step(&ev.step) else {
        return Ok(Some(Err(d.differ(
            "step",
            Value::from(format!("step {:?} ran", ev.step)),
            Value::from(format!("the playbook has no step {:?}", ev.step)),
        ))));
    };
    let taken = match kind {
        EventType::StepScheduled | EventType::StepStarted | EventType::StepSkipped => {
            admission(&d, step, kind != EventType::StepSkipped).await?
        }
        EventType::LoopStarted => loop_collection(&d, step, &p).await?,
        _ => arcs(&d, step, &p).await?,
    };
    Ok(Some(taken))
}

impl Decide<'_> {
    /// The divergence of `decision` at this event.
    fn differ(&self, decision: &str, recorded: Value, now: Value) -> Divergence {
        Divergence {
            step: self.ev.step.clone(),
            decision: decision.into(),
            event: Origin::of(self.seq, self.ev),
            recorded,
            now,
        }
    }

    /// The state as of this event.
    fn source(&self) -> AsOf<'_> {
        AsOf {
            mesh: self.mesh,
            folded: self.folded,
        }
    }

    /// The args of this event's step-run (its token's).
    fn args(&self) -> Value {
        self.rec
            .args
            .get(&self.ev.step_run_id)
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()))
    }
}

/// A token's admission, taken again: `was` admitted or not.
async fn admission(
    d: &Decide<'_>,
    step: &noetl_core::Step,
    was: bool,
) -> Result<Result<(), Divergence>, MeshError> {
    let now = match step.admit() {
        None => Ok(true),
        Some(a) => {
            let sc = decision_scope::admission_scope(
                &d.source(),
                d.plan,
                (step, a),
                &d.args(),
                &d.ev.step_run_id,
            )
            .await?;
            routing::admit(Some(a), &sc)
                .map(|a| a.allowed)
                .map_err(|e| e.to_string())
        }
    };
    let shown = |allowed: bool| Value::from(if allowed { "admitted" } else { "denied" });
    Ok(match now {
        Ok(now) if now == was => Ok(()),
        Ok(now) => Err(d.differ("admission", shown(was), shown(now))),
        Err(e) => Err(d.differ("admission", shown(was), Value::from(format!("fails: {e}")))),
    })
}

/// A loop's collection, taken again: its length against `loop.started`'s
/// `total` (a cursor loop claims as it goes: not compared).
async fn loop_collection(
    d: &Decide<'_>,
    step: &noetl_core::Step,
    p: &Value,
) -> Result<Result<(), Divergence>, MeshError> {
    let (Some(lp), false) = (step.loop_.as_ref(), p["mode"] == "cursor") else {
        return Ok(Ok(()));
    };
    let sc = decision_scope::loop_scope(&d.source(), d.plan, lp, &d.args(), &[]).await?;
    let not_a_list = |v: &Value| Value::from(format!("not a list: {}", noetl_core::json_type(v)));
    let now = match render_value(&lp.in_, &sc) {
        Ok(Value::Array(items)) => Value::from(items.len()),
        Ok(other) if crate::objects::is_ref(&other) => match d.mesh.results().hydrate(other).await?
        {
            Value::Array(items) => Value::from(items.len()),
            other => not_a_list(&other),
        },
        Ok(other) => not_a_list(&other),
        Err(e) => Value::from(format!("fails: {e}")),
    };
    let was = p["total"].clone();
    Ok(if now == was {
        Ok(())
    } else {
        Err(d.differ("loop collection", was, now))
    })
}

/// A boundary's arcs, taken again: the targets and args of the tokens it
/// fired.
async fn arcs(
    d: &Decide<'_>,
    step: &noetl_core::Step,
    p: &Value,
) -> Result<Result<(), Divergence>, MeshError> {
    let was = d
        .rec
        .fired
        .get(&d.ev.step_run_id)
        .cloned()
        .unwrap_or_default();
    let templates = scope::arc_templates(step);
    let next = step.next.as_ref();
    let now = if templates.is_empty() && next.is_none_or(|n| n.arcs.is_empty()) {
        Ok(Vec::new())
    } else {
        let sc = decision_scope::arc_scope(&d.source(), d.plan, d.ev, (p, &d.args()), &templates)
            .await?;
        routing::select_arcs(next, &sc)
            .map(|arcs| {
                arcs.into_iter()
                    .map(|a| (a.step, Value::Object(a.args)))
                    .collect::<Vec<_>>()
            })
            .map_err(|e| e.to_string())
    };
    Ok(match now {
        Ok(now) if same_arcs(&was, &now) => Ok(()),
        Ok(now) => Err(d.differ("arcs", shown_arcs(&was), shown_arcs(&now))),
        Err(e) => Err(d.differ(
            "arcs",
            shown_arcs(&was),
            Value::from(format!("routing fails: {e}")),
        )),
    })
}

/// The same targets with the same args (an arg that travelled by
/// reference is compared by name only).
fn same_arcs(was: &[(String, Value)], now: &[(String, Value)]) -> bool {
    let key = |arcs: &[(String, Value)]| {
        let mut v: Vec<(String, Value)> = arcs
            .iter()
            .map(|(s, a)| (s.clone(), comparable(a)))
            .collect();
        v.sort_by(|x, y| {
            x.0.cmp(&y.0)
                .then_with(|| x.1.to_string().cmp(&y.1.to_string()))
        });
        v
    };
    let (a, b) = (key(was), key(now));
    a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|((s1, a1), (s2, a2))| s1 == s2 && same_args(a1, a2))
}

/// Equal args, a value by reference on either side matching any value.
fn same_args(a: &Value, b: &Value) -> bool {
    let by_ref = |v: &Value| v.as_str() == Some(BY_REFERENCE);
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| v == w || by_ref(v) || by_ref(w)))
        }
        _ => a == b,
    }
}

/// What a value that travelled by reference is shown as.
const BY_REFERENCE: &str = "<by reference>";

/// Args as compared: values stored by reference stand for any value.
fn comparable(args: &Value) -> Value {
    match args {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = if crate::objects::is_ref(v) {
                        Value::from(BY_REFERENCE)
                    } else {
                        v.clone()
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn shown_arcs(arcs: &[(String, Value)]) -> Value {
    Value::Array(
        arcs.iter()
            .map(|(s, a)| serde_json::json!({"step": s, "args": comparable(a)}))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arcs_compare_by_target_and_args_in_any_order_a_reference_matching_any_value() {
        let a = |s: &str, v: Value| (s.to_string(), v);
        let was = vec![a("b", json!({"n": 1})), a("c", json!({}))];
        let swapped = vec![a("c", json!({})), a("b", json!({"n": 1}))];
        assert!(same_arcs(&was, &swapped));
        assert!(!same_arcs(
            &was,
            &[a("b", json!({"n": 2})), a("c", json!({}))]
        ));
        assert!(!same_arcs(&was, &[a("b", json!({"n": 1}))]));
        assert!(same_arcs(&[], &[]));
        let shown = shown_arcs(&was);
        assert_eq!(shown[0], json!({"step": "b", "args": {"n": 1}}));
    }
}
