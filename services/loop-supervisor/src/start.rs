//! Starting a loop run from its loop command: its settings rendered and
//! checked (a bad one fails the step-run), its collection stored (a loop
//! over `in`) or its first claims issued (a cursor loop), its run record
//! created (create-only), and what it implies published.

use noetl_core::{
    reduce,
    template::{render_value, Scope},
    FrameProcess, Loop, LoopMode, Step,
};
use noetl_mesh::{
    codec,
    keys::Keys,
    kv::{self, Cas},
    plan::PlanRecord,
    resume::LoopCarry,
    runtime::HandlerError,
    Mesh, MeshError,
};
use noetl_wire::LoopCommand;
use serde_json::Value;

use crate::collection::{store_items, Collection};
use crate::dispatch::{release_held, resume, unpause_command_id, Window};
use crate::finish::fail_loop;
use crate::state::{
    batches, continued_run,
    cursor::{frame_number, frame_templates, start_run},
    new_run, resumed, LoopRun,
};

/// Default bound of a parallel loop without `max_in_flight`.
pub const DEFAULT_MAX_IN_FLIGHT: u64 = 16;

/// Start the loop run of `cmd` (its loop run is `w.at`): read, decide,
/// write. A redelivered start whose run exists publishes again what the
/// run implies.
pub(crate) async fn on_start(w: &Window<'_>, cmd: &LoopCommand) -> Result<(), HandlerError> {
    let (mesh, plan, step) = (w.mesh, w.at.plan, w.at.step);
    let eid = plan.execution_id.as_str();
    let Some(lp) = step.loop_.as_ref() else {
        return Err(HandlerError::Refused(format!(
            "step {:?} of execution {eid} has no loop",
            step.step
        )));
    };
    let key = w.at.key();
    if let Some(run) = kv::get::<LoopRun>(mesh.loop_kv(), &key).await? {
        if cmd.command_id == unpause_command_id(w.at.srid) {
            return release_held(w, run).await;
        }
        // Redelivered start: the run was created, but what followed may not
        // have gone out (a crash, a failed publish): send it again.
        return resume(w, run, None).await;
    }
    // No record, but the loop started before: it was lost (a purge); its
    // events rebuild it rather than a second start.
    if let Some(run) = crate::rebuild::restore(mesh, w.at).await? {
        return resume(w, run, None).await;
    }
    let args = codec::args(&cmd.args_json).map_err(|e| {
        HandlerError::Refused(format!(
            "loop command of execution {eid} step {:?}: {e}",
            cmd.step
        ))
    })?;
    let s = Starting {
        cmd,
        plan,
        step,
        lp,
        sc: loop_scope(mesh, plan, lp, &args).await?,
        args,
    };
    let run = if lp.cursor.is_some() {
        cursor_run(&s).map(|run| (run, Value::Null))
    } else {
        start_in(mesh, &s).await?
    };
    let (mut run, collection) = match run {
        Ok((run, collection)) => (carried(mesh, w, run).await?, collection),
        Err(message) => return fail_loop(mesh, cmd, message).await,
    };
    // The first window's batches, recorded with the run.
    let first = run.in_flight.clone();
    let batch = crate::messages::batch_size(run.max_in_flight, mesh.config().loop_batch, step);
    batches::cut(&mut run, &first, batch);
    let run = create(mesh, &key, run).await?;
    resume(w, run, Some(collection)).await
}

/// The new run as it continues the run a resume names for it
/// ([`Keys::loop_carry`], [`resumed`]), a cursor loop's rows it runs
/// again written under its own frames; `run` itself when there is none.
async fn carried(mesh: &Mesh, w: &Window<'_>, run: LoopRun) -> Result<LoopRun, MeshError> {
    let eid = w.at.eid();
    let key = Keys::loop_carry(eid, w.at.srid);
    let Some(carry) = kv::get::<LoopCarry>(mesh.loop_kv(), &key).await? else {
        return Ok(run);
    };
    // Stopped first (it counts and starts nothing more), then read as the
    // log gives it: the same fold a fold of the new run makes, from as
    // many of its events as are read here.
    let stored = supersede(mesh, &Keys::loop_run(eid, &carry.from)).await?;
    let (mut run, seen) =
        match crate::rebuild::stopped_run(mesh, eid, &carry.from, w.at.step).await? {
            Some((old, seen)) => {
                // A cursor loop's rows it runs again, under its own run's
                // frames, before its record says where they are.
                let (run, carried) = continued_run(run, old, &carry.from);
                crate::rebuild::write_frames(mesh, w.at, &carried).await?;
                (run, Some(seen))
            }
            None => match stored {
                Some(old) => (resumed(run, &old, &carry.from, &[]), None),
                None => (run, None),
            },
        };
    run.continues = carry.from;
    run.continued_events = seen;
    Ok(run)
}

/// Mark the stored run at `key` superseded ([`LoopRun::superseded`]) and
/// return it as marked: what the new run continues, counted up to the
/// write that stopped it counting. `None` when it is not stored.
async fn supersede(mesh: &Mesh, key: &str) -> Result<Option<LoopRun>, MeshError> {
    kv::update(mesh.loop_kv(), key, |r: Option<&LoopRun>| match r {
        Some(r) if !r.superseded && !r.done_emitted => {
            let mut r = r.clone();
            r.superseded = true;
            Cas::Write(r)
        }
        _ => Cas::Keep,
    })
    .await
}

/// A loop command being started, its loop's settings to render.
struct Starting<'a> {
    cmd: &'a LoopCommand,
    plan: &'a PlanRecord,
    step: &'a Step,
    lp: &'a Loop,
    /// The scope the settings render in ([`loop_scope`]).
    sc: Scope,
    /// The step's args.
    args: Value,
}

impl Starting<'_> {
    fn render(
        &self,
        v: &Option<Value>,
    ) -> Option<Result<Value, noetl_core::template::TemplateError>> {
        v.as_ref().map(|v| render_value(v, &self.sc))
    }
}

/// The run of a new loop over `in`, its collection stored (with the list
/// of its chunks, for `loop.started`); or why the loop fails (its
/// collection or its settings are bad).
async fn start_in(
    mesh: &Mesh,
    s: &Starting<'_>,
) -> Result<Result<(LoopRun, Value), String>, MeshError> {
    let step = &s.step.step;
    // `loop.in` may give a result reference: its collection is read from
    // object storage.
    let rendered = match render_value(&s.lp.in_, &s.sc) {
        Ok(v) if noetl_mesh::objects::is_ref(&v) => match mesh.results().hydrate(v).await {
            Ok(v) => Ok(v),
            Err(e) => return Ok(Err(format!("loop.in of step {step:?}: {e}"))),
        },
        other => other,
    };
    let items = match collection(rendered, step, &s.plan.source_name) {
        Ok(items) => items,
        Err(message) => return Ok(Err(message)),
    };
    let max_in_flight = match in_bounds(s, items.len()) {
        Ok(n) => n,
        Err(message) => return Ok(Err(message)),
    };
    let collection = store_items(
        mesh,
        Collection {
            eid: &s.plan.execution_id,
            srid: &s.cmd.step_run_id,
            step,
            items: &items,
            limit: s.plan.max_payload_bytes(mesh.config().inline_limit),
        },
    )
    .await?;
    let total = items.len() as u64;
    let run = new_run(s.cmd, step, total, max_in_flight, s.args.clone());
    Ok(Ok((run, collection)))
}

/// The bound of a loop over `items` elements in flight, or why the loop
/// fails: too many items for the executor's limits, a bad
/// `max_in_flight`, bad reducers.
fn in_bounds(s: &Starting<'_>, items: usize) -> Result<u64, String> {
    let step = &s.step.step;
    let limits = noetl_core::limits::Limits::from_spec_limits(
        s.plan
            .playbook
            .executor
            .as_ref()
            .and_then(|e| e.spec.get("limits")),
    );
    let place = format!(
        "loop.in of step {step:?} in {}, execution {}",
        s.plan.source_name, s.plan.execution_id
    );
    limits
        .check_loop_items(items, &place)
        .map_err(|e| e.to_string())?;
    let rendered_max = s.render(&s.lp.spec.max_in_flight);
    let max_in_flight = max_in_flight(s.lp.spec.mode, rendered_max, step)?;
    reducers_declared(s)?;
    Ok(max_in_flight)
}

/// The run of a new cursor loop with its first claims issued, or why the
/// loop fails (bad frame settings or reducers). Its window is
/// `max_in_flight × frame.row_concurrency` iterations.
fn cursor_run(s: &Starting<'_>) -> Result<LoopRun, String> {
    let (lp, step) = (s.lp, &s.step.step);
    let frame = lp.spec.frame.clone().unwrap_or_default();
    let m = max_in_flight(lp.spec.mode, s.render(&lp.spec.max_in_flight), step)?;
    let rc = frame_number(s.render(&frame.row_concurrency), "row_concurrency", step)?;
    let max_rows = frame_number(s.render(&frame.max_rows), "max_rows", step)?;
    reducers_declared(s)?;
    let run = new_run(s.cmd, step, 0, m.saturating_mul(rc), s.args.clone());
    Ok(start_run(
        run,
        max_rows,
        frame.process == FrameProcess::Frame,
    ))
}

/// The loop's reducers are declared right, or why not.
fn reducers_declared(s: &Starting<'_>) -> Result<(), String> {
    reduce::declared(s.lp.spec.policy.as_ref())
        .map(|_| ())
        .map_err(|e| format!("loop.spec.policy.reducers of step {:?}: {e}", s.step.step))
}

/// Create the run under `key` (create-only); a run created meanwhile (a
/// concurrent redelivery) stands.
async fn create(mesh: &Mesh, key: &str, run: LoopRun) -> Result<LoopRun, MeshError> {
    if kv::create(mesh.loop_kv(), key, &run).await? {
        return Ok(run);
    }
    Ok(kv::get(mesh.loop_kv(), key).await?.unwrap_or(run))
}

/// The scope `loop.in`, `max_in_flight` and the frame templates render in
/// ([`noetl_mesh::decision_scope::loop_scope`], from KV).
async fn loop_scope(
    mesh: &Mesh,
    plan: &PlanRecord,
    lp: &Loop,
    args: &Value,
) -> Result<Scope, MeshError> {
    let frame = frame_templates(lp);
    let more: Vec<&str> = frame.iter().map(String::as_str).collect();
    noetl_mesh::decision_scope::loop_scope(mesh, plan, lp, args, &more).await
}

/// The loop's collection from its rendered `loop.in`, or why the loop
/// fails (not a list; the template failed).
fn collection<E: std::fmt::Display>(
    rendered: Result<Value, E>,
    step: &str,
    source: &str,
) -> Result<Vec<Value>, String> {
    match rendered {
        Ok(Value::Array(items)) => Ok(items),
        Ok(other) => Err(format!(
            "loop.in of step {step:?} must give a list, it gave {}",
            codec::json_type(&other)
        )),
        Err(e) => Err(format!("loop.in of step {step:?} failed in {source}: {e}")),
    }
}

/// Iterations in flight at most: 1 for a sequential loop; for a parallel
/// one its rendered `max_in_flight` (an integer >= 1, or such a string),
/// else [`DEFAULT_MAX_IN_FLIGHT`].
fn max_in_flight<E: std::fmt::Display>(
    mode: LoopMode,
    rendered: Option<Result<Value, E>>,
    step: &str,
) -> Result<u64, String> {
    match (mode, rendered) {
        (LoopMode::Sequential, _) => Ok(1),
        (LoopMode::Parallel, None) => Ok(DEFAULT_MAX_IN_FLIGHT),
        // NoETL's default: one claim worker.
        (LoopMode::Cursor, None) => Ok(1),
        (LoopMode::Parallel | LoopMode::Cursor, Some(Err(e))) => {
            Err(format!("loop.spec.max_in_flight of step {step:?}: {e}"))
        }
        (LoopMode::Parallel | LoopMode::Cursor, Some(Ok(v))) => {
            match v
                .as_u64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            {
                Some(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "loop.spec.max_in_flight of step {step:?} must be an integer >= 1, got {v}"
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests;
