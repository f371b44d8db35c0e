//! The OpenAPI document as the server behaves: generated from the handlers
//! and their types ([`crate::routes::ApiDoc`]), then made to state what
//! every route shares, by one plain function ([`conform`]): the statuses
//! the layers and extractors answer (400, 401, 408, 413, 422, 503), the
//! patterns of path parameters, which bodies are optional, the event
//! streams as text, and the range of each unsigned integer.

use serde_json::{json, Map, Value};

use crate::shape::params::{
    EXECUTION_ID_PATTERN, MAX_EXECUTION_ID, MAX_NAME, MAX_SIGNAL_NAME, NAME_PATTERN,
    SIGNAL_NAME_PATTERN,
};

/// Operations whose request body may be left out (`METHOD path`).
pub const OPTIONAL_BODIES: &[&str] = &[
    "post /api/catalog/list",
    "post /api/executions/{id}/cancel",
    "post /api/executions/{id}/pause",
    "post /api/executions/{id}/resume",
    "post /api/executions/{id}/signals/{name}",
    "post /api/executions/{id}/rerun",
    "post /api/executions/cleanup",
];

/// Statuses every operation of a kind answers: (status, when it applies,
/// description).
const SHARED: &[(&str, Needs, &str)] = &[
    (
        "400",
        Needs::Input,
        "The request cannot be read: a path parameter that is not one, a query that does not parse, a body that is not JSON",
    ),
    (
        "401",
        Needs::Token,
        "No bearer token, an unknown one, or another scheme",
    ),
    (
        "408",
        Needs::Body,
        "The request body did not arrive within the body timeout",
    ),
    (
        "413",
        Needs::Body,
        "The request body is over 6 MiB",
    ),
    (
        "422",
        Needs::Body,
        "JSON of the wrong shape (the message names the field), or a value that is not one",
    ),
    (
        "503",
        Needs::Token,
        "NATS or KV did not answer: try again",
    ),
];

/// Which operations a shared status applies to.
#[derive(Clone, Copy)]
enum Needs {
    /// Those with parameters or a body.
    Input,
    /// Those behind a token.
    Token,
    /// Those with a body.
    Body,
}

/// `doc` (the generated document as JSON) made to state what the server
/// does; see the module.
pub fn conform(mut doc: Value) -> Value {
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, op) in item.iter_mut() {
                if let Some(op) = op.as_object_mut() {
                    operation(&format!("{method} {path}"), path, op);
                }
            }
        }
    }
    unsigned_ranges(&mut doc);
    doc
}

/// One operation: shared statuses, path parameter patterns, an optional
/// body, an event stream as text.
fn operation(key: &str, path: &str, op: &mut Map<String, Value>) {
    let has_body = op.contains_key("requestBody");
    let has_params = op
        .get("parameters")
        .and_then(Value::as_array)
        .is_some_and(|p| !p.is_empty());
    let secured = op
        .get("security")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty());
    if OPTIONAL_BODIES.contains(&key) {
        if let Some(body) = op.get_mut("requestBody").and_then(Value::as_object_mut) {
            body.insert("required".into(), Value::Bool(false));
        }
    }
    if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
        for p in params.iter_mut() {
            path_pattern(path, p);
        }
    }
    let responses = op
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("responses is an object");
    for (status, needs, description) in SHARED {
        let applies = match needs {
            Needs::Input => has_params || has_body,
            Needs::Token => secured,
            Needs::Body => has_body,
        };
        if applies && !responses.contains_key(*status) {
            responses.insert((*status).into(), error_response(description));
        }
    }
    for response in responses.values_mut() {
        event_stream_as_text(response);
    }
}

/// An error answer: NoETL's body.
fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    })
}

/// A path parameter's schema as the server checks it.
fn path_pattern(path: &str, p: &mut Value) {
    if p.get("in").and_then(Value::as_str) != Some("path") {
        return;
    }
    let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
    let schema = match name {
        "id" => json!({
            "type": "string", "minLength": 1, "maxLength": MAX_EXECUTION_ID,
            "pattern": EXECUTION_ID_PATTERN
        }),
        "name" if path.contains("/signals/") => json!({
            "type": "string", "minLength": 1, "maxLength": MAX_SIGNAL_NAME,
            "pattern": SIGNAL_NAME_PATTERN
        }),
        "name" if path.starts_with("/api/credentials") => json!({
            "type": "string", "minLength": 1,
            "maxLength": crate::shape::credentials::MAX_NAME, "pattern": NAME_PATTERN
        }),
        _ => json!({
            "type": "string", "minLength": 1, "maxLength": MAX_NAME, "pattern": NAME_PATTERN
        }),
    };
    if let Some(p) = p.as_object_mut() {
        p.insert("schema".into(), schema);
    }
}

/// A `text/event-stream` answer is text (each `data:` a `StreamedEvent`),
/// not one JSON value.
fn event_stream_as_text(response: &mut Value) {
    if let Some(stream) = response
        .get_mut("content")
        .and_then(|c| c.get_mut("text/event-stream"))
        .and_then(Value::as_object_mut)
    {
        stream.insert(
            "schema".into(),
            json!({
                "type": "string",
                "description": "Server-Sent Events: `id:` the stream sequence, `event:` the event type, `data:` one StreamedEvent (components/schemas/StreamedEvent) as JSON"
            }),
        );
    }
}

/// Every unsigned integer (`minimum: 0` with a `format`) gets the maximum
/// of its Rust type instead of a signed format: a value above it is
/// refused, one below accepted.
fn unsigned_ranges(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let integer = match map.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                _ => false,
            };
            let unsigned = map.get("minimum").and_then(Value::as_f64) == Some(0.0);
            if integer && unsigned {
                let max = match map.get("format").and_then(Value::as_str) {
                    Some("int32") => Some(json!(u32::MAX)),
                    Some("int64") => Some(json!(u64::MAX)),
                    _ => None,
                };
                if let Some(max) = max {
                    map.remove("format");
                    map.insert("maximum".into(), max);
                }
            }
            for child in map.values_mut() {
                unsigned_ranges(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned_ranges),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        json!({"paths": {
            "/api/executions/{id}/cancel": {"post": {
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "requestBody": {"required": true, "content": {}},
                "security": [{"bearer": []}],
                "responses": {"200": {"description": "ok"}, "422": {"description": "ended"}}
            }},
            "/api/executions/{id}/results/{step}": {"get": {
                "parameters": [
                    {"name": "id", "in": "path", "schema": {"type": "string"}},
                    {"name": "step", "in": "path", "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "schema": {"type": ["integer", "null"], "format": "int32", "minimum": 0}}
                ],
                "security": [{"bearer": []}],
                "responses": {"200": {"description": "ok", "content": {"text/event-stream": {"schema": {"$ref": "#/x"}}}}}
            }},
            "/health": {"get": {"responses": {"200": {"description": "ok"}}}}
        }})
    }

    #[test]
    fn every_operation_states_the_statuses_its_layers_answer() {
        let d = conform(doc());
        let cancel = &d["paths"]["/api/executions/{id}/cancel"]["post"];
        for s in ["400", "401", "408", "413", "422", "503"] {
            assert!(cancel["responses"][s].is_object(), "{s}");
        }
        assert_eq!(cancel["responses"]["422"]["description"], "ended", "kept");
        assert_eq!(cancel["requestBody"]["required"], false);
        let result = &d["paths"]["/api/executions/{id}/results/{step}"]["get"];
        assert!(result["responses"]["413"].is_null(), "no body");
        assert!(result["responses"]["400"].is_object());
        let health = &d["paths"]["/health"]["get"];
        assert_eq!(health["responses"].as_object().unwrap().len(), 1);
    }

    #[test]
    fn a_signal_name_has_the_pattern_the_server_checks() {
        let d = crate::routes::openapi_document();
        let params = &d["paths"]["/api/executions/{id}/signals/{name}"]["post"]["parameters"];
        assert_eq!(params[1]["name"], "name");
        assert_eq!(params[1]["schema"]["pattern"], SIGNAL_NAME_PATTERN);
        assert_eq!(params[1]["schema"]["maxLength"], MAX_SIGNAL_NAME);
    }

    #[test]
    fn path_parameters_get_patterns_and_integers_their_range() {
        let d = conform(doc());
        let params = &d["paths"]["/api/executions/{id}/results/{step}"]["get"]["parameters"];
        assert_eq!(params[0]["schema"]["pattern"], EXECUTION_ID_PATTERN);
        assert_eq!(params[1]["schema"]["maxLength"], MAX_NAME);
        assert_eq!(params[2]["schema"]["maximum"], u32::MAX);
        assert!(params[2]["schema"]["format"].is_null());
        let stream = &d["paths"]["/api/executions/{id}/results/{step}"]["get"]["responses"]["200"]
            ["content"]["text/event-stream"]["schema"];
        assert_eq!(stream["type"], "string");
    }
}
