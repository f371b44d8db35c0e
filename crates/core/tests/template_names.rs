//! What `noetl validate` finds in templates beyond their syntax: a filter
//! or test the engine does not have (E049: compiled fine, failing when a
//! render reaches it), a bare `when` that does not parse as the engine
//! evaluates it (E036), and a condition of several `{{ }}` joined by text,
//! which renders as that text (W113).

use noetl_core::diagnostic::Diagnostic;
use noetl_core::load::load_playbook;
use noetl_core::template::{check_condition, unknown_names, NameKind, UnknownName};

fn diags(src: &str) -> Vec<Diagnostic> {
    match load_playbook(src, "t.yaml") {
        Ok(l) => l.warnings.0,
        Err(e) => e.diagnostics.0,
    }
}

/// `(code, line, col, message)` of every diagnostic.
fn found(src: &str) -> Vec<(&'static str, usize, usize, String)> {
    diags(src)
        .into_iter()
        .map(|d| {
            let s = d.span.expect("positioned");
            (d.code.as_str(), s.line, s.col, d.message)
        })
        .collect()
}

/// A two-step playbook; `when` is the arc's condition (line 9), `value`
/// the task's `result` (line 7).
fn pb(value: &str, when: &str) -> String {
    format!(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{ name: t }}\nworkflow:\n  - step: start\n    tool:\n      - {{ name: a, kind: noop, result: {value:?} }}\n    next:\n      arcs: [ {{ step: end, when: {when:?} }} ]\n  - step: end\n"
    )
}

fn unknown(kind: NameKind, name: &str) -> UnknownName {
    UnknownName {
        kind,
        name: name.into(),
    }
}

#[test]
fn filters_and_tests_the_engine_lacks_are_found_and_its_own_are_not() {
    assert_eq!(
        unknown_names("{{ x | to_json }} {{ y is integer_like }} {{ z | tojson | length }}"),
        [
            unknown(NameKind::Filter, "to_json"),
            unknown(NameKind::Test, "integer_like")
        ]
    );
    // Builtins beyond the documented list (minijinja's own) are the engine's.
    for ok in [
        "{{ x | title }}",
        "{{ xs | map(attribute='a') | list }}",
        "{{ x is defined and x is not none }}",
        "{% for r in rows | sort %}{{ r | string | upper }}{% endfor %}",
        "{{ now() }} {{ range(3) | list }}",
        "plain text",
    ] {
        assert_eq!(unknown_names(ok), [], "{ok}");
    }
    // Inside a branch no render of the probe reaches, still found.
    assert_eq!(
        unknown_names("{% if false %}{{ x | slugify }}{% endif %}"),
        [unknown(NameKind::Filter, "slugify")]
    );
}

#[test]
fn a_condition_is_compiled_as_the_engine_evaluates_it() {
    assert_eq!(check_condition("outcome.status == 'error'").unwrap(), []);
    assert_eq!(check_condition("{{ a < 3 }}").unwrap(), []);
    assert_eq!(check_condition("true").unwrap(), []);
    assert_eq!(check_condition("").unwrap(), []);
    assert!(check_condition("outcome.status = 'error'").is_err());
    assert!(check_condition("a && b").is_err());
    assert_eq!(
        check_condition("event.error is timeout_kind").unwrap(),
        [unknown(NameKind::Test, "timeout_kind")]
    );
}

#[test]
fn e049_an_unknown_filter_is_an_error_where_it_is_written() {
    let got = found(&pb("{{ workload.rows | to_json }}", "{{ true }}"));
    assert_eq!(
        got,
        [(
            "E049",
            7,
            40,
            "unknown filter `to_json`: the template fails when it is rendered".into()
        )]
    );
    let help = diags(&pb("{{ workload.rows | to_json }}", "{{ true }}"))[0]
        .help
        .clone()
        .unwrap_or_default();
    assert!(help.starts_with("did you mean `tojson`?"), "{help}");
}

#[test]
fn e036_a_bare_when_that_does_not_parse_is_an_error_and_e049_its_unknown_test() {
    let got = found(&pb("x", "outcome.status = 'error'"));
    assert_eq!(got.len(), 1, "{got:?}");
    let (code, line, col, message) = &got[0];
    assert_eq!((*code, *line, *col), ("E036", 9, 34));
    assert!(
        message.starts_with("condition \"outcome.status = 'error'\" does not parse"),
        "{message}"
    );
    let got = found(&pb("x", "event.name is done_event"));
    assert_eq!(
        got,
        [(
            "E049",
            9,
            34,
            "unknown test `done_event`: the template fails when it is rendered".into()
        )]
    );
    // A bare condition that parses, and one template: quiet.
    assert_eq!(found(&pb("x", "event.name == 'step.done'")), []);
    assert_eq!(found(&pb("x", "{{ event.name == 'step.done' }}")), []);
}

#[test]
fn w113_a_condition_of_several_outputs_joined_by_text_is_warned() {
    let got = found(&pb("x", "{{ workload.n > 5 }} and {{ workload.n < 9 }}"));
    assert_eq!(got.len(), 1, "{got:?}");
    let (code, line, col, message) = &got[0];
    assert_eq!((*code, *line, *col), ("W113", 9, 34));
    assert!(message.contains("renders as text"), "{message}");
    // Logic in `{% %}` is the author's own text form: quiet.
    assert_eq!(
        found(&pb("x", "{% if workload.n > 5 %}true{% endif %}")),
        []
    );
}
