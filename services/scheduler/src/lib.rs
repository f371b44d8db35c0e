//! noetl-scheduler: admits tokens and dispatches step-runs.
//!
//! For each token on `<p>.token.<eid>`: evaluate `step.spec.policy.admit`
//! (server side; inputs `workload`, `ctx`, `args`, `token`). Denied →
//! `step.skipped` (a boundary the router closes). Admitted →
//! `step.scheduled` and then: a loop step goes to the loop-supervisor
//! (`<p>.loop.<eid>`); a routing-only step (no tool) finishes at once with
//! `step.done`; any other step sends its first task command to
//! `<p>.task.<kind>`. The step-run id is the token id, so every publish is
//! idempotent under redelivery.

mod join;

use std::sync::Arc;

use async_nats::jetstream::Message;
use noetl_core::{routing, template::Scope, Step};
use noetl_mesh::{
    codec,
    commands::{self, FirstTask},
    event_type::EventType,
    events::{now_ms, types, EventDraft},
    ids::derive_id,
    payloads::{self, DeadlineSet, StepEnded, StepScheduled, StepSkipped},
    plan::PlanRecord,
    runtime::{self, BoxFuture, ConsumerLoop, Disposition, Handler, ServiceParams},
    scope,
    topology::{ConsumerSpec, StreamKind},
    Batch, Mesh, MeshError,
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
            handler: Arc::new(TokenHandler { mesh }),
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

impl Handler for TokenHandler {
    fn handle(&self, msg: Arc<Message>) -> BoxFuture<'static, Disposition> {
        let mesh = self.mesh.clone();
        Box::pin(async move {
            let token: Token = match runtime::decode("token", &msg) {
                Ok(t) => t,
                Err(e) => return runtime::disposition(Err(e)),
            };
            if mesh.cancellations().is_stopped(&token.execution_id) {
                return Disposition::Ack; // a cancelled execution starts no step
            }
            let span = tracing::debug_span!(
                "schedule",
                execution_id = %token.execution_id,
                step = %token.step,
                step_run_id = %token.token_id,
                trace_id = %token.trace_id,
            );
            runtime::disposition(
                tracing::Instrument::instrument(schedule(&mesh, token), span).await,
            )
        })
    }
}

use noetl_mesh::runtime::HandlerError;

// Over 80 lines on purpose: read, decide, write for one token; join, admission and start are
// functions of their own.
async fn schedule(mesh: &Mesh, token: Token) -> Result<(), HandlerError> {
    let eid = token.execution_id.as_str();
    let srid = token.token_id.as_str();
    let plan = token_plan(mesh, &token).await?;
    let Some(step) = plan.step(&token.step) else {
        return Err(HandlerError::Refused(format!(
            "token {srid} of execution {eid} names unknown step {:?}",
            token.step
        )));
    };
    let mut args = codec::args(&token.args_json).map_err(|e| {
        HandlerError::Refused(format!(
            "token {srid} of execution {eid} step {:?}: {e}",
            token.step
        ))
    })?;

    // Join: absorb tokens until every input has arrived.
    match join_arrival(mesh, &plan, &token, step, &args).await? {
        Some(merged) => args = merged,
        None => return Ok(()),
    }

    let admission = admission(mesh, &plan, step, &args, srid).await?;
    let ev = |t: &'static str, payload: Value| {
        EventDraft {
            event_type: t,
            execution_id: eid,
            step_run_id: srid,
            step: &step.step,
            trace_id: &token.trace_id,
            parent_id: &token.parent_step_run_id,
            payload,
            ..Default::default()
        }
        .build()
    };
    let admission = match admission {
        Ok(a) => a,
        Err(e) => {
            // A broken admission template fails the step-run (the router
            // decides whether an arc handles it).
            let message = format!(
                "admission of step {:?} failed in {}: {e}",
                step.step, plan.source_name
            );
            let failed = StepEnded::failed(payloads::error_body("admission", message), args);
            let failed = ev(types::STEP_FAILED, payloads::to_value(&failed));
            mesh.emit(&failed).await?.wait().await?;
            return Ok(());
        }
    };
    if !admission.allowed {
        let skipped = StepSkipped {
            reason: "admission denied".into(),
            rule: admission.rule,
            args: Some(args),
            arrived: None,
            inputs: None,
            join: false,
        };
        let skipped = ev(types::STEP_SKIPPED, payloads::to_value(&skipped));
        mesh.emit(&skipped).await?.wait().await?;
        return Ok(());
    }
    let mut batch = Batch::new();
    batch.push(
        mesh.emit(&ev(
            types::STEP_SCHEDULED,
            payloads::to_value(&StepScheduled {
                rule: admission.rule,
                is_loop: step.loop_.is_some(),
            }),
        ))
        .await?,
    );
    start_step(StartStep {
        mesh,
        plan: &plan,
        step,
        token: &token,
        args,
        batch,
        ev: &ev,
    })
    .await
}

/// The plan of a token's execution; a token of an execution without a
/// plan is refused.
async fn token_plan(mesh: &Mesh, token: &Token) -> Result<Arc<PlanRecord>, HandlerError> {
    mesh.plans()
        .get(mesh, &token.execution_id)
        .await
        .map_err(|e| match e {
            MeshError::NoPlan { .. } => HandlerError::Refused(format!(
                "token for unknown execution {} (step {:?})",
                token.execution_id, token.step
            )),
            e => HandlerError::Mesh(e),
        })
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
                event_type: types::STEP_SKIPPED,
                execution_id: eid,
                step_run_id: srid,
                step: &step.step,
                trace_id: &token.trace_id,
                parent_id: &token.parent_step_run_id,
                payload: payloads::to_value(&StepSkipped {
                    reason: "join.waiting".into(),
                    rule: None,
                    args: None,
                    arrived: Some(have),
                    inputs: Some(need),
                    join: true,
                }),
                ..Default::default()
            }
            .build();
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
    let eid = plan.execution_id.as_str();
    let Some(a) = step.admit() else {
        return Ok(Ok(routing::Admission {
            allowed: true,
            rule: None,
        }));
    };
    let roots = scope::roots(a.rules.iter().filter_map(|r| r.when.as_deref()));
    let loaded = scope::load(mesh, eid, &roots, &[]).await?;
    let sc = Scope::new()
        .workload(plan.workload.clone())
        .ctx(loaded.ctx)
        .args(scope::hydrate_args(mesh, args).await?)
        .event(payloads::to_value(&TokenView {
            name: "token",
            step: &step.step,
            args,
            token_id: srid,
        }))
        .execution_id(eid.to_string());
    Ok(routing::admit(Some(a), &sc))
}

/// `event` in an admission rule: the token asking to start the step.
#[derive(serde::Serialize)]
struct TokenView<'a> {
    /// Always `token`.
    name: &'static str,
    step: &'a str,
    args: &'a Value,
    token_id: &'a str,
}

/// What [`start_step`] needs.
struct StartStep<'a, F: Fn(&'static str, Value) -> noetl_wire::Event> {
    mesh: &'a Mesh,
    plan: &'a PlanRecord,
    step: &'a Step,
    token: &'a Token,
    args: Value,
    batch: Batch,
    ev: &'a F,
}

// Over 80 lines on purpose: one branch per way a step starts (loop, tasks, routing only), each
// publishing its own messages.
/// Start an admitted step-run: its deadline timer, then its loop command,
/// its first task command, or (a step without tasks) its `step.done`.
async fn start_step<F: Fn(&'static str, Value) -> noetl_wire::Event>(
    s: StartStep<'_, F>,
) -> Result<(), HandlerError> {
    let StartStep {
        mesh,
        plan,
        step,
        token,
        args,
        mut batch,
        ev,
    } = s;
    let (eid, srid) = (token.execution_id.as_str(), token.token_id.as_str());
    // The step-run's deadline, decided once here and carried by every
    // command of it; a timer backs it up for work that waits in a queue.
    let deadline = if step.loop_.is_some() || !step.tool.is_empty() {
        noetl_core::lifecycle::step_deadline(&noetl_core::lifecycle::StepDeadlineInput {
            playbook: &plan.playbook,
            step,
            now_ms: now_ms(),
            execution_started_ms: plan.started_ms,
        })
    } else {
        None
    };
    let (deadline_ms, deadline_of) = deadline
        .as_ref()
        .map(|d| (d.at_ms, d.what.clone()))
        .unwrap_or_default();
    if let Some(d) = &deadline {
        batch.push(
            mesh.emit(&ev(
                types::STEP_DEADLINE,
                payloads::to_value(&DeadlineSet {
                    at_ms: d.at_ms,
                    what: d.what.clone(),
                    args: Some(args.clone()),
                }),
            ))
            .await?,
        );
    }
    if step.loop_.is_some() {
        let cmd = LoopCommand {
            command_id: derive_id(&[srid, "loop"]),
            execution_id: eid.to_string(),
            step: step.step.clone(),
            step_run_id: srid.to_string(),
            args_json: codec::json_bytes(&args),
            trace_id: token.trace_id.clone(),
            deadline_ms,
            deadline_of: deadline_of.clone(),
        };
        batch.push(
            mesh.publish(
                mesh.subjects().loop_cmd(eid),
                &cmd.command_id,
                codec::encode(&cmd),
            )
            .await?,
        );
    } else if let Some(first) = step.tool.first() {
        batch.push(mesh.emit(&ev(types::STEP_STARTED, step_started())).await?);
        let cmd = commands::first_task(FirstTask {
            execution_id: eid,
            step: &step.step,
            step_run_id: srid,
            args: &args,
            trace_id: &token.trace_id,
            deadline: (deadline_ms, &deadline_of),
            iteration: None,
            total: 0,
        });
        batch.push(mesh.publish_task(plan, first, &cmd).await?);
    } else {
        // Routing-only step: nothing to run.
        batch.push(mesh.emit(&ev(types::STEP_STARTED, step_started())).await?);
        batch.push(
            mesh.emit(&ev(
                types::STEP_DONE,
                payloads::to_value(&StepEnded::done(Value::Null, args)),
            ))
            .await?,
        );
    }
    batch.wait().await?;
    Ok(())
}
/// The payload of `step.started`.
fn step_started() -> Value {
    payloads::typed_value(EventType::StepStarted, &payloads::StepStarted {})
}
