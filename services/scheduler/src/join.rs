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
    keys::Keys,
    kv::{self, Cas},
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
    /// The last firings (bounded): the token that fired the join and the
    /// merged args it fired with, so a redelivered firing token fires with
    /// the same args (same ids: JetStream drops the duplicates).
    #[serde(default)]
    firings: Vec<Firing>,
    /// Tokens absorbed by an earlier firing (bounded): a redelivered one
    /// must not arrive again, or it would re-arm the join with a stale
    /// token.
    #[serde(default)]
    consumed: Vec<String>,
}

/// One firing of a join.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Firing {
    token: String,
    args: Map<String, Value>,
}

/// Firings and absorbed tokens a join remembers.
const REMEMBERED: usize = 64;

/// What to do with an arriving token.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinOutcome {
    /// Wait for the other inputs (`have` of `need`): the token is absorbed
    /// (`step.skipped`, reason `join.waiting`).
    Wait {
        /// Inputs arrived.
        have: usize,
        /// Inputs needed.
        need: usize,
    },
    /// All inputs are there: run with these merged args.
    Fire(Value),
    /// A redelivered token whose effect is done and whose step-run is over
    /// (the router no longer holds it live): nothing to do.
    Stale,
}

/// Record `token_id` arriving from `from_step` with `args`.
///
/// Redelivery: a token that already fired the join fires again with the
/// same args while its step-run is live (the publishes that followed may
/// have failed; their ids are deterministic); a token absorbed earlier is
/// absorbed again without re-arming the join. Either is [`JoinOutcome::Stale`]
/// once the router no longer holds the token live.
pub async fn arrive(
    mesh: &Mesh,
    eid: &str,
    step: &str,
    inputs: &[String],
    from_step: &str,
    token_id: &str,
    args: &Value,
) -> Result<JoinOutcome, MeshError> {
    let key = Keys::join(eid, step);
    let mut outcome = JoinOutcome::Wait {
        have: 0,
        need: inputs.len(),
    };
    let mut redelivered = false;
    kv::update(mesh.exec_kv(), &key, |cur: Option<&Arrivals>| {
        redelivered = false;
        let mut a = cur.cloned().unwrap_or_default();
        if let Some(f) = a.firings.iter().find(|f| f.token == token_id) {
            outcome = JoinOutcome::Fire(Value::Object(f.args.clone()));
            redelivered = true;
            return Cas::Keep;
        }
        let have = |a: &Arrivals| inputs.iter().filter(|i| a.arrived.contains_key(*i)).count();
        if a.consumed.iter().any(|t| t == token_id) {
            outcome = JoinOutcome::Wait {
                have: have(&a),
                need: inputs.len(),
            };
            redelivered = true;
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
                have: have(&a),
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
        let n = have(&a);
        if n >= inputs.len() {
            outcome = JoinOutcome::Fire(Value::Object(a.args.clone()));
            a.firings.push(Firing {
                token: token_id.to_string(),
                args: std::mem::take(&mut a.args),
            });
            for t in std::mem::take(&mut a.arrived).into_values() {
                if let Value::String(t) = t {
                    if t != token_id {
                        a.consumed.push(t);
                    }
                }
            }
            if a.firings.len() > REMEMBERED {
                a.firings.remove(0);
            }
            if a.consumed.len() > REMEMBERED {
                let extra = a.consumed.len() - REMEMBERED;
                a.consumed.drain(..extra);
            }
        } else {
            outcome = JoinOutcome::Wait {
                have: n,
                need: inputs.len(),
            };
        }
        Cas::Write(a)
    })
    .await?;
    if redelivered {
        let live = mesh
            .exec_header(eid)
            .await?
            .is_some_and(|h| h.is_live(token_id));
        if !live {
            return Ok(JoinOutcome::Stale);
        }
    }
    Ok(outcome)
}
