//! Normalisation: every authoring shape becomes the canonical form, the
//! result is a fixed point, and positions survive into the source map.

use noetl_core::diagnostic::Diagnostics;
use noetl_core::load::load_playbook;
use noetl_core::normalize::{normalize, normalize_value};
use noetl_core::yaml::parse;
use serde_json::{json, Value};

fn norm(src: &str) -> (Value, Diagnostics) {
    let mut d = Diagnostics::default();
    let out = normalize(&parse(src).unwrap(), &mut d).to_json();
    (out, d)
}

const SHAPES: &str = "\
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: shapes }
workload:
keychain:
workflow:
  - step: start
    tool:
      - fetch: { kind: http, url: x }
      - kind: noop
      - name: keep
        kind: noop
        spec:
          policy:
            rules:
              - when: true
                then: { do: continue }
              - else: null
                then: { do: jump, to: fetch }
    next:
      arcs:
        - { step: single, when: false }
  - step: single
    spec:
      policy:
        admit:
          rules:
            - else:
                then: { allow: true }
    tool: { kind: python, code: 'x' }
  - step: labelled_single
    tool: { only: { kind: noop } }
";

#[test]
fn every_task_shape_becomes_canonical() {
    let (j, d) = norm(SHAPES);
    assert!(d.is_empty(), "{d:?}");
    let tools = &j["workflow"][0]["tool"];
    assert_eq!(
        tools[0],
        json!({"name": "fetch", "kind": "http", "url": "x"})
    );
    assert_eq!(tools[1], json!({"name": "task_1", "kind": "noop"}));
    assert_eq!(tools[2]["name"], "keep");
    assert_eq!(
        j["workflow"][1]["tool"],
        json!([{"name": "single_task", "kind": "python", "code": "x"}])
    );
    assert_eq!(
        j["workflow"][2]["tool"],
        json!([{"name": "only", "kind": "noop"}])
    );
}

#[test]
fn rules_get_the_canonical_else_and_string_when() {
    let (j, _) = norm(SHAPES);
    let rules = &j["workflow"][0]["tool"][2]["spec"]["policy"]["rules"];
    assert_eq!(rules[0]["when"], "true");
    assert_eq!(
        rules[1],
        json!({"else": true, "then": {"do": "jump", "to": "fetch"}})
    );
    assert_eq!(
        j["workflow"][1]["spec"]["policy"]["admit"]["rules"][0],
        json!({"else": true, "then": {"allow": true}})
    );
    assert_eq!(j["workflow"][0]["next"]["arcs"][0]["when"], "false");
}

#[test]
fn empty_optional_sections_are_dropped() {
    let (j, _) = norm(SHAPES);
    assert!(j.get("workload").is_none() && j.get("keychain").is_none());
    assert!(load_playbook(SHAPES, "s.yaml").is_ok());
}

#[test]
fn set_alias_merges_into_set_ctx_and_set_iter() {
    let src = "workflow:\n  - step: a\n    tool:\n      - kind: noop\n        spec:\n          policy:\n            rules:\n              - else:\n                  then:\n                    set_ctx: { a: 0, keep: 1 }\n                    set: { ctx.a: 1, ctx: { b: 2 }, iter.c: 3 }\n";
    let (j, d) = norm(src);
    let then = &j["workflow"][0]["tool"][0]["spec"]["policy"]["rules"][0]["then"];
    assert_eq!(then["set_ctx"], json!({"keep": 1, "a": 1, "b": 2}));
    assert_eq!(then["set_iter"], json!({"c": 3}));
    assert!(then.get("set").is_none());
    assert_eq!(d.codes(), vec!["W101"]);
    assert_eq!(
        d.0[0].path,
        "/workflow/0/tool/0/spec/policy/rules/0/then/set"
    );
}

#[test]
fn normalisation_is_idempotent() {
    for src in [SHAPES, include_str!("fixtures/valid/pagination.yaml")] {
        let (once, _) = norm(src);
        let (twice, d) = normalize_value(&once);
        assert_eq!(once, twice);
        assert!(d.is_empty(), "a second pass warns: {d:?}");
        let (thrice, _) = normalize_value(&twice);
        assert_eq!(twice, thrice);
    }
}

#[test]
fn source_map_points_normalised_nodes_at_their_source() {
    let l = load_playbook(SHAPES, "s.yaml").unwrap();
    let pos = |p: &str| {
        let s = l.source_map.lookup(p).unwrap();
        (s.line, s.col)
    };
    // The synthesised name of a label-keyed task sits on its label.
    assert_eq!(pos("/workflow/0/tool/0/name"), (9, 9));
    assert_eq!(pos("/workflow/0/tool/0/url"), (9, 35));
    // An unnamed task's synthetic name sits on the task.
    assert_eq!(pos("/workflow/0/tool/1/name"), (10, 9));
    // Unknown pointers fall back to the nearest ancestor.
    assert_eq!(pos("/workflow/0/tool/2/nothing/here"), (11, 9));
    assert!(l.source_map.len() > 20);
    assert_eq!(l.source_name, "s.yaml");
    assert_eq!(l.playbook.workflow[0].tool[1].name, "task_1");
    assert_eq!(l.playbook.entry_step().unwrap().step, "start");
}
