//! Which arcs a boundary fires: their scope (the event, `ctx`, workload,
//! args, results), the selection, and the `ctx` writes of the fired arcs.

use noetl_core::{routing, template::Scope, Step};
pub(super) use noetl_mesh::fold::error_text;
use noetl_mesh::{
    event_type::EventType, ids::derive_id, kv::Cas, payloads::BoundaryView, plan::PlanRecord,
    scope, state::TokenRecord, Mesh, MeshError,
};
use noetl_wire::Event;
use serde_json::{Map, Value};

/// What the arcs decided for one boundary event.
pub(super) struct Decision {
    pub(super) tokens: Vec<TokenRecord>,
    pub(super) unhandled_failure: bool,
    pub(super) error: Option<String>,
    /// The `ctx` writes of the fired arcs, already applied.
    pub(super) set_ctx: Option<Map<String, Value>>,
}

/// The scope arc conditions and args render in ([`noetl_mesh::decision_scope::arc_scope`],
/// from KV). The event's payload is read as JSON only here: a boundary
/// whose arcs render nothing never needs it whole.
pub(super) async fn arc_scope(
    mesh: &Mesh,
    plan: &PlanRecord,
    (ev, view): (&Event, &BoundaryView),
    templates: &[&str],
) -> Result<Scope, MeshError> {
    let args = view
        .args
        .clone()
        .unwrap_or_else(|| Value::Object(Map::new()));
    let payload = noetl_mesh::events::payload(ev);
    noetl_mesh::decision_scope::arc_scope(mesh, plan, ev, (&payload, &args), templates).await
}

/// Evaluate the step's arcs for this boundary event, in one pass: read the
/// scope their templates name, decide ([`route`]), then write the fired
/// arcs' `ctx` and their large arguments ([`place`]).
pub(super) async fn decide(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    (ev, kind): (&Event, Option<EventType>),
    view: &BoundaryView,
) -> Result<Decision, MeshError> {
    if kind == Some(EventType::StepSkipped) {
        return Ok(route(ev, kind, Ok(Vec::new())));
    }
    let next = step.next.as_ref();
    let templates = scope::arc_templates(step);
    let selected = if templates.is_empty() && next.map(|n| n.arcs.is_empty()).unwrap_or(true) {
        Ok(Vec::new())
    } else {
        // No `when` and no string in any arc's `args` or `set_ctx`: nothing
        // renders, so nothing is read for a scope.
        let sc = if templates.is_empty() {
            Scope::new()
        } else {
            arc_scope(mesh, plan, (ev, view), &templates).await?
        };
        routing::select_arcs(next, &sc).map_err(|e| {
            format!(
                "routing of step {:?} failed in {}: {e}",
                ev.step, plan.source_name
            )
        })
    };
    if let Err(message) = &selected {
        tracing::warn!(execution_id = %ev.execution_id, step = %ev.step, %message, "routing failed");
    }
    place(mesh, plan, ev, route(ev, kind, selected)).await
}

/// What the selected arcs decide, before anything is written: the tokens
/// they fire (ids derived from the step-run and the arc, args still
/// inline), their `ctx` writes, and whether the step-run's failure is left
/// unhandled (it failed and no arc fired, or routing itself failed).
pub(super) fn route(
    ev: &Event,
    kind: Option<EventType>,
    selected: Result<Vec<routing::SelectedArc>, String>,
) -> Decision {
    match selected {
        Ok(arcs) => {
            let patch = arc_ctx_patch(&arcs);
            let tokens: Vec<TokenRecord> = arcs
                .into_iter()
                .map(|a| TokenRecord {
                    token_id: derive_id(&[&ev.step_run_id, "arc", &a.index.to_string()]),
                    step: a.step,
                    args: Value::Object(a.args),
                    arc: a.index,
                    parent: ev.step_run_id.clone(),
                })
                .collect();
            Decision {
                unhandled_failure: kind == Some(EventType::StepFailed) && tokens.is_empty(),
                tokens,
                error: None,
                set_ctx: (!patch.is_empty()).then_some(patch),
            }
        }
        Err(message) => Decision {
            tokens: Vec::new(),
            unhandled_failure: true,
            error: Some(message),
            set_ctx: None,
        },
    }
}

/// Write what [`route`] decided: the arcs' `ctx` writes, then each token's
/// arguments, by reference when they are large (like large results).
async fn place(
    mesh: &Mesh,
    plan: &PlanRecord,
    ev: &Event,
    mut decision: Decision,
) -> Result<Decision, MeshError> {
    if let Some(patch) = &decision.set_ctx {
        apply_arc_ctx(mesh, &ev.execution_id, &ev.step_run_id, patch).await?;
    }
    let limit = plan.max_payload_bytes(mesh.config().inline_limit);
    for t in &mut decision.tokens {
        t.args = scope::offload_args(
            mesh,
            scope::OffloadArgs {
                execution_id: &ev.execution_id,
                step: &t.step,
                token_id: &t.token_id,
                args: &t.args,
            },
            limit,
        )
        .await?;
    }
    Ok(decision)
}

/// The `ctx` writes of the arcs that fire, in arc order (a later arc's
/// value for a key wins, as if applied one after the other).
pub(super) fn arc_ctx_patch(arcs: &[routing::SelectedArc]) -> Map<String, Value> {
    let mut patch = Map::new();
    for a in arcs {
        patch.extend(a.set_ctx.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    patch
}

/// Merge the arcs' `ctx` writes of step-run `step_run_id` into the
/// execution's `ctx` (compare-and-set), before their tokens are placed. The
/// write is recorded under the step-run's id in the same compare-and-set,
/// so a redelivered boundary event (whose patch may render differently,
/// e.g. `ctx.n + 1`) does not apply it again.
pub(super) async fn apply_arc_ctx(
    mesh: &Mesh,
    eid: &str,
    step_run_id: &str,
    patch: &Map<String, Value>,
) -> Result<(), MeshError> {
    use noetl_mesh::state::{ctx_applied, mark_ctx_applied};
    let id = format!("arcs:{step_run_id}");
    noetl_mesh::ctx_record::update(mesh, eid, |current: Option<&Value>| {
        let mut obj = match current {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        if ctx_applied(&obj, &id) {
            return Cas::Keep;
        }
        obj.extend(patch.iter().map(|(k, v)| (k.clone(), v.clone())));
        mark_ctx_applied(&mut obj, &id);
        Cas::Write(Value::Object(obj))
    })
    .await?;
    Ok(())
}

pub(super) fn failure_message(
    ev: &Event,
    error: Option<&Value>,
    routing_error: Option<&str>,
) -> String {
    if let Some(e) = routing_error {
        return e.to_string();
    }
    match error {
        Some(e) => format!("step {:?} failed: {}", ev.step, error_text(e)),
        None => format!("step {:?} failed", ev.step),
    }
}
