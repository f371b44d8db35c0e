//! The playbook loader (YAML parse, normalise, validate, type) on arbitrary
//! text: it loads or returns diagnostics, never panics, and what loads
//! normalises to a fixed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use noetl_core::diagnostic::Diagnostics;
use noetl_core::normalize::normalize;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    match noetl_core::load::load_playbook(src, "fuzz.yaml") {
        Ok(p) => {
            let json = serde_json::to_value(&p.playbook).expect("a playbook serialises");
            let back: noetl_core::Playbook =
                serde_json::from_value(json).expect("a loaded playbook reads back");
            assert_eq!(back, p.playbook);
        }
        Err(e) => {
            assert!(e.diagnostics.has_errors());
            let _ = e.render_human();
        }
    }
    if let Ok(raw) = noetl_core::yaml::parse(src) {
        let once = normalize(&raw, &mut Diagnostics::default());
        let twice = normalize(&once, &mut Diagnostics::default());
        assert_eq!(once.to_json(), twice.to_json(), "normalise is idempotent");
        let _ = noetl_core::validate::validate(&once);
    }
});
