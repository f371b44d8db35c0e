//! JSON Schema of the playbook document, generated from the model types and
//! widened to the authoring shapes the loader accepts (task-list forms,
//! `else` rules). Written in JSON Schema draft-07 (definitions under
//! `#/definitions`), the draft yaml-language-server supports best:
//! `# yaml-language-server: $schema=playbook.schema.json`.

use serde_json::{json, Value};

/// The `$ref` of a schema: its own, or (draft-07 ignores the siblings of a
/// `$ref`, so a described reference is `{description, allOf: [{$ref}]}`)
/// that of its single `allOf` member.
fn ref_of(schema: &Value) -> Option<&Value> {
    schema.get("$ref").or_else(|| match schema.get("allOf") {
        Some(Value::Array(all)) if all.len() == 1 => all[0].get("$ref"),
        _ => None,
    })
}

/// The schema of one tool field: its type, or a template string (which
/// renders to any type at run time).
fn field_schema(f: &crate::tool::Field) -> Value {
    use crate::tool::FieldType;
    let mut s = match f.ty {
        FieldType::Any => json!({}),
        FieldType::Str => json!({"type": "string"}),
        FieldType::Bool => json!({"type": ["boolean", "string"]}),
        FieldType::Object => json!({"type": ["object", "string"]}),
        FieldType::List => json!({"type": ["array", "string"]}),
        FieldType::StrOrList => {
            json!({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})
        }
        FieldType::Scalar => json!({"type": ["string", "number"]}),
    };
    s["description"] = json!(f.about);
    s
}

/// `if kind: <k> then` its fields, the required ones, and no other.
fn kind_fields(k: &crate::tool::Kind) -> Value {
    let props: serde_json::Map<String, Value> = k
        .fields
        .iter()
        .map(|f| (f.name.to_string(), field_schema(f)))
        .collect();
    let by_script = crate::script::script_target(k.name);
    let required: Vec<&str> = k
        .fields
        .iter()
        .filter(|f| f.required && Some(f.name) != by_script)
        .map(|f| f.name)
        .collect();
    let names: Vec<&str> = crate::tool::TASK_FIELDS
        .iter()
        .copied()
        .chain(k.fields.iter().map(|f| f.name))
        .collect();
    let mut then =
        json!({"properties": props, "required": required, "propertyNames": {"enum": names}});
    if let Some(field) = by_script {
        // The source, or a `script` that loads it.
        then["oneOf"] = json!([{"required": [field]}, {"required": ["script"]}]);
    }
    json!({
        "if": {"properties": {"kind": {"const": k.name}}, "required": ["kind"]},
        "then": then
    })
}

/// The schema as JSON (draft-07).
pub fn playbook_schema() -> Value {
    let mut v = generated_schema();
    v["title"] = json!("NoETL playbook (canonical v10)");
    widen_step_tool(&mut v);
    task_shapes(&mut v);
    task_then(&mut v);
    // Arc guards: a template string or a boolean.
    if let Some(when) = v.pointer_mut("/definitions/Arc/properties/when") {
        when["type"] = json!(["string", "boolean", "null"]);
    }
    rule_forms(&mut v);
    v
}

/// The schema the model types generate, with readable names for the two
/// rule instantiations.
fn generated_schema() -> Value {
    let schema = schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<crate::model::Playbook>();
    let text = serde_json::to_string(&schema).expect("schema serialises");
    // Readable names for the two rule instantiations.
    let text = text
        .replace("\"#/definitions/Rule2\"", "\"#/definitions/TaskRule\"")
        .replace("\"#/definitions/Rule\"", "\"#/definitions/AdmitRule\"");
    let mut v: Value = serde_json::from_str(&text).expect("schema is JSON");
    if let Some(defs) = v.pointer_mut("/definitions").and_then(Value::as_object_mut) {
        for (from, to) in [("Rule2", "TaskRule"), ("Rule", "AdmitRule")] {
            if let Some(d) = defs.remove(from) {
                defs.insert(to.into(), d);
            }
        }
    }
    v
}

/// `tool`: canonical list, label-keyed list items, or one task object.
fn widen_step_tool(v: &mut Value) {
    if let Some(step) = v.pointer_mut("/definitions/Step/properties/tool") {
        *step = json!({
            "description": "The ordered pipeline: a list of tasks ({name, kind, ...} or {label: {kind, ...}}) or one task object. Omit it for a routing-only step.",
            "anyOf": [
                {"type": "array", "minItems": 1, "items": {"anyOf": [
                    {"$ref": "#/definitions/Task"},
                    {"type": "object", "minProperties": 1, "maxProperties": 1,
                     "additionalProperties": {"$ref": "#/definitions/Task"}}
                ]}},
                {"$ref": "#/definitions/Task"}
            ]
        });
    }
}

/// A task: its name optional, the fields of each built-in kind, the kinds
/// this engine runs.
fn task_shapes(v: &mut Value) {
    // Task names are synthesised when missing.
    if let Some(req) = v.pointer_mut("/definitions/Task/required") {
        if let Some(a) = req.as_array_mut() {
            a.retain(|x| x != "name");
        }
    }
    // Each built-in kind's own fields (docs/tools.md): completed by editors,
    // anything else refused, as `noetl validate` does (E005).
    if let Some(task) = v.pointer_mut("/definitions/Task") {
        task["allOf"] = Value::Array(crate::tool::KINDS.iter().map(kind_fields).collect());
    }
    // The kinds this engine runs; any other is refused (E006, E007).
    if let Some(kind) = v.pointer_mut("/definitions/Task/properties/kind") {
        kind["enum"] = json!(crate::tool::task_kinds().collect::<Vec<_>>());
    }
}

/// A task rule's `then`: `attempts` at least 1, and the `set` alias.
fn task_then(v: &mut Value) {
    // `attempts` counts all attempts: at least 1.
    if let Some(att) = v.pointer_mut("/definitions/TaskThen/properties/attempts") {
        att["minimum"] = json!(1);
    }
    // `then.set` alias (W101).
    if let Some(props) = v
        .pointer_mut("/definitions/TaskThen/properties")
        .and_then(Value::as_object_mut)
    {
        props.insert(
            "set".into(),
            json!({
                "description": "Alias (warning W101): `{\"ctx.a\": 1, \"iter.b\": 2}` or `{ctx: {...}, iter: {...}}`; prefer set_ctx / set_iter.",
                "type": "object"
            }),
        );
    }
}

/// Rules: `else: {then: ...}`, `else: null` + `then`, `else: true` + `then`.
fn rule_forms(v: &mut Value) {
    let Some(defs) = v.pointer_mut("/definitions").and_then(Value::as_object_mut) else {
        return;
    };
    for name in ["AdmitRule", "TaskRule"] {
        if let Some(def) = defs.get_mut(name) {
            rule_form(def);
        }
    }
}

/// One rule definition: its `else` forms, a `when` or an `else` required,
/// `then` optional (an `else: {then: ...}` holds it), no other field.
fn rule_form(def: &mut Value) {
    let then_ref = def
        .pointer("/properties/then")
        .and_then(ref_of)
        .cloned()
        .unwrap_or(json!("#/definitions/TaskThen"));
    if let Some(props) = def
        .pointer_mut("/properties")
        .and_then(Value::as_object_mut)
    {
        props.insert(
            "else".into(),
            json!({
                "description": "Fallback rule: `else: {then: ...}`, or `else: true` (or empty) next to `then`. `else: false` is not a rule.",
                "anyOf": [
                    {"const": true},
                    {"type": "null"},
                    {"type": "object", "properties": {"then": {"$ref": then_ref}},
                     "additionalProperties": false}
                ]
            }),
        );
        if let Some(when) = props.get_mut("when") {
            when["type"] = json!(["string", "boolean", "null"]);
        }
    }
    def["additionalProperties"] = json!(false);
    def["anyOf"] = json!([{"required": ["when"]}, {"required": ["else"]}]);
    if let Some(a) = def.get_mut("required").and_then(Value::as_array_mut) {
        a.retain(|x| x != "then");
    }
    if def["required"].as_array().is_some_and(Vec::is_empty) {
        if let Some(o) = def.as_object_mut() {
            o.remove("required");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r);
                }
                m.values().for_each(|x| refs(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    #[test]
    fn schema_describes_the_document_and_the_authoring_shapes() {
        let s = playbook_schema();
        assert_eq!(s["type"], "object");
        assert_eq!(s["$schema"], "http://json-schema.org/draft-07/schema#");
        assert!(s.get("$defs").is_none() && s["definitions"].is_object());
        assert!(s["properties"]["workflow"].is_object());
        let req: Vec<&str> = s["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x.as_str())
            .collect();
        for r in ["apiVersion", "kind", "metadata", "workflow"] {
            assert!(req.contains(&r), "{r} not required: {req:?}");
        }
        // Root is closed: `vars` is not a property.
        assert_eq!(s["additionalProperties"], false);
        assert!(s["properties"].get("vars").is_none());
        // tool: list (canonical or label-keyed items) or a single task.
        let tool = &s["definitions"]["Step"]["properties"]["tool"]["anyOf"];
        assert_eq!(tool[0]["type"], "array");
        assert_eq!(tool[1]["$ref"], "#/definitions/Task");
        assert!(!s["definitions"]["Task"]["required"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == "name"));
        // Rules accept the `else` forms and point at their own `then` type.
        let admit = &s["definitions"]["AdmitRule"];
        assert_eq!(
            ref_of(&admit["properties"]["then"]).unwrap(),
            "#/definitions/AdmitThen"
        );
        assert_eq!(
            admit["properties"]["else"]["anyOf"][2]["properties"]["then"]["$ref"],
            "#/definitions/AdmitThen"
        );
        assert!(admit.get("required").is_none());
        let task_rule = &s["definitions"]["TaskRule"];
        assert_eq!(
            task_rule["properties"]["else"]["anyOf"][2]["properties"]["then"]["$ref"],
            "#/definitions/TaskThen"
        );
        assert_eq!(task_rule["additionalProperties"], false);
        // `else: false` is not a fallback rule.
        assert_eq!(
            task_rule["properties"]["else"]["anyOf"][0],
            json!({"const": true})
        );
        assert_eq!(
            s["definitions"]["TaskThen"]["properties"]["attempts"]["minimum"],
            1
        );
        let actions: Vec<&str> = s["definitions"]["Action"]["oneOf"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x["const"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(actions, ["continue", "retry", "jump", "break", "fail"]);
    }

    #[test]
    fn each_built_in_kind_lists_its_fields_and_refuses_others() {
        let s = playbook_schema();
        let branches = s["definitions"]["Task"]["allOf"].as_array().unwrap();
        let http = branches
            .iter()
            .find(|b| b["if"]["properties"]["kind"]["const"] == "http")
            .expect("an http branch");
        assert_eq!(http["then"]["required"], json!(["url"]));
        assert_eq!(
            http["then"]["properties"]["headers"]["type"],
            json!(["object", "string"])
        );
        let names = http["then"]["propertyNames"]["enum"].as_array().unwrap();
        for n in ["name", "kind", "spec", "desc", "url", "method", "auth"] {
            assert!(names.iter().any(|x| x == n), "{n}");
        }
        assert!(!names.iter().any(|x| x == "input"));
        assert_eq!(branches.len(), crate::tool::KINDS.len());
        let kinds = s["definitions"]["Task"]["properties"]["kind"]["enum"]
            .as_array()
            .unwrap();
        for k in ["noop", "shell", "artifact", "workbook"] {
            assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
        }
        assert!(!kinds.iter().any(|x| x == "snowflake"), "{kinds:?}");
    }

    #[test]
    fn every_reference_resolves() {
        let s = playbook_schema();
        let mut all = Vec::new();
        refs(&s, &mut all);
        assert!(all.len() > 10);
        for r in all {
            let ptr = r.strip_prefix('#').expect("local reference");
            assert!(s.pointer(ptr).is_some(), "dangling {r}");
        }
        assert!(s["definitions"].get("Rule").is_none() && s["definitions"].get("Rule2").is_none());
    }
}
