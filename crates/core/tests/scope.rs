//! The render scope's names read bare (docs/dsl.md, "Names read bare"):
//! workload keys at the lowest precedence, `output` and `_index`, and what
//! shadows what.

use noetl_core::template::{eval_condition, render_str, Scope, TemplateError};
use noetl_core::Outcome;
use serde_json::{json, Value};

fn render(src: &str, sc: &Scope) -> Value {
    render_str(src, sc).unwrap_or_else(|e| panic!("{src}: {e}"))
}

#[test]
fn a_workload_key_reads_bare() {
    let sc = Scope::new().workload(json!({"numbers": [1, 2], "api": {"url": "http://x"}}));
    assert_eq!(render("{{ numbers }}", &sc), json!([1, 2]));
    assert_eq!(render("{{ api.url }}/items", &sc), json!("http://x/items"));
    assert!(eval_condition("{{ numbers | length == 2 }}", &sc).unwrap());
    // The canonical spelling still works, of course.
    assert_eq!(render("{{ workload.numbers }}", &sc), json!([1, 2]));
}

#[test]
fn a_runtime_variable_shadows_a_workload_key_bound_or_not() {
    let sc = Scope::new()
        .workload(json!({"ctx": "workload's", "args": "workload's", "output": 1}))
        .ctx(json!({"a": 1}));
    assert_eq!(render("{{ ctx }}", &sc), json!({"a": 1}));
    // `args` is a runtime variable: unbound here, so undefined (null), never
    // the workload's value.
    assert_eq!(render("{{ args }}", &sc), Value::Null);
    assert_eq!(render("{{ output }}", &sc), Value::Null);
}

#[test]
fn a_step_or_task_name_shadows_a_workload_key_even_before_it_ran() {
    let sc = Scope::new()
        .workload(json!({"fetch": "workload's", "other": 7}))
        .declare("fetch");
    assert_eq!(
        render("{{ fetch }}", &sc),
        Value::Null,
        "declared: undefined"
    );
    let sc = sc.step_result("fetch", json!({"rows": [1]}));
    assert_eq!(render("{{ fetch.rows }}", &sc), json!([1]));
    assert_eq!(render("{{ other }}", &sc), json!(7));
}

#[test]
fn a_name_that_resolves_nowhere_is_still_an_error() {
    let sc = Scope::new().workload(json!({"numbers": [1]}));
    match render_str("{{ numbrs }}", &sc) {
        Err(TemplateError::UndefinedVariable { name, .. }) => assert_eq!(name, "numbrs"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_workload_key_never_hides_a_global_function() {
    let sc = Scope::new().workload(json!({"range": 5}));
    assert_eq!(render("{{ range(3) | list }}", &sc), json!([0, 1, 2]));
}

#[test]
fn output_is_the_outcome_in_task_policy() {
    let sc = Scope::new().outcome(&Outcome::ok(json!({"rows": [1, 2]})));
    assert_eq!(render("{{ output.status }}", &sc), json!("ok"));
    assert_eq!(render("{{ output.data.rows }}", &sc), json!([1, 2]));
    assert_eq!(render("{{ output.result.rows }}", &sc), json!([1, 2]));
    let sc = Scope::new().outcome(&Outcome::error("http.status", "503", true));
    assert_eq!(render("{{ output.status }}", &sc), json!("error"));
    assert_eq!(render("{{ output.error.kind }}", &sc), json!("http.status"));
}

#[test]
fn output_is_the_boundary_events_result_in_arcs() {
    let done = json!({"name": "step.done", "status": "ok", "result": {"n": 3}});
    let sc = Scope::new().event(done);
    assert_eq!(render("{{ output.status }}", &sc), json!("ok"));
    assert_eq!(render("{{ output.data.n }}", &sc), json!(3));
    let failed = json!({"name": "step.failed", "error": {"kind": "timeout"}});
    let sc = Scope::new().event(failed);
    assert_eq!(render("{{ output.status }}", &sc), json!("error"));
    assert_eq!(render("{{ output.error.kind }}", &sc), json!("timeout"));
    let loop_done = json!({"name": "loop.done", "counts": {"done": 2}});
    assert_eq!(
        render("{{ output.status }}", &Scope::new().event(loop_done)),
        json!("ok")
    );
}

#[test]
fn index_is_the_iterations_index() {
    let sc = Scope::new().iter(json!({"n": 5, "index": 2}));
    assert_eq!(render("{{ _index }}", &sc), json!(2));
    assert_eq!(render("{{ _index * iter.n }}", &sc), json!(10));
    // Outside a loop it is undefined, like `iter`.
    assert_eq!(render("{{ _index }}", &Scope::new()), Value::Null);
}
