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

use serde_json::Value;

use std::collections::{BTreeMap, BTreeSet};

use noetl_mesh::{
    event_type::EventType,
    join_record::{Arrivals, Firing},
    keys::Keys,
    kv::{self, Cas},
    payloads,
    replay::LogReader,
    Mesh, MeshError,
};

/// The inputs a join waits for, if the step is a join.
pub use noetl_mesh::dispatch::join_inputs as inputs;

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

/// A token arriving at a join.
struct JoinToken<'a> {
    /// The input steps the join waits for.
    inputs: &'a [String],
    /// The step whose arc sent the token.
    from_step: &'a str,
    /// The token (its step-run id).
    token_id: &'a str,
    /// The token's args (merged into the firing's).
    args: &'a Value,
}

/// What [`absorb`] decided.
#[derive(Debug, Clone)]
struct Absorbed {
    /// The record to write (`None`: keep it as it is).
    write: Option<Arrivals>,
    /// Wait or fire.
    outcome: JoinOutcome,
    /// The token was seen before (its firing or absorption is recorded):
    /// only acted on while the router still holds it live.
    redelivered: bool,
}

/// The join's record after token `t` arrives, and what to do. A token from
/// a step that is not an input counts as its own place (it never
/// completes the join); once every input has arrived the join fires with
/// the merged args and re-arms, remembering the firing token and the
/// absorbed ones (bounded) so their redeliveries change nothing.
fn absorb(cur: Option<&Arrivals>, t: &JoinToken<'_>) -> Absorbed {
    let need = t.inputs.len();
    let have = |a: &Arrivals| {
        t.inputs
            .iter()
            .filter(|i| a.arrived.contains_key(*i))
            .count()
    };
    let keep = |outcome, redelivered| Absorbed {
        write: None,
        outcome,
        redelivered,
    };
    let mut a = cur.cloned().unwrap_or_default();
    if let Some(f) = a.firings.iter().find(|f| f.token == t.token_id) {
        return keep(JoinOutcome::Fire(Value::Object(f.args.clone())), true);
    }
    if a.consumed.iter().any(|c| c == t.token_id) {
        return keep(
            JoinOutcome::Wait {
                have: have(&a),
                need,
            },
            true,
        );
    }
    let place = if t.inputs.iter().any(|i| i == t.from_step) {
        t.from_step.to_string()
    } else {
        format!("~{}", t.from_step)
    };
    if a.arrived.get(&place).and_then(Value::as_str) == Some(t.token_id) {
        return keep(
            JoinOutcome::Wait {
                have: have(&a),
                need,
            },
            false,
        );
    }
    a.arrived
        .insert(place, Value::String(t.token_id.to_string()));
    if let Value::Object(m) = t.args {
        for (k, v) in m {
            a.args.insert(k.clone(), v.clone());
        }
    }
    let n = have(&a);
    if n < need {
        return Absorbed {
            write: Some(a),
            outcome: JoinOutcome::Wait { have: n, need },
            redelivered: false,
        };
    }
    let outcome = JoinOutcome::Fire(Value::Object(a.args.clone()));
    a.firings.push(Firing {
        token: t.token_id.to_string(),
        args: std::mem::take(&mut a.args),
    });
    for other in std::mem::take(&mut a.arrived).into_values() {
        if let Value::String(other) = other {
            if other != t.token_id {
                a.consumed.push(other);
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
    Absorbed {
        write: Some(a),
        outcome,
        redelivered: false,
    }
}

/// [`absorb`] of token `t` into the record read (`cur`), unless the record
/// is missing and the log was not found empty of the join's arrivals in
/// the same attempt (`none_in_log`): it was purged after the arrival
/// looked, and the log must be read again (`None`).
fn decide_arrival(
    cur: Option<&Arrivals>,
    none_in_log: bool,
    t: &JoinToken<'_>,
) -> Option<Absorbed> {
    if cur.is_none() && !none_in_log {
        return None;
    }
    Some(absorb(cur, t))
}

/// The join record of `step` as the scheduler's events of execution
/// `log` leave it: [`absorb`] of each of the step's tokens in the order the
/// scheduler decided them (its first `step.skipped`, admitting
/// `step.started` — `step.scheduled` in older logs — or `step.failed`),
/// with the from-step and args of its creation
/// ([`payloads::tokens_created`]).
/// `None` when no token of the step was decided. Over a slice (the
/// tests'); [`restore`] makes the same two passes ([`Created`],
/// [`Decided`]) over the log as it reads it.
#[cfg(test)]
fn fold_arrivals(
    log: &[noetl_mesh::replay::Logged],
    step: &str,
    inputs: &[String],
) -> Option<Arrivals> {
    let mut created = Created::default();
    for l in log {
        created.see(&l.event, step);
    }
    let mut decided = Decided::new(&created, step, inputs);
    for l in log {
        decided.see(&l.event);
    }
    decided.cur
}

/// The first pass over a log of the fold of a join's arrivals: the step of each
/// step-run (what a token's from-step is), and the tokens of the join
/// step, with the step-run that created each and its args.
#[derive(Debug, Default)]
struct Created {
    step_of: BTreeMap<String, String>,
    tokens: BTreeMap<String, (String, Value)>,
}

impl Created {
    fn see(&mut self, ev: &noetl_wire::Event, step: &str) {
        if !ev.step_run_id.is_empty() && !self.step_of.contains_key(&ev.step_run_id) {
            self.step_of.insert(ev.step_run_id.clone(), ev.step.clone());
        }
        for t in payloads::tokens_created(ev).unwrap_or_default() {
            if t.step != step {
                continue;
            }
            self.tokens.insert(t.token_id, (t.parent, t.args));
        }
    }
}

/// The second pass of the fold of a join's arrivals: the record as the
/// scheduler's decisions leave it.
struct Decided<'a> {
    created: &'a Created,
    step: &'a str,
    inputs: &'a [String],
    decided: BTreeSet<String>,
    cur: Option<Arrivals>,
    resumes: u32,
}

impl<'a> Decided<'a> {
    fn new(created: &'a Created, step: &'a str, inputs: &'a [String]) -> Self {
        Self {
            created,
            step,
            inputs,
            decided: BTreeSet::new(),
            cur: None,
            resumes: 0,
        }
    }

    fn see(&mut self, ev: &noetl_wire::Event) {
        match EventType::of(ev) {
            Some(EventType::ExecutionResumed) => {
                if let Ok(r) = payloads::decode_typed::<payloads::Resumed>(ev) {
                    self.resumes = r.resumes;
                }
                return;
            }
            // A resume's token of the join step: the join fires again
            // for it as the resume made it ([`refired`]).
            Some(EventType::TokenCreated) if self.resumes > 0 => {
                if let (Some(a), Ok(t)) = (
                    self.cur.as_mut(),
                    payloads::decode_typed::<payloads::TokenCreated>(ev),
                ) {
                    if t.step == self.step {
                        refired(a, self.resumes, &t.token_id);
                    }
                }
                return;
            }
            _ => {}
        }
        let by_scheduler = matches!(
            EventType::of(ev),
            Some(EventType::StepSkipped | EventType::StepFailed)
        ) || payloads::is_admission(ev);
        if !by_scheduler || ev.step != self.step || self.decided.contains(&ev.step_run_id) {
            return;
        }
        self.decided.insert(ev.step_run_id.clone());
        let Some((from_run, args)) = self.created.tokens.get(&ev.step_run_id) else {
            return;
        };
        let from_step = (self.created.step_of.get(from_run)).map_or("", String::as_str);
        let token = JoinToken {
            inputs: self.inputs,
            from_step,
            token_id: &ev.step_run_id,
            args,
        };
        if let Some(a) = absorb(self.cur.as_ref(), &token).write {
            self.cur = Some(a);
        }
    }
}

/// The join record `a` as resume `n` leaves it for its token `new`: the
/// firing of the stopped token `new` runs again (`new` is its
/// [`noetl_mesh::resume::again_id`]) given to `new` with the same merged
/// args, as the router gave it ([`Arrivals::refire`]), so
/// the resumed token fires the join at once instead of waiting for
/// inputs that arrived long ago.
fn refired(a: &mut Arrivals, n: u32, new: &str) {
    let old = (a.firings.iter())
        .find(|f| noetl_mesh::resume::again_id(&f.token, n) == new)
        .map(|f| f.token.clone());
    if let Some(old) = old {
        a.refire(&old, new);
    }
}

/// A join record missing while the execution has events that fill one
/// (an earlier arrival waited: there is a `step.skipped`; or a resume
/// gave a stopped firing to its new token), written back
/// from them (create-only: one written meanwhile wins). Returns whether
/// the log holds arrivals of the join (a record of them is there now,
/// unless purged again since).
async fn restore(mesh: &Mesh, eid: &str, step: &str, inputs: &[String]) -> Result<bool, MeshError> {
    let waited = mesh.last_event_seq(eid, EventType::StepSkipped).await?;
    if waited.is_none()
        && (mesh.last_event_seq(eid, EventType::ExecutionResumed))
            .await?
            .is_none()
    {
        return Ok(false); // no token ever waited, none resumed: nothing to lose
    }
    // Two passes over the log (`Created`, `Decided`), each read a chunk at a
    // time: a join after a long loop does not hold the loop's events. The
    // second stops where the first did.
    let mut created = Created::default();
    let mut log = LogReader::of(mesh, eid);
    while let Some(l) = log.next().await? {
        created.see(&l.event, step);
    }
    let mut decided = Decided::new(&created, step, inputs);
    let mut log = LogReader::of(mesh, eid).through(log.read_through());
    while let Some(l) = log.next().await? {
        decided.see(&l.event);
    }
    let Some(arrivals) = decided.cur else {
        return Ok(false);
    };
    if kv::create(mesh.exec_kv(), &Keys::join(eid, step), &arrivals).await? {
        tracing::warn!(execution_id = %eid, step, arrived = arrivals.arrived.len(),
            "a join record was missing: rebuilt from the events");
    }
    Ok(true)
}

/// Record `token_id` arriving from `from_step` with `args`.
///
/// Redelivery: a token that already fired the join fires again with the
/// same args while its step-run is live (the publishes that followed may
/// have failed; their ids are deterministic); a token absorbed earlier is
/// absorbed again without re-arming the join. Either is [`JoinOutcome::Stale`]
/// once the router no longer holds the token live.
///
/// A missing record is never taken for "no arrival yet" unless the log
/// says so in the same attempt: a record purged between the arrival's
/// read and its write would otherwise be replaced by one holding this
/// token alone, and the join would wait for an input that came already.
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
    let token = JoinToken {
        inputs,
        from_step,
        token_id,
        args,
    };
    let mut decided = None;
    for _ in 0..kv::RESTORES {
        // Lost (purged) records come back from the log first; a record is
        // there from the first arrival on, so a missing one costs one read.
        let none_in_log = kv::get::<Arrivals>(mesh.exec_kv(), &key).await?.is_none()
            && !restore(mesh, eid, step, inputs).await?;
        kv::update(mesh.exec_kv(), &key, |cur: Option<&Arrivals>| {
            decided = decide_arrival(cur, none_in_log, &token);
            match decided.as_ref().and_then(|d| d.write.clone()) {
                Some(a) => Cas::Write(a),
                None => Cas::Keep,
            }
        })
        .await?;
        if decided.is_some() {
            break;
        }
    }
    let Some(Absorbed {
        outcome,
        redelivered,
        ..
    }) = decided
    else {
        // Retryable: the token is delivered again.
        return Err(kv::conflict(mesh.exec_kv(), &key, kv::RESTORES));
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_core::Playbook;
    use noetl_mesh::replay::Logged;
    use serde_json::json;

    fn inputs() -> Vec<String> {
        vec!["left".into(), "right".into()]
    }

    /// Token `id` from `from` arrives at a left+right join holding `cur`.
    fn arrive(cur: Option<&Arrivals>, from: &str, id: &str, args: Value) -> Absorbed {
        let inputs = inputs();
        absorb(
            cur,
            &JoinToken {
                inputs: &inputs,
                from_step: from,
                token_id: id,
                args: &args,
            },
        )
    }

    #[test]
    fn a_record_missing_is_no_arrival_only_when_the_log_says_so() {
        let (inputs, args) = (inputs(), json!({"b": 2}));
        let token = JoinToken {
            inputs: &inputs,
            from_step: "left",
            token_id: "t2",
            args: &args,
        };
        // Purged after the arrival found it (or its rebuild): read again.
        assert!(decide_arrival(None, false, &token).is_none());
        // The log holds no arrival: this is the first.
        let first = decide_arrival(None, true, &token).expect("decided");
        assert_eq!(first.outcome, JoinOutcome::Wait { have: 1, need: 2 });
        // A record read: absorbed into it, whatever the log said.
        let waiting = arrive(None, "right", "t1", json!({"a": 1})).write.unwrap();
        let fired = decide_arrival(Some(&waiting), false, &token).expect("decided");
        assert!(matches!(fired.outcome, JoinOutcome::Fire(_)), "{fired:?}");
    }

    fn logged(seq: u64, kind: &str, step: &str, run: &str, payload: Value) -> Logged {
        Logged {
            seq,
            event: noetl_wire::Event {
                event_type: kind.into(),
                execution_id: "e1".into(),
                step: step.into(),
                step_run_id: run.into(),
                payload_json: serde_json::to_vec(&payload).unwrap(),
                ..Default::default()
            },
        }
    }

    fn created(seq: u64, from_run: &str, token: &str, args: Value) -> Logged {
        let p = json!({"token_id": token, "step": "merge", "arc": 0, "args": args});
        logged(seq, "token.created", "merge", from_run, p)
    }

    #[test]
    fn a_join_record_folds_from_the_scheduler_s_events_as_it_was_written() {
        let inputs = inputs();
        let mut log = vec![
            logged(1, "step.done", "left", "rl", json!({"status": "ok"})),
            created(2, "rl", "t1", json!({"a": 1})),
            logged(3, "step.done", "right", "rr", json!({"status": "ok"})),
            created(4, "rr", "t2", json!({"b": 2})),
            logged(
                5,
                "step.skipped",
                "merge",
                "t1",
                json!({"reason": "join.waiting"}),
            ),
        ];
        // Waiting: the first arrival, as `arrive` recorded it.
        let waiting = fold_arrivals(&log, "merge", &inputs).expect("a record");
        let live = arrive(None, "left", "t1", json!({"a": 1})).write.unwrap();
        assert_eq!(waiting.arrived, live.arrived);
        assert_eq!(waiting.args, live.args);
        // Fired: the second arrival's decision (and a later failure of the
        // same step-run is not another arrival).
        log.push(logged(
            6,
            "step.started",
            "merge",
            "t2",
            json!({"loop": false}),
        ));
        log.push(logged(
            7,
            "step.failed",
            "merge",
            "t2",
            json!({"status": "error"}),
        ));
        let fired = fold_arrivals(&log, "merge", &inputs).expect("a record");
        let live = arrive(Some(&live), "right", "t2", json!({"b": 2}))
            .write
            .unwrap();
        assert!(fired.arrived.is_empty() && fired.args.is_empty());
        assert_eq!(fired.consumed, live.consumed);
        assert_eq!(fired.firings.len(), 1);
        assert_eq!(fired.firings[0].token, "t2");
        assert_eq!(
            Value::Object(fired.firings[0].args.clone()),
            json!({"a": 1, "b": 2})
        );
        // No token of the step decided: no record.
        assert!(fold_arrivals(&log[..4], "merge", &inputs).is_none());
    }

    #[test]
    fn a_resumed_firing_token_folds_as_the_resume_refired_it() {
        let inputs = inputs();
        let mut log = vec![
            logged(1, "step.done", "left", "rl", json!({"status": "ok"})),
            created(2, "rl", "t1", json!({"a": 1})),
            logged(3, "step.done", "right", "rr", json!({"status": "ok"})),
            created(4, "rr", "t2", json!({"b": 2})),
            logged(5, "step.skipped", "merge", "t1", json!({})),
            logged(6, "step.started", "merge", "t2", json!({"loop": false})),
            logged(7, "step.failed", "merge", "t2", json!({"status": "error"})),
            logged(8, "execution.failed", "", "", json!({"status": "error"})),
        ];
        let stopped = fold_arrivals(&log, "merge", &inputs).expect("a record");
        // Resume 1 runs t2 again as its again_id, with t2's merged args.
        let again = noetl_mesh::resume::again_id("t2", 1);
        let mut live = stopped.clone();
        assert!(live.refire("t2", &again), "t2 fired the join");
        log.push(logged(
            9,
            "execution.resumed",
            "",
            "",
            json!({"resumes": 1, "steps": ["merge"]}),
        ));
        let mut token = created(10, "", &again, json!({"b": 2}));
        let mut p: Value = serde_json::from_slice(&token.event.payload_json).unwrap();
        p["parent"] = json!("rr");
        token.event.payload_json = serde_json::to_vec(&p).unwrap();
        log.push(token);
        let resumed = fold_arrivals(&log, "merge", &inputs).expect("a record");
        assert_eq!(resumed, live);
        // The resumed token fires at once, with the stopped firing's args.
        let at = arrive(Some(&resumed), "right", &again, json!({"b": 2}));
        assert_eq!(at.outcome, JoinOutcome::Fire(json!({"a": 1, "b": 2})));
        // A token of another resume, or of a token that fired nothing: none.
        let other = noetl_mesh::resume::again_id("t1", 1);
        let mut a = stopped.clone();
        refired(&mut a, 1, &other);
        refired(&mut a, 2, &again);
        assert_eq!(a.firings.len(), stopped.firings.len());
    }

    #[test]
    fn the_first_input_waits_and_the_last_fires_with_merged_args() {
        let first = arrive(None, "left", "t1", json!({"a": 1}));
        assert_eq!(first.outcome, JoinOutcome::Wait { have: 1, need: 2 });
        assert!(!first.redelivered);
        let a = first.write.expect("recorded");
        let second = arrive(Some(&a), "right", "t2", json!({"b": 2}));
        assert_eq!(second.outcome, JoinOutcome::Fire(json!({"a": 1, "b": 2})));
        let a = second.write.expect("recorded");
        assert!(a.arrived.is_empty() && a.args.is_empty(), "re-armed");
        assert_eq!(a.consumed, vec!["t1".to_string()]);
    }

    #[test]
    fn a_redelivered_firing_token_fires_again_with_the_same_args() {
        let a = arrive(None, "left", "t1", json!({"a": 1})).write.unwrap();
        let a = arrive(Some(&a), "right", "t2", json!({"b": 2}))
            .write
            .unwrap();
        let again = arrive(Some(&a), "right", "t2", json!({"b": 99}));
        assert_eq!(again.outcome, JoinOutcome::Fire(json!({"a": 1, "b": 2})));
        assert!(again.redelivered && again.write.is_none());
    }

    #[test]
    fn a_redelivered_absorbed_token_does_not_re_arm_the_join() {
        let a = arrive(None, "left", "t1", json!({})).write.unwrap();
        let a = arrive(Some(&a), "right", "t2", json!({})).write.unwrap();
        let again = arrive(Some(&a), "left", "t1", json!({}));
        assert_eq!(again.outcome, JoinOutcome::Wait { have: 0, need: 2 });
        assert!(again.redelivered && again.write.is_none());
    }

    #[test]
    fn the_same_token_twice_before_firing_counts_once() {
        let a = arrive(None, "left", "t1", json!({})).write.unwrap();
        let again = arrive(Some(&a), "left", "t1", json!({}));
        assert_eq!(again.outcome, JoinOutcome::Wait { have: 1, need: 2 });
        assert!(again.write.is_none() && !again.redelivered);
    }

    #[test]
    fn a_token_from_a_step_that_is_not_an_input_never_completes_the_join() {
        let a = arrive(None, "left", "t1", json!({})).write.unwrap();
        let stray = arrive(Some(&a), "elsewhere", "t9", json!({}));
        assert_eq!(stray.outcome, JoinOutcome::Wait { have: 1, need: 2 });
        assert!(stray.write.unwrap().arrived.contains_key("~elsewhere"));
    }

    #[test]
    fn a_second_round_fires_again_and_memory_stays_bounded() {
        let mut a: Option<Arrivals> = None;
        for round in 0..(REMEMBERED + 5) {
            let l = format!("l{round}");
            let r = format!("r{round}");
            let w = arrive(a.as_ref(), "left", &l, json!({})).write.unwrap();
            let fired = arrive(Some(&w), "right", &r, json!({"round": round}));
            assert_eq!(fired.outcome, JoinOutcome::Fire(json!({"round": round})));
            a = fired.write;
        }
        let a = a.unwrap();
        assert_eq!(a.firings.len(), REMEMBERED);
        assert_eq!(a.consumed.len(), REMEMBERED);
    }

    fn playbook(workflow: Value) -> Playbook {
        serde_json::from_value(json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "join"},
            "workflow": workflow,
        }))
        .expect("a valid normalised playbook")
    }

    #[test]
    fn a_step_reached_by_two_arcs_of_one_step_is_one_input() {
        let pb = playbook(json!([
            {"step": "start", "next": {"arcs": [
                {"step": "merge", "when": "{{ ctx.a }}"},
                {"step": "merge"},
            ]}},
            {"step": "merge", "spec": {"join": "all"}},
        ]));
        assert_eq!(
            super::inputs(&pb, pb.step("merge").unwrap()),
            Some(vec!["start".to_string()])
        );
    }

    #[test]
    fn join_inputs_come_from_incoming_arcs_or_the_from_list() {
        let pb = playbook(json!([
            {"step": "start", "next": {"arcs": [{"step": "left"}, {"step": "right"}]}},
            {"step": "left", "next": {"arcs": [{"step": "merge"}]}},
            {"step": "right", "next": {"arcs": [{"step": "merge"}]}},
            {"step": "merge", "spec": {"join": "all"}},
            {"step": "pick", "spec": {"join": {"from": ["left"]}}},
            {"step": "plain"},
        ]));
        let step = |name: &str| pb.step(name).unwrap();
        assert_eq!(
            super::inputs(&pb, step("merge")),
            Some(vec!["left".to_string(), "right".to_string()])
        );
        assert_eq!(
            super::inputs(&pb, step("pick")),
            Some(vec!["left".to_string()])
        );
        assert_eq!(super::inputs(&pb, step("plain")), None);
    }
}
