//! Task outcome policy → directive (docs/dsl.md, "The pipeline"). Pure:
//! the executor applies the directive.
//!
//! * Rules are evaluated top to bottom; the first rule whose `when` holds
//!   wins; an `else` rule is the fallback wherever it is written. A non-`else`
//!   rule without `when` always matches.
//! * No policy: ok → `continue`, error → `fail`.
//! * A policy whose rules do not match and that has no `else` → its
//!   `on_unmatched`: `continue` (canonical v10 default), whatever the
//!   outcome status, or `fail`.
//! * `retry` is bounded by `attempts`, the TOTAL number of attempts including
//!   the first (default [`DEFAULT_ATTEMPTS`]). Once exhausted the directive is
//!   `fail` ("retry attempts exhausted (N)") for an error outcome and
//!   `continue` for an ok one.
//! * Retry delay: base `delay` seconds (number, numeric string or template;
//!   default [`DEFAULT_DELAY_S`]), times 1 (`none`), `attempt` (`linear`) or
//!   `2^(attempt-1)` (`exponential`), capped at [`MAX_DELAY_S`], then raised
//!   to the tool's `Retry-After` if that is longer (`attempt` is the attempt
//!   that produced the outcome).
//! * `set_iter` / `set_ctx` are rendered with the same scope and returned with
//!   any decision of the matched rule.

use std::time::Duration;

use thiserror::Error;

use crate::model::{Action, Backoff, Object, Rule, TaskPolicy, TaskThen};
use crate::outcome::Outcome;
use crate::template::{eval_condition, render_str, render_value, Scope, TemplateError};

/// Total attempts of a `retry` rule without `attempts`.
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// Base retry delay, in seconds, of a `retry` rule without `delay`.
pub const DEFAULT_DELAY_S: f64 = 1.0;
/// Upper bound of a computed retry delay, in seconds (Retry-After may exceed it).
pub const MAX_DELAY_S: f64 = 300.0;

/// What [`decide`] needs.
#[derive(Debug, Clone, Copy)]
pub struct PolicyInput<'a> {
    /// The task's `spec.policy`, if any.
    pub policy: Option<&'a TaskPolicy>,
    /// The outcome to judge.
    pub outcome: &'a Outcome,
    /// 1-based attempt that produced `outcome`.
    pub attempt: u32,
    /// Render scope; must expose `outcome` (and `iter`, `ctx`, `_prev`...).
    pub scope: &'a Scope,
    /// A tool-provided floor for the retry delay (HTTP `Retry-After`).
    pub retry_after: Option<Duration>,
}

/// The control decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Advance to the next task.
    Continue,
    /// Run the same task again after `delay`, as attempt `next_attempt`.
    Retry {
        /// Wait before the next attempt.
        delay: Duration,
        /// 1-based number of the next attempt.
        next_attempt: u32,
    },
    /// Move the program counter to task `to`.
    Jump {
        /// Target task label.
        to: String,
    },
    /// Stop the pipeline successfully.
    Break,
    /// Stop the pipeline as a failure.
    Fail {
        /// Why.
        reason: String,
    },
}

impl Decision {
    /// Its action as `task.done` names it: `continue`, `retry`, `jump`,
    /// `break` or `fail`.
    pub fn action(&self) -> &'static str {
        match self {
            Decision::Continue => "continue",
            Decision::Retry { .. } => "retry",
            Decision::Jump { .. } => "jump",
            Decision::Break => "break",
            Decision::Fail { .. } => "fail",
        }
    }
}

/// The templates of a task policy's rule: its `when`, `then.delay`,
/// `then.set_iter` and `then.set_ctx`.
pub fn rule_templates(rule: &Rule<TaskThen>) -> Vec<&str> {
    use serde_json::Value;
    fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            Value::Object(m) => m.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    let mut out: Vec<&str> = rule.when.as_deref().into_iter().collect();
    let then = &rule.then;
    if let Some(d) = &then.delay {
        strings(d, &mut out);
    }
    for patch in [&then.set_iter, &then.set_ctx].into_iter().flatten() {
        patch.values().for_each(|v| strings(v, &mut out));
    }
    out
}

/// A decision plus the patches of the matched rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Directive {
    /// What to do next.
    pub decision: Decision,
    /// Rendered iteration-scope patch.
    pub set_iter: Option<Object>,
    /// Rendered execution-scope patch.
    pub set_ctx: Option<Object>,
    /// Index of the matched rule; `None` when the default applied.
    pub rule: Option<usize>,
}

/// Which part of a rule failed to evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleField {
    /// `when`.
    When,
    /// `then.delay`.
    Delay,
    /// `then.set_iter`.
    SetIter,
    /// `then.set_ctx`.
    SetCtx,
}

impl std::fmt::Display for RuleField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RuleField::When => "when",
            RuleField::Delay => "then.delay",
            RuleField::SetIter => "then.set_iter",
            RuleField::SetCtx => "then.set_ctx",
        })
    }
}

/// A task policy could not be evaluated. Callers add the playbook location.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PolicyError {
    /// A template of rule `rule` failed.
    #[error("policy rule {rule}: {field}: {source}")]
    Template {
        /// Rule index.
        rule: usize,
        /// The failing field.
        field: RuleField,
        /// The template error.
        #[source]
        source: TemplateError,
    },
    /// `then.delay` is not a non-negative number of seconds.
    #[error(
        "policy rule {rule}: then.delay must be a non-negative number of seconds, got {value}"
    )]
    InvalidDelay {
        /// Rule index.
        rule: usize,
        /// The offending (rendered) value.
        value: String,
    },
    /// A `jump` rule without `to`.
    #[error("policy rule {rule}: `do: jump` requires `to`")]
    MissingJumpTarget {
        /// Rule index.
        rule: usize,
    },
}

/// Evaluates the task policy for one outcome.
pub fn decide(input: &PolicyInput) -> Result<Directive, PolicyError> {
    let Some(policy) = input.policy else {
        let decision = if input.outcome.is_ok() {
            Decision::Continue
        } else {
            Decision::Fail {
                reason: outcome_reason(input.outcome),
            }
        };
        return Ok(directive(decision, None));
    };
    let Some((index, rule)) = matched_rule(&policy.rules, input.scope)? else {
        return Ok(directive(unmatched(policy, input.outcome), None));
    };
    let then = &rule.then;
    let decision = match then.action {
        Action::Continue => Decision::Continue,
        Action::Break => Decision::Break,
        Action::Fail => Decision::Fail {
            reason: if input.outcome.is_ok() {
                format!("failed by policy rule {index}")
            } else {
                outcome_reason(input.outcome)
            },
        },
        Action::Jump => match &then.to {
            Some(to) => Decision::Jump { to: to.clone() },
            None => return Err(PolicyError::MissingJumpTarget { rule: index }),
        },
        Action::Retry => retry(index, then, input)?,
    };
    let set_iter = render_patch(
        then.set_iter.as_ref(),
        input.scope,
        index,
        RuleField::SetIter,
    )?;
    let set_ctx = render_patch(then.set_ctx.as_ref(), input.scope, index, RuleField::SetCtx)?;
    Ok(Directive {
        decision,
        set_iter,
        set_ctx,
        rule: Some(index),
    })
}

/// The retry delay for `attempt` (1-based attempt that failed), before the
/// Retry-After floor: `base`, `base*attempt` or `base*2^(attempt-1)`, capped
/// at [`MAX_DELAY_S`].
pub fn backoff_delay(base_s: f64, backoff: Backoff, attempt: u32) -> Duration {
    let attempt = attempt.max(1);
    let factor = match backoff {
        Backoff::None => 1.0,
        Backoff::Linear => f64::from(attempt),
        Backoff::Exponential => 2f64.powi(i32::try_from(attempt - 1).unwrap_or(i32::MAX)),
    };
    let secs = (base_s.max(0.0) * factor).min(MAX_DELAY_S);
    Duration::from_secs_f64(if secs.is_finite() { secs } else { MAX_DELAY_S })
}

fn directive(decision: Decision, rule: Option<usize>) -> Directive {
    Directive {
        decision,
        set_iter: None,
        set_ctx: None,
        rule,
    }
}

/// The decision when no rule matched and there is no `else`: the policy's
/// `on_unmatched` (`continue`, the default, or `fail`; the validator
/// refuses other values).
fn unmatched(policy: &TaskPolicy, outcome: &Outcome) -> Decision {
    match policy.extra.get("on_unmatched").and_then(|v| v.as_str()) {
        Some("fail") => {
            let status = if outcome.is_ok() {
                "ok".to_string()
            } else {
                format!("error, {}", outcome_reason(outcome))
            };
            Decision::Fail {
                reason: format!(
                    "no policy rule matched the outcome ({status}) and on_unmatched is fail"
                ),
            }
        }
        _ => Decision::Continue,
    }
}

fn outcome_reason(outcome: &Outcome) -> String {
    match &outcome.error {
        Some(e) if e.message.is_empty() => e.kind.clone(),
        Some(e) => format!("{}: {}", e.kind, e.message),
        None => "task failed".to_string(),
    }
}

fn matched_rule<'r>(
    rules: &'r [Rule<TaskThen>],
    scope: &Scope,
) -> Result<Option<(usize, &'r Rule<TaskThen>)>, PolicyError> {
    for (i, rule) in rules.iter().enumerate() {
        if rule.is_else {
            continue;
        }
        let hit = match &rule.when {
            None => true,
            Some(when) => eval_condition(when, scope).map_err(|source| PolicyError::Template {
                rule: i,
                field: RuleField::When,
                source,
            })?,
        };
        if hit {
            return Ok(Some((i, rule)));
        }
    }
    Ok(rules.iter().enumerate().find(|(_, r)| r.is_else))
}

fn retry(index: usize, then: &TaskThen, input: &PolicyInput) -> Result<Decision, PolicyError> {
    let attempts = then.attempts.unwrap_or(DEFAULT_ATTEMPTS).max(1);
    if input.attempt >= attempts {
        return Ok(if input.outcome.is_ok() {
            Decision::Continue
        } else {
            Decision::Fail {
                reason: format!("retry attempts exhausted ({attempts})"),
            }
        });
    }
    let base = base_delay(index, then.delay.as_ref(), input.scope)?;
    let mut delay = backoff_delay(base, then.backoff.unwrap_or_default(), input.attempt);
    if let Some(floor) = input.retry_after {
        delay = delay.max(floor);
    }
    Ok(Decision::Retry {
        delay,
        next_attempt: input.attempt.saturating_add(1),
    })
}

fn base_delay(
    index: usize,
    delay: Option<&serde_json::Value>,
    scope: &Scope,
) -> Result<f64, PolicyError> {
    use serde_json::Value;
    let rendered = match delay {
        None => return Ok(DEFAULT_DELAY_S),
        Some(Value::String(s)) => render_str(s, scope).map_err(|source| PolicyError::Template {
            rule: index,
            field: RuleField::Delay,
            source,
        })?,
        Some(v) => v.clone(),
    };
    let secs = match &rendered {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match secs {
        Some(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(PolicyError::InvalidDelay {
            rule: index,
            value: rendered.to_string(),
        }),
    }
}

fn render_patch(
    patch: Option<&Object>,
    scope: &Scope,
    rule: usize,
    field: RuleField,
) -> Result<Option<Object>, PolicyError> {
    let Some(patch) = patch else {
        return Ok(None);
    };
    let mut out = Object::new();
    for (k, v) in patch {
        let v = render_value(v, scope).map_err(|source| PolicyError::Template {
            rule,
            field,
            source,
        })?;
        out.insert(k.clone(), v);
    }
    Ok(Some(out))
}
