//! One test per validation rule: the error (with its position) and the
//! accepted counterpart.

use noetl_core::diagnostic::{Diagnostic, Severity};
use noetl_core::load::{load_playbook, LoadError, LoadedPlaybook};

/// Document head: 4 lines, `workflow:` is line 5, the first step line 6.
const HEAD: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\nworkflow:\n";

fn pb(workflow: &str) -> String {
    format!("{HEAD}{workflow}")
}

fn load(src: &str) -> Result<LoadedPlaybook, LoadError> {
    load_playbook(src, "t.yaml")
}

/// Every diagnostic, errors and warnings.
fn diags(src: &str) -> Vec<Diagnostic> {
    match load(src) {
        Ok(l) => l.warnings.0,
        Err(e) => e.diagnostics.0,
    }
}

fn codes(src: &str) -> Vec<&'static str> {
    diags(src).iter().map(|d| d.code.as_str()).collect()
}

/// `(line, col)` of the first diagnostic with `code`; panics with the list.
fn at(src: &str, code: &str) -> (usize, usize) {
    let all = diags(src);
    let d = all
        .iter()
        .find(|d| d.code == code)
        .unwrap_or_else(|| panic!("no {code} in {all:#?}"));
    let s = d.span.expect("positioned");
    (s.line, s.col)
}

fn message(src: &str, code: &str) -> Diagnostic {
    let all = diags(src);
    all.iter()
        .find(|d| d.code == code)
        .cloned()
        .unwrap_or_else(|| panic!("no {code} in {all:#?}"))
}

fn assert_ok(src: &str) -> LoadedPlaybook {
    match load(src) {
        Ok(l) => l,
        Err(e) => panic!("expected a valid playbook, got:\n{e}\n--\n{src}"),
    }
}

fn assert_clean(src: &str) {
    let l = assert_ok(src);
    assert!(
        l.warnings.is_empty(),
        "unexpected warnings: {:#?}",
        l.warnings
    );
}

const NOOP: &str = "    tool: { kind: noop }\n";

// ---------------------------------------------------------------- E001

#[test]
fn e001_yaml_syntax_error_has_a_position() {
    let src = format!("{HEAD}  - step: a\n    tool: [ {{ kind: noop }}\n    next: x\n");
    let d = message(&src, "E001");
    assert_eq!(d.severity, Severity::Error);
    assert!(d.span.unwrap().line >= 7, "{d:?}");
    assert!(d.message.starts_with("YAML syntax"), "{}", d.message);
}

#[test]
fn e001_duplicate_keys_are_refused_with_both_lines() {
    let src = pb("  - step: a\n    tool: { kind: noop }\n    step: b\n");
    assert_eq!(at(&src, "E001"), (8, 5));
    assert!(message(&src, "E001").message.contains("line 6"));
    assert_eq!(codes(&src), vec!["E001"]);
}

// ---------------------------------------------------------------- E002

#[test]
fn e002_unknown_root_section_and_root_vars() {
    let src = format!("vars: {{ a: 1 }}\n{HEAD}  - step: a\n{NOOP}workflo: []\n");
    let all = diags(&src);
    let e002: Vec<_> = all.iter().filter(|d| d.code == "E002").collect();
    assert_eq!(e002.len(), 2, "{all:#?}");
    assert_eq!(e002[0].span.unwrap().line, 1);
    assert!(e002[0].message.contains("vars"));
    assert!(e002[1].help.as_deref().unwrap().contains("`workflow`"));
}

#[test]
fn e002_every_root_section_is_accepted() {
    let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nkeychain: [{ name: pg, kind: postgres_credential }]\nexecutor: { kind: local, spec: { a: 1 } }\nworkload: { x: 1 }\nworkbook: { tasks: { t: { kind: noop } } }\nworkflow:\n  - step: a\n    tool: { kind: noop }\n";
    let l = assert_ok(src);
    assert_eq!(l.playbook.keychain[0].name, "pg");
    assert_eq!(l.playbook.workload["x"], 1);
}

// ---------------------------------------------------------------- E003

#[test]
fn e003_missing_root_fields() {
    let c = codes("workflow:\n  - step: a\n    tool: { kind: noop }\n");
    assert_eq!(c.iter().filter(|c| **c == "E003").count(), 3, "{c:?}");
    let c = codes("apiVersion: v\nkind: Playbook\nmetadata: { path: x }\n");
    assert_eq!(c.iter().filter(|c| **c == "E003").count(), 2, "{c:?}");
}

#[test]
fn e003_missing_step_name_task_kind_and_arc_step() {
    let src = pb("  - desc: nameless\n    tool: { kind: noop }\n  - step: b\n    tool:\n      - name: t\n        url: x\n    next:\n      arcs:\n        - when: \"{{ true }}\"\n");
    let all = diags(&src);
    let lines: Vec<usize> = all
        .iter()
        .filter(|d| d.code == "E003")
        .map(|d| d.span.unwrap().line)
        .collect();
    assert_eq!(lines, vec![6, 10, 14], "{all:#?}");
}

// ---------------------------------------------------------------- E004

#[test]
fn e004_wrong_shapes() {
    assert_eq!(
        at(
            "apiVersion: v\nkind: Playbook\nmetadata: { name: t }\nworkflow: { a: 1 }\n",
            "E004"
        ),
        (4, 11)
    );
    assert_eq!(at(&pb("  - step: a\n    tool: noop\n"), "E004"), (7, 11));
    let src = pb("  - step: a\n    loop: { in: [1], iterator: i, spec: { mode: sideways } }\n    tool: { kind: noop }\n");
    assert_eq!(at(&src, "E004"), (7, 49));
    let src =
        pb("  - step: a\n    tool: { kind: noop }\n    next: { arcs: [ { step: a, when: 3 } ] }\n");
    assert!(message(&src, "E004").message.contains("`when`"));
    let src = pb("  - step: a\n    spec: { policy: { failure: { mode: lenient } } }\n    tool: { kind: noop }\n");
    assert_eq!(
        message(&src, "E004").path,
        "/workflow/0/spec/policy/failure/mode"
    );
    let src = pb("  - step: a\n    spec: { failure: best_effort }\n    tool: { kind: noop }\n");
    assert_eq!(message(&src, "E004").path, "/workflow/0/spec/failure");
    let ok = assert_ok(&pb(
        "  - step: a\n    spec: { failure: { mode: best_effort } }\n    tool: { kind: noop }\n",
    ));
    assert_eq!(
        ok.playbook.workflow[0].failure_mode(),
        noetl_core::FailureMode::BestEffort
    );
}

#[test]
fn e004_after_validation_serde_errors_carry_the_path() {
    let src = "apiVersion: v\nkind: Playbook\nmetadata: { name: t }\nexecutor: { spec: 3 }\nworkflow:\n  - step: a\n    tool: { kind: noop }\n";
    let d = message(src, "E004");
    assert_eq!(d.path, "/executor/spec");
    assert_eq!(d.span.unwrap().line, 4);
    assert!(d.message.contains("/executor/spec"), "{}", d.message);
}

// ---------------------------------------------------------------- E005

#[test]
fn e005_unknown_fields_in_closed_shapes_suggest_the_closest() {
    let src = pb("  - step: a\n    loop: { in: [1], iterator: i, mod: x }\n    tool:\n      - name: t\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - else: true\n                then: { do: retry, attemps: 3 }\n    next:\n      arc: []\n      arcs:\n        - { step: a, whem: x }\n");
    let all: Vec<_> = diags(&src)
        .into_iter()
        .filter(|d| d.code == "E005")
        .collect();
    let found: Vec<(usize, &str)> = all
        .iter()
        .map(|d| (d.span.unwrap().line, d.help.as_deref().unwrap()))
        .collect();
    assert_eq!(found.len(), 4, "{all:#?}");
    assert_eq!(found[0].0, 7);
    assert!(
        found[1].1.starts_with("did you mean `attempts`"),
        "{found:?}"
    );
    assert_eq!(found[1].0, 15);
    assert!(found[2].1.starts_with("did you mean `arcs`"), "{found:?}");
    assert!(found[3].1.starts_with("did you mean `when`"), "{found:?}");
}

#[test]
fn e005_step_unknown_field() {
    let src = pb("  - step: a\n    tol: { kind: noop }\n");
    let d = message(&src, "E005");
    assert_eq!(d.span.unwrap().line, 7);
    assert!(d.help.unwrap().contains("`tool`"));
}

// ---------------------------------------------------------------- E006, E007

#[test]
fn e006_an_unknown_tool_kind_is_refused_at_its_line_with_the_closest_kind() {
    // `pg` would otherwise wait forever for an executor that never comes.
    let src = pb(
        "  - step: a\n    tool:\n      - name: t\n        kind: pg\n        command: select 1\n",
    );
    assert_eq!(at(&src, "E006"), (9, 15));
    let d = message(&src, "E006");
    assert!(d.message.contains("`pg`"), "{}", d.message);
    assert!(d.message.contains("task `t` of step `a`"), "{}", d.message);
    let help = d.help.unwrap();
    assert!(help.starts_with("did you mean `postgres`?"), "{help}");
    assert!(
        help.contains("`shell`") && help.contains("`artifact`"),
        "{help}"
    );
    // A typo by edit distance, in a root workbook task too.
    let src = format!(
        "{}workbook:\n  tasks:\n    w: {{ kind: pyhton, code: x }}\n",
        pb("  - step: a\n    tool: { kind: noop }\n")
    );
    assert!(message(&src, "E006")
        .help
        .unwrap()
        .starts_with("did you mean `python`?"));
    // Nothing close: the list alone.
    let src = pb("  - step: a\n    tool: { kind: frobnicate }\n");
    assert!(message(&src, "E006")
        .help
        .unwrap()
        .starts_with("tool kinds: `noop`"));
    // Every kind this engine runs is accepted.
    for k in ["noop", "shell", "artifact"] {
        assert!(
            !codes(&pb(&format!("  - step: a\n    tool: {{ kind: {k} }}\n"))).contains(&"E006")
        );
    }
}

#[test]
fn e007_a_noetl_kind_that_needs_a_cloud_service_is_refused_naming_it() {
    let src = pb("  - step: a\n    tool:\n      kind: snowflake\n      command: select 1\n");
    assert_eq!(at(&src, "E007"), (8, 13));
    let d = message(&src, "E007");
    assert_eq!(
        d.message,
        "tool kind `snowflake` of task `a_task` of step `a` is not available in this engine: it needs a Snowflake account"
    );
    assert!(!codes(&src).contains(&"E006"), "{:?}", codes(&src));
    for k in noetl_core::tool::UNAVAILABLE {
        let src = pb(&format!("  - step: a\n    tool: {{ kind: {} }}\n", k.name));
        let d = message(&src, "E007");
        assert!(d.message.contains(k.needs), "{}", d.message);
        assert_eq!(d.help.as_deref(), Some(k.instead));
    }
}

#[test]
fn e007_an_inline_auth_from_a_cloud_service_is_refused_naming_it() {
    let src = pb("  - step: a\n    tool:\n      kind: http\n      url: http://x\n      auth:\n        source: adc\n");
    let d = message(&src, "E007");
    assert!(
        d.message
            .contains("resolves from Google Application Default Credentials"),
        "{}",
        d.message
    );
    let src = pb("  - step: a\n    tool:\n      kind: duckdb\n      command: select 1\n      auth:\n        pg_db: { source: credential, tool: postgres }\n        gcs: { source: credential, type: gcs_hmac }\n");
    assert!(message(&src, "E007")
        .message
        .contains("Google Cloud Storage"));
    let src = pb("  - step: a\n    tool:\n      kind: http\n      url: http://x\n      auth: { openai: { type: bearer, provider: secret_manager } }\n");
    assert!(message(&src, "E007")
        .message
        .contains("cloud secret manager"));
    // Any other mapping: the name of a keychain entry is expected.
    let src = pb("  - step: a\n    tool:\n      kind: http\n      url: http://x\n      auth: { type: bearer, credential: api }\n");
    assert_eq!(codes(&src), ["E004"]);
    assert!(message(&src, "E004").help.unwrap().contains("`auth: NAME`"));
}

// ---------------------------------------------------------------- E010..E017

#[test]
fn e010_step_when_is_refused_admit_is_accepted() {
    let src = pb("  - step: a\n    when: \"{{ true }}\"\n    tool: { kind: noop }\n");
    assert_eq!(at(&src, "E010"), (7, 5));
    assert!(message(&src, "E010").help.unwrap().contains("admit"));
    assert_clean(&pb("  - step: a\n    spec:\n      policy:\n        admit:\n          rules:\n            - when: \"{{ workload.go }}\"\n              then: { allow: true }\n            - else:\n                then: { allow: false }\n    tool: { kind: noop }\n"));
}

#[test]
fn e011_eval_is_refused_on_steps_and_tasks() {
    let src =
        pb("  - step: a\n    eval: [ x ]\n    tool:\n      - kind: noop\n        eval: [ y ]\n");
    let all: Vec<_> = diags(&src)
        .into_iter()
        .filter(|d| d.code == "E011")
        .map(|d| d.span.unwrap().line)
        .collect();
    assert_eq!(all, vec![7, 10]);
}

#[test]
fn e012_expr_is_refused() {
    let src = pb("  - step: a\n    tool:\n      - kind: noop\n        spec:\n          policy:\n            rules:\n              - expr: \"x\"\n                then: { do: continue }\n");
    assert_eq!(at(&src, "E012"), (12, 17));
}

#[test]
fn e013_step_case_is_refused() {
    let src = pb("  - step: a\n    case: []\n    tool: { kind: noop }\n");
    assert_eq!(at(&src, "E013"), (7, 5));
}

#[test]
fn e014_pipe_is_refused() {
    let src = pb("  - step: a\n    pipe: [ x ]\n    tool: { kind: noop }\n");
    assert_eq!(at(&src, "E014"), (7, 5));
}

#[test]
fn e015_legacy_next_shapes() {
    let list = pb("  - step: a\n    tool: { kind: noop }\n    next:\n      - step: a\n");
    assert_eq!(at(&list, "E015"), (9, 7));
    let string = pb("  - step: a\n    tool: { kind: noop }\n    next: a\n");
    assert_eq!(at(&string, "E015"), (8, 11));
    let cond =
        pb("  - step: a\n    tool: { kind: noop }\n    next:\n      when: x\n      then: [ a ]\n");
    assert_eq!(
        codes(&cond).iter().filter(|c| **c == "E015").count(),
        2,
        "{:?}",
        codes(&cond)
    );
    assert!(!codes(&cond).contains(&"E005"));
}

#[test]
fn e016_sink_as_kind_step_key_or_task_key() {
    let src = pb("  - step: a\n    sink: { kind: postgres }\n    tool:\n      - kind: sink\n      - kind: noop\n        sink: x\n");
    let lines: Vec<usize> = diags(&src)
        .iter()
        .filter(|d| d.code == "E016")
        .map(|d| d.span.unwrap().line)
        .collect();
    assert_eq!(lines, vec![7, 9, 11]);
}

#[test]
fn e017_step_vars_is_refused() {
    let src = pb("  - step: a\n    vars: { x: 1 }\n    tool: { kind: noop }\n");
    assert_eq!(at(&src, "E017"), (7, 5));
}

// ---------------------------------------------------------------- E020..E026

fn task_with_policy(policy: &str) -> String {
    pb(&format!(
        "  - step: a\n    tool:\n      - name: first\n        kind: noop\n        spec:\n          policy: {policy}\n      - name: second\n        kind: noop\n"
    ))
}

#[test]
fn e020_task_policy_must_be_an_object_with_rules() {
    for policy in [
        "[ { do: retry } ]",
        "{ mode: exclusive }",
        "null",
        "{ rules: 3 }",
    ] {
        let src = task_with_policy(policy);
        assert_eq!(at(&src, "E020"), (11, 19), "{policy}");
    }
    assert_clean(&task_with_policy("{ rules: [] }"));
}

#[test]
fn e021_control_actions_outside_task_policy() {
    let src = pb("  - step: a\n    spec:\n      policy:\n        admit:\n          rules:\n            - else: { then: { allow: true, retry: 3 } }\n        rules:\n          - when: x\n            then: { do: retry }\n    loop:\n      in: [1]\n      iterator: i\n      spec: { policy: { do: break } }\n    tool: { kind: noop }\n    next:\n      spec: { do: jump }\n      arcs:\n        - step: a\n          when: \"{{ event.name == 'loop.done' }}\"\n          do: continue\n");
    let lines: Vec<usize> = diags(&src)
        .iter()
        .filter(|d| d.code == "E021")
        .map(|d| d.span.unwrap().line)
        .collect();
    assert_eq!(lines, vec![11, 14, 18, 21, 25], "{:#?}", diags(&src));
    assert!(!codes(&src).contains(&"E005"), "{:?}", codes(&src));
}

#[test]
fn e022_jump_target_must_be_a_task_of_the_same_pipeline() {
    let bad = task_with_policy("{ rules: [ { else: true, then: { do: jump, to: secnd } } ] }");
    let d = message(&bad, "E022");
    assert_eq!(d.span.unwrap().line, 11);
    assert!(d.help.unwrap().starts_with("did you mean `second`"));
    let far = task_with_policy("{ rules: [ { else: true, then: { do: jump, to: nowhere } } ] }");
    assert_eq!(
        message(&far, "E022").help.as_deref(),
        Some("tasks of this pipeline: `first`, `second`")
    );
    // A task of another step is not a target.
    let other = pb("  - step: a\n    tool:\n      - name: t\n        kind: noop\n        spec: { policy: { rules: [ { else: true, then: { do: jump, to: u } } ] } }\n    next: { arcs: [ { step: b } ] }\n  - step: b\n    tool: [ { name: u, kind: noop } ]\n");
    assert!(codes(&other).contains(&"E022"));
    // Explicit, label-keyed and synthetic names are all targets.
    for to in ["second", "first"] {
        assert_clean(&task_with_policy(&format!(
            "{{ rules: [ {{ else: true, then: {{ do: jump, to: {to} }} }} ] }}"
        )));
    }
    assert_clean(&pb("  - step: a\n    tool:\n      - fetch: { kind: noop }\n      - kind: noop\n        spec: { policy: { rules: [ { when: \"{{ iter.more }}\", then: { do: jump, to: fetch } }, { else: true, then: { do: jump, to: task_1 } } ] } }\n"));
}

#[test]
fn e023_attempts_must_be_a_positive_integer() {
    for bad in ["0", "-1", "'3'", "1.5"] {
        let src = task_with_policy(&format!(
            "{{ rules: [ {{ else: true, then: {{ do: retry, attempts: {bad} }} }} ] }}"
        ));
        assert!(codes(&src).contains(&"E023"), "{bad}: {:?}", codes(&src));
    }
    let ok = assert_ok(&task_with_policy(
        "{ rules: [ { else: true, then: { do: retry, attempts: 1 } } ] }",
    ));
    let rule = &ok.playbook.workflow[0].tool[0]
        .spec
        .policy
        .as_ref()
        .unwrap()
        .rules[0];
    assert_eq!(rule.then.attempts, Some(1));
}

#[test]
fn e024_backoff_must_be_known() {
    let src =
        task_with_policy("{ rules: [ { else: true, then: { do: retry, backoff: quadratic } } ] }");
    assert_eq!(at(&src, "E024"), (11, 72));
    for b in ["none", "linear", "exponential"] {
        assert_clean(&task_with_policy(&format!(
            "{{ rules: [ {{ else: true, then: {{ do: retry, backoff: {b} }} }} ] }}"
        )));
    }
}

#[test]
fn e025_unknown_action_suggests_the_closest() {
    let src = task_with_policy("{ rules: [ { else: true, then: { do: retyr } } ] }");
    let d = message(&src, "E025");
    assert!(d.help.unwrap().starts_with("did you mean `retry`"));
    for a in ["continue", "retry", "break", "fail"] {
        assert_clean(&task_with_policy(&format!(
            "{{ rules: [ {{ else: true, then: {{ do: {a} }} }} ] }}"
        )));
    }
}

#[test]
fn e026_jump_needs_to() {
    let src = task_with_policy("{ rules: [ { else: true, then: { do: jump } } ] }");
    assert_eq!(codes(&src), vec!["E026"]);
}

#[test]
fn e004_else_false_and_other_non_rule_values_are_refused() {
    // `else: false` used to become a rule without `when`: always matching.
    for (value, line, col) in [("false", 11, 38), ("\"no\"", 11, 38), ("3", 11, 38)] {
        let src = task_with_policy(&format!(
            "{{ rules: [ {{ when: \"{{{{ outcome.status == 'error' }}}}\", then: {{ do: fail }} }}, {{ else: {value}, then: {{ do: break }} }} ] }}"
        ));
        let bad = task_with_policy(&format!(
            "{{ rules: [ {{ else: {value}, then: {{ do: break }} }} ] }}"
        ));
        assert!(codes(&src).contains(&"E004"), "{value}: {:?}", codes(&src));
        let d = message(&bad, "E004");
        assert_eq!(
            d.path, "/workflow/0/tool/0/spec/policy/rules/0/else",
            "{value}"
        );
        assert_eq!(
            (d.span.unwrap().line, d.span.unwrap().col),
            (line, col),
            "{value}"
        );
        assert!(
            d.help
                .as_deref()
                .unwrap()
                .contains("`- else: { then: { do: continue } }`"),
            "{d:#?}"
        );
    }
    // Admission rules too; the help shows the admission form.
    let admit = pb("  - step: a\n    spec:\n      policy:\n        admit:\n          rules:\n            - else: false\n              then: { allow: true }\n    tool: { kind: noop }\n");
    let d = message(&admit, "E004");
    assert_eq!(d.span.unwrap().line, 11);
    assert!(d.message.contains("`else: false`"), "{d:#?}");
    assert!(d
        .help
        .unwrap()
        .contains("`- else: { then: { allow: false } }`"));
    // `when: false` is a rule that never matches: accepted.
    assert_clean(&task_with_policy(
        "{ rules: [ { when: false, then: { do: break } } ] }",
    ));
    // The accepted fallback forms.
    for form in [
        "{ else: true, then: { do: break } }",
        "{ else: { then: { do: break } } }",
        "{ else: null, then: { do: break } }",
    ] {
        assert_clean(&task_with_policy(&format!("{{ rules: [ {form} ] }}")));
    }
}

#[test]
fn e004_else_of_the_wrong_shape_shows_the_canonical_form() {
    // `- else: {do: break}`: the action written directly under `else`.
    let direct = task_with_policy("{ rules: [ { else: { do: break } } ] }");
    let d = message(&direct, "E004");
    assert_eq!(
        d.message,
        "`else` in a policy rule holds only `then`, found `do` directly under `else`"
    );
    assert_eq!(
        d.help.as_deref(),
        Some("the fallback rule is written `- else: { then: { do: break } }`")
    );
    assert!(!codes(&direct).contains(&"E003"), "{:?}", codes(&direct));
    // `else:` followed by a list item.
    let listed = pb("  - step: a\n    tool:\n      - name: t\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - else:\n                  - then: { do: break }\n");
    let d = message(&listed, "E004");
    assert_eq!(d.span.unwrap().line, 14);
    assert!(d.message.contains("is a list"), "{d:#?}");
    assert_eq!(
        d.help.as_deref(),
        Some("the fallback rule is written `- else: { then: { do: break } }`")
    );
    // `when` and `else` in one rule.
    let both = task_with_policy(
        "{ rules: [ { when: \"{{ outcome.error }}\", else: { then: { do: break } } } ] }",
    );
    let d = message(&both, "E004");
    assert!(d.message.contains("both `when` and `else`"), "{d:#?}");
}

#[test]
fn e021_control_actions_in_the_executor_spec() {
    let src = format!("{HEAD}  - step: a\n    tool: {{ kind: noop }}\nexecutor:\n  spec:\n    policy:\n      rules:\n        - when: \"{{{{ true }}}}\"\n          then: {{ do: retry }}\n");
    let d = message(&src, "E021");
    assert_eq!(d.span.unwrap().line, 13);
    assert_eq!(d.path, "/executor/spec/policy/rules/0/then/do");
    assert!(d.message.contains("the executor spec"), "{d:#?}");
    assert_clean(&format!("{HEAD}  - step: a\n    tool: {{ kind: noop }}\nexecutor:\n  spec:\n    timeout: 5\n    policy: {{ defaults: {{ timeouts: 5 }} }}\n"));
}

#[test]
fn e011_e012_legacy_conditions_on_arcs() {
    let src = pb("  - step: a\n    next:\n      arcs:\n        - step: b\n          expr: \"{{ ctx.x }}\"\n        - step: b\n          eval: \"{{ ctx.y }}\"\n  - step: b\n");
    let e12 = message(&src, "E012");
    assert_eq!(e12.span.unwrap().line, 10);
    assert!(e12.help.unwrap().contains("rename it to `when`"));
    let e11 = message(&src, "E011");
    assert_eq!(e11.span.unwrap().line, 12);
    assert!(!codes(&src).contains(&"E005"), "{:?}", codes(&src));
}

#[test]
fn workbook_task_bodies_are_validated_like_pipeline_tasks() {
    let wb = |body: &str| {
        format!("{HEAD}  - step: a\n    tool:\n      - name: c\n        kind: workbook\n        task: w\nworkbook:\n  tasks:\n    w:\n{body}")
    };
    // No kind.
    let d = message(&wb("      url: x\n"), "E003");
    assert_eq!(d.path, "/workbook/tasks/w");
    assert!(d.message.contains("workbook task `w`"), "{d:#?}");
    // Bad template, bad policy, legacy keys, nested workbook call.
    assert!(codes(&wb("      kind: http\n      url: \"{{ args.id \"\n")).contains(&"E036"));
    assert!(codes(&wb("      kind: noop\n      spec: { policy: { rules: [ { else: false, then: { do: break } } ] } }\n")).contains(&"E004"));
    assert!(codes(&wb(
        "      kind: noop\n      spec: { policy: [ { do: retry } ] }\n"
    ))
    .contains(&"E020"));
    assert!(codes(&wb("      kind: noop\n      spec: { policy: { rules: [ { else: true, then: { do: retyr } } ] } }\n")).contains(&"E025"));
    assert!(codes(&wb("      kind: noop\n      eval: x\n")).contains(&"E011"));
    assert!(codes(&wb("      kind: workbook\n      task: w\n")).contains(&"E004"));
    // A jump of the workbook task's own policy must target the caller's pipeline.
    let jump = wb("      kind: noop\n      spec: { policy: { rules: [ { else: true, then: { do: jump, to: elsewhere } } ] } }\n");
    let d = message(&jump, "E022");
    assert_eq!(d.path, "/workflow/0/tool/0/task");
    assert!(d.message.contains("`elsewhere`"), "{d:#?}");
    assert_clean(&wb("      kind: noop\n      spec: { policy: { rules: [ { when: \"{{ outcome.error }}\", then: { do: jump, to: c } } ] } }\n"));
    // List shapes: a task needs a name, names are unique.
    let list =
        |items: &str| format!("{HEAD}  - step: a\n    tool: {{ kind: noop }}\nworkbook:\n{items}");
    assert!(codes(&list("  - kind: noop\n")).contains(&"E003"));
    assert!(codes(&list(
        "  - { name: x, kind: noop }\n  - { name: x, kind: noop }\n"
    ))
    .contains(&"E034"));
    assert!(codes(&list("  tasks: 3\n")).contains(&"E004"));
    assert!(codes(&list("  taks: {}\n")).contains(&"E005"));
    // The else shorthand is normalised inside workbook tasks too.
    let ok = assert_ok(&wb("      kind: noop\n      spec: { policy: { rules: [ { else: { then: { do: break } } } ] } }\n"));
    let def = &ok.playbook.workbook.as_ref().unwrap()["tasks"]["w"];
    assert_eq!(def["spec"]["policy"]["rules"][0]["else"], true);
    assert_eq!(def["spec"]["policy"]["rules"][0]["then"]["do"], "break");
}

// ---------------------------------------------------------------- E030..E037

#[test]
fn e030_arc_target_must_exist() {
    let src = pb("  - step: start\n    next: { arcs: [ { step: finsh } ] }\n  - step: finish\n    tool: { kind: noop }\n");
    let d = message(&src, "E030");
    assert_eq!(d.span.unwrap().line, 7);
    assert!(d.help.unwrap().contains("`finish`"));
}

#[test]
fn e031_empty_workflow_has_no_entry() {
    assert_eq!(codes(&pb("  []\n")), vec!["E031"]);
}

#[test]
fn e032_e033_loop_needs_in_and_iterator() {
    let src = pb("  - step: a\n    loop: { spec: { mode: parallel } }\n    tool: { kind: noop }\n");
    let c = codes(&src);
    assert!(c.contains(&"E032") && c.contains(&"E033"), "{c:?}");
    assert_eq!(at(&src, "E032"), (7, 11));
}

#[test]
fn e034_duplicate_task_names_including_synthetic_ones() {
    let src = pb("  - step: a\n    tool:\n      - { name: t, kind: noop }\n      - { name: t, kind: noop }\n");
    assert_eq!(at(&src, "E034"), (9, 17));
    let synthetic = pb(
        "  - step: a\n    tool:\n      - { name: task_1, kind: noop }\n      - { kind: noop }\n",
    );
    assert!(codes(&synthetic).contains(&"E034"));
    // The same name in two different steps is fine.
    assert_clean(&pb("  - step: a\n    tool: [ { name: t, kind: noop } ]\n    next: { arcs: [ { step: b } ] }\n  - step: b\n    tool: [ { name: t, kind: noop } ]\n"));
}

#[test]
fn e035_duplicate_step_names() {
    let src = pb("  - step: a\n    tool: { kind: noop }\n  - step: a\n    tool: { kind: noop }\n");
    assert_eq!(at(&src, "E035"), (8, 11));
    assert!(message(&src, "E035").message.contains("line 6"));
}

#[test]
fn e036_templates_must_parse_except_python_code() {
    let src = pb("  - step: a\n    tool:\n      - kind: http\n        url: \"{{ workload.url \"\n      - kind: python\n        code: \"x = '{{ not a template'\"\n");
    let all: Vec<_> = diags(&src)
        .into_iter()
        .filter(|d| d.code == "E036")
        .collect();
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0].span.unwrap().line, 9);
    assert_eq!(all[0].path, "/workflow/0/tool/0/url");
    let stmt = pb("  - step: a\n    tool:\n      - kind: noop\n        msg: \"{% if x %}y\"\n");
    assert!(codes(&stmt).contains(&"E036"));
}

#[test]
fn e036_comment_and_statement_openers_alone_are_parsed() {
    // `{#` or `{%` without `{{` still makes a template.
    for text in ["{# unclosed comment", "a {% if x %} b", "{% endfor %}"] {
        let src = pb(&format!(
            "  - step: a\n    tool:\n      - kind: noop\n        result: \"{text}\"\n"
        ));
        assert_eq!(at(&src, "E036"), (9, 17), "{text}");
    }
    assert_clean(&pb(
        "  - step: a\n    tool:\n      - kind: noop\n        result: \"{# a comment #}text\"\n",
    ));
}

#[test]
fn e036_only_a_python_tasks_own_code_is_raw() {
    // `code` elsewhere (an HTTP body, args, a noop) is a template like any field.
    let src = pb("  - step: a\n    tool:\n      - kind: http\n        url: x\n        body: { code: \"{{ oops\" }\n      - kind: noop\n        code: \"{% if %}\"\n      - kind: python\n        args: { code: \"{{ bad\" }\n        code: \"d = {'{{': 1}\"\n");
    let paths: Vec<String> = diags(&src)
        .into_iter()
        .filter(|d| d.code == "E036")
        .map(|d| d.path)
        .collect();
    assert_eq!(
        paths,
        [
            "/workflow/0/tool/0/body/code",
            "/workflow/0/tool/1/code",
            "/workflow/0/tool/2/args/code",
        ]
    );
}

#[test]
fn e037_explicit_empty_tool_list_but_no_tool_is_fine() {
    assert_eq!(at(&pb("  - step: a\n    tool: []\n"), "E037"), (7, 11));
    assert!(codes(&pb("  - step: a\n    tool:\n")).contains(&"E037"));
    let l = assert_ok(&pb("  - step: a\n    desc: routing only\n"));
    assert!(l.playbook.workflow[0].tool.is_empty());
}

// ---------------------------------------------------------------- warnings

#[test]
fn w101_set_alias_is_accepted_and_named() {
    let src = task_with_policy(
        "{ rules: [ { else: true, then: { set: { ctx.a: 1, iter: { b: 2 } } } } ] }",
    );
    let l = assert_ok(&src);
    let w: Vec<_> = l.warnings.iter().collect();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].code, "W101");
    assert!(
        w[0].message.contains("`set_ctx` and `set_iter`"),
        "{}",
        w[0].message
    );
    let then = &l.playbook.workflow[0].tool[0]
        .spec
        .policy
        .as_ref()
        .unwrap()
        .rules[0]
        .then;
    assert_eq!(then.set_ctx.as_ref().unwrap()["a"], 1);
    assert_eq!(then.set_iter.as_ref().unwrap()["b"], 2);
    // A `set` that is not the alias form is an unknown field.
    let bad = task_with_policy("{ rules: [ { else: true, then: { set: { a: 1 } } } ] }");
    assert!(codes(&bad).contains(&"E005"));
}

#[test]
fn w102_unreachable_step() {
    let src = pb(
        "  - step: start\n    tool: { kind: noop }\n  - step: orphan\n    tool: { kind: noop }\n",
    );
    assert_eq!(at(&src, "W102"), (8, 11));
    assert!(load(&src).is_ok());
    // `start` is the entry even when it is not first; the first step then
    // needs an arc too.
    let src = pb("  - step: first\n    tool: { kind: noop }\n  - step: start\n    next: { arcs: [ { step: first } ] }\n");
    assert_clean(&src);
}

#[test]
fn w103_arc_after_unconditional_arc_in_exclusive_mode() {
    let src = pb("  - step: start\n    next:\n      arcs:\n        - step: b\n        - step: c\n          when: \"{{ true }}\"\n  - step: b\n  - step: c\n");
    assert_eq!(at(&src, "W103"), (10, 11));
    let inclusive = pb("  - step: start\n    next:\n      spec: { mode: inclusive }\n      arcs:\n        - step: b\n        - step: c\n  - step: b\n  - step: c\n");
    assert_clean(&inclusive);
}

#[test]
fn w104_set_ctx_in_parallel_loop() {
    let body = |mode: &str| {
        pb(&format!("  - step: a\n    loop: {{ in: [1, 2], iterator: i, spec: {{ mode: {mode} }} }}\n    tool:\n      - kind: noop\n        spec: {{ policy: {{ rules: [ {{ else: true, then: {{ set_ctx: {{ k: 1 }} }} }} ] }} }}\n"))
    };
    assert_eq!(at(&body("parallel"), "W104"), (10, 69));
    assert_clean(&body("sequential"));
    // A key the loop reduces is the intended parallel write: no warning.
    let reduced = body("parallel").replace(
        "spec: { mode: parallel }",
        "spec: { mode: parallel, policy: { reducers: { k: sum } } }",
    );
    assert_clean(&reduced);
}

#[test]
fn w105_loop_arcs_should_test_loop_done() {
    let src = pb("  - step: a\n    loop: { in: [1], iterator: i }\n    tool: { kind: noop }\n    next:\n      arcs:\n        - step: b\n          when: \"{{ event.name == 'step.done' }}\"\n  - step: b\n");
    assert_eq!(at(&src, "W105"), (11, 9));
    let ok = src.replace("step.done", "loop.done");
    assert_clean(&ok);
}

// ---------------------------------------------------------------- all at once

#[test]
fn all_errors_are_reported_at_once_in_source_order() {
    let src = "apiVersion: v\nkind: Playbook\nvars: {}\nmetadata: { name: t }\nworkflow:\n  - step: a\n    when: x\n    tool:\n      - name: t\n        kind: noop\n        spec: { policy: { rules: [ { else: true, then: { do: jump, to: nowhere } } ] } }\n    next: { arcs: [ { step: zz } ] }\n  - step: a\n    tool: []\n";
    let err = load(src).unwrap_err();
    let got: Vec<(&str, usize)> = err
        .diagnostics
        .iter()
        .map(|d| (d.code.as_str(), d.span.unwrap().line))
        .collect();
    assert_eq!(
        got,
        vec![
            ("E002", 3),
            ("E010", 7),
            ("E022", 11),
            ("E030", 12),
            ("E035", 13),
            ("E037", 14)
        ],
        "{err}"
    );
    // Display: one short line per diagnostic.
    let text = err.to_string();
    assert_eq!(text.lines().count(), 6);
    assert!(text.starts_with("t.yaml:3:1: error[E002]: "), "{text}");
}

#[test]
fn w106_an_unknown_top_level_name_in_a_template_is_a_warning_with_a_suggestion() {
    let src = pb(r#"  - step: start
    tool:
      - name: t
        kind: noop
        result: "{{ wrokload.x }}"
"#);
    assert_eq!(at(&src, "W106"), (10, 17));
    let d = diags(&src);
    let w = d.iter().find(|d| d.code == "W106").unwrap();
    assert!(w.message.contains("`wrokload`"), "{}", w.message);
    assert!(
        w.help
            .as_deref()
            .unwrap_or("")
            .contains("did you mean `workload`"),
        "{w:?}"
    );
    // Runtime variables, steps, tasks (named or label-keyed), loop locals
    // and builtins are all known.
    let ok = pb(r#"  - step: start
    tool:
      - fetch: { kind: noop, result: "{{ workload.a }}" }
      - name: t
        kind: noop
        result: "{{ fetch }} {{ t }} {{ ctx.a }} {{ _prev }} {{ range(2) | list }} {% for x in args.xs %}{{ x }}{% endfor %} {{ execution_id }}"
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'step.done' and start is defined }}"
  - step: end
"#);
    assert!(!codes(&ok).contains(&"W106"), "{:#?}", diags(&ok));
    // A loop's iterator read bare in its tasks (NoETL binds it): the help
    // names the canonical spelling.
    let bare = pb(r#"  - step: each
    loop: { in: "{{ [1, 2] }}", iterator: city }
    tool:
      - name: t
        kind: noop
        result: "{{ city.name }}"
"#);
    assert_w106_help(
        &bare,
        "`city`",
        "`city` is the loop's iterator: its element is `iter.city`",
    );
    // A name the template tests for being defined is read knowing it may
    // be missing: no warning, unless it looks like a typo of a known name.
    let guarded = pb(r#"  - step: start
    tool:
      - name: t
        kind: noop
        result: "{{ reply.status if reply is defined else 'none' }} {{ extra | default(1) }}"
      - name: u
        kind: noop
        result: "{{ wrokload.x | default(1) }}"
"#);
    let d = diags(&guarded);
    let w106: Vec<_> = d.iter().filter(|d| d.code == "W106").collect();
    assert_eq!(w106.len(), 1, "{w106:#?}");
    assert!(
        w106[0].message.contains("`wrokload`"),
        "{}",
        w106[0].message
    );
    // A name a `set` writes, read bare (NoETL's variables): the help
    // names `ctx.<name>`.
    let set_read = pb(r#"  - step: start
    tool:
      - name: t
        kind: noop
        spec:
          policy:
            rules:
              - else: { then: { do: continue, set_ctx: { fetched: "{{ outcome.result }}" } } }
      - name: u
        kind: noop
        result: "{{ fetched.rows }}"
"#);
    assert_w106_help(
        &set_read,
        "`fetched`",
        "`fetched` is written by a `set` of the playbook into `ctx`: read it as `ctx.fetched`",
    );
    // NoETL's bare `loop_index` in a loop's task: the help names `iter.index`.
    let index = pb(r#"  - step: each
    loop: { in: "{{ [1, 2] }}", iterator: city }
    tool:
      - name: t
        kind: noop
        result: "{{ loop_index }}"
"#);
    assert_w106_help(
        &index,
        "`loop_index`",
        "the iteration's index is `iter.index`",
    );
}

/// `playbook` gets a W106 whose message names `name` and whose help starts
/// with `help`.
fn assert_w106_help(playbook: &str, name: &str, help: &str) {
    let d = diags(playbook);
    let w = d.iter().find(|d| d.code == "W106").expect("W106");
    assert!(w.message.contains(name), "{}", w.message);
    assert!(w.help.as_deref().unwrap_or("").starts_with(help), "{w:?}");
}

/// A one-task pipeline of `kind` with the task's other lines `fields`
/// (each indented 8 spaces): the task starts on line 8, `kind` is line 9,
/// the first of `fields` line 10.
fn one_task(kind: &str, fields: &[&str]) -> String {
    let mut s = format!("  - step: a\n    tool:\n      - name: t\n        kind: {kind}\n");
    for f in fields {
        s.push_str(&format!("        {f}\n"));
    }
    pb(&s)
}

#[test]
fn e005_every_kind_refuses_a_field_its_tool_does_not_read() {
    // (kind, a valid task's fields, a misspelt field, what it meant)
    let table: &[(&str, &[&str], &str, &str)] = &[
        ("noop", &[], "reslt: 1", "result"),
        ("python", &["code: \"result = 1\""], "agrs: {}", "args"),
        ("http", &["url: http://x"], "header: {}", "headers"),
        (
            "postgres",
            &["command: select 1", "connection: postgresql://u@h/db"],
            "param: []",
            "params",
        ),
        (
            "duckdb",
            &["command: select 1"],
            "databse: d.db",
            "database",
        ),
        ("playbook", &["path: demo/child"], "verison: 2", "version"),
    ];
    for (kind, valid, typo, meant) in table {
        assert_clean(&one_task(kind, valid));
        let mut fields = valid.to_vec();
        fields.push(typo);
        let src = one_task(kind, &fields);
        let line = 10 + valid.len();
        assert_eq!(at(&src, "E005"), (line, 9), "{kind}: at the field");
        let d = message(&src, "E005");
        let field = typo.split(':').next().unwrap();
        assert_eq!(
            d.message,
            format!("unknown field `{field}` in task `t` of step `a` (a {kind} task)"),
            "{kind}"
        );
        let help = d.help.unwrap_or_default();
        assert!(
            help.starts_with(&format!("did you mean `{meant}`?")),
            "{kind}: {help}"
        );
    }
}

#[test]
fn e005_a_legacy_input_field_points_to_args() {
    let src = one_task("python", &["code: \"result = 1\"", "input: { n: 1 }"]);
    assert_eq!(at(&src, "E005"), (11, 9));
    let help = message(&src, "E005").help.unwrap_or_default();
    assert!(
        help.contains("inputs as `args`") && help.contains("noetl migrate"),
        "{help}"
    );
}

#[test]
fn e004_a_tool_field_of_the_wrong_type_and_templates_that_may_render_to_it() {
    let src = one_task("http", &["url: http://x", "headers: [a, b]"]);
    assert_eq!(at(&src, "E004"), (11, 18), "at the value");
    assert_eq!(
        message(&src, "E004").message,
        "`headers` of task `t` of step `a` must be a mapping, found a list"
    );
    let src = one_task("postgres", &["command: [select 1, 2]"]);
    assert_eq!(at(&src, "E004"), (10, 18), "a list of strings only");
    let src = one_task("http", &["url: http://x", "follow_redirects: \"no\""]);
    assert_eq!(at(&src, "E004"), (11, 27));
    // A template renders at run time: it passes for any type.
    assert_clean(&one_task(
        "http",
        &[
            "url: http://x",
            "headers: \"{{ workload.headers }}\"",
            "follow_redirects: \"{{ workload.follow }}\"",
        ],
    ));
    assert_clean(&one_task(
        "postgres",
        &[
            "command: [\"select 1\", \"select 2\"]",
            "transaction: false",
            "connection: \"{{ workload.dsn }}\"",
        ],
    ));
}

#[test]
fn e003_a_tool_without_its_required_field() {
    for (kind, field) in [
        ("python", "code"),
        ("http", "url"),
        ("postgres", "command"),
        ("duckdb", "command"),
    ] {
        let src = one_task(kind, &[]);
        assert_eq!(at(&src, "E003"), (8, 9), "{kind}");
        assert_eq!(
            message(&src, "E003").message,
            format!("task `t` of step `a` (a {kind} task) has no `{field}`")
        );
    }
}

#[test]
fn a_kind_that_is_not_built_in_is_refused_once_not_field_by_field() {
    let src = one_task("custom_kind", &["anything: 1"]);
    assert_eq!(codes(&src), ["E006"]);
}

#[test]
fn w107_a_workload_key_read_bare_is_a_gentle_warning_with_the_canonical_spelling() {
    let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\nworkload:\n  numbers: [1, 2]\nworkflow:\n  - step: a\n    tool:\n      - name: t\n        kind: noop\n        result: \"{{ numbers }}\"\n        spec:\n          policy:\n            rules:\n              - when: \"{{ output.status == 'ok' and _index is none }}\"\n                then: { do: continue }\n      - name: u\n        kind: noop\n        result: \"{{ nmbers }}\"\n";
    let loaded = assert_ok(src);
    let codes: Vec<&str> = loaded.warnings.0.iter().map(|d| d.code.as_str()).collect();
    assert_eq!(codes, ["W107", "W106"], "{:#?}", loaded.warnings);
    let w = &loaded.warnings.0[0];
    assert_eq!(w.span.map(|s| (s.line, s.col)), Some((12, 17)));
    assert_eq!(
        w.message,
        "template reads the workload value `numbers` bare"
    );
    assert!(w
        .help
        .as_deref()
        .unwrap_or("")
        .starts_with("write `workload.numbers`"));
    // `output` and `_index` are runtime variables: no warning for them.
    assert!(loaded.warnings.0[1].message.contains("`nmbers`"));
}

#[test]
fn arc_set_ctx_is_a_mapping_of_templates() {
    assert_clean(&pb(
        "  - step: a\n    next:\n      arcs:\n        - step: b\n          set_ctx: { city: \"{{ event.name }}\", n: 1 }\n  - step: b\n",
    ));
    let src = pb("  - step: a\n    next:\n      arcs:\n        - step: b\n          set_ctx: [city]\n  - step: b\n");
    assert_eq!(at(&src, "E004"), (10, 20));
    assert!(message(&src, "E004").message.contains("arc `set_ctx`"));
    // A control action among the values is data, not a policy.
    assert_ok(&pb(
        "  - step: a\n    next:\n      arcs:\n        - step: b\n          set_ctx: { do: retry }\n  - step: b\n",
    ));
}

#[test]
fn a_playbook_task_takes_return_step_and_timeout() {
    assert_clean(&pb(
        "  - step: a\n    tool:\n      - name: c\n        kind: playbook\n        path: x/y\n        return_step: finish\n        timeout: 30\n",
    ));
    let src = pb(
        "  - step: a\n    tool:\n      - name: c\n        kind: playbook\n        path: x/y\n        return_step: [finish]\n",
    );
    assert!(codes(&src).contains(&"E004"), "{:?}", codes(&src));
}

#[test]
fn e005_noetl_tool_fields_say_what_they_are_and_that_migrate_rewrites_them() {
    // (kind, the task's other fields, NoETL's field, what the hint names)
    let table: &[(&str, &[&str], &str, &str)] = &[
        ("postgres", &[], "query: select 1", "`command`"),
        ("duckdb", &[], "commands: [select 1]", "`command`"),
        (
            "postgres",
            &["command: select 1"],
            "credential: pg",
            "`auth`",
        ),
        (
            "postgres",
            &["command: select 1"],
            "pool: {max: 2}",
            "pooled",
        ),
        ("http", &[], "endpoint: http://x", "`url`"),
        ("http", &["url: http://x"], "data: {q: 1}", "`params`"),
        ("http", &["url: http://x"], "payload: {q: 1}", "`json`"),
        ("http", &["url: http://x"], "timeout: 5", "`spec.timeout`"),
        (
            "http",
            &["url: http://x"],
            "timeout_seconds: 5",
            "`spec.timeout`",
        ),
        (
            "http",
            &["url: http://x"],
            "output_select: [a]",
            "by reference",
        ),
    ];
    for (kind, fields, legacy, names) in table {
        let mut all: Vec<&str> = fields.to_vec();
        all.push(legacy);
        let src = one_task(kind, &all);
        let d = message(&src, "E005");
        let help = d.help.unwrap_or_default();
        assert!(
            help.contains(names) && help.contains("noetl migrate"),
            "{kind} {legacy}: {help}"
        );
    }
}

#[test]
fn verify_ssl_and_a_libs_mapping_are_tool_fields() {
    assert_clean(&one_task("http", &["url: https://x", "verify_ssl: false"]));
    assert_clean(&one_task(
        "python",
        &[
            "code: \"result = json.dumps(dt(2024, 1, 1).year)\"",
            "libs: { json: json, dt: { from: datetime, import: date } }",
        ],
    ));
    let src = one_task("http", &["url: https://x", "verify_ssl: \"no\""]);
    assert_eq!(at(&src, "E004"), (11, 21));
    // NoETL ignores a list: refused, and `noetl migrate` makes it imports.
    let src = one_task("python", &["code: \"result = 1\"", "libs: [math]"]);
    assert_eq!(at(&src, "E004"), (11, 15));
}

/// Issue 40: a name no scope can provide is said before the run, where a
/// condition would read it as false.
#[test]
fn w106_a_workload_key_the_workload_does_not_have_is_a_warning_with_did_you_mean() {
    let src = format!(
        "{}workload:\n  threshold: 3\n  url: http://x\nworkflow:\n  - step: start\n    tool:\n      - name: t\n        kind: noop\n        result: \"{{{{ workload.url | default('y') }}}} {{{{ workload.missing | d('z') }}}}\"\n    next:\n      arcs:\n        - step: end\n          when: \"{{{{ workload.treshold > 2 }}}}\"\n  - step: end\n",
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\n"
    );
    let d = diags(&src);
    let w: Vec<&Diagnostic> = d.iter().filter(|d| d.code == "W106").collect();
    assert_eq!(
        w.len(),
        1,
        "a key read with a default is meant to be missing: {d:#?}"
    );
    assert!(
        w[0].message.contains("`workload.treshold`"),
        "{}",
        w[0].message
    );
    assert!(
        w[0].help
            .as_deref()
            .unwrap_or("")
            .contains("did you mean `workload.threshold`"),
        "{:?}",
        w[0]
    );
    assert_eq!(w[0].span.unwrap().line, 17);
    // Without a declared workload every key comes from the request.
    let open = pb("  - step: start\n    tool:\n      - name: t\n        kind: noop\n        result: \"{{ workload.anything }}\"\n");
    assert!(!codes(&open).contains(&"W106"), "{:#?}", diags(&open));
}

/// Issue 40: an unknown reducer is refused by `validate` (and so by
/// `run`), not by the loop-supervisor once the loop starts.
#[test]
fn e045_an_unknown_reducer_is_refused_with_did_you_mean() {
    let src = pb(r#"  - step: start
    loop:
      in: "{{ workload.items }}"
      iterator: n
      spec:
        mode: parallel
        policy:
          reducers:
            total: summ
            seen: { op: append }
    tool:
      - name: t
        kind: noop
"#);
    assert_eq!(codes(&src), ["E045"], "{:#?}", diags(&src));
    let e = message(&src, "E045");
    assert!(
        e.message
            .contains("unknown reducer `summ` for ctx key `total`"),
        "{}",
        e.message
    );
    assert!(
        e.help
            .as_deref()
            .unwrap_or("")
            .contains("did you mean `sum`"),
        "{e:?}"
    );
    assert_eq!(at(&src, "E045").0, 14);
}

/// Issue 40: the shapes the loop-supervisor refuses at run time are
/// refused by `validate` first: a `loop.in` that cannot give a list, a
/// `max_in_flight` below 1.
#[test]
fn e004_a_loop_collection_or_bound_the_loop_supervisor_would_refuse() {
    let src = pb(r#"  - step: start
    loop:
      in: { a: 1 }
      iterator: n
      spec:
        mode: parallel
        max_in_flight: 0
    tool:
      - name: t
        kind: noop
"#);
    let d = diags(&src);
    let lines: Vec<usize> = d
        .iter()
        .filter(|d| d.code == "E004")
        .map(|d| d.span.unwrap().line)
        .collect();
    assert_eq!(lines, [8, 12], "{d:#?}");
    assert!(
        d[0].message
            .contains("`loop.in` of step `start` must be a list"),
        "{d:#?}"
    );
    let ok = pb(r#"  - step: start
    loop:
      in: "{{ workload.items }}"
      iterator: n
      spec: { mode: parallel, max_in_flight: "{{ workload.n }}" }
    tool:
      - name: t
        kind: noop
"#);
    assert!(!codes(&ok).contains(&"E004"), "{:#?}", diags(&ok));
}

/// Issue 40: the policy of the old `playbooks/hello.yaml` on a python task
/// swallows its errors; a rule that reads `outcome.status` says the
/// catch-all is meant.
#[test]
fn w109_an_else_rule_that_goes_on_over_errors_is_a_warning() {
    let swallow = pb(r#"  - step: start
    tool:
      - name: calc
        kind: python
        code: "result = totl"
        spec:
          policy:
            rules:
              - else:
                  then:
                    set_ctx: { total: "{{ outcome.result }}" }
"#);
    assert_eq!(at(&swallow, "W109"), (14, 17));
    let w = message(&swallow, "W109");
    assert!(w.message.contains("task `calc`"), "{}", w.message);
    assert!(
        w.help
            .as_deref()
            .unwrap_or("")
            .contains("outcome.status == 'error'"),
        "{w:?}"
    );
    let meant = pb(r#"  - step: start
    tool:
      - name: calc
        kind: python
        code: "result = totl"
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: continue }
              - else:
                  then:
                    set_ctx: { total: "{{ outcome.result }}" }
      - name: quiet
        kind: noop
        spec:
          policy:
            rules:
              - else: { then: { set_ctx: { n: 1 } } }
"#);
    assert!(!codes(&meant).contains(&"W109"), "{:#?}", diags(&meant));
}

// ---------------------------------------------------------------- W110, W111

#[test]
fn w110_w111_an_http_tasks_literal_url_and_method_are_checked_as_the_tool_reads_them() {
    let src = pb(
        "  - step: a\n    tool:\n      - name: t\n        kind: http\n        url: htp//example.com\n        method: gett\n",
    );
    // The task would fail with `http.config` whenever it runs: a warning,
    // not refused (the spec's own examples hold `url: "..."`).
    assert!(load(&src).is_ok());
    assert_eq!(at(&src, "W111"), (10, 14));
    let d = message(&src, "W111");
    assert!(d.message.contains("task `t` of step `a`"), "{}", d.message);
    assert!(d.message.contains("relative URL"), "{}", d.message);
    // An extension method is sent as written: a warning, with the closest.
    assert_eq!(at(&src, "W110"), (11, 17));
    assert!(message(&src, "W110")
        .help
        .unwrap()
        .starts_with("did you mean `GET`?"));
    // A scheme of another protocol, or a host without one, too.
    for url in ["ftp://example.com/f", "localhost:8080/x"] {
        let src = pb(&format!(
            "  - step: a\n    tool: {{ kind: http, url: \"{url}\" }}\n"
        ));
        assert!(codes(&src).contains(&"W111"), "{url}: {:#?}", diags(&src));
    }
    // A template is left to run time, `...` is an elision; standard
    // methods in any case pass.
    for (url, method) in [
        ("...", "GET"),
        ("https://api.example.com/x?y=1", "post"),
        ("{{ workload.base }}/items", "GET"),
        ("http://{{ workload.host }}:8080", "{{ workload.method }}"),
    ] {
        let src = pb(&format!(
            "  - step: a\n    tool: {{ kind: http, url: \"{url}\", method: \"{method}\" }}\n"
        ));
        let found = codes(&src);
        assert!(
            !found.contains(&"W111") && !found.contains(&"W110"),
            "{url} {method}: {:#?}",
            diags(&src)
        );
    }
}
