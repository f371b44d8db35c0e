//! Templates: native values, text, lenient conditions, strict top-level names,
//! filters, tests and functions.

use noetl_core::template::{
    check_syntax, eval_condition, is_template, referenced_roots, render_str, render_text,
    render_value, Scope, TemplateError,
};
use noetl_core::Outcome;
use serde_json::{json, Value};

fn scope() -> Scope {
    Scope::new()
        .workload(json!({
            "items": [1, 2, 3],
            "api_url": "http://api",
            "name": "Ada",
            "obj": {"z": 1, "a": 2},
            "n": "2",
            "empty": "",
            "flag": false,
        }))
        .ctx(json!({"store_ok": true, "count": 5}))
        .iter(json!({"page": "1", "endpoint": {"path": "/x"}, "parent": {"city": "Oslo"}}))
        .args(json!({"id": 7}))
        .execution_id("e-1")
        .step_result("fetch", json!({"rows": [{"a": 1}], "row_count": 1}))
}

fn r(src: &str) -> Value {
    render_str(src, &scope()).unwrap_or_else(|e| panic!("{src}: {e}"))
}

fn cond(src: &str) -> bool {
    eval_condition(src, &scope()).unwrap_or_else(|e| panic!("{src}: {e}"))
}

#[test]
fn exact_expression_yields_native_values() {
    assert_eq!(r("{{ workload.items }}"), json!([1, 2, 3]));
    assert_eq!(r("  {{ workload.items }}\n"), json!([1, 2, 3]));
    assert_eq!(r("{{ (iter.page | int) + 1 }}"), json!(2));
    assert_eq!(r("{{ ctx.store_ok }}"), json!(true));
    assert_eq!(r("{{ workload.obj }}"), json!({"z": 1, "a": 2}));
    assert_eq!(r("{{ none }}"), Value::Null);
    assert_eq!(r("{{ fetch.rows[0].a }}"), json!(1));
    assert_eq!(r("{{ iter.parent.city }}"), json!("Oslo"));
    assert_eq!(r("{{ args.id * 2 }}"), json!(14));
    assert_eq!(r("{{- execution_id -}}"), json!("e-1"));
    assert_eq!(r("{{ 1.5 }}"), json!(1.5));
}

#[test]
fn object_key_order_is_preserved() {
    let v = r("{{ workload.obj }}");
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["z", "a"]);
}

#[test]
fn mixed_text_yields_strings() {
    assert_eq!(r("{{ workload.api_url }}/data"), json!("http://api/data"));
    assert_eq!(r("page={{ iter.page }}&x={{ 1 + 1 }}"), json!("page=1&x=2"));
    assert_eq!(r("{{ workload.name }}{{ workload.name }}"), json!("AdaAda"));
    // text forms: bool lowercase, lists/objects as compact JSON, null empty
    assert_eq!(r("b={{ ctx.store_ok }}"), json!("b=true"));
    assert_eq!(r("l={{ workload.items }}"), json!("l=[1,2,3]"));
    assert_eq!(r("o={{ workload.obj }}"), json!("o={\"z\":1,\"a\":2}"));
    assert_eq!(r("n={{ none }}."), json!("n=."));
    assert_eq!(
        r("{% for i in workload.items %}{{ i }}{% if not loop.last %},{% endif %}{% endfor %}"),
        json!("1,2,3")
    );
    // trailing newline of block scalars survives
    assert_eq!(r("x={{ args.id }}\n"), json!("x=7\n"));
}

#[test]
fn strings_without_template_syntax_are_returned_as_is() {
    assert_eq!(r("plain text"), json!("plain text"));
    assert_eq!(r("{ not a template }"), json!("{ not a template }"));
    assert!(!is_template("a { b } c"));
    assert!(is_template("{{ a }}"));
    assert!(is_template("{% if a %}{% endif %}"));
    assert!(is_template("{# note #}"));
}

#[test]
fn render_value_walks_structures() {
    let input = json!({
        "url": "{{ workload.api_url }}/x",
        "items": "{{ workload.items }}",
        "nested": [{"page": "{{ (iter.page | int) + 1 }}"}, 3, null, true],
        "{{ keys_are_not_rendered }}": "literal",
    });
    let out = render_value(&input, &scope()).unwrap();
    assert_eq!(
        out,
        json!({
            "url": "http://api/x",
            "items": [1, 2, 3],
            "nested": [{"page": 2}, 3, null, true],
            "{{ keys_are_not_rendered }}": "literal",
        })
    );
}

#[test]
fn unknown_top_level_variable_is_an_error_naming_it() {
    let err = render_str("{{ wrokload.x }}", &scope()).unwrap_err();
    assert_eq!(
        err,
        TemplateError::UndefinedVariable {
            name: "wrokload".into(),
            template: "{{ wrokload.x }}".into()
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("wrokload") && msg.contains("{{ wrokload.x }}"),
        "{msg}"
    );
    // in mixed text and nested structures too
    assert!(matches!(
        render_value(&json!({"a": ["x {{ nope }} y"]}), &scope()),
        Err(TemplateError::UndefinedVariable { name, .. }) if name == "nope"
    ));
    // and where a filter or attribute reads it
    assert!(matches!(
        render_str("{{ nope | upper }}", &scope()),
        Err(TemplateError::UndefinedVariable { .. })
    ));
    assert!(matches!(
        render_str("{{ nope.x if ctx is defined else 1 }}", &scope()),
        Err(TemplateError::UndefinedVariable { .. })
    ));
}

#[test]
fn a_name_tested_for_being_defined_may_be_missing() {
    // Jinja's reads of what may be missing (NoETL's playbooks write them).
    assert_eq!(
        render_str("{{ nope | default(1) }}", &scope()).unwrap(),
        json!(1)
    );
    assert_eq!(
        render_str(
            "{{ nope.status if nope is defined else 'completed' }}",
            &scope()
        )
        .unwrap(),
        json!("completed")
    );
    assert_eq!(
        render_str("{{ nope is not defined }}", &scope()).unwrap(),
        json!(true)
    );
    assert_eq!(
        render_str("{{ nope['a'].b | d('x') }}", &scope()).unwrap(),
        json!("x")
    );
    assert_eq!(
        render_text("status: {{ nope.status | default('none') }}", &scope()).unwrap(),
        "status: none"
    );
    // A filter that applies to something else guards nothing.
    assert!(matches!(
        render_str("{{ nope ~ 'a' | default('b') }}", &scope()),
        Err(TemplateError::UndefinedVariable { name, .. }) if name == "nope"
    ));
    // The guard covers the name, not the template's other names.
    assert!(matches!(
        render_str("{{ other ~ (nope | default('')) }}", &scope()),
        Err(TemplateError::UndefinedVariable { name, .. }) if name == "other"
    ));
}

#[test]
fn runtime_and_declared_names_are_known_even_when_unbound() {
    let sc = Scope::new().workload(json!({}));
    assert_eq!(render_str("{{ iter.page }}", &sc).unwrap(), Value::Null);
    assert_eq!(
        render_str("{{ _prev | default('none') }}", &sc).unwrap(),
        json!("none")
    );
    let sc = sc.declare("later_step");
    assert_eq!(
        render_str("{{ later_step.rows | default([]) }}", &sc).unwrap(),
        json!([])
    );
    // names bound in the template itself are not roots
    assert_eq!(
        render_str("{% set x = 2 %}{{ x }}", &sc).unwrap(),
        json!("2")
    );
}

#[test]
fn a_declared_set_is_known_and_extends_earlier_declarations() {
    let names: std::sync::Arc<std::collections::BTreeSet<String>> =
        std::sync::Arc::new(["a".to_string(), "b".to_string()].into());
    let sc = Scope::new().declare_all(names.clone());
    assert_eq!(render_str("{{ a | default(1) }}", &sc).unwrap(), json!(1));
    assert!(render_str("{{ c }}", &sc).is_err(), "c was not declared");
    let sc = Scope::new().declare("c").declare_all(names);
    for name in ["a", "b", "c"] {
        assert_eq!(
            render_str(&format!("{{{{ {name} | default(2) }}}}"), &sc).unwrap(),
            json!(2),
            "{name}"
        );
    }
}

#[test]
fn missing_nested_attributes_are_null_or_empty_and_defaultable() {
    assert_eq!(r("{{ workload.missing.deeper }}"), Value::Null);
    assert_eq!(r("a{{ workload.missing.deeper }}b"), json!("ab"));
    assert_eq!(r("{{ workload.missing | default(5) }}"), json!(5));
    assert_eq!(r("{{ workload.missing.deeper | d('x') }}"), json!("x"));
    assert_eq!(
        r("{{ outcome.result.data.paging.page | default(iter.page) }}"),
        json!("1")
    );
}

#[test]
fn default_applies_to_falsy_with_second_argument() {
    assert_eq!(r("{{ workload.empty | default('x') }}"), json!(""));
    assert_eq!(r("{{ workload.empty | default('x', true) }}"), json!("x"));
    assert_eq!(r("{{ workload.flag | default(1, true) }}"), json!(1));
    assert_eq!(r("{{ ctx.count | default(1, true) }}"), json!(5));
}

#[test]
fn conditions_are_lenient() {
    // missing anything is undefined and falsy
    assert!(!cond("{{ nope }}"));
    assert!(!cond("{{ nope.deeper.still }}"));
    assert!(!cond("{{ outcome.http.status in [500, 502] }}"));
    assert!(cond("{{ outcome.http.status not in [500, 502] }}"));
    assert!(!cond("{{ outcome.http.status == 500 }}"));
    assert!(cond("{{ outcome.http.status != 500 }}"));
    // ordering comparisons with undefined/null are false, whichever way
    assert!(!cond("{{ outcome.http.status < 400 }}"));
    assert!(!cond("{{ outcome.http.status >= 400 }}"));
    assert!(!cond("{{ none < 3 }}"));
    assert!(!cond("{{ 3 > nope }}"));
    assert!(!cond("{{ 'a' < 3 }}"));
    assert!(cond("{{ not (outcome.http.status < 400) }}"));
    // defined comparisons still work
    assert!(cond("{{ ctx.count > 3 }}"));
    assert!(cond("{{ ctx.count >= 5 and ctx.count <= 5 }}"));
    assert!(!cond("{{ ctx.count < 5 }}"));
    assert!(cond("{{ 1 < ctx.count < 10 }}"));
    assert!(!cond("{{ 1 < ctx.count < 3 }}"));
    assert!(cond("{{ (iter.page | int) + 1 > 1 }}"));
    assert!(cond("{{ 'a' < 'b' }}"));
    assert!(cond("{{ true > 0 }}"));
    assert!(cond(
        "{{ ctx.store_ok == true and workload.name == 'Ada' }}"
    ));
    assert!(cond("{{ [1, 2] | length > 1 if ctx.store_ok else false }}"));
}

#[test]
fn conditions_use_jinja_truthiness_and_plain_literals() {
    assert!(cond("true"));
    assert!(cond(" True "));
    assert!(!cond("false"));
    assert!(!cond(""));
    assert!(cond("{{ true }}"));
    assert!(!cond("{{ [] }}"));
    assert!(!cond("{{ 0 }}"));
    assert!(!cond("{{ '' }}"));
    assert!(cond("{{ workload.items }}"));
    assert!(cond("{{ workload.name }}"));
    // bare expression without braces
    assert!(cond("ctx.store_ok == true"));
    assert!(!cond("ctx.count < 2"));
    // text conditions: rendered text decides
    assert!(cond("{% if ctx.store_ok %}yes please{% endif %}"));
    assert!(!cond("{% if nope %}yes{% endif %}"));
    assert!(!cond(" {{ workload.flag }} "));
    assert!(!cond(" {% if true %}False{% endif %}"));
}

#[test]
fn conditions_can_read_outcome() {
    let o = Outcome::error("http.status", "boom", true).with_helper("http", json!({"status": 503}));
    let sc = scope().outcome(&o);
    let when = "{{ outcome.status == 'error' and outcome.http.status in [429,500,502,503,504] }}";
    assert!(eval_condition(when, &sc).unwrap());
    assert!(eval_condition("{{ outcome.error.retryable }}", &sc).unwrap());
    assert!(eval_condition("{{ outcome.http.status >= 500 }}", &sc).unwrap());
    let ok = scope().outcome(&Outcome::ok(json!({"x": 1})));
    assert!(!eval_condition(when, &ok).unwrap());
    assert!(eval_condition("{{ outcome.result.x == 1 }}", &ok).unwrap());
}

#[test]
fn syntax_errors_are_reported() {
    assert_eq!(check_syntax("no template"), Ok(()));
    assert_eq!(check_syntax("{{ a.b | default(1) }}"), Ok(()));
    let err = check_syntax("{{ a b }}").unwrap_err();
    match &err {
        TemplateError::Syntax { template, message } => {
            assert_eq!(template, "{{ a b }}");
            assert!(message.contains("unexpected"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        check_syntax("{% if x %}unclosed"),
        Err(TemplateError::Syntax { .. })
    ));
    assert!(matches!(
        render_str("{{ (a }}", &scope()),
        Err(TemplateError::Syntax { .. })
    ));
    assert!(matches!(
        eval_condition("{{ a == }}", &scope()),
        Err(TemplateError::Syntax { .. })
    ));
}

#[test]
fn render_errors_are_typed() {
    let err = render_str("{{ workload.name | int }}", &scope()).unwrap_err();
    assert!(matches!(err, TemplateError::Render { .. }), "{err:?}");
    let err = render_str("{{ workload.items | no_such_filter }}", &scope()).unwrap_err();
    match err {
        TemplateError::Render { message, template } => {
            assert!(
                message.contains("no_such_filter") || message.contains("unknown filter"),
                "{message}"
            );
            assert_eq!(template, "{{ workload.items | no_such_filter }}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        render_str("{% include 'other' %}", &scope()),
        Err(TemplateError::Render { .. })
    ));
}

#[test]
fn referenced_roots_lists_top_level_names() {
    assert_eq!(
        referenced_roots("{{ ctx.a }} {{ fetch.rows | length }} {% for x in workload.items %}{{ x }}{% endfor %}"),
        vec!["ctx", "fetch", "workload"]
    );
    assert_eq!(
        referenced_roots("{{ range(3) | list }} {{ now() }}"),
        Vec::<String>::new()
    );
    assert!(referenced_roots("plain").is_empty());
    assert!(referenced_roots("{{ broken").is_empty());
}

#[test]
fn builtin_filters() {
    let cases: &[(&str, Value)] = &[
        ("{{ '2' | int }}", json!(2)),
        ("{{ '2' | int == 2 }}", json!(true)),
        ("{{ '2.7' | float }}", json!(2.7)),
        ("{{ 3 | string }}", json!("3")),
        ("{{ true | string }}", json!("true")),
        ("{{ workload.items | string }}", json!("[1,2,3]")),
        ("{{ workload.items | length }}", json!(3)),
        ("{{ workload.obj | length }}", json!(2)),
        ("{{ 'AbC' | lower }}", json!("abc")),
        ("{{ 'AbC' | upper }}", json!("ABC")),
        ("{{ '  x ' | trim }}", json!("x")),
        ("{{ 'a-b' | replace('-', '_') }}", json!("a_b")),
        ("{{ workload.items | join(',') }}", json!("1,2,3")),
        ("{{ workload.items | first }}", json!(1)),
        ("{{ workload.items | last }}", json!(3)),
        ("{{ 'ab' | list }}", json!(["a", "b"])),
        (
            "{{ workload.obj | items | list }}",
            json!([["z", 1], ["a", 2]]),
        ),
        ("{{ 2.567 | round(2) }}", json!(2.57)),
        ("{{ -3 | abs }}", json!(3)),
        ("{{ [3, 1, 2] | min }}", json!(1)),
        ("{{ [3, 1, 2] | max }}", json!(3)),
        ("{{ [3, 1, 2] | sum }}", json!(6)),
        ("{{ [1, 1, 2] | unique | list }}", json!([1, 2])),
        ("{{ [3, 1, 2] | sort }}", json!([1, 2, 3])),
        ("{{ 'a b&c' | urlencode }}", json!("a%20b%26c")),
        ("{{ workload.obj | tojson }}", json!("{\"z\": 1, \"a\": 2}")),
        ("{{ range(3) | list }}", json!([0, 1, 2])),
    ];
    for (src, want) in cases {
        assert_eq!(&r(src), want, "{src}");
    }
}

#[test]
fn added_filters() {
    let cases: &[(&str, Value)] = &[
        ("{{ '{\"a\": [1, 2]}' | fromjson }}", json!({"a": [1, 2]})),
        ("{{ ('{\"a\": 5}' | fromjson).a }}", json!(5)),
        ("{{ workload.obj | keys }}", json!(["z", "a"])),
        ("{{ workload.obj | values }}", json!([1, 2])),
        ("{{ workload.missing | keys }}", json!([])),
        ("{{ 'hello' | b64encode }}", json!("aGVsbG8=")),
        ("{{ 'hi' | b64encode }}", json!("aGk=")),
        ("{{ '' | b64encode }}", json!("")),
        ("{{ 'aGVsbG8=' | b64decode }}", json!("hello")),
        ("{{ 'aGk' | b64decode }}", json!("hi")),
        (
            "{{ 'héllo wörld!?' | b64encode | b64decode }}",
            json!("héllo wörld!?"),
        ),
        (
            "{{ workload.obj | tojson | fromjson }}",
            json!({"z": 1, "a": 2}),
        ),
    ];
    for (src, want) in cases {
        assert_eq!(&r(src), want, "{src}");
    }
    assert!(matches!(
        render_str("{{ 'not json' | fromjson }}", &scope()),
        Err(TemplateError::Render { .. })
    ));
    assert!(matches!(
        render_str("{{ '@@@' | b64decode }}", &scope()),
        Err(TemplateError::Render { .. })
    ));
    assert!(matches!(
        render_str("{{ [1] | keys }}", &scope()),
        Err(TemplateError::Render { .. })
    ));
}

#[test]
fn tests_and_functions() {
    let cases: &[(&str, bool)] = &[
        ("{{ workload is defined }}", true),
        ("{{ workload.missing is defined }}", false),
        ("{{ workload.missing is undefined }}", true),
        ("{{ none is none }}", true),
        ("{{ ctx.count is number }}", true),
        ("{{ workload.name is string }}", true),
        ("{{ workload.obj is mapping }}", true),
        ("{{ workload.items is sequence }}", true),
        ("{{ workload.items is mapping }}", false),
    ];
    for (src, want) in cases {
        assert_eq!(r(src), json!(want), "{src}");
    }
    let now = r("{{ now() }}");
    let now = now.as_str().unwrap();
    // RFC 3339 UTC: 2024-01-02T03:04:05[.fraction]Z
    let b = now.as_bytes();
    assert!(now.len() >= 20 && now.ends_with('Z'), "{now}");
    assert_eq!(
        (b[4], b[7], b[10], b[13], b[16]),
        (b'-', b'-', b'T', b':', b':'),
        "{now}"
    );
    assert!(now[..4].parse::<u32>().unwrap() >= 2024, "{now}");
}

#[test]
fn render_text_always_gives_text() {
    assert_eq!(
        render_text("{{ workload.items }}", &scope()).unwrap(),
        "[1,2,3]"
    );
    assert_eq!(render_text("plain", &scope()).unwrap(), "plain");
}

#[test]
fn scope_builder_binds_runtime_variables() {
    let o = Outcome::ok(json!({"v": 1}));
    let sc = Scope::new()
        .keychain(json!({"pg": {"user": "u"}}))
        .task("fetch_page")
        .prev(json!({"rows": 2}))
        .attempt(3)
        .outcome(&o)
        .event(json!({"name": "step.done"}))
        .loop_info(0, 2)
        .execution_id("e-9");
    let got = render_value(
        &json!([
            "{{ keychain.pg.user }}",
            "{{ _task }}",
            "{{ _prev.rows }}",
            "{{ _attempt }}",
            "{{ outcome.status }}",
            "{{ outcome.result.v }}",
            "{{ event.name }}",
            "{{ loop.index }}",
            "{{ loop.first }}",
            "{{ loop.last }}",
            "{{ loop.length }}",
            "{{ execution_id }}",
        ]),
        &sc,
    )
    .unwrap();
    assert_eq!(
        got,
        json!([
            "u",
            "fetch_page",
            2,
            3,
            "ok",
            1,
            "step.done",
            0,
            true,
            false,
            2,
            "e-9"
        ])
    );
    assert!(sc.contains("_task"));
    assert_eq!(sc.get("_attempt"), Some(json!(3)));
    assert_eq!(sc.get("nope"), None);
    // clones are independent
    let a = sc.clone().ctx(json!({"x": 1}));
    assert!(a.contains("ctx"));
    assert!(!sc.contains("ctx"));
}

#[test]
fn many_distinct_templates_keep_working() {
    // Goes past the cache bound, forcing a cache rotation.
    let sc = scope();
    for i in 0..5000 {
        let src = format!("{{{{ ctx.count + {i} }}}}");
        assert_eq!(render_str(&src, &sc).unwrap(), json!(5 + i));
    }
    assert_eq!(r("{{ ctx.count }}"), json!(5));
}

#[test]
fn concurrent_rendering() {
    let handles: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let sc = scope().args(json!({"t": t}));
                for i in 0..200 {
                    let v =
                        render_str(&format!("{{{{ args.t * 1000 + {} }}}}", i % 50), &sc).unwrap();
                    assert_eq!(v, json!(t * 1000 + i % 50));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn syntax_error_messages_match_check_syntax() {
    let sc = scope();
    for src in ["{{ a b }}", "  {{ a b }} "] {
        let from_render = render_str(src, &sc).unwrap_err();
        let from_check = check_syntax(src).unwrap_err();
        assert_eq!(from_render, from_check);
        let msg = from_render.to_string();
        assert!(msg.contains("expected end of variable block"), "{msg}");
        assert!(!msg.contains("syntax error: syntax error"), "{msg}");
    }
    let cond_err = eval_condition("{{ a b }}", &sc).unwrap_err();
    assert_eq!(cond_err, check_syntax("{{ a b }}").unwrap_err());
}
