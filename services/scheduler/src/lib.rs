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
//!
//! The tokens that come here are those whose admission reads something: an
//! execution's entry token and a resume's, a token of a step with an
//! admission policy or a join, and any token of a paused execution (held
//! here). The router starts the others itself with the same decision
//! (`noetl_mesh::dispatch`).

mod join;

use std::sync::Arc;

use noetl_core::{routing, Step};
use noetl_mesh::{
    codec,
    dispatch::{self, decide, Decide},
    effects,
    events::{now_ms, EventDraft},
    handler::{Handle, Handled, Job, StepOf, Typed, WhenStopped},
    pause::Held,
    payloads::StepSkipped,
    plan::PlanRecord,
    runtime::{self, BoxFuture, ConsumerLoop, HandlerError, ServiceParams},
    topology::{ConsumerSpec, StreamKind},
    Mesh, MeshError,
};
use noetl_wire::Token;
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
/// are read, [`decide`] says what to publish (`noetl_mesh::dispatch`,
/// which the router also uses for a token it need not send here).
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
        return Ok(Ok(dispatch::admitted()));
    };
    let sc = noetl_mesh::decision_scope::admission_scope(mesh, plan, (step, a), args, srid).await?;
    Ok(routing::admit(Some(a), &sc))
}
