//! The record of a join's arrivals (`<eid>.join.<step>`): the scheduler
//! writes it as tokens arrive at a step with `spec.join`, and a resume
//! gives a stopped firing to the token that runs it again
//! ([`Arrivals::refire`]). One type for both, so the record has one shape
//! (docs/architecture.md, "KV buckets").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One join's arrivals so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Arrivals {
    /// Input step → the token that arrived from it.
    #[serde(default)]
    pub arrived: Map<String, Value>,
    /// Merged args of the arrivals.
    #[serde(default)]
    pub args: Map<String, Value>,
    /// The last firings (bounded): the token that fired the join and the
    /// merged args it fired with, so a redelivered firing token fires with
    /// the same args (same ids: JetStream drops the duplicates).
    #[serde(default)]
    pub firings: Vec<Firing>,
    /// Tokens absorbed by an earlier firing (bounded): a redelivered one
    /// must not arrive again, or it would re-arm the join with a stale
    /// token.
    #[serde(default)]
    pub consumed: Vec<String>,
}

/// One firing of a join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Firing {
    /// The token that fired it.
    pub token: String,
    /// The merged args it fired with.
    pub args: Map<String, Value>,
}

impl Arrivals {
    /// Give the firing of stopped token `old` to `new` (same merged args),
    /// so the token a resume runs again fires the join at once instead of
    /// waiting for inputs that arrived long ago. False, the record
    /// unchanged, when `new` has its firing already or `old` fired
    /// nothing here.
    pub fn refire(&mut self, old: &str, new: &str) -> bool {
        if self.firings.iter().any(|f| f.token == new) {
            return false;
        }
        let Some(f) = self.firings.iter().find(|f| f.token == old) else {
            return false;
        };
        let again = Firing {
            token: new.to_string(),
            args: f.args.clone(),
        };
        self.firings.push(again);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_join_fired_by_the_stopped_token_fires_again_for_the_new_one() {
        let rec = json!({"arrived": {}, "args": {}, "firings": [{"token": "old", "args": {"x": 1}}], "consumed": ["o2"]});
        let mut a: Arrivals = serde_json::from_value(rec).unwrap();
        assert!(a.refire("old", "new"));
        assert_eq!(
            serde_json::to_value(&a.firings).unwrap(),
            json!([{"token": "old", "args": {"x": 1}}, {"token": "new", "args": {"x": 1}}])
        );
        assert_eq!(a.consumed, vec!["o2".to_string()]);
        let once = a.clone();
        assert!(!a.refire("old", "new"), "once");
        assert!(!a.refire("other", "new2"), "other fired nothing");
        assert_eq!(a, once);
    }

    #[test]
    fn a_record_written_before_firings_were_kept_reads() {
        let a: Arrivals =
            serde_json::from_value(json!({"arrived": {"left": "t1"}, "args": {"a": 1}})).unwrap();
        assert!(a.firings.is_empty() && a.consumed.is_empty());
        assert_eq!(a.arrived["left"], "t1");
    }
}
