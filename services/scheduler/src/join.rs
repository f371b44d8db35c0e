//! Joins: a step with `spec.join` is a Petri-net transition with several
//! input places. It runs once a token has arrived from every incoming step
//! (the steps whose arcs target it, or the `from` list); earlier tokens are
//! absorbed. Arrivals are recorded under compare-and-set in
//! `<eid>.join.<step>`, so concurrent and redelivered tokens are counted once.
//!
//! ```yaml
//! - step: merge
//!   spec:
//!     join: all                # or: { from: [left, right] }
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use noetl_core::{Playbook, Step};
use noetl_mesh::{
    kv::{self, key_part, Cas},
    Mesh, MeshError,
};

/// The inputs a join waits for, if the step is a join.
pub fn inputs(playbook: &Playbook, step: &Step) -> Option<Vec<String>> {
    let join = step.spec.extra.get("join")?;
    if let Some(Value::Array(from)) = join.get("from") {
        return Some(
            from.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
        );
    }
    if join.as_str() != Some("all") && !join.is_object() {
        return None;
    }
    let mut from: Vec<String> = playbook
        .workflow
        .iter()
        .filter(|s| {
            s.next
                .as_ref()
                .map(|n| n.arcs.iter().any(|a| a.step == step.step))
                .unwrap_or(false)
        })
        .map(|s| s.step.clone())
        .collect();
    from.dedup();
    Some(from)
}

/// One join's arrivals so far.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Arrivals {
    /// Input step → the token that arrived from it.
    arrived: Map<String, Value>,
    /// Merged args of the arrivals.
    args: Map<String, Value>,
    /// Tokens that fired the join (a redelivered one fires again, idempotently).
    fired: Vec<String>,
}

/// What to do with an arriving token.
pub enum JoinOutcome {
    /// Wait for the other inputs (`have` of `need`).
    Wait {
        /// Inputs arrived.
        have: usize,
        /// Inputs needed.
        need: usize,
    },
    /// All inputs are there: run with these merged args.
    Fire(Value),
}

/// Record `token_id` arriving from `from_step` with `args`.
pub async fn arrive(
    mesh: &Mesh,
    eid: &str,
    step: &str,
    inputs: &[String],
    from_step: &str,
    token_id: &str,
    args: &Value,
) -> Result<JoinOutcome, MeshError> {
    let key = format!("{eid}.join.{}", key_part(step));
    let mut outcome = JoinOutcome::Wait {
        have: 0,
        need: inputs.len(),
    };
    kv::update(mesh.exec_kv(), &key, |cur: Option<&Arrivals>| {
        let mut a = cur.cloned().unwrap_or_default();
        if a.fired.iter().any(|t| t == token_id) {
            outcome = JoinOutcome::Fire(Value::Object(a.args.clone()));
            return Cas::Keep;
        }
        let place = if inputs.iter().any(|i| i == from_step) {
            from_step.to_string()
        } else {
            // A token from a step that is not an input counts as its own place.
            format!("~{from_step}")
        };
        if a.arrived.get(&place).and_then(Value::as_str) == Some(token_id) {
            outcome = JoinOutcome::Wait {
                have: a.arrived.len(),
                need: inputs.len(),
            };
            return Cas::Keep;
        }
        a.arrived.insert(place, Value::String(token_id.to_string()));
        if let Value::Object(m) = args {
            for (k, v) in m {
                a.args.insert(k.clone(), v.clone());
            }
        }
        let have = inputs.iter().filter(|i| a.arrived.contains_key(*i)).count();
        if have >= inputs.len() {
            outcome = JoinOutcome::Fire(Value::Object(a.args.clone()));
            a.fired.push(token_id.to_string());
            if a.fired.len() > 16 {
                a.fired.remove(0);
            }
            a.arrived.clear();
            a.args.clear();
        } else {
            outcome = JoinOutcome::Wait {
                have,
                need: inputs.len(),
            };
        }
        Cas::Write(a)
    })
    .await?;
    Ok(outcome)
}
