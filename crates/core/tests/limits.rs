//! Every limit of `noetl_core::limits` refuses with a clear error: the
//! limit's name, the actual size and where (docs/architecture.md, "Limits").

use noetl_core::limits::{
    MAX_ARCS, MAX_PLAYBOOK_BYTES, MAX_STEPS, MAX_TEMPLATE_OUTPUT_BYTES, MAX_YAML_DEPTH,
};
use noetl_core::load::{load_playbook, LoadError};
use noetl_core::template::{render_str, render_text, Scope, TemplateError};
use serde_json::json;

const HEAD: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: big }\n";

fn refused(src: &str) -> LoadError {
    match load_playbook(src, "hostile.yaml") {
        Ok(_) => panic!("a playbook beyond a limit was accepted"),
        Err(e) => e,
    }
}

fn codes(e: &LoadError) -> Vec<&'static str> {
    e.diagnostics.errors().map(|d| d.code.as_str()).collect()
}

/// A chain of `n` noop steps, each with `arcs` arcs to the next.
fn chain(n: usize, arcs: usize) -> String {
    let mut s = format!("{HEAD}workflow:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  - step: {}\n    tool: [{{ kind: noop }}]\n",
            step(i)
        ));
        if i + 1 < n {
            s.push_str("    next:\n      spec: { mode: inclusive }\n      arcs:\n");
            for _ in 0..arcs {
                s.push_str(&format!("        - step: {}\n", step(i + 1)));
            }
        }
    }
    s
}

fn step(i: usize) -> String {
    if i == 0 {
        "start".into()
    } else {
        format!("s{i}")
    }
}

#[test]
fn a_playbook_above_the_size_limit_is_refused_with_e040() {
    let pad = "#".repeat(MAX_PLAYBOOK_BYTES);
    let src = format!("{}{pad}\n", chain(2, 1));
    let e = refused(&src);
    assert_eq!(codes(&e), vec!["E040"]);
    let msg = e.to_string();
    assert!(msg.starts_with("hostile.yaml:1:1"), "{msg}");
    assert!(msg.contains("max_playbook_bytes"), "{msg}");
    assert!(msg.contains(&src.len().to_string()), "{msg}");
    // The human rendering works without the (refused) text.
    assert!(e.render_human().contains("E040"));
    // A file is refused by its size, before it is read.
    let dir = std::env::temp_dir().join(format!("noetl-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("big.yaml");
    std::fs::write(&file, &src).unwrap();
    let e = noetl_core::load::load_file(&file).unwrap_err();
    assert_eq!(codes(&e), vec!["E040"]);
    assert!(e.to_string().contains(&src.len().to_string()), "{e}");
    assert!(e.to_string().contains("big.yaml:1:1"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn yaml_nested_beyond_the_limit_is_refused_with_e041() {
    let deep = format!(
        "{HEAD}workload:\n  x: {}1{}\n",
        "[".repeat(MAX_YAML_DEPTH),
        "]".repeat(MAX_YAML_DEPTH)
    );
    let e = refused(&deep);
    assert_eq!(codes(&e), vec!["E041"]);
    let msg = e.to_string();
    assert!(msg.contains("hostile.yaml:5:"), "{msg}");
    assert!(msg.contains("max_yaml_depth"), "{msg}");
}

#[test]
fn alias_bombs_are_refused_with_e042_without_expanding() {
    let mut src = format!("{HEAD}workload:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let p = i - 1;
        src.push_str(&format!(
            "  a{i}: &a{i} [{}]\n",
            vec![format!("*a{p}"); 10].join(", ")
        ));
    }
    let started = std::time::Instant::now();
    let e = refused(&src);
    assert_eq!(codes(&e), vec!["E042"]);
    let msg = e.to_string();
    assert!(msg.contains("max_alias_expansion"), "{msg}");
    assert!(msg.contains("hostile.yaml:"), "{msg}");
    assert!(
        started.elapsed().as_secs() < 5,
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn too_many_steps_is_refused_with_e043() {
    assert!(load_playbook(&chain(50, 1), "ok.yaml").is_ok());
    let e = refused(&chain(MAX_STEPS + 1, 1));
    assert_eq!(codes(&e), vec!["E043"]);
    let msg = e.to_string();
    assert!(msg.contains("max_steps"), "{msg}");
    assert!(msg.contains(&(MAX_STEPS + 1).to_string()), "{msg}");
    // Positioned at the first step past the limit.
    let line = 5 + 6 * MAX_STEPS;
    assert!(msg.contains(&format!("hostile.yaml:{line}:")), "{msg}");
}

#[test]
fn too_many_arcs_is_refused_with_e044() {
    let per_step = MAX_ARCS / 4 + 1;
    let e = refused(&chain(6, per_step));
    assert_eq!(codes(&e), vec!["E044"]);
    let msg = e.to_string();
    assert!(msg.contains("max_arcs"), "{msg}");
    assert!(
        msg.contains("/workflow/3/next/arcs") || msg.contains("hostile.yaml:"),
        "{msg}"
    );
}

#[test]
fn template_text_output_is_bounded() {
    let scope = Scope::new().workload(json!({"n": 40}));
    // 40 x 1 MiB of text: above the limit, refused while rendering.
    let src = "{% for i in range(workload.n) %}{{ 'x' * 1048576 }}{% endfor %}";
    let e = render_text(src, &scope).unwrap_err();
    assert!(matches!(e, TemplateError::TooLarge { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("max_template_output_bytes"), "{msg}");
    assert!(
        msg.contains(&MAX_TEMPLATE_OUTPUT_BYTES.to_string()),
        "{msg}"
    );
    assert!(
        msg.contains("range(workload.n)"),
        "names the template: {msg}"
    );
    // Below the limit the same template renders.
    let small = Scope::new().workload(json!({"n": 2}));
    assert_eq!(render_text(src, &small).unwrap().len(), 2 * 1048576);
}

#[test]
fn template_native_output_is_bounded() {
    let scope = Scope::new();
    let e = render_str("{{ 'abcd' * 10000000 }}", &scope).unwrap_err();
    assert!(matches!(e, TemplateError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("max_template_output_bytes"), "{e}");
    assert_eq!(
        render_str("{{ 'ab' * 3 }}", &scope).unwrap(),
        json!("ababab")
    );
    // A list built by repetition is measured before it is materialised.
    let started = std::time::Instant::now();
    let e = render_str("{{ ['x' * 1024] * 100000 }}", &scope).unwrap_err();
    assert!(matches!(e, TemplateError::TooLarge { .. }), "{e}");
    assert!(
        started.elapsed().as_secs() < 20,
        "took {:?}",
        started.elapsed()
    );
    let e = render_text("list: {{ ['x' * 1024] * 100000 }}", &scope).unwrap_err();
    assert!(e.to_string().contains("max_template_output_bytes"), "{e}");
    // Reading a large value is not building one: data never fails for size.
    let big = "x".repeat(MAX_TEMPLATE_OUTPUT_BYTES + 1);
    let data = Scope::new().workload(json!({"big": big}));
    let v = render_str("{{ workload.big }}", &data).unwrap();
    assert_eq!(
        v.as_str().map(str::len),
        Some(MAX_TEMPLATE_OUTPUT_BYTES + 1)
    );
}

#[test]
fn template_work_is_bounded_by_fuel() {
    let scope = Scope::new();
    let src = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}";
    let started = std::time::Instant::now();
    let e = render_text(src, &scope).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("max_template_fuel"), "{msg}");
    assert!(
        started.elapsed().as_secs() < 10,
        "took {:?}",
        started.elapsed()
    );
}
