//! An execution's records as a fold of its events (docs/architecture.md
//! "The event log"): the header, the step records, `ctx`, the waiters and
//! the pause, rebuilt from the event stream alone, plus the objects its
//! events reference. [`apply`] takes one event at a time, in stream
//! order; every event type is named in its `match`, so a new type does
//! not compile until the fold places it.
//!
//! Values an event carries by reference (large `ctx` patches, reducer
//! results, the workload, a waiter's command) are read before the fold
//! sees the event ([`crate::replay::hydrate`]): the fold itself is a plain
//! function.

use std::collections::BTreeMap;

use noetl_wire::Event;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::event_type::EventType;
use crate::payloads::{
    self, BoundaryView, ExecutionEnded, LoopDone, NextSelected, PlanIdentity, PlaybookInitialized,
    Resumed, TaskDone, TokenCreated,
};
use crate::state::{ExecHeader, ExecStatus, StepRecord, StepStatus, TokenRecord};
use crate::MeshError;

/// The event that last changed a record: what `noetl exec replay` names
/// when the stored record differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    /// Its sequence number in the events stream (0 when not read from it).
    pub seq: u64,
    /// Its type.
    pub event_type: String,
    /// Its id.
    pub event_id: String,
    /// Its step (empty for execution events).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub step: String,
}

impl Origin {
    pub(crate) fn of(seq: u64, ev: &Event) -> Self {
        Self {
            seq,
            event_type: ev.event_type.clone(),
            event_id: ev.event_id.clone(),
            step: ev.step.clone(),
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (seq {}", self.event_type, self.seq)?;
        if !self.step.is_empty() {
            write!(f, ", step {:?}", self.step)?;
        }
        write!(f, ", id {})", self.event_id)
    }
}

/// Which event last changed each record of a [`Folded`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Origins {
    /// The header.
    pub header: Option<Origin>,
    /// Each step's record, by step name.
    pub steps: BTreeMap<String, Origin>,
    /// Each `ctx` key.
    pub ctx: BTreeMap<String, Origin>,
    /// The plan.
    pub plan: Option<Origin>,
}

/// The records an execution's events determine.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Folded {
    /// The execution's header (`None` until its first event that makes one).
    pub header: Option<ExecHeader>,
    /// Each step's record, by step name.
    pub steps: BTreeMap<String, StepRecord>,
    /// `ctx` as users see it.
    pub ctx: Map<String, Value>,
    /// The plan it runs (`playbook.initialized`, or its last
    /// `execution.resumed` that names one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanIdentity>,
    /// The merged workload it runs with (its last resume's, when one
    /// changed it).
    pub workload: Value,
    /// Its trace id (of `playbook.initialized`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub trace_id: String,
    /// A resume changed its plan (`--set`, `--playbook-version`) and its
    /// `execution.resumed`, written before resumes named their plan, names
    /// it only by key: the plan is not rebuilt from them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub plan_changed_by_resume: bool,
    /// Events folded so far.
    pub events: usize,
    /// The sequence number of the last one.
    pub last_seq: u64,
    /// Which event last changed each record.
    #[serde(skip)]
    pub origins: Origins,
    /// Each step's last result as its boundary event carries it (a
    /// reference when large; a loop's counts): what templates read by the
    /// step's name.
    #[serde(skip)]
    pub results: BTreeMap<String, Value>,
    /// The writes already applied to `ctx` (task runs, arcs, loop runs):
    /// a write is applied once, as the `ctx` bucket does.
    #[serde(skip)]
    applied: crate::id_set::IdSet,
    /// The same, in the order they were applied.
    #[serde(skip)]
    applied_order: Vec<String>,
    /// The waiters owed (`<eid>.wait.<signal>`, [`crate::waiter::Waits`]).
    #[serde(skip)]
    pub waits: crate::waiter::Waits,
    /// The pause (`<eid>.paused`, [`crate::pause::PauseLog`]).
    #[serde(skip)]
    pub pause: crate::pause::PauseLog,
    /// Boundary events the router has not answered yet (no `next.selected`
    /// of their step-run in the log so far), by step-run: they end their
    /// token only once it has ([`Self::routed`]).
    #[serde(skip)]
    unrouted: BTreeMap<String, Vec<(u64, Event, EventType)>>,
}

/// The status a boundary event gives its step's record, or `None` for an
/// event that is not a step-run's boundary.
pub fn boundary_status(kind: EventType) -> Option<StepStatus> {
    match kind {
        EventType::StepDone | EventType::LoopDone => Some(StepStatus::Done),
        EventType::StepFailed => Some(StepStatus::Failed),
        EventType::StepSkipped => Some(StepStatus::Skipped),
        _ => None,
    }
}

/// The step record a boundary event of type `kind` writes (the router's
/// and the fold's, from the same code).
pub fn step_record(
    ev: &Event,
    kind: Option<EventType>,
    view: &BoundaryView,
    status: StepStatus,
) -> StepRecord {
    StepRecord {
        status,
        last_step_run_id: ev.step_run_id.clone(),
        loop_counts: view
            .counts
            .filter(|_| kind == Some(EventType::LoopDone))
            .map(|c| payloads::to_value(&c)),
        error: view.error.as_ref().map(error_text),
        handled: view.handled.clone(),
    }
}

/// A step's error as the step record keeps it: `kind: message`, else the
/// message, else its JSON.
pub fn error_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(m) => match (m.get("kind"), m.get("message")) {
            (Some(k), Some(Value::String(msg))) => {
                format!("{}: {msg}", k.as_str().unwrap_or("error"))
            }
            (_, Some(Value::String(msg))) => msg.clone(),
            _ => v.to_string(),
        },
        other => other.to_string(),
    }
}

impl Folded {
    /// Fold every event of `log` (stream order) into an empty state.
    pub fn of<'a>(log: impl IntoIterator<Item = (u64, &'a Event)>) -> Result<Self, MeshError> {
        let mut state = Self::default();
        for (seq, ev) in log {
            state.apply(seq, ev)?;
        }
        Ok(state)
    }

    /// Apply one event (`seq`: its stream sequence number). A payload that
    /// does not decode is an error naming the event.
    pub fn apply(&mut self, seq: u64, ev: &Event) -> Result<(), MeshError> {
        self.events += 1;
        self.last_seq = seq;
        self.waits.apply(ev)?;
        self.pause.apply(seq, ev)?;
        let Some(kind) = EventType::of(ev) else {
            return Ok(()); // a type no service writes: nothing the fold keeps
        };
        use EventType as T;
        match kind {
            T::PlaybookInitialized => self.initialized(seq, ev)?,
            T::TokenCreated => {
                for t in payloads::tokens_created(ev)? {
                    self.create_token(seq, ev, t);
                }
            }
            T::StepDone | T::StepFailed | T::StepSkipped | T::LoopDone => {
                self.boundary(seq, ev, kind)?
            }
            T::TaskDone => self.task_done(seq, ev)?,
            T::NextSelected => {
                let p: NextSelected = payloads::decode_typed(ev)?;
                if let Some(patch) = p.set_ctx {
                    self.write_ctx(seq, ev, &format!("arcs:{}", ev.step_run_id), patch);
                }
                // The tokens its arcs fired, as a `token.created` each did
                // before it in older logs.
                for t in payloads::tokens_created(ev)? {
                    self.create_token(seq, ev, t);
                }
                self.routed(&ev.step_run_id, Some(&p.on))?;
            }
            T::ExecutionCompleted | T::ExecutionFailed | T::ExecutionCancelled => {
                // Whatever boundary was left unanswered was handled on the
                // way to the end (a log from before skips were answered,
                // a router that stopped between its write and its events).
                for srid in self.unrouted.keys().cloned().collect::<Vec<_>>() {
                    self.routed(&srid, None)?;
                }
                self.ended(seq, ev)?
            }
            T::ExecutionResumed => self.resumed(seq, ev)?,
            // What these change lives outside the records folded here
            // (loop runs, joins, timers, pauses, gates) or nowhere.
            T::MessageDeadLettered
            | T::WorkflowInitialized
            | T::StepScheduled
            | T::StepStarted
            | T::TaskStarted
            | T::LoopStarted
            | T::LoopIterationStarted
            | T::BatchAccepted
            | T::BatchCompleted
            | T::LoopIterationDone
            | T::LoopIterationFailed
            | T::LoopClaimed
            | T::ExecutionCancelRequested
            | T::ExecutionDeadline
            | T::StepDeadline
            | T::TaskUnserved
            | T::Audit
            | T::ExecutionPaused
            | T::ExecutionUnpaused
            | T::WaitStarted
            | T::WaitTimeout
            | T::SignalReceived
            | T::ExecutionResumeRequested
            | T::StepSuperseded => {}
            T::ExecutionQueued => self.queued(ev)?,
        }
        Ok(())
    }

    fn initialized(&mut self, seq: u64, ev: &Event) -> Result<(), MeshError> {
        let p: PlaybookInitialized = payloads::decode_typed(ev)?;
        let header = self.header.get_or_insert_with(|| ExecHeader {
            started_at: crate::codec::event_time(ev),
            ..ExecHeader::running(ev.execution_id.clone(), Vec::new())
        });
        header.playbook = p.playbook;
        header.source = p.source;
        header.parent_execution_id = p.parent_execution_id;
        self.plan = p.plan;
        self.workload = p.workload;
        self.trace_id = ev.trace_id.clone();
        self.origins.header = Some(Origin::of(seq, ev));
        self.origins.plan = Some(Origin::of(seq, ev));
        Ok(())
    }

    /// An execution waiting in line behind its concurrency key: its entry
    /// token is live (not published) until a slot is its.
    fn queued(&mut self, ev: &Event) -> Result<(), MeshError> {
        let p: crate::gate::ExecutionQueued = payloads::decode_typed(ev)?;
        let Some(header) = self.header.as_mut() else {
            return Ok(());
        };
        if header.live.is_empty() && !header.status.is_terminal() && !p.entry_step.is_empty() {
            let entry = crate::token::entry_token_id(&ev.execution_id);
            header.live.push(TokenRecord::new(entry, p.entry_step));
        }
        Ok(())
    }

    /// Token `p`, created by `ev` (a `token.created`, or a `next.selected`
    /// that fired it; [`payloads::tokens_created`]), is live unless it
    /// already is.
    fn create_token(&mut self, seq: u64, ev: &Event, p: TokenCreated) {
        let Some(header) = self.header.as_mut() else {
            return;
        };
        if header.is_live(&p.token_id) {
            return;
        }
        header.live.push(TokenRecord {
            token_id: p.token_id,
            step: p.step,
            args: p.args,
            arc: p.arc.unwrap_or(0),
            parent: p.parent,
        });
        self.origins.header = Some(Origin::of(seq, ev));
    }

    /// A step-run's boundary: its result, and a loop's reducer results go
    /// into `ctx` whatever the boundary; its token ends once the router
    /// has answered it ([`Self::routed`]).
    fn boundary(&mut self, seq: u64, ev: &Event, kind: EventType) -> Result<(), MeshError> {
        let p = crate::events::payload(ev);
        match kind {
            EventType::StepDone => {
                self.results.insert(ev.step.clone(), p["result"].clone());
            }
            EventType::LoopDone if !p["counts"].is_null() => {
                self.results.insert(ev.step.clone(), p["counts"].clone());
            }
            _ => {}
        }
        if kind == EventType::LoopDone {
            let done: LoopDone = payloads::decode_typed(ev)?;
            self.reduce(seq, ev, &done)?;
            if !done.boundary {
                return Ok(()); // the failing loop's boundary is its step.failed
            }
        }
        self.unrouted
            .entry(ev.step_run_id.clone())
            .or_default()
            .push((seq, ev.clone(), kind));
        Ok(())
    }

    /// The router answered step-run `srid`'s boundary of type `on` (any,
    /// when `None`) with `next.selected`: the boundary ends its token now.
    /// A token ends when the router's answer is in the log, not when the
    /// step-run's own boundary is: the header rebuilt from a log whose last
    /// boundaries the router has not handled yet keeps their tokens live,
    /// so their (re)delivery still routes them.
    fn routed(&mut self, srid: &str, on: Option<&str>) -> Result<(), MeshError> {
        let Some(waiting) = self.unrouted.get_mut(srid) else {
            return Ok(());
        };
        let at = on
            .and_then(|on| waiting.iter().position(|(_, e, _)| e.event_type == on))
            .unwrap_or(0);
        let (seq, ev, kind) = waiting.remove(at);
        if waiting.is_empty() {
            self.unrouted.remove(srid);
        }
        self.end_token(seq, &ev, kind)
    }

    /// A routed boundary: while its token is live, the step's record (not
    /// for a token a join absorbed) and the token's end.
    fn end_token(&mut self, seq: u64, ev: &Event, kind: EventType) -> Result<(), MeshError> {
        let view: BoundaryView = payloads::decode(ev)?;
        let Some(header) = self.header.as_mut() else {
            return Ok(());
        };
        if !header.is_live(&ev.step_run_id) {
            return Ok(()); // a redelivery, or after the execution ended
        }
        header.live.retain(|t| t.token_id != ev.step_run_id);
        self.origins.header = Some(Origin::of(seq, ev));
        if view.join {
            return Ok(());
        }
        let status = boundary_status(kind).expect("a boundary kind");
        self.steps
            .insert(ev.step.clone(), step_record(ev, Some(kind), &view, status));
        self.origins
            .steps
            .insert(ev.step.clone(), Origin::of(seq, ev));
        Ok(())
    }

    fn reduce(&mut self, seq: u64, ev: &Event, done: &LoopDone) -> Result<(), MeshError> {
        if done.reduce.is_empty() || !self.first_write(&format!("loop:{}", ev.step_run_id)) {
            return Ok(());
        }
        for r in &done.reduce {
            let v = noetl_core::reduce::combine(r.op, &r.key, self.ctx.get(&r.key), &r.value)
                .map_err(|e| {
                    MeshError::Invalid(format!(
                        "loop.done of execution {} (step {:?}) names a reducer result that does not fold: {e}",
                        ev.execution_id, ev.step
                    ))
                })?;
            self.ctx.insert(r.key.clone(), v);
            self.origins.ctx.insert(r.key.clone(), Origin::of(seq, ev));
        }
        Ok(())
    }

    fn task_done(&mut self, seq: u64, ev: &Event) -> Result<(), MeshError> {
        let p: TaskDone = payloads::decode_typed(ev)?;
        if p.ctx_refused {
            return Ok(());
        }
        if let Some(mut patch) = p.set_ctx {
            for k in &p.reduced {
                patch.remove(k);
            }
            self.write_ctx(seq, ev, &ev.task_run_id, patch);
        }
        Ok(())
    }

    /// Merge `patch` into `ctx` once per write `id`.
    fn write_ctx(&mut self, seq: u64, ev: &Event, id: &str, patch: Map<String, Value>) {
        if patch.is_empty() || !self.first_write(id) {
            return;
        }
        for (k, v) in patch {
            self.origins.ctx.insert(k.clone(), Origin::of(seq, ev));
            self.ctx.insert(k, v);
        }
    }

    fn ended(&mut self, seq: u64, ev: &Event) -> Result<(), MeshError> {
        let p: ExecutionEnded = payloads::decode_typed(ev)?;
        let now = crate::codec::event_time(ev);
        let header = self.header.get_or_insert_with(|| ExecHeader {
            // Refused (or cancelled) before its first step: the terminal
            // event is its only one.
            source: p.source.clone().unwrap_or_default(),
            started_at: now.clone(),
            ..ExecHeader::running(ev.execution_id.clone(), Vec::new())
        });
        header.status = p.status;
        header.error = p.error;
        header.live.clear();
        header.stopped = p.stopped;
        header.ended_at = Some(now);
        header.terminal_emitted = true;
        self.origins.header = Some(Origin::of(seq, ev));
        Ok(())
    }

    fn resumed(&mut self, seq: u64, ev: &Event) -> Result<(), MeshError> {
        let p: Resumed = payloads::decode_typed(ev)?;
        let Some(h) = self.header.as_ref() else {
            return Ok(());
        };
        // The plan from now on, when the event names it (events written
        // before resumes named their plan change it only by key).
        let changed = !p.set.is_empty() || p.playbook_version.is_some();
        if let Some(plan) = p.plan {
            self.plan = Some(plan);
            self.origins.plan = Some(Origin::of(seq, ev));
        }
        match (p.workload, p.workload_ref) {
            // The whole plan named again: whatever an older resume changed.
            (w, _) if !w.is_null() => {
                self.workload = w;
                self.plan_changed_by_resume = self.plan.is_none();
            }
            // Not read back (a fold of a log not hydrated): not known here.
            (_, Some(_)) => self.plan_changed_by_resume = true,
            (_, None) => self.plan_changed_by_resume |= changed,
        }
        let mut next = crate::state::resumed_header(h, Vec::new(), p.resumed_at_ms);
        next.resumes = p.resumes;
        // Another catalog version is the source from now on (the router
        // names a catalog playbook `path@v<N>`).
        let catalog = self.plan.as_ref().and_then(|id| {
            let path = id.catalog_path.as_ref()?;
            Some(format!("{path}@v{}", id.catalog_version?))
        });
        if let Some(source) = catalog.filter(|_| p.playbook_version.is_some()) {
            next.source = source;
        }
        self.header = Some(next);
        self.origins.header = Some(Origin::of(seq, ev));
        Ok(())
    }

    /// Record write `id` as applied; false when it already was.
    fn first_write(&mut self, id: &str) -> bool {
        let first = self.applied.insert(id);
        if first {
            self.applied_order.push(id.to_string());
        }
        first
    }

    /// The ids of the writes applied to `ctx`, oldest first (what the
    /// stored `ctx` remembers, so a redelivery does not apply one twice).
    pub fn applied_writes(&self) -> &[String] {
        &self.applied_order
    }

    /// True when a boundary of step-run `srid` is folded and the router's
    /// answer to it (`next.selected`) is not yet.
    pub fn awaits_answer(&self, srid: &str) -> bool {
        self.unrouted.contains_key(srid)
    }

    /// True when the events folded say the execution runs.
    pub fn is_running(&self) -> bool {
        self.header
            .as_ref()
            .is_some_and(|h| h.status == ExecStatus::Running)
    }

    /// True when the execution has ended (as far as the events folded say).
    pub fn ended_status(&self) -> Option<ExecStatus> {
        self.header
            .as_ref()
            .map(|h| h.status)
            .filter(|s| s.is_terminal())
    }
}

/// Whether the events `log` of one execution (in stream order) say it
/// ended: its last end or resume is an end. Reads the types only: what a
/// late message of an execution whose state is gone asks before it writes
/// any of that state back.
pub fn ended<'a>(log: impl IntoIterator<Item = &'a Event>) -> bool {
    log.into_iter()
        .filter_map(|e| EventType::parse(&e.event_type))
        .filter(|t| t.ends_execution() || *t == EventType::ExecutionResumed)
        .last()
        .is_some_and(EventType::ends_execution)
}

#[cfg(test)]
pub(crate) mod tests;
