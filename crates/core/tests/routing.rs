//! Admission and arc selection.

use noetl_core::routing::{admit, select_arcs, Admission, RoutingError, SelectedArc};
use noetl_core::template::{Scope, TemplateError};
use noetl_core::{Admit, Next};
use serde_json::{json, Value};

fn admit_rules(rules: Value) -> Admit {
    serde_json::from_value(json!({ "rules": rules })).unwrap()
}

fn next(mode: &str, arcs: Value) -> Next {
    serde_json::from_value(json!({"spec": {"mode": mode}, "arcs": arcs})).unwrap()
}

fn scope(event: &str) -> Scope {
    Scope::new()
        .workload(json!({"limit": 10, "region": "eu"}))
        .ctx(json!({"store_ok": true, "count": 3}))
        .args(json!({"city": "Oslo"}))
        .event(json!({"name": event, "step": "fetch"}))
        .execution_id("e1")
        .step_result("fetch", json!({"row_count": 7, "rows": [1, 2]}))
}

fn obj(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().unwrap().clone()
}

#[test]
fn admission_defaults_to_allow() {
    let sc = scope("token");
    assert_eq!(
        admit(None, &sc).unwrap(),
        Admission {
            allowed: true,
            rule: None
        }
    );
    // rules but no match and no else: allow (docs/dsl.md "Steps": the default)
    let a = admit_rules(json!([{"when": "{{ ctx.count > 100 }}", "then": {"allow": false}}]));
    assert_eq!(
        admit(Some(&a), &sc).unwrap(),
        Admission {
            allowed: true,
            rule: None
        }
    );
    let empty = admit_rules(json!([]));
    assert_eq!(
        admit(Some(&empty), &sc).unwrap(),
        Admission {
            allowed: true,
            rule: None
        }
    );
}

#[test]
fn admission_first_match_wins_else_is_fallback() {
    let a = admit_rules(json!([
        {"when": "{{ ctx.count > 100 }}", "then": {"allow": true}},
        {"when": "{{ workload.region == 'eu' }}", "then": {"allow": false}},
        {"when": "{{ ctx.store_ok }}", "then": {"allow": true}},
        {"else": true, "then": {"allow": false}},
    ]));
    assert_eq!(
        admit(Some(&a), &scope("token")).unwrap(),
        Admission {
            allowed: false,
            rule: Some(1)
        }
    );

    let deny_by_default = admit_rules(json!([
        {"else": true, "then": {"allow": false}},
        {"when": "{{ args.city == 'Oslo' }}", "then": {"allow": true}},
    ]));
    assert_eq!(
        admit(Some(&deny_by_default), &scope("token")).unwrap(),
        Admission {
            allowed: true,
            rule: Some(1)
        }
    );
    let other = Scope::new().args(json!({"city": "Rome"}));
    assert_eq!(
        admit(Some(&deny_by_default), &other).unwrap(),
        Admission {
            allowed: false,
            rule: Some(0)
        }
    );
    // a missing `ctx` is undefined (lenient), so the else applies
    assert_eq!(
        admit(
            Some(&admit_rules(json!([
                {"when": "{{ ctx.ready }}", "then": {"allow": true}},
                {"else": true, "then": {"allow": false}},
            ]))),
            &Scope::new()
        )
        .unwrap(),
        Admission {
            allowed: false,
            rule: Some(1)
        }
    );
}

#[test]
fn admission_errors_name_the_rule() {
    let a = admit_rules(json!([
        {"when": "true", "then": {"allow": true}},
    ]));
    assert!(admit(Some(&a), &scope("t")).unwrap().allowed);
    let bad = admit_rules(json!([
        {"when": "{{ ctx.count > }}", "then": {"allow": true}},
    ]));
    let err = admit(Some(&bad), &scope("t")).unwrap_err();
    assert!(matches!(
        err,
        RoutingError::AdmitCondition {
            rule: 0,
            source: TemplateError::Syntax { .. }
        }
    ));
    assert!(err.to_string().starts_with("admit rule 0: when:"), "{err}");
}

fn seed_arcs() -> Value {
    json!([
        {"step": "continue", "when": "{{ event.name == 'step.done' and ctx.store_ok == true }}",
         "args": {"rows": "{{ fetch.rows }}", "city": "{{ args.city }}", "label": "n={{ fetch.row_count }}", "fixed": 1}},
        {"step": "audit", "when": "{{ event.name == 'step.done' }}"},
        {"step": "failed", "when": "{{ event.name == 'step.done' and ctx.store_ok != true }}"},
        {"step": "failed", "when": "{{ event.name == 'step.failed' }}"},
        {"step": "always"},
    ])
}

#[test]
fn exclusive_fires_the_first_matching_arc_with_rendered_args() {
    let n = next("exclusive", seed_arcs());
    let got = select_arcs(Some(&n), &scope("step.done")).unwrap();
    assert_eq!(
        got,
        vec![SelectedArc {
            index: 0,
            step: "continue".into(),
            args: obj(json!({"rows": [1, 2], "city": "Oslo", "label": "n=7", "fixed": 1})),
            set_ctx: obj(json!({})),
        }]
    );
    let got = select_arcs(Some(&n), &scope("step.failed")).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].index, got[0].step.as_str()), (3, "failed"));
    assert!(got[0].args.is_empty());
    // an arc without `when` always holds
    let got = select_arcs(Some(&n), &scope("loop.done")).unwrap();
    assert_eq!((got[0].index, got[0].step.as_str()), (4, "always"));
}

#[test]
fn an_arc_renders_its_ctx_writes_only_when_it_fires() {
    let n = next(
        "exclusive",
        json!([
            {"step": "a", "when": "{{ event.name == 'step.failed' }}", "set_ctx": {"why": "failed"}},
            {"step": "b", "set_ctx": {"rows": "{{ fetch.rows }}", "n": "{{ fetch.row_count + 1 }}"}},
        ]),
    );
    let got = select_arcs(Some(&n), &scope("step.done")).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].set_ctx, obj(json!({"rows": [1, 2], "n": 8})));
    let bad = next(
        "exclusive",
        json!([{"step": "a", "set_ctx": {"x": "{{ nope.x }}"}}]),
    );
    let e = select_arcs(Some(&bad), &scope("step.done")).unwrap_err();
    assert!(e.to_string().contains("set_ctx"), "{e}");
}

#[test]
fn exclusive_is_the_default_mode() {
    let n: Next = serde_json::from_value(json!({"arcs": seed_arcs()})).unwrap();
    let got = select_arcs(Some(&n), &scope("step.done")).unwrap();
    assert_eq!(got.iter().map(|a| a.index).collect::<Vec<_>>(), [0]);
}

#[test]
fn inclusive_fires_all_matching_arcs_in_order() {
    let n = next("inclusive", seed_arcs());
    let got = select_arcs(Some(&n), &scope("step.done")).unwrap();
    assert_eq!(got.iter().map(|a| a.index).collect::<Vec<_>>(), [0, 1, 4]);
    assert_eq!(
        got.iter().map(|a| a.step.as_str()).collect::<Vec<_>>(),
        ["continue", "audit", "always"]
    );
    assert_eq!(got[0].args["rows"], json!([1, 2]));
    let got = select_arcs(Some(&n), &scope("step.failed")).unwrap();
    assert_eq!(got.iter().map(|a| a.index).collect::<Vec<_>>(), [3, 4]);
}

#[test]
fn no_next_or_no_match_selects_nothing() {
    assert!(select_arcs(None, &scope("step.done")).unwrap().is_empty());
    let n = next(
        "exclusive",
        json!([{"step": "x", "when": "{{ event.name == 'nope' }}"}]),
    );
    assert!(select_arcs(Some(&n), &scope("step.done"))
        .unwrap()
        .is_empty());
    let empty = next("inclusive", json!([]));
    assert!(select_arcs(Some(&empty), &scope("step.done"))
        .unwrap()
        .is_empty());
}

#[test]
fn args_are_only_rendered_for_selected_arcs_and_errors_name_the_arc() {
    let n = next(
        "exclusive",
        json!([
            {"step": "a", "when": "{{ event.name == 'step.done' }}", "args": {"x": "{{ args.city }}"}},
            {"step": "b", "args": {"x": "{{ wrokload.limit }}"}},
        ]),
    );
    // arc 1 is not selected: its bad args are never rendered
    assert_eq!(
        select_arcs(Some(&n), &scope("step.done")).unwrap()[0].step,
        "a"
    );
    let err = select_arcs(Some(&n), &scope("step.failed")).unwrap_err();
    match &err {
        RoutingError::ArcArgs {
            field: "args",
            arc: 1,
            step,
            source: TemplateError::UndefinedVariable { name, .. },
        } => {
            assert_eq!(step, "b");
            assert_eq!(name, "wrokload");
        }
        other => panic!("{other:?}"),
    }
    let bad_when = next("exclusive", json!([{"step": "z", "when": "{% if %}"}]));
    assert!(matches!(
        select_arcs(Some(&bad_when), &scope("step.done")),
        Err(RoutingError::ArcCondition { arc: 0, .. })
    ));
}

/// The router skips reading a scope when no arc has a template (no `when`,
/// no string in `args` or `set_ctx`): such arcs select the same in an
/// empty scope as in a full one.
#[test]
fn arcs_without_templates_select_the_same_in_an_empty_scope() {
    let n = next(
        "inclusive",
        json!([
            {"step": "a"},
            {"step": "b", "args": {"n": 3, "flags": [true, null]}, "set_ctx": {"seen": 1}}
        ]),
    );
    let full = select_arcs(Some(&n), &scope("step.done")).unwrap();
    let empty = select_arcs(Some(&n), &Scope::new()).unwrap();
    assert_eq!(full, empty);
    assert_eq!(empty.len(), 2);
    assert_eq!(empty[1].args, obj(json!({"n": 3, "flags": [true, null]})));
    assert_eq!(empty[1].set_ctx, obj(json!({"seen": 1})));
}
