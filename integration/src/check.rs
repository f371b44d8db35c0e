//! What every execution of the playbook [`mix`](crate::mix) must show once
//! it ended, whatever was killed or delivered twice: a pure function of what was read back (KV, the event stream,
//! the sink's counts) and the case's expectation.

use std::collections::{BTreeMap, BTreeSet};

use noetl_mesh::events::payload;
use noetl_mesh::state::{ExecHeader, ExecSummary};
use noetl_wire::Event;
use serde_json::Value;

use crate::mix::Case;

/// What was read back for one execution.
pub struct Observed<'a> {
    /// Its header, if it exists.
    pub header: Option<&'a ExecHeader>,
    /// Its summary (status, ctx, steps), if it exists.
    pub summary: Option<&'a ExecSummary>,
    /// Every event in the stream for it, in stream order.
    pub events: &'a [Event],
    /// The sink's calls for it: key → count.
    pub calls: &'a BTreeMap<String, u32>,
    /// Its rows in PostgreSQL ([`crate::rows::of`]): `<step>/<idx>` →
    /// attempts.
    pub rows: &'a BTreeMap<String, u32>,
}

/// The verdict on one execution.
#[derive(Debug, Default)]
pub struct Verdict {
    /// What is wrong; empty when everything holds.
    pub anomalies: Vec<String>,
    /// Calls the sink saw more than once for one reported attempt
    /// (at-least-once: a crash interrupted the call).
    pub repeated_calls: u32,
}

/// Numbers equal as numbers (`3` and `3.0`), everything else exactly.
pub fn same(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Number(e), Value::Number(a)) => e.as_f64() == a.as_f64(),
        (Value::Array(e), Value::Array(a)) => {
            e.len() == a.len() && e.iter().zip(a).all(|(x, y)| same(x, y))
        }
        (Value::Object(e), Value::Object(a)) => {
            e.len() == a.len()
                && e.iter()
                    .all(|(k, v)| a.get(k).is_some_and(|av| same(v, av)))
        }
        _ => expected == actual,
    }
}

/// Check one execution against its case.
pub fn check(case: &Case, seen: &Observed<'_>) -> Verdict {
    let mut v = Verdict::default();
    let mut bad = |s: String| v.anomalies.push(s);
    let (Some(header), Some(summary)) = (seen.header, seen.summary) else {
        bad("no header: the execution was never started".into());
        return v;
    };

    let status = serde_json::to_value(summary.status).unwrap_or_default();
    if status != case.status {
        bad(format!(
            "status {status}, expected {:?} (error: {:?})",
            case.status, summary.error
        ));
    }
    if !same(&case.ctx, &summary.ctx) {
        bad(format!("ctx {}, expected {}", summary.ctx, case.ctx));
    }
    let steps = serde_json::to_value(&summary.steps).unwrap_or_default();
    if steps != case.steps {
        bad(format!("steps {steps}, expected {}", case.steps));
    }
    if !header.live.is_empty() {
        let live: Vec<&str> = header.live.iter().map(|t| t.step.as_str()).collect();
        bad(format!("tokens left live at the end: {live:?}"));
    }

    // Every event id once: JetStream's de-duplication and the
    // deterministic ids hold across kills and server restarts.
    let mut ids = BTreeSet::new();
    for e in seen.events {
        if !ids.insert(e.event_id.as_str()) {
            bad(format!(
                "event {} ({} {}) stored twice",
                e.event_id, e.event_type, e.step
            ));
        }
    }
    let events = seen.events;
    fn of<'e>(events: &'e [Event], t: &'e str) -> impl Iterator<Item = &'e Event> + 'e {
        events.iter().filter(move |e| e.event_type == t)
    }

    let terminal =
        of(events, "execution.completed").count() + of(events, "execution.failed").count();
    if terminal != 1 {
        bad(format!("{terminal} terminal events, expected 1"));
    }

    // A step-run ends once: one step.done or step.failed.
    let mut ends: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in of(events, "step.done").chain(of(events, "step.failed")) {
        ends.entry(e.step_run_id.as_str())
            .or_default()
            .push(e.event_type.as_str());
    }
    for (srid, types) in &ends {
        if types.len() > 1 {
            bad(format!(
                "step-run {srid} ended {} times: {types:?}",
                types.len()
            ));
        }
    }

    // Loops: one loop.done per loop step, counting each item once.
    for (step, expected_done) in case.loops {
        let dones: Vec<&Event> = of(events, "loop.done")
            .filter(|e| e.step == *step)
            .collect();
        if dones.len() != 1 {
            bad(format!(
                "{} loop.done for step {step}, expected 1",
                dones.len()
            ));
            continue;
        }
        let counts = payload(dones[0])["counts"].clone();
        if counts["done"].as_u64() != Some(*expected_done) || counts["failed"].as_u64() != Some(0) {
            bad(format!(
                "loop {step} counted {counts}, expected {expected_done} done"
            ));
        }
        let mut per_index: BTreeMap<u64, u32> = BTreeMap::new();
        for e in of(events, "loop.iteration.done")
            .chain(of(events, "loop.iteration.failed"))
            .filter(|e| e.step == *step)
        {
            if let Some(i) = payload(e)["index"].as_u64() {
                *per_index.entry(i).or_default() += 1;
            }
        }
        let twice: Vec<u64> = per_index
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(i, _)| *i)
            .collect();
        if !twice.is_empty() {
            bad(format!("loop {step}: iterations {twice:?} reported twice"));
        }
        if per_index.len() as u64 != *expected_done {
            bad(format!(
                "loop {step}: {} iterations reported, expected {expected_done}",
                per_index.len()
            ));
        }
    }

    // Side effects: each attempt the engine reports is one distinct call
    // key; a key called more than once is a call a crash interrupted.
    if !case.http_tasks.is_empty() {
        let reported = seen
            .events
            .iter()
            .filter(|e| e.event_type == "task.done" && case.http_tasks.contains(&e.task.as_str()))
            .map(|e| e.event_id.as_str())
            .collect::<BTreeSet<_>>()
            .len();
        let distinct = seen.calls.len();
        if distinct != reported {
            bad(format!(
                "{reported} http attempts reported, {distinct} distinct calls made: {:?}",
                seen.calls
            ));
        }
        v.repeated_calls = seen.calls.values().map(|n| n.saturating_sub(1)).sum();
    }

    // Rows in PostgreSQL: each (step, iteration) key exactly once (the
    // table's key keeps a repeat to one row and counts it in `attempts`).
    if !case.rows.is_empty() {
        let expected: BTreeSet<String> = case
            .rows
            .iter()
            .flat_map(|(step, n)| (0..*n).map(move |i| format!("{step}/{i}")))
            .collect();
        let found: BTreeSet<String> = seen.rows.keys().cloned().collect();
        if found != expected {
            let missing: Vec<&String> = expected.difference(&found).collect();
            let extra: Vec<&String> = found.difference(&expected).collect();
            bad(format!(
                "rows in PostgreSQL: missing {missing:?}, unexpected {extra:?}"
            ));
        }
        v.repeated_calls += seen.rows.values().map(|n| n.saturating_sub(1)).sum::<u32>();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mix::mix;
    use noetl_mesh::state::ExecStatus;
    use serde_json::json;

    fn event(t: &str, step: &str, srid: &str, task: &str, payload: Value) -> Event {
        Event {
            event_id: format!("{t}/{step}/{srid}/{task}/{payload}"),
            event_type: t.into(),
            step: step.into(),
            step_run_id: srid.into(),
            task: task.into(),
            payload_json: serde_json::to_vec(&payload).unwrap(),
            ..Default::default()
        }
    }

    fn retries_ok() -> (ExecHeader, ExecSummary, Vec<Event>, BTreeMap<String, u32>) {
        let header = ExecHeader {
            execution_id: "e".into(),
            status: ExecStatus::Completed,
            playbook: "chaos_retries".into(),
            source: "retries".into(),
            live: vec![],
            terminal_emitted: true,
            started_at: String::new(),
            ended_at: None,
            error: None,
            parent_execution_id: String::new(),
            stopped: Vec::new(),
            resumes: 0,
            resumed_at_ms: 0,
        };
        let summary = ExecSummary {
            execution_id: "e".into(),
            status: ExecStatus::Completed,
            playbook: "chaos_retries".into(),
            ctx: json!({"succeeded_on": 3.0}),
            steps: [("start".to_string(), "done".to_string())].into(),
            error: None,
            started_at: String::new(),
            ended_at: None,
            paused: None,
            queued: false,
        };
        let events = vec![
            event("task.done", "start", "r1", "flaky", json!({"attempt": 1})),
            event("task.done", "start", "r1", "flaky", json!({"attempt": 2})),
            event("task.done", "start", "r1", "flaky", json!({"attempt": 3})),
            event("step.done", "start", "r1", "", json!({})),
            event("execution.completed", "", "", "", json!({})),
        ];
        let calls = [
            ("flaky/-/1".to_string(), 1),
            ("flaky/-/2".to_string(), 2),
            ("flaky/-/3".to_string(), 1),
        ]
        .into();
        (header, summary, events, calls)
    }

    fn case(name: &str) -> Case {
        mix().into_iter().find(|c| c.name == name).unwrap()
    }

    fn verdict(
        c: &Case,
        h: &ExecHeader,
        s: &ExecSummary,
        e: &[Event],
        calls: &BTreeMap<String, u32>,
    ) -> Verdict {
        check(
            c,
            &Observed {
                header: Some(h),
                summary: Some(s),
                events: e,
                calls,
                rows: &BTreeMap::new(),
            },
        )
    }

    #[test]
    fn a_clean_end_has_no_anomaly_and_counts_repeated_calls() {
        let (h, s, e, calls) = retries_ok();
        let v = verdict(&case("retries"), &h, &s, &e, &calls);
        assert!(v.anomalies.is_empty(), "{:?}", v.anomalies);
        assert_eq!(v.repeated_calls, 1);
    }

    #[test]
    fn each_broken_guarantee_is_named() {
        let c = case("retries");
        let (mut h, mut s, mut e, mut calls) = retries_ok();
        s.ctx = json!({"succeeded_on": 2});
        s.status = ExecStatus::Failed;
        h.live.push(noetl_mesh::state::TokenRecord {
            token_id: "t".into(),
            step: "start".into(),
            args: Value::Null,
            arc: 0,
            parent: String::new(),
        });
        e.push(event("step.failed", "start", "r1", "", json!({})));
        e.push(e[0].clone());
        e.push(event("execution.failed", "", "", "", json!({})));
        calls.insert("flaky/-/9".into(), 1);
        let v = verdict(&c, &h, &s, &e, &calls);
        let all = v.anomalies.join("\n");
        for needle in [
            "status \"failed\"",
            "ctx {",
            "tokens left live",
            "stored twice",
            "2 terminal events",
            "ended 2 times",
            "http attempts reported",
        ] {
            assert!(all.contains(needle), "{needle} missing from:\n{all}");
        }
    }

    #[test]
    fn a_loop_item_counted_twice_or_missing_is_an_anomaly() {
        let c = case("children");
        let (h, mut s, _, calls) = retries_ok();
        s.ctx = c.ctx.clone();
        s.steps = [("start".to_string(), "done".to_string())].into();
        let it = |i: u64| event("loop.iteration.done", "start", "l", "", json!({"index": i}));
        let mut e = vec![
            it(0),
            it(1),
            event(
                "loop.done",
                "start",
                "l",
                "",
                json!({"counts": {"done": 3, "failed": 0}}),
            ),
            event("execution.completed", "", "", "", json!({})),
        ];
        let mut dup = it(1);
        dup.event_id.push('x');
        e.push(dup);
        let v = verdict(&c, &h, &s, &e, &calls);
        let all = v.anomalies.join("\n");
        assert!(all.contains("iterations [1] reported twice"), "{all}");
        assert!(all.contains("2 iterations reported, expected 3"), "{all}");
    }

    #[test]
    fn a_row_missing_or_unexpected_is_an_anomaly_and_a_repeated_upsert_is_counted() {
        let c = case("rows");
        let (h, mut s, _, calls) = retries_ok();
        s.ctx = c.ctx.clone();
        s.steps = [("start".to_string(), "done".to_string())].into();
        let it = |i: u64| event("loop.iteration.done", "start", "l", "", json!({"index": i}));
        let mut e: Vec<Event> = (0..6).map(it).collect();
        e.push(event(
            "loop.done",
            "start",
            "l",
            "",
            json!({"counts": {"done": 6, "failed": 0}}),
        ));
        e.push(event("execution.completed", "", "", "", json!({})));
        let mut rows: BTreeMap<String, u32> = (0..6).map(|i| (format!("start/{i}"), 1)).collect();
        let check_rows = |rows: &BTreeMap<String, u32>| {
            check(
                &c,
                &Observed {
                    header: Some(&h),
                    summary: Some(&s),
                    events: &e,
                    calls: &calls,
                    rows,
                },
            )
        };
        let v = check_rows(&rows);
        assert!(v.anomalies.is_empty(), "{:?}", v.anomalies);
        rows.insert("start/2".into(), 3);
        assert_eq!(check_rows(&rows).repeated_calls, 2);
        rows.remove("start/4");
        rows.insert("start/9".into(), 1);
        let all = check_rows(&rows).anomalies.join("\n");
        assert!(
            all.contains(r#"missing ["start/4"], unexpected ["start/9"]"#),
            "{all}"
        );
    }

    #[test]
    fn numbers_compare_as_numbers_everything_else_exactly() {
        assert!(same(&json!({"a": [1, 2.0]}), &json!({"a": [1.0, 2]})));
        assert!(!same(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(!same(&json!(["x"]), &json!(["x", "y"])));
        assert!(!same(&json!("1"), &json!(1)));
    }
}
