//! Building template scopes on the server side (router, scheduler,
//! loop-supervisor): what to load from KV for a set of templates, and only
//! that (`ctx` and step results cost a KV read each).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::{kv, state::result_key, Mesh, MeshError};

/// Top-level names a set of templates reads.
pub fn roots<'a>(templates: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for t in templates {
        if noetl_core::template::is_template(t) {
            out.extend(noetl_core::template::referenced_roots(t));
        }
    }
    out
}

/// Every string inside a JSON value (to find the templates in `args` maps).
pub fn strings(v: &Value) -> Vec<&str> {
    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(m) => m.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

/// What a server-side scope needs loaded.
pub struct Loaded {
    /// `ctx` (only read when referenced; `{}` otherwise).
    pub ctx: Value,
    /// Results of other steps referenced by name.
    pub steps: Map<String, Value>,
}

/// Load `ctx` and the results of referenced steps of execution `eid`.
pub async fn load(
    mesh: &Mesh,
    eid: &str,
    roots: &BTreeSet<String>,
    step_names: &[&str],
) -> Result<Loaded, MeshError> {
    let ctx = if roots.contains("ctx") {
        mesh.exec_ctx(eid).await?
    } else {
        Value::Object(Map::new())
    };
    let mut steps = Map::new();
    for name in step_names {
        if roots.contains(*name) {
            if let Some(v) = kv::get::<Value>(mesh.exec_kv(), &result_key(eid, name)).await? {
                // A result stored by reference is read back where a
                // template reads into it.
                let v = mesh.results().hydrate(v).await?;
                steps.insert(name.to_string(), v);
            }
        }
    }
    Ok(Loaded { ctx, steps })
}
