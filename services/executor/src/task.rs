//! The decisions about one task run, as plain functions: which credential
//! a task's `auth` names, what the step-run does after the task (policy,
//! deadline, `ctx` conflicts), the `task.done` payload, and the error a
//! failed step-run reports. The pipeline (`pipeline.rs`) does the I/O
//! around them.

use noetl_core::limits::compact;
use noetl_core::policy::{Decision, Directive, PolicyError};
use noetl_core::tool::AuthCredential;
use noetl_core::{Outcome, OutcomeError, OutcomeStatus, StepError, Task};
use serde_json::{Map, Value};

use crate::secrets::Resolved;
use noetl_mesh::payloads::{RetryAt, TaskDone};

/// Largest task result (serialised JSON bytes) carried whole in `task.done`.
pub const TASK_EVENT_LIMIT: usize = 4 * 1024;

/// Which task of which step, for messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Who<'a> {
    /// Task name.
    pub task: &'a str,
    /// Step name.
    pub step: &'a str,
}

impl Who<'_> {
    /// An error outcome of `kind` naming the task and step.
    pub(crate) fn error(&self, kind: &str, message: &str) -> Outcome {
        Outcome::error(
            kind,
            format!("task {:?} of step {:?}: {message}", self.task, self.step),
            false,
        )
    }
}

/// The credential a task's rendered `auth` field names: none when absent;
/// why not when it names no keychain entry or is not a name (the task
/// then fails with an `auth` error, see [`Who::error`]).
pub(crate) fn auth(
    config: &Map<String, Value>,
    credentials: &Resolved,
) -> Result<Option<AuthCredential>, String> {
    match config.get("auth") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) => match credentials.credential(name) {
            Some(c) => Ok(Some(c)),
            None => Err(format!(
                "`auth: {name}` names no credential of the playbook's `keychain`; declare it there"
            )),
        },
        Some(_) => Err("`auth` must name a keychain entry (a string)".into()),
    }
}

/// The credentials named by an `auth` inside a mapping field of a task (a
/// transfer's `source.auth`, `target.auth`), by that field's name; why not
/// when one names no keychain entry.
pub(crate) fn nested_auth(
    config: &Map<String, Value>,
    credentials: &Resolved,
) -> Result<std::collections::BTreeMap<String, AuthCredential>, String> {
    let mut out = std::collections::BTreeMap::new();
    for (field, value) in config {
        let Value::Object(inner) = value else {
            continue;
        };
        if let Some(c) = auth(inner, credentials).map_err(|why| {
            // `auth: x` names no credential... → `source.auth: x` names...
            format!("`{field}.{}", why.strip_prefix('`').unwrap_or(&why))
        })? {
            out.insert(field.clone(), c);
        }
    }
    Ok(out)
}

/// What the step-run does after a task, and what the policy wrote.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settled {
    /// Continue, retry, jump, break or fail.
    pub decision: Decision,
    /// `set_iter` patch.
    pub set_iter: Option<Map<String, Value>>,
    /// `set_ctx` patch.
    pub set_ctx: Option<Map<String, Value>>,
    /// The rule that matched.
    pub rule: Option<usize>,
    /// The policy (or a `ctx` write) failed: the step-run's error says so.
    pub policy_error: Option<String>,
}

/// What [`settle`] reads.
pub(crate) struct SettleInput<'a> {
    /// The policy's directive, or why it could not be evaluated.
    pub decided: Result<Directive, PolicyError>,
    /// Set when the step-run's deadline cut the tool call short (its
    /// message).
    pub out_of_time: Option<&'a str>,
    /// The task.
    pub who: Who<'a>,
    /// The playbook's source, named in a policy error.
    pub source: &'a str,
}

/// The decision after a task: out of time the step-run fails whatever the
/// policy says (a retry could not finish in time either); a policy that
/// fails to evaluate fails it naming task, step and playbook.
pub(crate) fn settle(i: SettleInput<'_>) -> Settled {
    let fail = |reason: String, policy_error| Settled {
        decision: Decision::Fail { reason },
        set_iter: None,
        set_ctx: None,
        rule: None,
        policy_error,
    };
    if let Some(message) = i.out_of_time {
        return fail(
            format!("{}: {message}", noetl_core::lifecycle::TIMEOUT),
            None,
        );
    }
    match i.decided {
        Ok(d) => Settled {
            decision: d.decision,
            set_iter: d.set_iter,
            set_ctx: d.set_ctx,
            rule: d.rule,
            policy_error: None,
        },
        Err(e) => {
            let message = format!(
                "task policy of task {:?} in step {:?} ({}): {e}",
                i.who.task, i.who.step, i.source
            );
            fail(message.clone(), Some(message))
        }
    }
}

/// A `ctx` write that conflicts or a reducer that fails fails the task
/// (and so its iteration), whatever the policy decided: the outcome
/// becomes an error of `kind`.
pub(crate) fn fail_on_ctx_error(
    outcome: &mut Outcome,
    s: &mut Settled,
    kind: &str,
    message: String,
) {
    outcome.error = Some(OutcomeError {
        kind: kind.to_string(),
        retryable: false,
        message: message.clone(),
        extra: Map::new(),
    });
    outcome.status = OutcomeStatus::Error;
    s.decision = Decision::Fail {
        reason: message.clone(),
    };
    s.policy_error = Some(message);
}

/// What a task's `task.done` says of its `set_ctx` beyond the patch
/// (docs/architecture.md "The event log").
#[derive(Debug, Default)]
pub(crate) struct CtxLog {
    /// The patch stored whole, when it is too large to ride in the event.
    pub(crate) set_ctx_ref: Option<Value>,
    /// Keys that went to the loop's reducers, not into `ctx`.
    pub(crate) reduced: Vec<String>,
    /// Nothing was written (`ctx.conflict`, a reducer error).
    pub(crate) refused: bool,
}

/// The `task.done` payload.
pub(crate) fn done_payload(outcome: &Outcome, attempt: u32, s: &Settled, ctx: CtxLog) -> TaskDone {
    let retry = match &s.decision {
        Decision::Retry {
            delay,
            next_attempt,
        } => Some(RetryAt {
            delay_ms: delay.as_millis() as u64,
            next_attempt: *next_attempt,
        }),
        _ => None,
    };
    TaskDone {
        status: outcome.status,
        attempt,
        duration_ms: outcome.meta.duration_ms,
        result: compact(&outcome.result, TASK_EVENT_LIMIT),
        error: outcome.error.clone(),
        action: action_name(&s.decision).to_string(),
        rule: s.rule,
        set_ctx: s.set_ctx.clone().filter(|_| ctx.set_ctx_ref.is_none()),
        set_iter: s.set_iter.clone(),
        retry,
        set_ctx_ref: ctx.set_ctx_ref,
        reduced: ctx.reduced,
        ctx_refused: ctx.refused,
        index: None,
        started: None,
    }
}

/// `{kind, message, task}` of a failed step-run.
pub(crate) fn failure(
    task: &Task,
    outcome: &Outcome,
    reason: &str,
    policy_error: Option<String>,
) -> Value {
    if let Some(message) = policy_error {
        return StepError::new("policy", message, Some(&task.name)).to_value();
    }
    match &outcome.error {
        Some(e) => {
            let own = if e.message.is_empty() {
                e.kind.clone()
            } else {
                format!("{}: {}", e.kind, e.message)
            };
            let message = if reason == own {
                e.message.clone()
            } else {
                format!("{reason}; last error: {own}")
            };
            StepError::new(&e.kind, message, Some(&task.name)).to_value()
        }
        None => StepError::new("policy.fail", reason, Some(&task.name)).to_value(),
    }
}

/// The `action` a `task.done` event names.
pub(crate) fn action_name(d: &Decision) -> &'static str {
    d.action()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    /// The `task.done` payload as it is written.
    fn done_payload(outcome: &Outcome, attempt: u32, s: &Settled, ctx: CtxLog) -> Value {
        noetl_mesh::payloads::to_value(&super::done_payload(outcome, attempt, s, ctx))
    }

    const WHO: Who<'static> = Who {
        task: "fetch",
        step: "load",
    };

    fn config(auth: Value) -> Map<String, Value> {
        json!({"url": "http://x", "auth": auth})
            .as_object()
            .cloned()
            .unwrap()
    }

    fn keychain() -> Resolved {
        let mut r = Resolved::default();
        r.scope
            .insert("api".into(), json!({"token": "s3cr3t-value"}));
        r.kinds.insert("api".into(), "bearer".into());
        r
    }

    #[test]
    fn auth_names_a_keychain_entry_or_nothing() {
        let none = auth(&Map::new(), &keychain()).unwrap();
        assert!(none.is_none());
        assert!(auth(&config(Value::Null), &keychain()).unwrap().is_none());
        let c = auth(&config(json!("api")), &keychain()).unwrap().unwrap();
        assert_eq!((c.name.as_str(), c.kind.as_str()), ("api", "bearer"));
    }

    #[test]
    fn an_unknown_or_non_string_auth_is_an_auth_error_naming_the_task() {
        let why = auth(&config(json!("nope")), &keychain()).unwrap_err();
        assert!(why.contains("`auth: nope`"), "{why}");
        let err = WHO.error("auth", &why).error.unwrap();
        assert_eq!(err.kind, "auth");
        assert!(
            err.message.starts_with(r#"task "fetch" of step "load": "#),
            "{}",
            err.message
        );
        let why = auth(&config(json!({"name": "api"})), &keychain()).unwrap_err();
        assert!(why.contains("must name a keychain entry"), "{why}");
    }

    #[test]
    fn an_auth_inside_a_mapping_field_is_resolved_by_that_field() {
        let c = json!({"source": {"tool": "http", "auth": "api"}, "target": {"table": "t"}});
        let nested = nested_auth(c.as_object().unwrap(), &keychain()).unwrap();
        assert_eq!(nested.keys().collect::<Vec<_>>(), ["source"]);
        assert_eq!(nested["source"].kind, "bearer");
        let c = json!({"target": {"auth": "nope"}});
        let why = nested_auth(c.as_object().unwrap(), &keychain()).unwrap_err();
        assert!(
            why.starts_with("`target.auth: nope` names no credential"),
            "{why}"
        );
    }

    fn directive(decision: Decision) -> Directive {
        Directive {
            decision,
            set_iter: None,
            set_ctx: Some(json!({"n": 1}).as_object().cloned().unwrap()),
            rule: Some(2),
        }
    }

    #[test]
    fn the_policy_decides_unless_the_step_run_is_out_of_time() {
        let s = settle(SettleInput {
            decided: Ok(directive(Decision::Continue)),
            out_of_time: None,
            who: WHO,
            source: "p.yaml",
        });
        assert_eq!(s.decision, Decision::Continue);
        assert_eq!((s.rule, s.policy_error.clone()), (Some(2), None));
        assert!(s.set_ctx.is_some());
        let late = settle(SettleInput {
            decided: Ok(directive(Decision::Retry {
                delay: Duration::from_secs(1),
                next_attempt: 2,
            })),
            out_of_time: Some("step \"load\" ran out of time"),
            who: WHO,
            source: "p.yaml",
        });
        assert_eq!(
            late.decision,
            Decision::Fail {
                reason: "timeout: step \"load\" ran out of time".into()
            }
        );
        assert!(late.set_ctx.is_none(), "an out-of-time task writes nothing");
    }

    #[test]
    fn a_policy_that_cannot_be_evaluated_fails_naming_task_step_and_playbook() {
        let s = settle(SettleInput {
            decided: Err(PolicyError::Template {
                rule: 0,
                field: noetl_core::policy::RuleField::When,
                source: noetl_core::template::TemplateError::Syntax {
                    message: "unexpected end".into(),
                    template: "{{".into(),
                },
            }),
            out_of_time: None,
            who: WHO,
            source: "p.yaml",
        });
        let message = s.policy_error.clone().unwrap();
        assert!(
            message.starts_with(
                r#"task policy of task "fetch" in step "load" (p.yaml): policy rule 0"#
            ),
            "{message}"
        );
        assert_eq!(s.decision, Decision::Fail { reason: message });
    }

    #[test]
    fn a_ctx_conflict_fails_the_task_whatever_the_policy_said() {
        let mut outcome = Outcome::ok(json!(1));
        let mut s = settle(SettleInput {
            decided: Ok(directive(Decision::Continue)),
            out_of_time: None,
            who: WHO,
            source: "p.yaml",
        });
        fail_on_ctx_error(
            &mut outcome,
            &mut s,
            "ctx.conflict",
            "key n written twice".into(),
        );
        assert_eq!(outcome.status, OutcomeStatus::Error);
        assert_eq!(outcome.error.as_ref().unwrap().kind, "ctx.conflict");
        assert_eq!(
            s.decision,
            Decision::Fail {
                reason: "key n written twice".into()
            }
        );
        assert_eq!(s.policy_error.as_deref(), Some("key n written twice"));
    }

    #[test]
    fn task_done_names_the_action_and_a_retry_its_delay() {
        let outcome = Outcome::error("http.status", "503", true);
        let s = settle(SettleInput {
            decided: Ok(Directive {
                decision: Decision::Retry {
                    delay: Duration::from_millis(1500),
                    next_attempt: 2,
                },
                set_iter: None,
                set_ctx: None,
                rule: Some(0),
            }),
            out_of_time: None,
            who: WHO,
            source: "p.yaml",
        });
        let p = done_payload(&outcome, 1, &s, CtxLog::default());
        assert_eq!(p["action"], "retry");
        assert_eq!(p["retry"], json!({"delay_ms": 1500, "next_attempt": 2}));
        assert_eq!(
            (p["attempt"].clone(), p["rule"].clone()),
            (json!(1), json!(0))
        );
        assert_eq!(p["error"]["kind"], "http.status");
        let ok = done_payload(
            &Outcome::ok(json!("x")),
            3,
            &settle(SettleInput {
                decided: Ok(directive(Decision::Continue)),
                out_of_time: None,
                who: WHO,
                source: "p.yaml",
            }),
            CtxLog::default(),
        );
        assert_eq!(ok["action"], "continue");
        assert!(ok.get("retry").is_none());
        assert_eq!(ok["set_ctx"], json!({"n": 1}));
        assert!(ok.get("set_ctx_ref").is_none() && ok.get("reduced").is_none());
        // A large patch rides by reference, and the log says which keys
        // went to reducers and that nothing was written on a refusal.
        let by_ref = done_payload(
            &Outcome::ok(json!("x")),
            1,
            &settle(SettleInput {
                decided: Ok(directive(Decision::Continue)),
                out_of_time: None,
                who: WHO,
                source: "p.yaml",
            }),
            CtxLog {
                set_ctx_ref: Some(json!({"ref": "noetl://execution/e/log/t", "key": "k"})),
                reduced: vec!["total".into()],
                refused: true,
            },
        );
        assert!(by_ref.get("set_ctx").is_none_or(Value::is_null), "{by_ref}");
        assert_eq!(by_ref["set_ctx_ref"]["key"], "k");
        assert_eq!(by_ref["reduced"], json!(["total"]));
        assert_eq!(by_ref["ctx_refused"], json!(true));
    }

    #[test]
    fn every_decision_has_its_action_name() {
        let table = [
            (Decision::Continue, "continue"),
            (
                Decision::Retry {
                    delay: Duration::ZERO,
                    next_attempt: 2,
                },
                "retry",
            ),
            (Decision::Jump { to: "t".into() }, "jump"),
            (Decision::Break, "break"),
            (Decision::Fail { reason: "r".into() }, "fail"),
        ];
        for (d, name) in table {
            assert_eq!(action_name(&d), name);
        }
    }

    fn task() -> Task {
        serde_json::from_value(json!({"name": "fetch", "kind": "http"})).unwrap()
    }

    #[test]
    fn a_failed_step_run_reports_the_task_s_last_error_and_why_it_stopped() {
        let boom = Outcome::error("http.status", "503", true);
        // The policy failed the step for the error itself: its message.
        assert_eq!(
            failure(&task(), &boom, "http.status: 503", None),
            json!({"kind": "http.status", "message": "503", "task": "fetch"})
        );
        // Another reason (retries exhausted): both.
        assert_eq!(
            failure(&task(), &boom, "retries exhausted", None)["message"],
            "retries exhausted; last error: http.status: 503"
        );
        // No error on the outcome: the policy's own fail.
        assert_eq!(
            failure(&task(), &Outcome::ok(json!(1)), "bad row", None),
            json!({"kind": "policy.fail", "message": "bad row", "task": "fetch"})
        );
        // A policy error wins.
        assert_eq!(
            failure(&task(), &boom, "x", Some("rule 0: when: bad".into()))["kind"],
            "policy"
        );
    }
}
