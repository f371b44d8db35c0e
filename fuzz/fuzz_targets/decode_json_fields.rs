//! The JSON fields of wire messages (args, payloads, iter, reduce) on
//! arbitrary bytes: a value or an error, never a panic; values round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use noetl_wire::codec::{json_bytes, json_object, json_value};

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = json_value(data) {
        assert_eq!(json_value(&json_bytes(&v)).expect("re-encoded JSON"), v);
    }
    let _ = json_object(data);
});
