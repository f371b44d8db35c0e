//! What a boundary publishes once its header write is stored: the tokens
//! it fired that are still live, and `next.selected` naming them, as
//! effects (deterministic ids: a redelivery republishes the same messages,
//! JetStream drops the copies). A token whose admission reads nothing is
//! not sent to the scheduler: its step-run is started here, with the
//! scheduler's own decision (`noetl_mesh::dispatch`), and its
//! `step.started` is stored inside `next.selected`.

use noetl_core::Step;
use noetl_mesh::{
    codec, dispatch,
    effects::Effect,
    events::EventDraft,
    patches::Carried,
    payloads::{NextSelected, SelectedArc},
    plan::PlanRecord,
    state::{ExecHeader, TokenRecord},
};
use noetl_wire::{Event, Token};
use serde_json::{Map, Value};

/// What [`fired`] needs.
pub(super) struct Fired<'a> {
    pub(super) ev: &'a Event,
    pub(super) step: &'a Step,
    pub(super) header: &'a ExecHeader,
    /// This delivery applied the boundary (a redelivery did not).
    pub(super) applied: bool,
    /// Why routing failed, if it did.
    pub(super) error: Option<String>,
    /// The `ctx` writes of the fired arcs, inline or by reference.
    pub(super) set_ctx: Option<Carried<Map<String, Value>>>,
    /// A redelivery that applied nothing and finds none of its tokens
    /// live, of a step-run with no `next.selected` in the log: the first
    /// delivery wrote the header and stopped before its events, so this
    /// one answers the boundary (it fired no token: a token is published
    /// only after its `next.selected` is stored).
    pub(super) unanswered: bool,
    /// Where the fired tokens may start at once: the execution's plan, and
    /// the time (epoch ms), unless the execution is paused (its tokens go
    /// to the scheduler, which holds them).
    pub(super) start_here: Option<(&'a PlanRecord, u64)>,
}

/// What the step-run's boundary publishes: `next.selected`, the router's
/// answer to the boundary that ends its token in the fold of the log and
/// names the tokens it fired that are still live in `header` (their
/// records: one event for the answer and its tokens, where there was a
/// `token.created` per token), then those tokens. Also for a skipped
/// step-run, with no arc; not for a redelivery that finds nothing of its
/// own left and its answer in the log already.
pub(super) fn fired(f: Fired<'_>) -> Vec<Effect> {
    let (ev, srid) = (f.ev, f.ev.step_run_id.as_str());
    let fired: Vec<&TokenRecord> = f.header.live.iter().filter(|t| t.parent == srid).collect();
    let mut arcs = Vec::with_capacity(fired.len());
    let mut work = Vec::new();
    for t in &fired {
        let mut token = Token {
            token_id: t.token_id.clone(),
            execution_id: ev.execution_id.clone(),
            step: t.step.clone(),
            args_json: Vec::new(),
            trace_id: ev.trace_id.clone(),
            parent_step_run_id: srid.to_string(),
            parent_step: ev.step.clone(),
        };
        // A step-run started here: its `step.started` rides in its arc
        // (read back as its own event), its work goes out after
        // `next.selected` (`effects::apply`). Else the token, with its
        // args, for the scheduler.
        let started = f.start_here.and_then(|(plan, now_ms)| {
            dispatch::start_unadmitted(plan, &token, t.args.clone(), now_ms)
        });
        let started = match started {
            Some(u) => {
                work.extend(u.then);
                Some(u.started)
            }
            None => {
                token.args_json = codec::json_bytes(&t.args);
                work.push(Effect::Token(token));
                None
            }
        };
        let arc = SelectedArc {
            arc: t.arc,
            step: t.step.clone(),
            token_id: t.token_id.clone(),
            args: t.args.clone(),
            started,
        };
        arcs.push(arc);
    }
    // The event first, then the tokens: a token's step can only start after
    // this boundary's `next.selected` is in the stream, so the stream
    // keeps cause before effect across services.
    let mut effects: Vec<Effect> = Vec::with_capacity(work.len() + 1);
    if f.applied || !fired.is_empty() || f.unanswered {
        let mode = f
            .step
            .next
            .as_ref()
            .map(|n| n.spec.mode)
            .unwrap_or_default();
        effects.push(Effect::Emit(
            EventDraft {
                execution_id: &ev.execution_id,
                step_run_id: srid,
                step: &ev.step,
                trace_id: &ev.trace_id,
                parent_id: &ev.event_id,
                ..Default::default()
            }
            .build(&NextSelected {
                on: ev.event_type.clone(),
                mode,
                arcs,
                error: f.error,
                set_ctx_ref: f.set_ctx.as_ref().and_then(Carried::reference),
                set_ctx: f.set_ctx.and_then(Carried::inline),
            }),
        ));
    }
    effects.extend(work);
    effects
}

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_mesh::state::ExecStatus;
    use serde_json::json;

    fn step() -> Step {
        serde_json::from_value(json!({"step": "a"})).unwrap()
    }

    fn ev(event_type: &str) -> Event {
        Event {
            event_id: "ev1".into(),
            event_type: event_type.into(),
            execution_id: "e1".into(),
            step: "a".into(),
            step_run_id: "r1".into(),
            ..Default::default()
        }
    }

    fn header(live: Vec<TokenRecord>) -> ExecHeader {
        ExecHeader {
            status: ExecStatus::Running,
            ..ExecHeader::running("e1", live)
        }
    }

    fn fired_token(id: &str, parent: &str) -> TokenRecord {
        TokenRecord {
            token_id: id.into(),
            step: format!("to-{id}"),
            args: json!({"x": 1}),
            arc: 0,
            parent: parent.into(),
        }
    }

    fn names(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .map(|e| match e {
                Effect::Emit(ev) => ev.event_type.clone(),
                Effect::Token(t) => format!("token:{}", t.token_id),
                Effect::Task { kind, cmd, .. } => format!("task:{kind}:{}", cmd.step_run_id),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn events_go_before_the_tokens_they_announce() {
        let (e, s) = (ev("step.done"), step());
        let h = header(vec![fired_token("t1", "r1"), fired_token("other", "r0")]);
        let effects = fired(Fired {
            ev: &e,
            step: &s,
            header: &h,
            applied: true,
            error: None,
            set_ctx: None,
            unanswered: false,
            start_here: None,
        });
        assert_eq!(names(&effects), ["next.selected", "token:t1"]);
        // The answer names the token it fired, with its args: its record
        // in the log (no `token.created` of its own).
        let Effect::Emit(selected) = &effects[0] else {
            unreachable!()
        };
        let created = noetl_mesh::payloads::tokens_created(selected).unwrap();
        assert_eq!(created.len(), 1);
        assert_eq!(created[0].token_id, "t1");
        assert_eq!(created[0].arc, Some(0));
        let Effect::Token(t) = &effects[1] else {
            unreachable!()
        };
        assert_eq!(
            (t.parent_step_run_id.as_str(), t.parent_step.as_str()),
            ("r1", "a")
        );
    }

    #[test]
    fn a_redelivery_with_its_answer_logged_selects_nothing_and_a_skip_or_an_unanswered_one_is_answered(
    ) {
        let (done, skipped, s) = (ev("step.done"), ev("step.skipped"), step());
        let h = header(vec![]);
        let again = fired(Fired {
            ev: &done,
            step: &s,
            header: &h,
            applied: false,
            error: None,
            set_ctx: None,
            unanswered: false,
            start_here: None,
        });
        assert!(again.is_empty(), "{:?}", names(&again));
        let answered_late = fired(Fired {
            ev: &done,
            step: &s,
            header: &h,
            applied: false,
            error: None,
            set_ctx: None,
            unanswered: true,
            start_here: None,
        });
        assert_eq!(names(&answered_late), ["next.selected"]);
        let skip = fired(Fired {
            ev: &skipped,
            step: &s,
            header: &h,
            applied: true,
            error: None,
            set_ctx: None,
            unanswered: false,
            start_here: None,
        });
        assert_eq!(names(&skip), ["next.selected"], "a skip is answered too");
    }

    #[test]
    fn a_token_whose_admission_reads_nothing_starts_here_and_the_others_go_to_the_scheduler() {
        let playbook = json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "t"},
            "workflow": [
                {"step": "a", "next": {"arcs": [{"step": "to-t1"}, {"step": "to-t2"}]}},
                {"step": "to-t1", "tool": [{"name": "n", "kind": "noop"}]},
                {"step": "to-t2", "spec": {"join": "all"}},
            ],
        });
        let plan = PlanRecord::new(
            "e1".into(),
            "t.yaml".into(),
            serde_json::from_value(playbook).unwrap(),
            json!({}),
        );
        let (e, s) = (ev("step.done"), step());
        let h = header(vec![fired_token("t1", "r1"), fired_token("t2", "r1")]);
        let run = |start_here| {
            fired(Fired {
                ev: &e,
                step: &s,
                header: &h,
                applied: true,
                error: None,
                set_ctx: None,
                unanswered: false,
                start_here,
            })
        };
        let started = run(Some((&plan, 1_000)));
        assert_eq!(
            names(&started),
            ["next.selected", "task:noop:t1", "token:t2"],
            "the plain step starts here; the join's token goes to the scheduler"
        );
        let Effect::Task { cmd, .. } = &started[1] else {
            unreachable!()
        };
        assert_eq!(
            codec::json_value(&cmd.args_json).unwrap(),
            json!({"x": 1}),
            "the command carries the token's args"
        );
        // The step-run's `step.started` rides in its arc, and reads back
        // as the event the scheduler's own decision stores.
        let Effect::Emit(selected) = &started[0] else {
            unreachable!()
        };
        let read: Vec<Event> = noetl_mesh::events::unfold(selected.clone()).collect();
        assert_eq!(
            read.iter()
                .map(|e| e.event_type.as_str())
                .collect::<Vec<_>>(),
            ["next.selected", "step.started"]
        );
        let token = Token {
            token_id: "t1".into(),
            execution_id: "e1".into(),
            step: "to-t1".into(),
            args_json: codec::json_bytes(&json!({"x": 1})),
            parent_step_run_id: "r1".into(),
            parent_step: "a".into(),
            ..Default::default()
        };
        let decided = dispatch::decide(&dispatch::Decide {
            plan: &plan,
            step: plan.step("to-t1").expect("the step"),
            token: &token,
            args: json!({"x": 1}),
            admission: Ok(dispatch::admitted()),
            now_ms: 1_000,
        });
        let Some(Effect::Emit(alone)) = decided.first() else {
            unreachable!()
        };
        assert_eq!(
            (
                read[1].event_id.as_str(),
                read[1].step_run_id.as_str(),
                read[1].step.as_str()
            ),
            (alone.event_id.as_str(), "t1", "to-t1")
        );
        assert_eq!(read[1].parent_id, alone.parent_id);
        assert_eq!(read[1].payload_json, alone.payload_json);
        assert!(
            !String::from_utf8_lossy(&read[0].payload_json).contains("started"),
            "the answer reads as one written before the merge"
        );
        assert_eq!(
            names(&run(None)),
            ["next.selected", "token:t1", "token:t2"],
            "a paused execution's tokens all go to the scheduler, which holds them"
        );
    }
}
