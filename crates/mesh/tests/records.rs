//! The typed records services keep in KV round-trip exactly through the
//! JSON bytes they are stored as: decode(encode(x)) == x (proptest, in the
//! normal test run). Wire messages: `crates/wire/tests/properties.rs`.

use noetl_mesh::catalog::Entry;
use noetl_mesh::state::{ExecHeader, ExecStatus, StepRecord, StepStatus, TokenRecord};
use proptest::prelude::*;
use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Value};

fn round_trip<T: Serialize + DeserializeOwned>(x: &T) -> T {
    let bytes = serde_json::to_vec(x).expect("a record serialises");
    serde_json::from_slice(&bytes).expect("a stored record reads back")
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9._-]{1,16}", any::<String>()]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn token() -> impl Strategy<Value = TokenRecord> {
    (text(), text(), json_value(), any::<u16>(), text()).prop_map(
        |(token_id, step, args, arc, parent)| TokenRecord {
            token_id,
            step,
            args,
            arc: arc as usize,
            parent,
        },
    )
}

fn exec_status() -> impl Strategy<Value = ExecStatus> {
    prop_oneof![
        Just(ExecStatus::Running),
        Just(ExecStatus::Completed),
        Just(ExecStatus::Failed),
        Just(ExecStatus::Cancelled),
    ]
}

fn header() -> impl Strategy<Value = ExecHeader> {
    (
        (text(), exec_status(), text(), text()),
        proptest::collection::vec(token(), 0..4),
        (any::<bool>(), text(), proptest::option::of(text())),
        (proptest::option::of(text()), text()),
    )
        .prop_map(
            |(
                (execution_id, status, playbook, source),
                live,
                (terminal_emitted, started_at, ended_at),
                (error, parent_execution_id),
            )| ExecHeader {
                execution_id,
                status,
                playbook,
                source,
                live,
                terminal_emitted,
                started_at,
                ended_at,
                error,
                parent_execution_id,
                stopped: Vec::new(),
                resumes: 0,
                resumed_at_ms: 0,
            },
        )
}

fn step_record() -> impl Strategy<Value = StepRecord> {
    (
        prop_oneof![
            Just(StepStatus::Done),
            Just(StepStatus::Failed),
            Just(StepStatus::Skipped)
        ],
        text(),
        proptest::option::of(json_value()),
        proptest::option::of(text()),
    )
        .prop_map(
            |(status, last_step_run_id, loop_counts, error)| StepRecord {
                status,
                last_step_run_id,
                // `null` counts are stored as absent.
                loop_counts: loop_counts.filter(|v| !v.is_null()),
                error,
                handled: Vec::new(),
            },
        )
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        text(),
        any::<u32>(),
        text(),
        text(),
        proptest::option::of(text()),
        text(),
    )
        .prop_map(
            |(path, version, name, yaml, original, registered_at)| Entry {
                path,
                version,
                name,
                yaml,
                original,
                registered_at,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn execution_headers_round_trip(x in header()) {
        prop_assert_eq!(round_trip(&x), x);
    }

    #[test]
    fn step_records_round_trip(x in step_record()) {
        prop_assert_eq!(round_trip(&x), x);
    }

    #[test]
    fn token_records_round_trip(x in token()) {
        prop_assert_eq!(round_trip(&x), x);
    }

    #[test]
    fn catalog_entries_round_trip(x in entry()) {
        prop_assert_eq!(round_trip(&x), x);
    }
}
