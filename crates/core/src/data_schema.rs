//! The data a `wait` task accepts (docs/operations.md, "Waiting for a
//! signal"): a JSON Schema, checked when a signal arrives. The keywords a
//! signal's data is checked against: `type` (one name or a list),
//! `properties`, `required`, `additionalProperties: false`, `enum`,
//! `const`, `items`, `minimum`, `maximum`, `minLength`, `maxLength`.
//! Others are accepted and not checked (said in the docs).

use serde_json::Value;

/// Why data does not fit a schema: where (`$.approved`) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {what}")]
pub struct Mismatch {
    /// JSON path of the value, `$` the data itself.
    pub path: String,
    /// What is wrong.
    pub what: String,
}

/// Check `data` against `schema`: the first mismatch, if any.
pub fn check(schema: &Value, data: &Value) -> Result<(), Mismatch> {
    at(schema, data, "$")
}

fn mismatch(path: &str, what: String) -> Result<(), Mismatch> {
    Err(Mismatch {
        path: path.to_string(),
        what,
    })
}

/// The JSON Schema type names `v` has (`integer` numbers are `number`s too).
fn is_type(v: &Value, name: &str) -> bool {
    match name {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
        _ => true,
    }
}

fn type_name(v: &Value) -> &'static str {
    crate::json_type(v)
}

fn at(schema: &Value, data: &Value, path: &str) -> Result<(), Mismatch> {
    let Some(s) = schema.as_object() else {
        return Ok(());
    };
    if let Some(t) = s.get("type") {
        let names: Vec<&str> = match t {
            Value::String(n) => vec![n.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !names.is_empty() && !names.iter().any(|n| is_type(data, n)) {
            return mismatch(
                path,
                format!("expected {}, got {}", names.join(" or "), type_name(data)),
            );
        }
    }
    if let Some(options) = s.get("enum").and_then(Value::as_array) {
        if !options.contains(data) {
            return mismatch(
                path,
                format!("{data} is not one of {}", Value::Array(options.clone())),
            );
        }
    }
    if let Some(c) = s.get("const") {
        if c != data {
            return mismatch(path, format!("expected {c}, got {data}"));
        }
    }
    bounds(s, data, path)?;
    if let Some(obj) = data.as_object() {
        object(s, obj, path)?;
    }
    if let (Some(items), Some(list)) = (s.get("items"), data.as_array()) {
        for (i, item) in list.iter().enumerate() {
            at(items, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn bounds(s: &serde_json::Map<String, Value>, data: &Value, path: &str) -> Result<(), Mismatch> {
    if let Some(n) = data.as_f64() {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64).filter(|m| n < *m) {
            return mismatch(path, format!("{n} is less than the minimum {min}"));
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64).filter(|m| n > *m) {
            return mismatch(path, format!("{n} is more than the maximum {max}"));
        }
    }
    if let Some(text) = data.as_str() {
        let len = text.chars().count() as u64;
        if let Some(min) = s
            .get("minLength")
            .and_then(Value::as_u64)
            .filter(|m| len < *m)
        {
            return mismatch(path, format!("shorter than {min} characters"));
        }
        if let Some(max) = s
            .get("maxLength")
            .and_then(Value::as_u64)
            .filter(|m| len > *m)
        {
            return mismatch(path, format!("longer than {max} characters"));
        }
    }
    Ok(())
}

fn object(
    s: &serde_json::Map<String, Value>,
    obj: &serde_json::Map<String, Value>,
    path: &str,
) -> Result<(), Mismatch> {
    let props = s.get("properties").and_then(Value::as_object);
    if let Some(required) = s.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !obj.contains_key(name) {
                return mismatch(path, format!("`{name}` is required"));
            }
        }
    }
    for (k, v) in obj {
        match props.and_then(|p| p.get(k)) {
            Some(sub) => at(sub, v, &format!("{path}.{k}"))?,
            None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                return mismatch(path, format!("`{k}` is not allowed here"));
            }
            None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn approval() -> Value {
        json!({
            "type": "object",
            "required": ["approved", "by"],
            "additionalProperties": false,
            "properties": {
                "approved": {"type": "boolean"},
                "by": {"type": "string", "minLength": 1},
                "comment": {"type": ["string", "null"]}
            }
        })
    }

    #[test]
    fn an_approval_fits_and_each_mistake_names_its_place() {
        let s = approval();
        assert_eq!(check(&s, &json!({"approved": true, "by": "ann"})), Ok(()));
        assert_eq!(
            check(&s, &json!({"approved": false, "by": "bo", "comment": null})),
            Ok(())
        );
        let e = check(&s, &json!({"approved": "yes", "by": "ann"})).unwrap_err();
        assert_eq!(e.to_string(), "$.approved: expected boolean, got a string");
        let e = check(&s, &json!({"approved": true})).unwrap_err();
        assert_eq!(e.to_string(), "$: `by` is required");
        let e = check(&s, &json!({"approved": true, "by": "ann", "x": 1})).unwrap_err();
        assert_eq!(e.to_string(), "$: `x` is not allowed here");
        let e = check(&s, &json!({"approved": true, "by": ""})).unwrap_err();
        assert_eq!(e.path, "$.by");
        assert!(check(&s, &json!([1])).is_err());
    }

    #[test]
    fn enums_consts_numbers_and_items() {
        let s = json!({"type": "array", "items": {"enum": ["a", "b"]}});
        assert_eq!(check(&s, &json!(["a", "b"])), Ok(()));
        assert_eq!(check(&s, &json!(["a", "c"])).unwrap_err().path, "$[1]");
        let n = json!({"type": "integer", "minimum": 1, "maximum": 3});
        assert_eq!(check(&n, &json!(2)), Ok(()));
        assert!(check(&n, &json!(2.5)).is_err());
        assert!(check(&n, &json!(4)).is_err());
        assert!(check(&json!({"const": 7}), &json!(8)).is_err());
        // No schema keyword it knows: anything fits.
        assert_eq!(check(&json!({}), &json!({"any": 1})), Ok(()));
    }
}
