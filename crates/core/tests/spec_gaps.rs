//! The spec's smaller gaps (issue 36, item 6) as `noetl validate` and
//! `noetl run` see them (both load through `load_playbook`): `loop.done`
//! and `loop.*` where no loop runs (E046), the authoring sugar `choose`,
//! `while` and `until` (E047), admission rules that read a step's result
//! (accepted: the scheduler renders them with the step results).

use noetl_core::diagnostic::Diagnostic;
use noetl_core::load::load_playbook;

const HEAD: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\nworkflow:\n";

fn diags(workflow: &str) -> Vec<Diagnostic> {
    match load_playbook(&format!("{HEAD}{workflow}"), "t.yaml") {
        Ok(l) => l.warnings.0,
        Err(e) => e.diagnostics.0,
    }
}

/// The diagnostics with `code`, as `(line, message)`.
fn with(workflow: &str, code: &str) -> Vec<(usize, String)> {
    diags(workflow)
        .into_iter()
        .filter(|d| d.code == code)
        .map(|d| (d.span.map(|s| s.line).unwrap_or(0), d.message))
        .collect()
}

const LOOP_STEP: &str = r#"  - step: start
    loop: { in: "{{ [1, 2] }}", iterator: n }
    tool:
      - name: each
        kind: noop
        result: { i: "{{ loop.index }}", first: "{{ loop.first }}" }
    next:
      arcs:
        - step: done
          when: "{{ event.name == 'loop.done' }}"
          args: { total: "{{ event.counts.total }}" }
  - step: done
"#;

#[test]
fn loop_reads_in_a_loop_steps_tasks_and_the_loop_done_event_are_accepted() {
    assert_eq!(diags(LOOP_STEP), vec![]);
}

#[test]
fn loop_done_read_as_a_variable_is_refused_at_its_line() {
    let wf = LOOP_STEP.replace("event.name == 'loop.done'", "loop.done");
    let found = with(&wf, "E046");
    assert_eq!(found.len(), 1, "{found:?}");
    let (line, message) = &found[0];
    assert_eq!(*line, 15, "the arc's `when`");
    assert!(
        message.contains("`loop.done`") && message.contains("event"),
        "{message}"
    );
}

#[test]
fn loop_done_is_refused_even_inside_a_loop_task() {
    let wf = LOOP_STEP.replace("{{ loop.first }}", "{{ loop.done }}");
    let found = with(&wf, "E046");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, 11);
}

#[test]
fn loop_reads_where_no_loop_runs_are_refused_naming_the_place() {
    // An arc of the loop step: it runs once, when the loop has ended.
    let wf = LOOP_STEP.replace("event.counts.total", "loop.length");
    let found = with(&wf, "E046");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, 16);
    assert!(
        found[0].1.contains("`loop.length`") && found[0].1.contains("arcs of loop step `start`"),
        "{}",
        found[0].1
    );
    // A step without `loop`.
    let wf = "  - step: start\n    tool:\n      - name: a\n        kind: noop\n        result: \"{{ loop.index }}\"\n";
    let found = with(wf, "E046");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, 10);
    assert!(
        found[0]
            .1
            .contains("task of step `start`, which has no `loop`"),
        "{}",
        found[0].1
    );
    // Admission of a loop step: before any iteration.
    let wf = LOOP_STEP.replace(
        "    loop:",
        "    spec: { policy: { admit: { rules: [ { when: \"{{ loop.first }}\", then: { allow: true } } ] } } }\n    loop:",
    );
    let found = with(&wf, "E046");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].1.contains("spec of step `start`"),
        "{}",
        found[0].1
    );
}

#[test]
fn a_jinja_for_blocks_own_loop_is_not_the_loop_variable() {
    let wf = "  - step: start\n    tool:\n      - name: a\n        kind: noop\n        result: \"{% for x in [1, 2] %}{{ loop.index }}{% endfor %}\"\n";
    assert_eq!(with(wf, "E046"), vec![]);
}

#[test]
fn authoring_sugar_is_refused_by_name_not_as_a_task_without_kind() {
    for (sugar, body) in [
        (
            "choose",
            "\n          - when: \"{{ ctx.a }}\"\n            then: [{ name: x, kind: noop }]",
        ),
        (
            "while",
            " { when: \"{{ ctx.more }}\", do: [{ name: x, kind: noop }] }",
        ),
        (
            "until",
            " { when: \"{{ ctx.done }}\", do: [{ name: x, kind: noop }] }",
        ),
    ] {
        let wf = format!("  - step: start\n    tool:\n      - name: first\n        kind: noop\n      - {sugar}:{body}\n");
        let all = diags(&wf);
        let e: Vec<&Diagnostic> = all.iter().filter(|d| d.code == "E047").collect();
        assert_eq!(e.len(), 1, "{sugar}: {all:#?}");
        assert_eq!(e[0].span.map(|s| s.line), Some(10), "{sugar}");
        assert!(
            e[0].message.contains(&format!("authoring sugar `{sugar}`")),
            "{}",
            e[0].message
        );
        assert!(
            e[0].help.as_deref().unwrap_or("").contains("jump"),
            "{:?}",
            e[0].help
        );
        assert!(
            !all.iter().any(|d| d.message.contains("no `kind`")),
            "{sugar}: {all:#?}"
        );
    }
    // At step level too.
    let found = with("  - step: start\n    until: \"{{ ctx.done }}\"\n", "E047");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].1.contains("`until`"), "{}", found[0].1);
}

#[test]
fn admission_rules_may_read_an_earlier_steps_result() {
    let wf = r#"  - step: start
    tool: { kind: noop, result: { go: true } }
    next: { arcs: [ { step: gated } ] }
  - step: gated
    spec:
      policy:
        admit:
          rules:
            - when: "{{ start.go }}"
              then: { allow: true }
            - else:
                then: { allow: false }
"#;
    assert_eq!(diags(wf), vec![]);
}
