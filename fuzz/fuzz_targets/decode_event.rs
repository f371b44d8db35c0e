//! The event decoder (protobuf or JSON) on arbitrary bytes: an event or an
//! error, never a panic; what decodes re-encodes, both ways, to the same
//! event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use noetl_wire::codec::{decode_event, encode, event_json};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_event(data) {
        let again = decode_event(&encode(&m)).expect("re-encoded event decodes");
        assert_eq!(again, m);
        if let Ok(text) = event_json(&m) {
            let back = decode_event(&text).expect("an event as JSON decodes");
            assert_eq!(back.event_id, m.event_id);
            assert_eq!(back.event_type, m.event_type);
        }
    }
});
