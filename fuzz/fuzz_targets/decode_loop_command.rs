//! The LoopCommand decoder on arbitrary bytes: a message or an error, never a
//! panic; what decodes re-encodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use noetl_wire::codec::{decode, encode};
use noetl_wire::LoopCommand;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode::<LoopCommand>("loop_command", data) {
        let again =
            decode::<LoopCommand>("loop_command", &encode(&m)).expect("re-encoded message decodes");
        assert_eq!(again, m);
    }
});
