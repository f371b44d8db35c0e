//! The scopes the services' decisions render in, over a
//! [`StateSource`] (KV live, the fold of the events in a replay): a
//! boundary's arcs (router), a token's admission (scheduler), a loop's
//! `in` (loop-supervisor). `noetl exec replay --playbook` builds them with
//! the same functions ([`crate::rejudge`]).

use noetl_core::template::Scope;
use noetl_core::Step;
use serde_json::Value;

use crate::plan::PlanRecord;
use crate::scope::{event_scope, strings, StateSource};
use crate::MeshError;

/// The scope a step's arcs render in at boundary event `ev`: workload,
/// `ctx`, the step's `args`, `event` ([`event_scope`]), and the step
/// results `templates` read.
pub async fn arc_scope<S: StateSource>(
    source: &S,
    plan: &PlanRecord,
    ev: &noetl_wire::Event,
    (payload, args): (&Value, &Value),
    templates: &[&str],
) -> Result<Scope, MeshError> {
    let sc = plan
        .template_scope(source, templates.iter().copied(), args)
        .await?;
    Ok(sc.event(event_scope(ev, payload)))
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

/// The scope a step's admission rules render in for the token `srid`
/// with `args`: workload, `ctx`, `args`, the step results the rules read,
/// `event` (the token) and the execution id.
pub async fn admission_scope<S: StateSource>(
    source: &S,
    plan: &PlanRecord,
    (step, admit): (&Step, &noetl_core::model::Admit),
    args: &Value,
    srid: &str,
) -> Result<Scope, MeshError> {
    // The scope arcs and `loop.in` render in: workload, ctx, args and the
    // results of the steps the rules read by name; `event` is the token.
    let sc = plan
        .template_scope(
            source,
            admit.rules.iter().filter_map(|r| r.when.as_deref()),
            args,
        )
        .await?;
    Ok(sc.event(crate::payloads::to_value(&TokenView {
        name: "token",
        step: &step.step,
        args,
        token_id: srid,
    })))
}

/// The scope a loop's `in` and `max_in_flight` render in (with the
/// loop-supervisor's own `more` templates): workload, `ctx`, the step's
/// args, the step results they read, and in a child playbook the
/// parent's iteration as `iter.parent`.
pub async fn loop_scope<S: StateSource>(
    source: &S,
    plan: &PlanRecord,
    lp: &noetl_core::model::Loop,
    args: &Value,
    more: &[&str],
) -> Result<Scope, MeshError> {
    let mut all = strings(&lp.in_);
    if let Some(m) = &lp.spec.max_in_flight {
        all.extend(strings(m));
    }
    all.extend(more.iter().copied());
    let mut sc = plan.template_scope(source, all, args).await?;
    if !plan.parent_iter.is_null() {
        sc = sc.iter(serde_json::json!({"parent": plan.parent_iter}));
    }
    Ok(sc)
}
