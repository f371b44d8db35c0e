//! Building template scopes on the server side (router, scheduler,
//! loop-supervisor): what to load from KV for a set of templates, and only
//! that (`ctx` and step results cost a KV read each).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::{keys::Keys, kv, Mesh, MeshError};

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

/// Step arguments (token inscriptions) as templates and tools see them:
/// each top-level value that travelled by reference (it was larger than
/// the execution's `max_payload_bytes`, see [`offload_args`]) is read back.
pub async fn hydrate_args(mesh: &Mesh, args: &Value) -> Result<Value, MeshError> {
    let Value::Object(m) = args else {
        return Ok(args.clone());
    };
    if !m.values().any(crate::objects::is_ref) {
        return Ok(args.clone());
    }
    let mut out = Map::with_capacity(m.len());
    for (k, v) in m {
        out.insert(k.clone(), mesh.results().hydrate(v.clone()).await?);
    }
    Ok(Value::Object(out))
}

/// What an arc's rendered `args` become on the wire: themselves when their
/// JSON fits in `limit` bytes, else each value above the limit is written
/// to object storage and replaced by its reference. Arguments never fail
/// for size; tokens, KV headers and events stay small.
pub async fn offload_args(
    mesh: &Mesh,
    p: OffloadArgs<'_>,
    limit: usize,
) -> Result<Value, MeshError> {
    let Value::Object(m) = p.args else {
        return Ok(p.args.clone());
    };
    if crate::objects::is_small(p.args, limit) {
        return Ok(p.args.clone());
    }
    let mut out = Map::with_capacity(m.len());
    for (i, (k, v)) in m.iter().enumerate() {
        // By position: two names that sanitise alike never share a key.
        let id = crate::keys::Keys::args_object(p.token_id, i);
        let v = mesh
            .results()
            .offload(
                crate::objects::PutParams {
                    execution_id: p.execution_id,
                    step: p.step,
                    id: &id,
                    value: v,
                },
                limit,
            )
            .await?;
        out.insert(k.clone(), v);
    }
    Ok(Value::Object(out))
}

/// Where offloaded arguments are written ([`offload_args`]).
pub struct OffloadArgs<'a> {
    /// Execution id.
    pub execution_id: &'a str,
    /// The step the token is for.
    pub step: &'a str,
    /// The token's (deterministic) id: a redelivery writes the same keys.
    pub token_id: &'a str,
    /// The rendered arguments.
    pub args: &'a Value,
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
        let mut stored = kv::get::<Value>(mesh.ctx_kv(), eid).await?;
        // Lost from KV while the execution runs: written back from its
        // events first (nothing is written for one that is not running).
        if stored.is_none() && crate::ctx_record::restore(mesh, eid).await? {
            stored = kv::get::<Value>(mesh.ctx_kv(), eid).await?;
        }
        crate::state::user_ctx(stored.unwrap_or_else(|| Value::Object(Map::new())))
    } else {
        Value::Object(Map::new())
    };
    let mut steps = Map::new();
    for name in step_names {
        if roots.contains(*name) {
            if let Some(v) = kv::get::<Value>(mesh.exec_kv(), &Keys::result(eid, name)).await? {
                // A result stored by reference is read back where a
                // template reads into it.
                let v = mesh.results().hydrate(v).await?;
                steps.insert(name.to_string(), v);
            }
        }
    }
    Ok(Loaded { ctx, steps })
}
