//! Task policy: every branch of `decide`.

use std::time::Duration;

use noetl_core::policy::{
    backoff_delay, decide, Decision, Directive, PolicyError, PolicyInput, RuleField,
};
use noetl_core::template::{Scope, TemplateError};
use noetl_core::{Backoff, Outcome, TaskPolicy};
use serde_json::{json, Value};

fn policy(rules: Value) -> TaskPolicy {
    serde_json::from_value(json!({ "rules": rules })).unwrap()
}

fn scope_for(outcome: &Outcome) -> Scope {
    Scope::new()
        .workload(json!({"base_delay": 4}))
        .iter(json!({"page": 1, "endpoint": {"path": "/a"}}))
        .ctx(json!({"seen": 2}))
        .prev(json!({"rows": 10}))
        .task("fetch_page")
        .outcome(outcome)
}

fn run(
    policy: Option<&TaskPolicy>,
    outcome: &Outcome,
    attempt: u32,
) -> Result<Directive, PolicyError> {
    run_after(policy, outcome, attempt, None)
}

fn run_after(
    policy: Option<&TaskPolicy>,
    outcome: &Outcome,
    attempt: u32,
    retry_after: Option<Duration>,
) -> Result<Directive, PolicyError> {
    let scope = scope_for(outcome);
    decide(&PolicyInput {
        policy,
        outcome,
        attempt,
        scope: &scope,
        retry_after,
    })
}

fn ok() -> Outcome {
    Outcome::ok(json!({"data": {"paging": {"hasMore": true, "page": 1}, "data": [1, 2]}}))
}

fn http_err(status: u16) -> Outcome {
    Outcome::error("http.status", format!("status {status}"), true)
        .with_helper("http", json!({"status": status}))
}

fn decision(d: Result<Directive, PolicyError>) -> Decision {
    d.unwrap().decision
}

#[test]
fn no_policy_ok_continues_error_fails() {
    let d = run(None, &ok(), 1).unwrap();
    assert_eq!(
        d,
        Directive {
            decision: Decision::Continue,
            set_iter: None,
            set_ctx: None,
            rule: None
        }
    );
    let d = run(None, &Outcome::error("timeout", "took too long", true), 1).unwrap();
    assert_eq!(
        d.decision,
        Decision::Fail {
            reason: "timeout: took too long".into()
        }
    );
    assert_eq!(d.rule, None);
}

#[test]
fn no_match_and_no_else_continues_even_on_error() {
    let p = policy(json!([{"when": "{{ outcome.http.status == 404 }}", "then": {"do": "fail"}}]));
    let d = run(Some(&p), &http_err(500), 1).unwrap();
    assert_eq!(d.decision, Decision::Continue);
    assert_eq!(d.rule, None);
    let empty = policy(json!([]));
    assert_eq!(
        decision(run(Some(&empty), &http_err(500), 1)),
        Decision::Continue
    );
}

#[test]
fn first_match_wins_and_else_is_fallback() {
    let p = policy(json!([
        {"else": true, "then": {"do": "break"}},
        {"when": "{{ outcome.status == 'error' }}", "then": {"do": "fail"}},
        {"when": "{{ outcome.status == 'error' and outcome.http.status == 500 }}", "then": {"do": "continue"}},
    ]));
    let d = run(Some(&p), &http_err(500), 1).unwrap();
    assert_eq!(d.rule, Some(1));
    assert_eq!(
        d.decision,
        Decision::Fail {
            reason: "http.status: status 500".into()
        }
    );
    let d = run(Some(&p), &ok(), 1).unwrap();
    assert_eq!(d.rule, Some(0));
    assert_eq!(d.decision, Decision::Break);
}

#[test]
fn every_action() {
    let p = |then: Value| policy(json!([{"when": "true", "then": then}]));
    assert_eq!(
        decision(run(Some(&p(json!({}))), &ok(), 1)),
        Decision::Continue
    );
    assert_eq!(
        decision(run(Some(&p(json!({"do": "continue"}))), &http_err(500), 1)),
        Decision::Continue
    );
    assert_eq!(
        decision(run(Some(&p(json!({"do": "break"}))), &ok(), 1)),
        Decision::Break
    );
    assert_eq!(
        decision(run(
            Some(&p(json!({"do": "jump", "to": "store_200"}))),
            &ok(),
            1
        )),
        Decision::Jump {
            to: "store_200".into()
        }
    );
    assert_eq!(
        decision(run(Some(&p(json!({"do": "fail"}))), &ok(), 1)),
        Decision::Fail {
            reason: "failed by policy rule 0".into()
        }
    );
    assert_eq!(
        decision(run(Some(&p(json!({"do": "retry"}))), &http_err(503), 1)),
        Decision::Retry {
            delay: Duration::from_secs(1),
            next_attempt: 2
        }
    );
}

#[test]
fn retry_bounded_by_total_attempts() {
    let p = policy(json!([
        {"when": "{{ outcome.status == 'error' and outcome.http.status in [429,500,502,503,504] }}",
         "then": {"do": "retry", "attempts": 3}},
        {"when": "{{ outcome.status == 'error' }}", "then": {"do": "fail"}},
    ]));
    let e = http_err(502);
    assert_eq!(
        decision(run(Some(&p), &e, 1)),
        Decision::Retry {
            delay: Duration::from_secs(1),
            next_attempt: 2
        }
    );
    assert_eq!(
        decision(run(Some(&p), &e, 2)),
        Decision::Retry {
            delay: Duration::from_secs(1),
            next_attempt: 3
        }
    );
    let d = run(Some(&p), &e, 3).unwrap();
    assert_eq!(
        d.decision,
        Decision::Fail {
            reason: "retry attempts exhausted (3)".into()
        }
    );
    assert_eq!(d.rule, Some(0));
    // 401 is not retryable here: second rule
    let d = run(Some(&p), &http_err(401), 1).unwrap();
    assert_eq!(d.rule, Some(1));
    assert!(matches!(d.decision, Decision::Fail { .. }));
}

#[test]
fn retry_default_attempts_is_three_and_ok_outcome_continues_when_exhausted() {
    let p = policy(json!([{"when": "true", "then": {"do": "retry"}}]));
    assert!(matches!(
        decision(run(Some(&p), &ok(), 2)),
        Decision::Retry {
            next_attempt: 3,
            ..
        }
    ));
    assert_eq!(decision(run(Some(&p), &ok(), 3)), Decision::Continue);
    assert_eq!(
        decision(run(Some(&p), &http_err(500), 3)),
        Decision::Fail {
            reason: "retry attempts exhausted (3)".into()
        }
    );
    // attempts: 1 means no retry at all
    let once = policy(json!([{"when": "true", "then": {"do": "retry", "attempts": 1}}]));
    assert_eq!(
        decision(run(Some(&once), &http_err(500), 1)),
        Decision::Fail {
            reason: "retry attempts exhausted (1)".into()
        }
    );
}

fn retry_delay(then: Value, attempt: u32, retry_after: Option<Duration>) -> Duration {
    let mut then = then;
    then["do"] = json!("retry");
    then["attempts"] = json!(100);
    let p = policy(json!([{"else": true, "then": then}]));
    match decision(run_after(Some(&p), &http_err(503), attempt, retry_after)) {
        Decision::Retry {
            delay,
            next_attempt,
        } => {
            assert_eq!(next_attempt, attempt + 1);
            delay
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn backoff_none_is_constant() {
    for attempt in 1..=4 {
        assert_eq!(
            retry_delay(json!({"delay": 2}), attempt, None),
            Duration::from_secs(2)
        );
        assert_eq!(
            retry_delay(json!({"delay": 2, "backoff": "none"}), attempt, None),
            Duration::from_secs(2)
        );
    }
}

#[test]
fn backoff_linear_multiplies_by_attempt() {
    let got: Vec<Duration> = (1..=4)
        .map(|a| retry_delay(json!({"delay": 1.5, "backoff": "linear"}), a, None))
        .collect();
    assert_eq!(got, [1.5, 3.0, 4.5, 6.0].map(Duration::from_secs_f64));
}

#[test]
fn backoff_exponential_doubles_and_caps_at_300s() {
    let got: Vec<Duration> = (1..=5)
        .map(|a| retry_delay(json!({"delay": 2.0, "backoff": "exponential"}), a, None))
        .collect();
    assert_eq!(got, [2, 4, 8, 16, 32].map(Duration::from_secs));
    assert_eq!(
        retry_delay(json!({"delay": 2.0, "backoff": "exponential"}), 9, None),
        Duration::from_secs(300)
    );
    assert_eq!(
        retry_delay(json!({"delay": 2.0, "backoff": "exponential"}), 90, None),
        Duration::from_secs(300)
    );
    assert_eq!(
        retry_delay(json!({"delay": 1000}), 1, None),
        Duration::from_secs(300)
    );
    assert_eq!(
        backoff_delay(2.0, Backoff::Exponential, u32::MAX),
        Duration::from_secs(300)
    );
    assert_eq!(
        backoff_delay(2.0, Backoff::Linear, 0),
        Duration::from_secs(2)
    );
}

#[test]
fn retry_after_is_a_floor() {
    let d = retry_delay(json!({"delay": 1}), 1, Some(Duration::from_secs(30)));
    assert_eq!(d, Duration::from_secs(30));
    let d = retry_delay(json!({"delay": 10}), 1, Some(Duration::from_secs(3)));
    assert_eq!(d, Duration::from_secs(10));
    // the floor wins over the cap too
    let d = retry_delay(json!({"delay": 1000}), 1, Some(Duration::from_secs(600)));
    assert_eq!(d, Duration::from_secs(600));
}

#[test]
fn delay_may_be_a_template_or_numeric_string() {
    assert_eq!(
        retry_delay(json!({"delay": "{{ workload.base_delay }}"}), 1, None),
        Duration::from_secs(4)
    );
    assert_eq!(
        retry_delay(
            json!({"delay": "{{ workload.base_delay / 2 }}", "backoff": "linear"}),
            3,
            None
        ),
        Duration::from_secs(6)
    );
    assert_eq!(
        retry_delay(json!({"delay": "0.5"}), 1, None),
        Duration::from_millis(500)
    );
}

#[test]
fn invalid_delay_is_an_error() {
    for bad in [
        json!(-1),
        json!("soon"),
        json!([1]),
        json!("{{ iter.endpoint }}"),
    ] {
        let p = policy(json!([{"when": "true", "then": {"do": "retry", "delay": bad}}]));
        let err = run(Some(&p), &http_err(500), 1).unwrap_err();
        assert!(
            matches!(err, PolicyError::InvalidDelay { rule: 0, .. }),
            "{bad}: {err:?}"
        );
    }
    let p = policy(json!([{"when": "true", "then": {"do": "retry", "delay": "{{ nope }}"}}]));
    assert!(matches!(
        run(Some(&p), &http_err(500), 1),
        Err(PolicyError::Template {
            rule: 0,
            field: RuleField::Delay,
            ..
        })
    ));
}

#[test]
fn jump_requires_to() {
    let p = policy(json!([
        {"when": "false", "then": {"do": "break"}},
        {"when": "true", "then": {"do": "jump"}},
    ]));
    assert_eq!(
        run(Some(&p), &ok(), 1).unwrap_err(),
        PolicyError::MissingJumpTarget { rule: 1 }
    );
}

#[test]
fn set_iter_and_set_ctx_are_rendered_with_the_scope() {
    let p = policy(json!([
        {"when": "{{ outcome.status == 'error' }}", "then": {"do": "fail"}},
        {"else": true, "then": {
            "do": "continue",
            "set_iter": {
                "http_status": "{{ outcome.http.status | default(200) }}",
                "has_more": "{{ outcome.result.data.paging.hasMore | default(false) }}",
                "page": "{{ (iter.page | int) + 1 }}",
                "items": "{{ outcome.result.data.data | default([]) }}",
                "path": "p={{ iter.endpoint.path }}",
                "literal": 5,
            },
            "set_ctx": {"rows_seen": "{{ _prev.rows + ctx.seen }}", "last_task": "{{ _task }}"},
        }},
    ]));
    let d = run(Some(&p), &ok(), 1).unwrap();
    assert_eq!(d.rule, Some(1));
    assert_eq!(d.decision, Decision::Continue);
    assert_eq!(
        Value::Object(d.set_iter.unwrap()),
        json!({"http_status": 200, "has_more": true, "page": 2, "items": [1, 2], "path": "p=/a", "literal": 5})
    );
    assert_eq!(
        Value::Object(d.set_ctx.unwrap()),
        json!({"rows_seen": 12, "last_task": "fetch_page"})
    );
}

#[test]
fn patches_come_with_any_decision() {
    let p = policy(json!([
        {"when": "{{ iter.page < 5 }}", "then": {"do": "jump", "to": "fetch_page",
                                                "set_iter": {"page": "{{ iter.page + 1 }}"}}},
    ]));
    let d = run(Some(&p), &ok(), 1).unwrap();
    assert_eq!(
        d.decision,
        Decision::Jump {
            to: "fetch_page".into()
        }
    );
    assert_eq!(Value::Object(d.set_iter.unwrap()), json!({"page": 2}));
    assert_eq!(d.set_ctx, None);
}

#[test]
fn template_errors_carry_the_rule_index() {
    let p = policy(json!([
        {"when": "false", "then": {"do": "break"}},
        {"when": "{{ outcome.status == }}", "then": {"do": "break"}},
    ]));
    let err = run(Some(&p), &ok(), 1).unwrap_err();
    assert!(matches!(
        &err,
        PolicyError::Template {
            rule: 1,
            field: RuleField::When,
            source: TemplateError::Syntax { .. }
        }
    ));
    assert!(err.to_string().contains("policy rule 1"), "{err}");

    let p = policy(json!([{"else": true, "then": {"set_ctx": {"x": "{{ wrokload.y }}"}}}]));
    let err = run(Some(&p), &ok(), 1).unwrap_err();
    match err {
        PolicyError::Template {
            rule: 0,
            field: RuleField::SetCtx,
            source: TemplateError::UndefinedVariable { name, .. },
        } => {
            assert_eq!(name, "wrokload")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn when_conditions_are_lenient() {
    // no `http` helper: comparisons are false, no error
    let p = policy(json!([
        {"when": "{{ outcome.http.status >= 500 }}", "then": {"do": "retry"}},
        {"when": "{{ outcome.http.status < 500 }}", "then": {"do": "break"}},
        {"else": true, "then": {"do": "fail"}},
    ]));
    let e = Outcome::error("timeout", "t", true);
    let d = run(Some(&p), &e, 1).unwrap();
    assert_eq!(d.rule, Some(2));
    assert_eq!(
        d.decision,
        Decision::Fail {
            reason: "timeout: t".into()
        }
    );
}

#[test]
fn else_false_is_not_a_rule_even_over_the_wire() {
    // Read as `is_else: false` it would be a rule without `when`, which
    // always matches: a policy sent as JSON must not get that meaning either.
    let err = serde_json::from_value::<TaskPolicy>(
        json!({"rules": [{"else": false, "then": {"do": "break"}}]}),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("`else: false` is not a rule"),
        "{err}"
    );
    for fallback in [json!(true), Value::Null] {
        let p = policy(json!([{"else": fallback, "then": {"do": "break"}}]));
        assert!(p.rules[0].is_else);
    }
    assert!(!policy(json!([{"when": "{{ true }}", "then": {"do": "break"}}])).rules[0].is_else);
}
