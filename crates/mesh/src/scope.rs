//! Building template scopes on the server side (router, scheduler,
//! loop-supervisor): what to load from KV for a set of templates, and only
//! that (`ctx` and step results cost a KV read each).

use std::collections::BTreeSet;
use std::future::Future;

use noetl_core::Step;
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

/// Where a server-side scope reads the records it needs: KV, live
/// ([`Mesh`]), or the fold of an execution's events as of one of them
/// (`noetl exec replay --playbook`, [`crate::rejudge`]). The decisions
/// build their scopes through it ([`load_from`], [`crate::decision_scope`]),
/// so a replay runs the code that ran live.
pub trait StateSource: Sync {
    /// `ctx` of execution `eid` as templates see it (`{}` when none).
    fn ctx(&self, eid: &str) -> impl Future<Output = Result<Value, MeshError>> + Send;
    /// The stored result of step `name` of `eid`, read back when it was
    /// stored by reference.
    fn step_result(
        &self,
        eid: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Value>, MeshError>> + Send;
    /// Step arguments as templates see them ([`hydrate_args`]).
    fn args(&self, args: &Value) -> impl Future<Output = Result<Value, MeshError>> + Send;
}

impl StateSource for Mesh {
    async fn ctx(&self, eid: &str) -> Result<Value, MeshError> {
        // Lost from KV while the execution runs: written back from its
        // events first (nothing is written for one that is not running).
        let stored = crate::ctx_record::read(self, eid).await?;
        Ok(crate::state::user_ctx(
            stored.unwrap_or_else(|| Value::Object(Map::new())),
        ))
    }

    async fn step_result(&self, eid: &str, name: &str) -> Result<Option<Value>, MeshError> {
        let mut stored = kv::get::<Value>(self.exec_kv(), &Keys::result(eid, name)).await?;
        // Lost from KV while the step's record says it is done: written
        // back from the events.
        if stored.is_none() {
            stored = crate::result_record::restore(self, eid, name).await?;
        }
        match stored {
            // A result stored by reference is read back where a template
            // reads into it.
            Some(v) => Ok(Some(self.results().hydrate(v).await?)),
            None => Ok(None),
        }
    }

    async fn args(&self, args: &Value) -> Result<Value, MeshError> {
        hydrate_args(self, args).await
    }
}

/// Load `ctx` and the results of referenced steps of execution `eid`
/// from KV ([`load_from`] the mesh).
pub async fn load(
    mesh: &Mesh,
    eid: &str,
    roots: &BTreeSet<String>,
    step_names: &[&str],
) -> Result<Loaded, MeshError> {
    load_from(mesh, eid, roots, step_names).await
}

/// Load `ctx` (when `roots` reads it) and the results of the steps among
/// `step_names` that `roots` reads, from `source`.
pub async fn load_from<S: StateSource>(
    source: &S,
    eid: &str,
    roots: &BTreeSet<String>,
    step_names: &[&str],
) -> Result<Loaded, MeshError> {
    let ctx = if roots.contains("ctx") {
        source.ctx(eid).await?
    } else {
        Value::Object(Map::new())
    };
    let mut steps = Map::new();
    for name in step_names {
        if roots.contains(*name) {
            if let Some(v) = source.step_result(eid, name).await? {
                steps.insert(name.to_string(), v);
            }
        }
    }
    Ok(Loaded { ctx, steps })
}

/// The `event` arcs' conditions see: the boundary event's payload plus its
/// `name`, `step` and `step_run_id`.
pub fn event_scope(ev: &noetl_wire::Event, payload: &Value) -> Value {
    let mut event = match payload {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    event.insert("name".into(), Value::String(ev.event_type.clone()));
    event.insert("step".into(), Value::String(ev.step.clone()));
    event.insert("step_run_id".into(), Value::String(ev.step_run_id.clone()));
    Value::Object(event)
}

/// Every template of a step's arcs (conditions, args, `set_ctx`).
pub fn arc_templates(step: &Step) -> Vec<&str> {
    step.next
        .as_ref()
        .map(|n| {
            n.arcs
                .iter()
                .flat_map(|a| {
                    let mut v: Vec<&str> = a.when.as_deref().into_iter().collect();
                    for x in a.args.iter().chain(&a.set_ctx).flat_map(|m| m.values()) {
                        v.extend(strings(x));
                    }
                    v
                })
                .collect()
        })
        .unwrap_or_default()
}
