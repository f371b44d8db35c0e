//! Seed rules the loader keeps (docs/dsl.md): the seed spellings of loop
//! and executor settings take effect, what cannot take effect is refused
//! with its reason, and task names read inside their pipeline.

use noetl_core::diagnostic::Diagnostic;
use noetl_core::load::{load_playbook, LoadError, LoadedPlaybook};
use noetl_core::policy::{decide, Decision, PolicyInput};
use noetl_core::template::Scope;
use noetl_core::{LoopMode, Outcome};
use serde_json::json;

/// Document head: 4 lines, `workflow:` is line 5, the first step line 6.
const HEAD: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\n";

fn load(src: &str) -> Result<LoadedPlaybook, LoadError> {
    load_playbook(src, "t.yaml")
}

fn diags(src: &str) -> Vec<Diagnostic> {
    match load(src) {
        Ok(l) => l.warnings.0,
        Err(e) => e.diagnostics.0,
    }
}

/// The diagnostic with `code`; panics with the list.
fn find(src: &str, code: &str) -> Diagnostic {
    let all = diags(src);
    all.iter()
        .find(|d| d.code == code)
        .cloned()
        .unwrap_or_else(|| panic!("no {code} in {all:#?}"))
}

fn loop_doc(spec: &str) -> String {
    format!(
        "{HEAD}workflow:\n  - step: start\n    loop:\n      in: [1, 2]\n      iterator: i\n      spec:\n{spec}    tool: [{{name: t, kind: noop}}]\n"
    )
}

#[test]
fn loop_spec_policy_mode_and_max_in_flight_take_effect() {
    let src = loop_doc("        policy: { mode: parallel, max_in_flight: 4, exec: distributed }\n");
    let pb = load(&src).expect("loads").playbook;
    let spec = &pb.workflow[0].loop_.as_ref().unwrap().spec;
    assert_eq!(spec.mode, LoopMode::Parallel);
    assert_eq!(spec.max_in_flight, Some(json!(4)));
    // Written both ways with the same value: fine.
    let src = loop_doc("        mode: parallel\n        policy: { mode: parallel }\n");
    assert_eq!(
        load(&src).unwrap().playbook.workflow[0]
            .loop_
            .as_ref()
            .unwrap()
            .spec
            .mode,
        LoopMode::Parallel
    );
}

#[test]
fn loop_mode_written_both_ways_must_agree() {
    let src = loop_doc("        mode: sequential\n        policy:\n          mode: parallel\n");
    let e = find(&src, "E004");
    assert_eq!(e.span.unwrap().line, 13);
    assert_eq!(e.path, "/workflow/0/loop/spec/policy/mode");
    assert!(
        e.message.contains("`loop.spec.policy.mode: \"parallel\"` and `loop.spec.mode: \"sequential\"` disagree (line 11)"),
        "{}",
        e.message
    );
}

#[test]
fn loop_exec_is_an_intent_distributed_or_local() {
    assert!(load(&loop_doc("        policy: { exec: local }\n")).is_ok());
    let e = find(&loop_doc("        policy: { exec: everywhere }\n"), "E004");
    assert_eq!(e.path, "/workflow/0/loop/spec/policy/exec");
    assert!(
        e.message.contains("`distributed`, `local`") || e.message.contains("distributed"),
        "{}",
        e.message
    );
}

fn keychain_doc(kind: &str) -> String {
    format!(
        "{HEAD}keychain:\n  - name: openai_token\n    kind: {kind}\nworkflow:\n  - step: start\n"
    )
}

#[test]
fn a_keychain_kind_that_needs_a_cloud_service_is_refused_with_the_reason() {
    let e = find(&keychain_doc("secrets"), "E004");
    assert_eq!(e.span.unwrap().line, 7);
    assert!(
        e.message
            .contains("keychain kind `secrets` is not available here"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("a cloud secret manager"),
        "{}",
        e.message
    );
    let help = e.help.unwrap();
    assert!(
        help.contains("--kind secret") && help.contains("postgres_credential"),
        "{help}"
    );
    let e = find(&keychain_doc("bearr"), "E004");
    assert!(e.help.unwrap().contains("did you mean `bearer`?"));
    for kind in [
        "postgres_credential",
        "bearer",
        "basic",
        "api_key",
        "secret",
    ] {
        assert!(load(&keychain_doc(kind)).is_ok(), "{kind}");
    }
}

fn policy_doc(policy: &str) -> String {
    format!(
        "{HEAD}workflow:\n  - step: start\n    tool:\n      - name: t\n        kind: noop\n        spec:\n          policy:\n{policy}"
    )
}

#[test]
fn on_unmatched_fail_fails_the_task_when_no_rule_matches() {
    let src = policy_doc("            on_unmatched: fail\n            rules:\n              - when: \"{{ outcome.status == 'error' }}\"\n                then: { do: retry }\n");
    let pb = load(&src).expect("loads").playbook;
    let policy = pb.workflow[0].tool[0].spec.policy.clone();
    let ok = Outcome::ok(json!(1));
    let scope = Scope::new().outcome(&ok);
    let d = decide(&PolicyInput {
        policy: policy.as_ref(),
        outcome: &ok,
        attempt: 1,
        scope: &scope,
        retry_after: None,
    })
    .unwrap();
    match d.decision {
        Decision::Fail { reason } => assert!(reason.contains("on_unmatched is fail"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // `continue` (the default) goes on.
    let src = src.replace("on_unmatched: fail", "on_unmatched: continue");
    let policy = load(&src).unwrap().playbook.workflow[0].tool[0]
        .spec
        .policy
        .clone();
    let d = decide(&PolicyInput {
        policy: policy.as_ref(),
        outcome: &ok,
        attempt: 1,
        scope: &scope,
        retry_after: None,
    })
    .unwrap();
    assert_eq!(d.decision, Decision::Continue);
}

#[test]
fn on_unmatched_other_values_are_refused() {
    let src = policy_doc("            on_unmatched: retry\n            rules:\n              - else: { then: { do: continue } }\n");
    let e = find(&src, "E004");
    assert_eq!(e.span.unwrap().line, 12);
    assert!(
        e.message.contains("`on_unmatched: retry` in task `t`"),
        "{}",
        e.message
    );
}

fn executor_doc(spec: &str) -> String {
    format!("{HEAD}executor:\n  spec:\n{spec}workflow:\n  - step: start\n    tool: [{{name: t, kind: noop}}]\n")
}

#[test]
fn executor_policy_limits_and_default_timeouts_take_effect() {
    let src = executor_doc("    policy:\n      limits: { max_payload_bytes: 1048576 }\n      defaults: { timeouts: 7 }\n      results: { reference_first: true }\n");
    let pb = load(&src).expect("loads").playbook;
    let spec = &pb.executor.as_ref().unwrap().spec;
    assert_eq!(spec["limits"]["max_payload_bytes"], 1048576);
    let step = &pb.workflow[0];
    let eff = noetl_core::merge::effective_task_spec(&json!({}), &pb, step, &step.tool[0]);
    assert_eq!(eff["timeout"], 7, "the default task timeout: {eff}");
}

#[test]
fn executor_policy_settings_that_cannot_take_effect_are_refused() {
    let e = find(
        &executor_doc("    policy:\n      defaults: { resources: { cpu: 2 } }\n"),
        "E005",
    );
    assert!(
        e.message
            .contains("executors are sized by their deployment"),
        "{}",
        e.message
    );
    let e = find(
        &executor_doc("    policy:\n      results: { reference_first: false }\n"),
        "E004",
    );
    assert!(
        e.message.contains("always travel by reference"),
        "{}",
        e.message
    );
    let e = find(&executor_doc("    policy:\n      placement: gpu\n"), "E005");
    assert_eq!(e.path, "/executor/spec/policy/placement");
    let e = find(
        &executor_doc("    limits: { max_payload_byte: 10 }\n"),
        "E005",
    );
    assert!(e
        .help
        .unwrap()
        .contains("did you mean `max_payload_bytes`?"));
    let e = find(
        &executor_doc("    limits: { max_payload_bytes: 10 }\n    policy:\n      limits: { max_payload_bytes: 20 }\n"),
        "E004",
    );
    assert_eq!(e.span.unwrap().line, 9);
    assert!(e.message.contains("disagree"), "{}", e.message);
}

fn pipeline_doc(tasks: &str, arcs: &str) -> String {
    format!("{HEAD}workflow:\n  - step: start\n    tool:\n{tasks}{arcs}  - step: end\n")
}

#[test]
fn a_task_reads_an_earlier_task_of_its_pipeline_by_name_without_a_warning() {
    let src = pipeline_doc(
        "      - { name: fetch, kind: noop }\n      - { name: use, kind: noop, result: \"{{ fetch.rows }}\" }\n",
        "    next: { arcs: [ { step: end } ] }\n",
    );
    let all = diags(&src);
    assert!(
        all.iter().all(|d| d.code != "W106" && d.code != "W108"),
        "{all:#?}"
    );
}

#[test]
fn a_task_that_reads_a_later_task_is_warned() {
    let src = pipeline_doc(
        "      - { name: use, kind: noop, result: \"{{ fetch.rows }}\" }\n      - { name: fetch, kind: noop }\n",
        "    next: { arcs: [ { step: end } ] }\n",
    );
    let w = find(&src, "W108");
    assert_eq!(w.span.unwrap().line, 8);
    assert!(
        w.message
            .contains("task `use` of step `start` reads `fetch`"),
        "{}",
        w.message
    );
    // With a jump in the pipeline the later task may have run first.
    let jumping = src.replace(
        "{ name: fetch, kind: noop }",
        "{ name: fetch, kind: noop, spec: { policy: { rules: [ { when: \"{{ false }}\", then: { do: jump, to: use } } ] } } }",
    );
    assert!(diags(&jumping).iter().all(|d| d.code != "W108"));
}

#[test]
fn a_task_name_outside_its_pipeline_is_unknown() {
    let src = pipeline_doc(
        "      - { name: fetch, kind: noop }\n",
        "    next: { arcs: [ { step: end, args: { n: \"{{ fetch.rows }}\" } } ] }\n",
    );
    let w = find(&src, "W106");
    assert!(w
        .help
        .unwrap()
        .contains("`fetch` is a task of step `start`"));
}
