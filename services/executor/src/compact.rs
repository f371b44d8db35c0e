//! Compact forms of results for events and KV (reference-first: bulk data
//! never rides in the event log).

use serde_json::{json, Value};

/// Largest task result (serialised JSON bytes) carried whole in `task.done`.
pub const TASK_EVENT_LIMIT: usize = 4 * 1024;

/// `value` itself when its JSON fits in `limit` bytes, else
/// `{"truncated": true, "size": <bytes>, "preview": "<first bytes of the JSON>"}`.
pub fn compact(value: &Value, limit: usize) -> Value {
    if value.is_null() || matches!(value, Value::Bool(_) | Value::Number(_)) {
        return value.clone();
    }
    let text = value.to_string();
    if text.len() <= limit {
        return value.clone();
    }
    let mut end = limit.min(1024);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    json!({"truncated": true, "size": text.len(), "preview": &text[..end]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_stay_and_big_ones_become_previews() {
        assert_eq!(compact(&json!({"a": 1}), 100), json!({"a": 1}));
        let big = json!({"s": "é".repeat(5000)});
        let c = compact(&big, TASK_EVENT_LIMIT);
        assert_eq!(c["truncated"], true);
        assert_eq!(c["size"], big.to_string().len());
        assert!(c["preview"].as_str().unwrap().len() <= 1024);
    }
}
