//! What a token's step-run publishes once its admission is known
//! ([`decide`]): a failed admission fails it, a denied one skips it, an
//! admitted one is started (`step.started`, then its deadline timer and
//! its loop command, first task command or, without tasks, its
//! `step.done`).
//!
//! The scheduler decides this for every token it receives. The router
//! decides it itself for a token whose admission needs nothing read
//! ([`needs_no_admission`]: no `admit` policy, not a join) of an execution
//! that is not paused, and publishes the step-run's start instead of the
//! token: the same events and command under the same ids, one message and
//! one hop fewer (docs/architecture.md, "The flow of one execution").

use noetl_core::{routing, Playbook, Step};
use noetl_wire::{LoopCommand, Token};
use serde_json::Value;

use crate::commands::{self, FirstTask};
use crate::effects::Effect;
use crate::events::EventDraft;
use crate::ids::derive_id;
use crate::payloads::{
    self, DeadlineSet, EventPayload, StepDeadlineSet, StepEnded, StepSkipped, StepStarted,
};
use crate::plan::PlanRecord;

/// The inputs a join waits for, if the step is a join: the steps whose
/// arcs target it, or its `join.from` list.
pub fn join_inputs(playbook: &Playbook, step: &Step) -> Option<Vec<String>> {
    let join = step.spec.extra.get("join")?;
    if let Some(Value::Array(from)) = join.get("from") {
        return Some(
            from.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
        );
    }
    if join.as_str() != Some("all") && !join.is_object() {
        return None;
    }
    let mut from: Vec<String> = playbook
        .workflow
        .iter()
        .filter(|s| {
            s.next
                .as_ref()
                .map(|n| n.arcs.iter().any(|a| a.step == step.step))
                .unwrap_or(false)
        })
        .map(|s| s.step.clone())
        .collect();
    from.dedup();
    Some(from)
}

/// Whether a token of `step` is admitted without reading anything: the
/// step has no admission policy and is not a join, so [`decide`] with
/// [`admitted`] is all the scheduler would do with it.
pub fn needs_no_admission(playbook: &Playbook, step: &Step) -> bool {
    step.admit().is_none() && join_inputs(playbook, step).is_none()
}

/// A step-run started without its scheduler ([`start_unadmitted`]).
#[derive(Debug)]
pub struct Unadmitted {
    /// Its `step.started`, carried in the event that created the token
    /// (`next.selected`'s arc, the entry's `token.created`).
    pub started: StepStarted,
    /// What the scheduler publishes after `step.started`, in order: the
    /// step-run's deadline timer, then its work.
    pub then: Vec<Effect>,
}

/// The step-run of `token` started without its scheduler, when its step
/// needs no admission ([`needs_no_admission`]): what the scheduler would
/// publish for it ([`decide`], admitted), under the same ids, with its
/// `step.started` apart. `args` are the token's (`null` is `{}`, as the
/// scheduler reads absent args); the token's own `args_json` is not read.
/// `None` for a token whose step must be admitted by the scheduler, or is
/// not in the plan (the scheduler fails it).
pub fn start_unadmitted(
    plan: &PlanRecord,
    token: &Token,
    args: Value,
    now_ms: u64,
) -> Option<Unadmitted> {
    let step = plan.step(&token.step)?;
    if !needs_no_admission(&plan.playbook, step) {
        return None;
    }
    let args = match args {
        Value::Null => Value::Object(Default::default()),
        args => args,
    };
    let d = Decide {
        plan,
        step,
        token,
        args,
        admission: Ok(admitted()),
        now_ms,
    };
    Some(Unadmitted {
        started: StepStarted::admitted(None, step.loop_.is_some()),
        then: start(&d),
    })
}

/// The admission of a step without a policy.
pub fn admitted() -> routing::Admission {
    routing::Admission {
        allowed: true,
        rule: None,
    }
}

/// What [`decide`] needs: the token, its step and args, and what its
/// admission policy said.
pub struct Decide<'a> {
    /// The execution's plan.
    pub plan: &'a PlanRecord,
    /// The token's step.
    pub step: &'a Step,
    /// The token (its id is the step-run's).
    pub token: &'a Token,
    /// The step-run's args (a join's merged ones).
    pub args: Value,
    /// The admission (its inner error: a template of the policy failed).
    pub admission: Result<routing::Admission, routing::RoutingError>,
    /// The time, epoch ms.
    pub now_ms: u64,
}

/// What a token's step-run publishes: a failed admission fails it, a
/// denied one skips it; an admitted one is started.
pub fn decide(d: &Decide<'_>) -> Vec<Effect> {
    let step = d.step;
    let admission = match &d.admission {
        Ok(a) => a,
        Err(e) => {
            // A broken admission template fails the step-run (the router
            // decides whether an arc handles it).
            let message = format!(
                "admission of step {:?} failed in {}: {e}",
                step.step, d.plan.source_name
            );
            let failed =
                StepEnded::failed(payloads::error_body("admission", message), d.args.clone());
            return vec![emit(d, &failed)];
        }
    };
    if !admission.allowed {
        let skipped = StepSkipped {
            reason: "admission denied".into(),
            rule: admission.rule,
            args: Some(d.args.clone()),
            arrived: None,
            inputs: None,
            join: false,
        };
        return vec![emit(d, &skipped)];
    }
    // Admitted and started in one event (`step.scheduled` of older logs
    // said the first half).
    let mut effects = vec![emit(
        d,
        &StepStarted::admitted(admission.rule, step.loop_.is_some()),
    )];
    effects.extend(start(d));
    effects
}

/// An event of the token's step-run, with `payload`.
fn emit(d: &Decide<'_>, payload: &impl EventPayload) -> Effect {
    let token = d.token;
    Effect::Emit(
        EventDraft {
            execution_id: &token.execution_id,
            step_run_id: &token.token_id,
            step: &d.step.step,
            trace_id: &token.trace_id,
            parent_id: &token.parent_step_run_id,
            ..Default::default()
        }
        .build(payload),
    )
}

/// Start an admitted step-run: its deadline timer, then its loop command,
/// its first task command, or (a step without tasks) its `step.done`.
fn start(d: &Decide<'_>) -> Vec<Effect> {
    let (plan, step, token, args) = (d.plan, d.step, d.token, &d.args);
    let (eid, srid) = (token.execution_id.as_str(), token.token_id.as_str());
    let mut effects = Vec::new();
    // The step-run's deadline, decided once here and carried by every
    // command of it; a timer backs it up for work that waits in a queue.
    let deadline = if step.loop_.is_some() || !step.tool.is_empty() {
        noetl_core::lifecycle::step_deadline(&noetl_core::lifecycle::StepDeadlineInput {
            playbook: &plan.playbook,
            step,
            now_ms: d.now_ms,
            execution_started_ms: plan.started_ms,
        })
    } else {
        None
    };
    let (deadline_ms, deadline_of) = deadline
        .as_ref()
        .map(|d| (d.at_ms, d.what.clone()))
        .unwrap_or_default();
    if let Some(set) = &deadline {
        effects.push(emit(
            d,
            &StepDeadlineSet(DeadlineSet {
                at_ms: set.at_ms,
                what: set.what.clone(),
                args: Some(args.clone()),
            }),
        ));
    }
    if step.loop_.is_some() {
        effects.push(Effect::Loop(LoopCommand {
            command_id: derive_id(&[srid, "loop"]),
            execution_id: eid.to_string(),
            step: step.step.clone(),
            step_run_id: srid.to_string(),
            args_json: crate::codec::json_bytes(args),
            trace_id: token.trace_id.clone(),
            deadline_ms,
            deadline_of,
        }));
    } else if let Some(first) = step.tool.first() {
        let cmd = commands::first_task(FirstTask {
            execution_id: eid,
            step: &step.step,
            step_run_id: srid,
            args,
            trace_id: &token.trace_id,
            deadline: (deadline_ms, &deadline_of),
            iteration: None,
            total: 0,
        });
        effects.push(Effect::Task {
            kind: noetl_core::workbook::effective_kind(plan.playbook.workbook.as_ref(), first),
            task: first.name.clone(),
            cmd,
        });
    } else {
        // Routing-only step: nothing to run.
        effects.push(emit(d, &StepEnded::done(Value::Null, args.clone())));
    }
    effects
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(step: Value) -> PlanRecord {
        let playbook = json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "t"},
            "workflow": [step],
        });
        PlanRecord::new(
            "e1".into(),
            "t.yaml".into(),
            serde_json::from_value(playbook).unwrap(),
            json!({}),
        )
    }

    fn token() -> Token {
        Token {
            token_id: "t1".into(),
            execution_id: "e1".into(),
            step: "s".into(),
            ..Default::default()
        }
    }

    /// The event types and other effects, in publish order.
    fn kinds(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .map(|e| match e {
                Effect::Emit(ev) => ev.event_type.clone(),
                Effect::Task { kind, .. } => format!("task:{kind}"),
                Effect::Loop(_) => "loop".into(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn decided(
        plan: &PlanRecord,
        admission: Result<routing::Admission, routing::RoutingError>,
    ) -> Vec<Effect> {
        decide(&Decide {
            plan,
            step: &plan.playbook.workflow[0],
            token: &token(),
            args: json!({"a": 1}),
            admission,
            now_ms: 1_000,
        })
    }

    #[test]
    fn an_admitted_tool_step_is_started_and_its_first_task_sent() {
        let p =
            plan(json!({"step": "s", "tool": [{"name": "t", "kind": "python", "code": "x = 1"}]}));
        let effects = decided(&p, Ok(admitted()));
        assert_eq!(kinds(&effects), ["step.started", "task:python"]);
        let Effect::Emit(started) = &effects[0] else {
            unreachable!()
        };
        assert_eq!(
            payloads::decode::<StepStarted>(started).unwrap(),
            StepStarted::admitted(None, false),
            "the admission rides in the start"
        );
        assert!(payloads::is_admission(started));
        let Effect::Task { cmd, task, .. } = &effects[1] else {
            unreachable!()
        };
        assert_eq!(
            (task.as_str(), cmd.step_run_id.as_str(), cmd.pc, cmd.attempt),
            ("t", "t1", 0, 1)
        );
    }

    #[test]
    fn a_routing_only_step_is_done_at_once_and_a_loop_goes_to_the_supervisor() {
        let p = plan(json!({"step": "s"}));
        assert_eq!(
            kinds(&decided(&p, Ok(admitted()))),
            ["step.started", "step.done"]
        );
        let p = plan(
            json!({"step": "s", "loop": {"in": "{{ [1, 2] }}", "iterator": "x"},
                            "tool": [{"name": "t", "kind": "noop"}]}),
        );
        assert_eq!(
            kinds(&decided(&p, Ok(admitted()))),
            ["step.started", "loop"]
        );
    }

    #[test]
    fn a_denied_admission_skips_and_a_broken_one_fails_the_step_run() {
        let p = plan(json!({"step": "s"}));
        let denied = Ok(routing::Admission {
            allowed: false,
            rule: Some(0),
        });
        assert_eq!(kinds(&decided(&p, denied)), ["step.skipped"]);
        let broken = Err(routing::RoutingError::AdmitCondition {
            rule: 0,
            source: noetl_core::template::TemplateError::Syntax {
                template: "{{ x".into(),
                message: "unexpected end".into(),
            },
        });
        let effects = decided(&p, broken);
        assert_eq!(kinds(&effects), ["step.failed"]);
    }

    #[test]
    fn a_step_with_a_timeout_sets_its_deadline_timer_first() {
        let p = plan(
            json!({"step": "s", "spec": {"policy": {"lifecycle": {"timeout_s": 5}}},
                            "tool": [{"name": "t", "kind": "noop"}]}),
        );
        let effects = decided(&p, Ok(admitted()));
        assert_eq!(
            kinds(&effects),
            ["step.started", "step.deadline", "task:noop"]
        );
    }

    #[test]
    fn only_a_step_without_a_policy_or_a_join_is_admitted_without_a_read() {
        let pb: Playbook = serde_json::from_value(json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "t"},
            "workflow": [
                {"step": "start", "next": {"arcs": [{"step": "merge"}, {"step": "gated"}]}},
                {"step": "merge", "spec": {"join": "all"}},
                {"step": "gated", "spec": {"policy": {"admit": {"rules": [
                    {"when": "{{ ctx.go }}", "then": {"allow": true}}]}}}},
                {"step": "plain", "tool": [{"name": "t", "kind": "noop"}]},
            ],
        }))
        .expect("a valid normalised playbook");
        let direct = |name: &str| needs_no_admission(&pb, pb.step(name).unwrap());
        assert!(direct("start") && direct("plain"));
        assert!(!direct("merge"), "a join reads its arrivals");
        assert!(!direct("gated"), "an admission policy reads its scope");
    }

    #[test]
    fn a_token_needing_no_admission_starts_as_the_scheduler_would_start_it() {
        let p = plan(json!({"step": "s", "tool": [{"name": "t", "kind": "noop"}]}));
        let mut t = token();
        let start = |t: &Token, args: Value| start_unadmitted(&p, t, args, 1_000);
        let unadmitted = start(&t, json!({"a": 1})).expect("started without a read");
        let ids = |effects: &[Effect]| {
            effects
                .iter()
                .map(|e| e.id().to_string())
                .collect::<Vec<_>>()
        };
        let scheduler = decided(&p, Ok(admitted()));
        assert_eq!(kinds(&scheduler), ["step.started", "task:noop"]);
        let Effect::Emit(decided) = &scheduler[0] else {
            unreachable!()
        };
        assert_eq!(
            Some(&unadmitted.started),
            payloads::decode::<StepStarted>(decided).ok().as_ref(),
            "the scheduler's step.started, apart"
        );
        assert_eq!(
            ids(&unadmitted.then),
            ids(&scheduler[1..]),
            "then the scheduler's other effects under its ids"
        );
        let Effect::Task { cmd, .. } = &unadmitted.then[0] else {
            unreachable!()
        };
        assert_eq!(
            crate::codec::json_value(&cmd.args_json).unwrap(),
            json!({"a": 1})
        );
        t.args_json = br#"{"ignored": true}"#.to_vec();
        let Effect::Task { cmd, .. } = &start(&t, Value::Null).unwrap().then[0] else {
            unreachable!()
        };
        assert_eq!(
            crate::codec::json_value(&cmd.args_json).unwrap(),
            json!({}),
            "null args are an empty object, as the scheduler reads absent ones"
        );

        let gated = plan(json!({"step": "s", "spec": {"policy": {"admit": {"rules": [
            {"when": "{{ true }}", "then": {"allow": true}}]}}}}));
        assert!(
            start_unadmitted(&gated, &t, Value::Null, 1_000).is_none(),
            "a policy: to the scheduler"
        );
        t.step = "missing".into();
        assert!(
            start(&t, Value::Null).is_none(),
            "no such step: the scheduler fails it"
        );
    }
}
