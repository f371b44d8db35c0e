//! Properties of the wire codec (proptest, in the normal test run):
//! decode(encode(x)) == x for every message type, and every decoder turns
//! arbitrary bytes into a message or a `DecodeError`, never a panic.

use noetl_wire::codec::{self, decode, decode_execution_request, encode};
use noetl_wire::{
    Event, ExecutionRequest, IterationRef, LoopCommand, ResultRef, TaskCommand, Token,
};
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9._:/-]{1,24}", any::<String>()]
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        Just(br#"{"a":1}"#.to_vec()),
        proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

fn iteration() -> impl Strategy<Value = IterationRef> {
    (text(), any::<u64>(), bytes(), bytes(), any::<u64>()).prop_map(
        |(loop_run_id, index, iter_json, reduce_json, total)| IterationRef {
            loop_run_id,
            index,
            iter_json,
            reduce_json,
            total,
        },
    )
}

fn task_command() -> impl Strategy<Value = TaskCommand> {
    (
        (text(), text(), text(), text(), any::<u32>(), any::<u32>()),
        (
            bytes(),
            bytes(),
            proptest::option::of(iteration()),
            any::<u64>(),
        ),
        (text(), any::<u64>(), bytes(), any::<u64>(), text(), bytes()),
    )
        .prop_map(
            |(
                (command_id, execution_id, step, step_run_id, pc, attempt),
                (args_json, prev_json, iteration, not_before_ms),
                (
                    trace_id,
                    steps_taken,
                    resume_outcome_json,
                    deadline_ms,
                    deadline_of,
                    results_json,
                ),
            )| TaskCommand {
                command_id,
                execution_id,
                step,
                step_run_id,
                pc,
                attempt,
                args_json,
                prev_json,
                iteration,
                not_before_ms,
                trace_id,
                steps_taken,
                resume_outcome_json,
                deadline_ms,
                deadline_of,
                results_json,
                claim: None,
                handled_json: Vec::new(),
                batch: Vec::new(),
            },
        )
}

fn execution_request() -> impl Strategy<Value = ExecutionRequest> {
    (
        (text(), text(), any::<u32>(), text(), bytes()),
        (
            text(),
            text(),
            text(),
            proptest::option::of(task_command()),
            bytes(),
        ),
    )
        .prop_map(
            |(
                (execution_id, path, version, playbook_yaml, workload_json),
                (parent_execution_id, source_name, trace_id, parent_resume, parent_iter_json),
            )| ExecutionRequest {
                execution_id,
                path,
                version,
                playbook_yaml,
                workload_json,
                parent_execution_id,
                source_name,
                trace_id,
                parent_resume,
                parent_iter_json,
                ..Default::default()
            },
        )
}

fn token() -> impl Strategy<Value = Token> {
    (text(), text(), text(), bytes(), text(), text(), text()).prop_map(
        |(token_id, execution_id, step, args_json, trace_id, parent_step_run_id, parent_step)| {
            Token {
                token_id,
                execution_id,
                step,
                args_json,
                trace_id,
                parent_step_run_id,
                parent_step,
            }
        },
    )
}

fn loop_command() -> impl Strategy<Value = LoopCommand> {
    (
        (text(), text(), text(), text()),
        (bytes(), text(), any::<u64>(), text()),
    )
        .prop_map(
            |(
                (command_id, execution_id, step, step_run_id),
                (args_json, trace_id, deadline_ms, deadline_of),
            )| LoopCommand {
                command_id,
                execution_id,
                step,
                step_run_id,
                args_json,
                trace_id,
                deadline_ms,
                deadline_of,
            },
        )
}

fn event() -> impl Strategy<Value = Event> {
    (
        (text(), text(), text(), text(), text(), text()),
        (text(), text(), text(), text(), bytes(), any::<u64>()),
    )
        .prop_map(
            |(
                (event_id, event_type, ts, execution_id, step_run_id, task_run_id),
                (trace_id, parent_id, step, task, payload_json, ts_ms),
            )| Event {
                event_id,
                event_type,
                ts,
                execution_id,
                step_run_id,
                task_run_id,
                trace_id,
                parent_id,
                step,
                task,
                payload_json,
                ts_ms,
            },
        )
}

fn result_ref() -> impl Strategy<Value = ResultRef> {
    (text(), text(), text(), any::<u64>(), text(), bytes()).prop_map(
        |(uri, store, key, size, checksum, preview_json)| ResultRef {
            uri,
            store,
            key,
            size,
            checksum,
            preview_json,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn execution_requests_round_trip(x in execution_request()) {
        prop_assert_eq!(decode::<ExecutionRequest>("r", &encode(&x)).unwrap(), x.clone());
        // The request decoder (JSON or protobuf) reads protobuf the same way,
        // unless the bytes happen to start like JSON.
        let enc = encode(&x);
        if enc.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            prop_assert_eq!(decode_execution_request(&enc).unwrap(), x);
        }
    }

    #[test]
    fn tokens_round_trip(x in token()) {
        prop_assert_eq!(decode::<Token>("t", &encode(&x)).unwrap(), x);
    }

    #[test]
    fn task_commands_round_trip(x in task_command()) {
        prop_assert_eq!(decode::<TaskCommand>("c", &encode(&x)).unwrap(), x);
    }

    #[test]
    fn loop_commands_round_trip(x in loop_command()) {
        prop_assert_eq!(decode::<LoopCommand>("l", &encode(&x)).unwrap(), x);
    }

    #[test]
    fn events_round_trip(x in event()) {
        prop_assert_eq!(decode::<Event>("e", &encode(&x)).unwrap(), x);
    }

    #[test]
    fn result_refs_round_trip(x in result_ref()) {
        prop_assert_eq!(decode::<ResultRef>("ref", &encode(&x)).unwrap(), x);
    }

    /// JSON fields round-trip through their byte form.
    #[test]
    fn json_fields_round_trip(v in json()) {
        prop_assert_eq!(codec::json_value(&codec::json_bytes(&v)).unwrap(), v);
    }

    /// Arbitrary bytes: every decoder answers, and what it decodes
    /// re-encodes to the same message.
    #[test]
    fn decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(m) = decode::<TaskCommand>("c", &data) {
            prop_assert_eq!(decode::<TaskCommand>("c", &encode(&m)).unwrap(), m);
        }
        if let Ok(m) = decode::<Event>("e", &data) {
            prop_assert_eq!(decode::<Event>("e", &encode(&m)).unwrap(), m);
        }
        let _ = decode::<Token>("t", &data);
        let _ = decode::<LoopCommand>("l", &data);
        let _ = decode_execution_request(&data);
        let _ = codec::json_value(&data);
        let _ = codec::json_object(&data);
    }
}

fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{json, Value};
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
