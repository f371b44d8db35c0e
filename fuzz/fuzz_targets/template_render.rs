//! The template renderer on arbitrary templates, against a scope with every
//! root: render, text render, conditions and syntax checks never panic and
//! stay within the output limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use noetl_core::limits::MAX_TEMPLATE_OUTPUT_BYTES;
use noetl_core::template::{
    check_syntax, eval_condition, referenced_roots, render_str, render_text, Scope,
};
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    let scope = Scope::new()
        .workload(json!({"items": [1, 2, 3], "name": "Ada", "obj": {"a": 1}}))
        .ctx(json!({"x": 1, "s": "text"}))
        .iter(json!({"i": 0}))
        .args(json!({"id": 7}))
        .execution_id("e-fuzz")
        .step_result("fetch", json!({"rows": [{"a": 1}]}));
    let _ = check_syntax(src);
    let _ = referenced_roots(src);
    if let Ok(v) = render_str(src, &scope) {
        assert!(serde_json::to_vec(&v).unwrap().len() <= MAX_TEMPLATE_OUTPUT_BYTES + 2);
    }
    if let Ok(t) = render_text(src, &scope) {
        assert!(t.len() <= MAX_TEMPLATE_OUTPUT_BYTES);
    }
    let _ = eval_condition(src, &scope);
});
