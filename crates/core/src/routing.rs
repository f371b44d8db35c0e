//! Server-side admission (`step.spec.policy.admit`) and arc selection
//! (`step.next`). Pure functions over a [`Scope`].
//!
//! Admission: an omitted `admit` allows; otherwise the first rule whose
//! `when` holds decides, an `else` rule is the fallback (wherever written),
//! and when nothing matches and there is no `else` the step is admitted
//! (docs/dsl.md "Steps": admission defaults to allow; write
//! `- else: {then: {allow: false}}` to deny by default).
//!
//! Arcs: `exclusive` (default) fires the first arc whose `when` holds, in
//! YAML order; `inclusive` fires all of them. An arc without `when` always
//! holds. Each selected arc's `args` and `set_ctx` are rendered with the
//! scope.

use thiserror::Error;

use crate::model::{Admit, Next, Object, RouteMode};
use crate::template::{eval_condition, render_value, Scope, TemplateError};

/// The admission verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Whether the token may run the step.
    pub allowed: bool,
    /// The deciding rule; `None` when the default (allow) applied.
    pub rule: Option<usize>,
}

/// One arc that fires.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectedArc {
    /// Index of the arc in `next.arcs`.
    pub index: usize,
    /// Target step.
    pub step: String,
    /// Rendered inscription: the `args` of the target step-run.
    pub args: Object,
    /// Rendered `ctx` writes of the arc (empty when it has none).
    pub set_ctx: Object,
}

/// Admission or routing could not be evaluated. Callers add the location.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RoutingError {
    /// The `when` of admission rule `rule` failed.
    #[error("admit rule {rule}: when: {source}")]
    AdmitCondition {
        /// Rule index.
        rule: usize,
        /// The template error.
        #[source]
        source: TemplateError,
    },
    /// The `when` of arc `arc` failed.
    #[error("arc {arc} (to {step:?}): when: {source}")]
    ArcCondition {
        /// Arc index.
        arc: usize,
        /// Target step.
        step: String,
        /// The template error.
        #[source]
        source: TemplateError,
    },
    /// The `args` (or `set_ctx`) of arc `arc` failed to render.
    #[error("arc {arc} (to {step:?}): {field}: {source}")]
    ArcArgs {
        /// `args` or `set_ctx`.
        field: &'static str,
        /// Arc index.
        arc: usize,
        /// Target step.
        step: String,
        /// The template error.
        #[source]
        source: TemplateError,
    },
}

/// Evaluates step admission.
pub fn admit(admit: Option<&Admit>, scope: &Scope) -> Result<Admission, RoutingError> {
    let default = Admission {
        allowed: true,
        rule: None,
    };
    let Some(admit) = admit else {
        return Ok(default);
    };
    for (i, rule) in admit.rules.iter().enumerate() {
        if rule.is_else {
            continue;
        }
        let hit = match &rule.when {
            None => true,
            Some(when) => eval_condition(when, scope)
                .map_err(|source| RoutingError::AdmitCondition { rule: i, source })?,
        };
        if hit {
            return Ok(Admission {
                allowed: rule.then.allow,
                rule: Some(i),
            });
        }
    }
    Ok(admit
        .rules
        .iter()
        .position(|r| r.is_else)
        .map(|i| Admission {
            allowed: admit.rules[i].then.allow,
            rule: Some(i),
        })
        .unwrap_or(default))
}

/// Selects the arcs that fire, in YAML order. No `next` → none.
pub fn select_arcs(next: Option<&Next>, scope: &Scope) -> Result<Vec<SelectedArc>, RoutingError> {
    let Some(next) = next else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (index, arc) in next.arcs.iter().enumerate() {
        let hit = match &arc.when {
            None => true,
            Some(when) => {
                eval_condition(when, scope).map_err(|source| RoutingError::ArcCondition {
                    arc: index,
                    step: arc.step.clone(),
                    source,
                })?
            }
        };
        if !hit {
            continue;
        }
        let render = |field: &'static str, values: Option<&Object>| {
            let mut out = Object::new();
            for (k, v) in values.into_iter().flatten() {
                let v = render_value(v, scope).map_err(|source| RoutingError::ArcArgs {
                    field,
                    arc: index,
                    step: arc.step.clone(),
                    source,
                })?;
                out.insert(k.clone(), v);
            }
            Ok::<_, RoutingError>(out)
        };
        out.push(SelectedArc {
            index,
            step: arc.step.clone(),
            args: render("args", arc.args.as_ref())?,
            set_ctx: render("set_ctx", arc.set_ctx.as_ref())?,
        });
        if next.spec.mode == RouteMode::Exclusive {
            break;
        }
    }
    Ok(out)
}
