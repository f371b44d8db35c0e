//! Properties of the loader on generated input (proptest, in the normal test
//! run): normalising is idempotent, validation and loading never panic, and
//! every playbook that loads round-trips through JSON unchanged.

use noetl_core::diagnostic::Diagnostics;
use noetl_core::load::load_playbook;
use noetl_core::normalize::normalize;
use noetl_core::template::{render_str, Scope};
use noetl_core::validate::validate;
use noetl_core::yaml::{parse, Node};
use noetl_core::Playbook;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Keys the loader knows, so generated documents reach deep rules.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "workload",
    "workflow",
    "workbook",
    "executor",
    "keychain",
    "step",
    "tool",
    "next",
    "arcs",
    "spec",
    "loop",
    "in",
    "iterator",
    "when",
    "name",
    "args",
    "policy",
    "rules",
    "then",
    "do",
    "else",
    "set_ctx",
    "set_iter",
    "to",
    "attempts",
    "backoff",
    "mode",
    "result",
    "code",
    "url",
    "x",
];

const STRINGS: &[&str] = &[
    "noop",
    "python",
    "http",
    "start",
    "end",
    "continue",
    "retry",
    "jump",
    "break",
    "fail",
    "{{ ctx.x }}",
    "{{ workload.items }}",
    "{{ outcome.status == 'error' }}",
    "{% if x %}y{% endif %}",
    "{{",
    "sequential",
    "parallel",
    "inclusive",
    "exclusive",
    "Playbook",
    "noetl.io/v2",
    "",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|i| json!(i)),
        proptest::sample::select(STRINGS).prop_map(|s| json!(s)),
        "[a-z{}% ]{0,12}".prop_map(Value::String),
    ]
}

/// JSON documents shaped like (broken) playbooks.
fn doc() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::vec((proptest::sample::select(KEYS), inner), 0..6).prop_map(
                |kv| {
                    let mut m = Map::new();
                    for (k, v) in kv {
                        m.insert(k.to_string(), v);
                    }
                    Value::Object(m)
                }
            ),
        ]
    })
}

fn node(v: &Value) -> Node {
    Node::from_json(v, Default::default())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// normalise(normalise(x)) == normalise(x), for any document.
    #[test]
    fn normalise_is_idempotent(v in doc()) {
        let mut d = Diagnostics::default();
        let once = normalize(&node(&v), &mut d);
        let twice = normalize(&once, &mut Diagnostics::default());
        prop_assert_eq!(once.to_json(), twice.to_json());
    }

    /// Validation of anything normalised returns diagnostics, never panics.
    #[test]
    fn validate_never_panics(v in doc()) {
        let n = normalize(&node(&v), &mut Diagnostics::default());
        let _ = validate(&n);
    }

    /// Loading YAML text never panics: it loads or names a problem.
    #[test]
    fn load_never_panics_on_arbitrary_text(src in "[ -~\n\t]{0,200}") {
        if let Err(e) = load_playbook(&src, "gen.yaml") {
            prop_assert!(e.diagnostics.has_errors());
            prop_assert!(e.to_string().starts_with("gen.yaml:"));
        }
    }

    /// The YAML of a generated document loads the same way its JSON does.
    #[test]
    fn load_never_panics_on_generated_documents(v in doc()) {
        let src = serde_json::to_string(&v).unwrap();
        match load_playbook(&src, "gen.json") {
            Ok(p) => {
                // A loaded playbook round-trips through its JSON form.
                let back: Playbook = serde_json::from_value(
                    serde_json::to_value(&p.playbook).unwrap()
                ).unwrap();
                prop_assert_eq!(back, p.playbook);
            }
            Err(e) => prop_assert!(e.diagnostics.has_errors()),
        }
    }

    /// Rendering any text as a template never panics.
    #[test]
    fn render_never_panics(src in "[a-z0-9 {}%#|.()'\"*+-]{0,60}") {
        let scope = Scope::new().workload(json!({"items": [1, 2]})).ctx(json!({"x": 1}));
        let _ = render_str(&src, &scope);
    }

    /// Parsing then printing YAML is stable: parse(json(parse(s))) == parse(s).
    #[test]
    fn yaml_parse_is_stable(v in doc()) {
        let src = serde_json::to_string(&v).unwrap();
        let first = parse(&src).unwrap().to_json();
        let again = parse(&serde_json::to_string(&first).unwrap()).unwrap().to_json();
        prop_assert_eq!(first, again);
    }
}

#[test]
fn every_sample_playbook_round_trips_and_normalises_to_a_fixed_point() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../playbooks");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        let raw = parse(&src).unwrap();
        let once = normalize(&raw, &mut Diagnostics::default());
        let twice = normalize(&once, &mut Diagnostics::default());
        assert_eq!(once.to_json(), twice.to_json(), "{}", path.display());
        if let Ok(p) = load_playbook(&src, &path.display().to_string()) {
            let back: Playbook =
                serde_json::from_value(serde_json::to_value(&p.playbook).unwrap()).unwrap();
            assert_eq!(back, p.playbook, "{}", path.display());
            seen += 1;
        }
    }
    assert!(seen >= 10, "only {seen} sample playbooks loaded");
}
