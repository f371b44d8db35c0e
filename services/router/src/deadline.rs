//! Routing stops at the execution's deadline: past it, a boundary event
//! fires no arc and the execution fails, naming the deadline (its timer,
//! `timers`, would end it a moment later). A leaf: the boundary handler and
//! the timers both read it.

use noetl_core::lifecycle::{self, Due};
use noetl_mesh::plan::PlanRecord;

/// The error that stops routing when the execution is past its deadline
/// and arcs would start more steps (checked on every boundary event).
pub fn stops_routing(plan: &PlanRecord, fires: bool, now_ms: u64) -> Option<String> {
    if !fires || plan.started_ms == 0 {
        return None;
    }
    let d = lifecycle::execution_deadline(&plan.playbook, plan.started_ms)?;
    match lifecycle::due(d.at_ms, now_ms) {
        Due::Now => Some(lifecycle::execution_timeout_message(&d)),
        Due::In(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(timeout_s: Option<u64>, started_ms: u64) -> PlanRecord {
        let mut playbook = json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "t"},
            "workflow": [{"step": "start"}],
        });
        if let Some(s) = timeout_s {
            playbook["executor"] = json!({"spec": {"limits": {"timeout_s": s}}});
        }
        let mut p = PlanRecord::new(
            "e1".into(),
            "t.yaml".into(),
            serde_json::from_value(playbook).unwrap(),
            json!({}),
        );
        p.started_ms = started_ms;
        p
    }

    #[test]
    fn past_the_execution_deadline_no_arc_fires() {
        let p = plan(Some(2), 1_000);
        let stop = stops_routing(&p, true, 3_000).expect("past the deadline");
        assert!(stop.contains("executor.spec.limits.timeout_s: 2"), "{stop}");
        assert_eq!(stops_routing(&p, true, 2_999), None, "before it");
    }

    #[test]
    fn routing_goes_on_without_a_deadline_or_without_tokens_to_fire() {
        assert_eq!(stops_routing(&plan(None, 1_000), true, u64::MAX), None);
        assert_eq!(stops_routing(&plan(Some(2), 1_000), false, 9_000), None);
        assert_eq!(
            stops_routing(&plan(Some(2), 0), true, 9_000),
            None,
            "not started"
        );
    }
}
