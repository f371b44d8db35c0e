//! The execution-request decoder (JSON or protobuf) on arbitrary bytes: a
//! request or an error, never a panic; what decodes round-trips through
//! protobuf.
#![no_main]

use libfuzzer_sys::fuzz_target;
use noetl_wire::codec::{decode, decode_execution_request, encode};
use noetl_wire::ExecutionRequest;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = decode_execution_request(data) {
        let again: ExecutionRequest = decode("request", &encode(&r)).expect("re-encoded request");
        assert_eq!(again, r);
    }
});
