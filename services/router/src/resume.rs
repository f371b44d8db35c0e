//! `execution.resume_requested`: resume a failed or cancelled execution
//! where it stopped ([`noetl_mesh::resume`] decides; docs/operations.md
//! "Resume"). Read, decide, write, in an order a crash can repeat:
//!
//! 1. the plan (its workload changes, another version, the clock restarted),
//!    what loops continue from ([`Keys::loop_carry`]) and joins refire
//!    ([`Arrivals::refire`]), and `step.superseded` for `--from`: each
//!    idempotent;
//! 2. the header, in one compare-and-set that applies only while the
//!    execution is still stopped with the resume count the client saw;
//! 3. `execution.resumed`, then each token's `token.created` and the token,
//!    and the execution's new deadline timer (deterministic ids: a
//!    redelivery, which finds the header already resumed, publishes the
//!    same messages again and JetStream drops the copies).

use std::sync::Arc;

use noetl_mesh::{
    codec,
    effects::{self, Effect},
    events::{now_ms, EventDraft},
    join_record::Arrivals,
    keys::Keys,
    kv::{self, Cas, RevisionCache},
    patches,
    payloads::{self, DeadlineSet, TokenCreated},
    plan::PlanRecord,
    resume::{self, Prepared, ResumeError, ResumeRequested, Resumed, Superseded},
    runtime::HandlerError,
    state::{ExecHeader, ExecStatus, TokenRecord},
    Mesh, MeshError,
};
use noetl_wire::{Event, Token};
use serde_json::Value;

/// Carry out a resume request (one that cannot be carried out is logged
/// and acknowledged: the client checked the same before asking, so only a
/// race with another resume or a change since gets here).
pub(crate) async fn on_resume(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    ev: &Event,
) -> Result<(), HandlerError> {
    let eid = ev.execution_id.as_str();
    let req: ResumeRequested = payloads::decode_typed(ev)?;
    let prepared = match resume::prepare(mesh, eid, &req).await {
        Ok(p) => p,
        Err(ResumeError::Mesh(e)) => return Err(e.into()),
        Err(why) => return again_or_refused(mesh, &req, ev, why).await,
    };
    if prepared.header.resumes != req.expect_resumes {
        tracing::warn!(execution_id = %eid, "resume request for a stop already resumed: ignored");
        return Ok(());
    }
    let Prepared {
        header: _,
        plan,
        decision,
    } = prepared;
    // Its concurrency key's slot first (taken again: its end released it).
    let why = match crate::gates::admit_resumed(mesh, &plan).await? {
        crate::gates::Admitted::Go(_) => None,
        crate::gates::Admitted::Refused(why) => Some(why),
        crate::gates::Admitted::Queued => Some("queued".to_string()), // not asked to
    };
    if let Some(why) = why {
        tracing::warn!(execution_id = %eid, %why, "resume refused");
        return Ok(());
    }
    // 1. What the new run reads, and what it supersedes.
    let plan = Arc::new(plan);
    write_ahead(Ahead {
        mesh,
        ev,
        req: &req,
        plan: &plan,
        decision: &decision,
    })
    .await?;

    // 2. The header, while it is still the stop the client saw.
    let n = req.expect_resumes + 1;
    let tokens = decision.tokens.clone();
    let stored = kv::update_cached(
        mesh.exec_kv(),
        &Keys::header(eid),
        headers,
        |h: Option<&ExecHeader>| match h {
            Some(h) if h.status.is_terminal() && h.resumes == req.expect_resumes => {
                let mut next = resume::resumed_header(h, tokens.clone(), now_ms());
                // Another catalog version is the source from now on.
                next.source = plan.source_name.clone();
                Cas::Write(next)
            }
            _ => Cas::Keep,
        },
    )
    .await?;
    let Some(header) = stored.filter(|h| h.resumes == n && h.status == ExecStatus::Running) else {
        tracing::warn!(execution_id = %eid, "execution changed while it was resumed: left as it is");
        return Ok(());
    };
    tracing::info!(execution_id = %eid, resumes = n, "execution resumed");
    mesh.health().metrics().execution("resumed");

    // 3. The event, then the tokens.
    let continued: Vec<String> = (decision.continues.iter())
        .filter_map(|(new, _)| header.live.iter().find(|t| &t.token_id == new))
        .map(|t| t.step.clone())
        .collect();
    publish(Publish {
        mesh,
        plan: &plan,
        req: &req,
        tokens: &decision.tokens,
        continued,
        cause: &ev.event_id,
        resumed_at_ms: header.resumed_at_ms,
    })
    .await?;
    Ok(())
}

/// What [`write_ahead`] writes from.
struct Ahead<'a> {
    mesh: &'a Mesh,
    /// The request event.
    ev: &'a Event,
    req: &'a ResumeRequested,
    /// The plan the execution runs under from now on.
    plan: &'a Arc<PlanRecord>,
    decision: &'a resume::Decision,
}

/// Step 1 (each write idempotent): the plan, what each continued loop
/// continues from, every stopped loop run marked superseded (so none starts
/// anything once the execution runs again), the joins that fire again, and
/// `step.superseded`.
async fn write_ahead(a: Ahead<'_>) -> Result<(), MeshError> {
    let (mesh, plan) = (a.mesh, a.plan);
    let eid = plan.execution_id.as_str();
    mesh.plans().store(mesh, plan.clone()).await?;
    for (new, old) in &a.decision.continues {
        let carry = resume::LoopCarry { from: old.clone() };
        kv::put(mesh.loop_kv(), &Keys::loop_carry(eid, new), &carry).await?;
    }
    for srid in &a.decision.retired {
        resume::supersede_loop_run(mesh, eid, srid).await?;
    }
    for (step, new, old) in &a.decision.refires {
        refire(mesh, eid, step, (old, new)).await?;
    }
    let n = (a.req.expect_resumes + 1).to_string();
    let from = a.req.from.clone().unwrap_or_default();
    let superseded: Vec<Effect> = (a.decision.superseded.iter())
        .map(|(step, srid)| {
            Effect::Emit(
                EventDraft {
                    execution_id: eid,
                    step_run_id: srid,
                    step,
                    trace_id: &plan.trace_id,
                    parent_id: &a.ev.event_id,
                    discriminator: &n,
                    ..Default::default()
                }
                .build(&Superseded {
                    step_run_id: srid.clone(),
                    from: from.clone(),
                }),
            )
        })
        .collect();
    effects::apply(mesh, superseded).await
}

/// A request whose execution is no longer stopped: a redelivery after the
/// header was resumed publishes what follows again; anything else is
/// refused (logged, acknowledged).
async fn again_or_refused(
    mesh: &Mesh,
    req: &ResumeRequested,
    ev: &Event,
    why: ResumeError,
) -> Result<(), HandlerError> {
    let eid = ev.execution_id.as_str();
    let header = mesh.exec_header(eid).await?;
    let Some(h) =
        header.filter(|h| h.resumes == req.expect_resumes + 1 && h.status == ExecStatus::Running)
    else {
        tracing::warn!(execution_id = %eid, error = %why, "resume refused");
        return Ok(());
    };
    let plan = mesh.plans().get(mesh, eid).await?;
    let continued = (h.live.iter())
        .filter(|t| plan.step(&t.step).is_some_and(|s| s.loop_.is_some()))
        .map(|t| t.step.clone())
        .collect();
    publish(Publish {
        mesh,
        plan: &plan,
        req,
        tokens: &h.live,
        continued,
        cause: &ev.event_id,
        resumed_at_ms: h.resumed_at_ms,
    })
    .await?;
    Ok(())
}

/// Give the join record of `step` a firing for the new token (the old
/// one's merged args), when the old token fired it.
async fn refire(
    mesh: &Mesh,
    eid: &str,
    step: &str,
    (old, new): (&str, &str),
) -> Result<(), MeshError> {
    kv::update(
        mesh.exec_kv(),
        &Keys::join(eid, step),
        |cur: Option<&Arrivals>| {
            let mut next = cur.cloned().unwrap_or_default();
            match next.refire(old, new) {
                true => Cas::Write(next),
                false => Cas::Keep,
            }
        },
    )
    .await?;
    Ok(())
}

/// What [`publish`] sends.
struct Publish<'a> {
    mesh: &'a Mesh,
    plan: &'a PlanRecord,
    req: &'a ResumeRequested,
    /// The tokens that went live.
    tokens: &'a [TokenRecord],
    /// The loop steps that continue their stopped run.
    continued: Vec<String>,
    /// The request event's id.
    cause: &'a str,
    /// When the header was resumed.
    resumed_at_ms: u64,
}

/// `execution.resumed`, each token's `token.created` and the token, and
/// the execution's deadline timer counted from the resume (all with
/// deterministic ids).
async fn publish(p: Publish<'_>) -> Result<(), MeshError> {
    let plan = p.plan;
    let eid = plan.execution_id.as_str();
    let mut set: Vec<String> = p.req.set.keys().cloned().collect();
    set.sort();
    let header_n = p.req.expect_resumes + 1;
    let n = header_n.to_string();
    // The plan from now on, named so a fold of the log reads it back
    // (docs/architecture.md "The event log"); the workload by reference
    // whatever its size (`--set` values may be secrets), under a name
    // the resume fixes (a redelivery writes the same object).
    let identity = crate::entry::identity(p.mesh, plan).await?;
    let workload_ref = match set.is_empty() && p.req.playbook_version.is_none() {
        true => None,
        false => {
            let id = format!("workload-resume-{n}");
            Some(patches::store_whole(p.mesh.results(), eid, &id, &plan.workload).await?)
        }
    };
    let mut out = vec![Effect::Emit(
        EventDraft {
            execution_id: eid,
            trace_id: &plan.trace_id,
            parent_id: p.cause,
            discriminator: &n,
            ..Default::default()
        }
        .build(&Resumed {
            resumes: header_n,
            steps: p.tokens.iter().map(|t| t.step.clone()).collect(),
            continued_loops: p.continued,
            from: p.req.from.clone(),
            set,
            playbook_version: p.req.playbook_version,
            by: p.req.by.clone(),
            resumed_at_ms: p.resumed_at_ms,
            plan: Some(identity),
            workload_ref,
            workload: Value::Null,
        }),
    )];
    for t in p.tokens {
        let created = EventDraft {
            execution_id: eid,
            step: &t.step,
            trace_id: &plan.trace_id,
            parent_id: p.cause,
            discriminator: &t.token_id,
            ..Default::default()
        }
        .build(&TokenCreated {
            token_id: t.token_id.clone(),
            step: t.step.clone(),
            arc: None,
            args: t.args.clone(),
            parent: t.parent.clone(),
            started: None,
        });
        out.push(Effect::Emit(created));
    }
    out.extend(p.tokens.iter().map(|t| {
        Effect::Token(Token {
            token_id: t.token_id.clone(),
            execution_id: eid.to_string(),
            step: t.step.clone(),
            args_json: codec::json_bytes(&t.args),
            trace_id: plan.trace_id.clone(),
            parent_step_run_id: t.parent.clone(),
            parent_step: String::new(),
        })
    }));
    if let Some(d) = noetl_core::lifecycle::execution_deadline(&plan.playbook, plan.started_ms) {
        out.push(Effect::Emit(
            EventDraft {
                execution_id: eid,
                trace_id: &plan.trace_id,
                discriminator: &n,
                ..Default::default()
            }
            .build(&payloads::ExecutionDeadlineSet(DeadlineSet {
                at_ms: d.at_ms,
                what: d.what.clone(),
                args: None,
            })),
        ));
    }
    effects::apply(p.mesh, out).await
}
