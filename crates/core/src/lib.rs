//! noetl-core: the NoETL canonical v10 playbook language.
//!
//! Reading (`yaml`, `load`), normalising (`normalize`), validating
//! (`validate`, `diagnostic`), templating (`template`) and the pure evaluation
//! functions the services call (`merge`, `policy`, `routing`, `reduce`).

pub mod codes;
pub mod concurrency;
pub mod data_schema;
pub mod diagnostic;
pub mod field_rules;
pub mod lifecycle;
pub mod limits;
pub mod load;
pub mod merge;
pub mod model;
pub mod names;
pub mod noetl_fields;
pub mod normalize;
pub mod outcome;
pub mod policy;
pub mod reduce;
pub mod routing;
pub mod schema;
pub mod script;
mod spellings;
pub mod sql;
pub mod template;
pub mod timeout;
pub mod tool;
pub mod transfer;
pub mod validate;
pub mod workbook;
pub mod yaml;

pub use model::*;
pub use outcome::*;

/// Name of a JSON value's type, for error messages ("a string", "a list"...).
pub fn json_type(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
