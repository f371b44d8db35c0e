//! NoETL's tool fields that `noetl migrate` rewrites, by kind: what the
//! validator's E005 says of one, and what the migrate crate reads to tell
//! a tool field from a nested one.

/// What a load error says about a NoETL tool field `noetl migrate`
/// rewrites (E005's help), by kind and field.
pub fn tool_field_hint(kind: &str, field: &str) -> Option<&'static str> {
    Some(match (kind, field) {
        ("postgres" | "duckdb", "query" | "queries" | "commands" | "cmd" | "cmds") => {
            "NoETL's name of `command`: `noetl migrate` renames it"
        }
        ("postgres", "credential") => "NoETL's name of `auth`: `noetl migrate` renames it",
        ("postgres", "pool") => "connections are pooled per credential; `noetl migrate` removes it",
        ("http", "endpoint") => "NoETL's name of `url`: `noetl migrate` renames it",
        ("http", "verify") => "NoETL's name of `verify_ssl`: `noetl migrate` renames it",
        ("http", "data") => {
            "`params` for a GET or DELETE, `json` for other methods: `noetl migrate` rewrites it"
        }
        ("http", "payload") => "a JSON body: `noetl migrate` renames it to `json`",
        ("http", "timeout" | "timeout_seconds") => {
            "seconds go in `spec.timeout`: `noetl migrate` moves it"
        }
        (_, "output_select") => {
            "a large result travels by reference already; `noetl migrate` removes it"
        }
        _ => return None,
    })
}
