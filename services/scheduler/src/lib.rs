//! noetl-scheduler: admits tokens and dispatches step-runs.
//!
//! For each token on `<p>.token.<eid>`: evaluate `step.spec.policy.admit`
//! (server side; inputs `workload`, `ctx`, `args`, `token`). Denied →
//! `step.skipped` (a boundary the router closes). Admitted →
//! `step.started` (the admission's rule with it) and then: a loop step
//! goes to the loop-supervisor (`<p>.loop.<eid>`); a routing-only step (no
//! tool) finishes at once with `step.done`; any other step sends its first
//! task command to `<p>.task.<kind>`. The step-run id is the token id, so
//! every publish is idempotent under redelivery.

mod join;

use std::sync::Arc;

use noetl_core::{routing, Step};
use noetl_mesh::{
    codec,
    commands::{self, FirstTask},
    effects::{self, Effect},
    events::{now_ms, EventDraft},
    handler::{Handle, Handled, Job, StepOf, Typed, WhenStopped},
    ids::derive_id,
    pause::Held,
    payloads::{
        self, DeadlineSet, EventPayload, StepDeadlineSet, StepEnded, StepSkipped, StepStarted,
    },
    plan::PlanRecord,
    runtime::{self, BoxFuture, ConsumerLoop, HandlerError, ServiceParams},
    topology::{ConsumerSpec, StreamKind},
    Mesh, MeshError,
};
use noetl_wire::{LoopCommand, Token};
use serde_json::Value;

/// Run the scheduler until `params.shutdown` is cancelled, then drain.
pub async fn serve(params: ServiceParams) -> Result<(), MeshError> {
    let mesh = params.mesh.clone();
    let consumer = mesh
        .consumer(&ConsumerSpec {
            durable: "scheduler".into(),
            stream: StreamKind::Work,
            filter_subjects: vec![mesh.subjects().tokens_all()],
            max_ack_pending: 10_000,
        })
        .await?;
    runtime::run(
        mesh.clone(),
        ConsumerLoop {
            name: "scheduler".into(),
            consumer,
            concurrency: params.concurrency,
            handler: Arc::new(Typed::new(TokenHandler { mesh })),
            shutdown: params.shutdown,
        },
    )
    .await
}

/// Handles tokens.
pub struct TokenHandler {
    /// The mesh.
    pub mesh: Mesh,
}

impl Handle for TokenHandler {
    type In = Token;
    type Plan = StepOf;
    const NAME: &'static str = "schedule";
    /// A cancelled execution starts no step.
    const WHEN_STOPPED: WhenStopped = WhenStopped::Ack;

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn handle(
        self: Arc<Self>,
        job: Job<Token, StepOf>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            schedule(&self.mesh, job.input, &job.plan).await?;
            Ok(Handled::Done)
        })
    }
}

/// Read, decide, write for one token: the join and the admission policy
/// are read, [`decide`] says what to publish.
async fn schedule(mesh: &Mesh, token: Token, at: &StepOf) -> Result<(), HandlerError> {
    let (plan, step) = (&at.plan, at.step());
    let eid = token.execution_id.as_str();
    let srid = token.token_id.as_str();
    // A paused execution starts no step: the token waits for the unpause.
    if mesh.pauses().await?.is_paused(eid) {
        let held = Held::Token { token_id: srid };
        mesh.hold(eid, held, codec::encode(&token)).await?;
        return Ok(());
    }
    let mut args = codec::args(&token.args_json).map_err(|e| {
        HandlerError::Refused(format!(
            "token {srid} of execution {eid} step {:?}: {e}",
            token.step
        ))
    })?;

    // Join: absorb tokens until every input has arrived.
    match join_arrival(mesh, plan, &token, step, &args).await? {
        Some(merged) => args = merged,
        None => return Ok(()),
    }

    let admission = admission(mesh, plan, step, &args, srid).await?;
    let effects = decide(&Decide {
        plan,
        step,
        token: &token,
        args,
        admission,
        now_ms: now_ms(),
    });
    effects::apply(mesh, effects).await?;
    Ok(())
}

/// A token arriving at a join step: `None` while the join waits for its
/// other inputs (the token is absorbed, `step.skipped`) or when the token
/// is stale; the merged args once it fires. Other steps: their own args.
async fn join_arrival(
    mesh: &Mesh,
    plan: &PlanRecord,
    token: &Token,
    step: &Step,
    args: &Value,
) -> Result<Option<Value>, HandlerError> {
    let Some(inputs) = join::inputs(&plan.playbook, step) else {
        return Ok(Some(args.clone()));
    };
    let (eid, srid) = (token.execution_id.as_str(), token.token_id.as_str());
    match join::arrive(
        mesh,
        eid,
        &step.step,
        &inputs,
        &token.parent_step,
        srid,
        args,
    )
    .await?
    {
        join::JoinOutcome::Wait { have, need } => {
            let ev = EventDraft {
                execution_id: eid,
                step_run_id: srid,
                step: &step.step,
                trace_id: &token.trace_id,
                parent_id: &token.parent_step_run_id,
                ..Default::default()
            }
            .build(&StepSkipped {
                reason: "join.waiting".into(),
                rule: None,
                args: None,
                arrived: Some(have),
                inputs: Some(need),
                join: true,
            });
            mesh.emit(&ev).await?.wait().await?;
            Ok(None)
        }
        join::JoinOutcome::Fire(merged) => Ok(Some(merged)),
        // A redelivered token whose step-run is over: nothing to redo.
        join::JoinOutcome::Stale => Ok(None),
    }
}

/// The step's admission policy on this token (allowed when it has none);
/// the inner error is a template of the policy that failed.
async fn admission(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    args: &Value,
    srid: &str,
) -> Result<Result<routing::Admission, noetl_core::routing::RoutingError>, MeshError> {
    let Some(a) = step.admit() else {
        return Ok(Ok(routing::Admission {
            allowed: true,
            rule: None,
        }));
    };
    let sc = noetl_mesh::decision_scope::admission_scope(mesh, plan, (step, a), args, srid).await?;
    Ok(routing::admit(Some(a), &sc))
}

/// What [`decide`] needs: the token, its step and args, and what its
/// admission policy said.
struct Decide<'a> {
    plan: &'a PlanRecord,
    step: &'a Step,
    token: &'a Token,
    args: Value,
    /// The admission (its inner error: a template of the policy failed).
    admission: Result<routing::Admission, noetl_core::routing::RoutingError>,
    /// The time, epoch ms.
    now_ms: u64,
}

/// What a token's step-run publishes: a failed admission fails it, a
/// denied one skips it; an admitted one is started
/// ([`start`]).
fn decide(d: &Decide<'_>) -> Vec<Effect> {
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
            args_json: codec::json_bytes(args),
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

    fn allowed() -> Result<routing::Admission, routing::RoutingError> {
        Ok(routing::Admission {
            allowed: true,
            rule: None,
        })
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
        let effects = decided(&p, allowed());
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
            kinds(&decided(&p, allowed())),
            ["step.started", "step.done"]
        );
        let p = plan(
            json!({"step": "s", "loop": {"in": "{{ [1, 2] }}", "iterator": "x"},
                            "tool": [{"name": "t", "kind": "noop"}]}),
        );
        assert_eq!(kinds(&decided(&p, allowed())), ["step.started", "loop"]);
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
        let effects = decided(&p, allowed());
        assert_eq!(
            kinds(&effects),
            ["step.started", "step.deadline", "task:noop"]
        );
    }
}
