//! `GET /api/console/executions/{id}/graph`: the execution's plan as a
//! graph (its steps, its arcs, laid out by [`super::layout`]) with each
//! step's latest status and, for a loop step, its progress. It reads what
//! the API's handlers read (the header, the plan, the step records) and,
//! for a loop that is running, its run record in the loop bucket; the
//! decision is [`graph_of`], a plain function.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use noetl_core::Playbook;
use noetl_mesh::handled::HandledError;
use noetl_mesh::keys::Keys;
use noetl_mesh::payloads::LoopCounts;
use noetl_mesh::state::{ExecHeader, StepRecord, StepStatus};
use noetl_mesh::{kv, Mesh};
use serde::{Deserialize, Serialize};

use super::layout::layout;
use crate::error::ApiError;
use crate::extract::ExecutionId;
use crate::handlers::{header, plan_of};
use crate::shape::status::status_name;
use crate::state::AppState;

/// The answer of `GET /api/console/executions/{id}/graph`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    /// Execution id.
    pub execution_id: String,
    /// `RUNNING`, `COMPLETED`, `FAILED` or `CANCELLED`.
    pub status: String,
    /// False until the router has stored the plan (no steps yet).
    pub planned: bool,
    /// The entry step.
    pub entry: Option<String>,
    /// How many layers (columns) the steps take.
    pub layers: usize,
    /// The steps, in workflow order.
    pub steps: Vec<GraphStep>,
    /// The arcs, step by step in workflow order, each step's in YAML order.
    pub arcs: Vec<GraphArc>,
}

/// One step of [`Graph`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphStep {
    /// Step name.
    pub name: String,
    /// Its `desc`.
    pub desc: Option<String>,
    /// Its column (0: the entry step, and steps no arc reaches).
    pub layer: usize,
    /// Its row within the column.
    pub order: usize,
    /// Its pipeline: each task's name and tool kind.
    pub tasks: Vec<GraphTask>,
    /// `sequential`, `parallel` or `cursor` for a loop step.
    pub loop_mode: Option<String>,
    /// `running` (a live token), else its latest run's `done`, `failed` or
    /// `skipped`, else `not_run`.
    pub status: String,
    /// Live tokens of the step (runs in progress or waiting).
    pub live: usize,
    /// Its latest step-run: the running one, else the last ended.
    pub step_run_id: Option<String>,
    /// Why its latest run failed.
    pub error: Option<String>,
    /// Task errors of its latest ended run that a policy rule handled (the
    /// run went on: `continue`, `jump`, `break`), from its record.
    #[serde(default)]
    pub handled: Vec<HandledError>,
    /// A loop step's progress: of the running loop, else of its last run.
    pub loop_progress: Option<LoopProgress>,
}

/// One task of a [`GraphStep`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphTask {
    /// The task's name.
    pub name: String,
    /// Its tool kind.
    pub kind: String,
}

/// One arc of [`Graph`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphArc {
    /// The step it leaves.
    pub from: String,
    /// The step it goes to.
    pub to: String,
    /// Its index in `from`'s `next.arcs`.
    pub index: usize,
    /// Its guard, if any.
    pub when: Option<String>,
    /// True when it goes back to a step before it (it closes a cycle).
    pub back: bool,
}

/// Iteration counts of a loop run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopProgress {
    /// Iterations in the collection (a cursor loop's grows as it claims).
    pub total: u64,
    /// Succeeded.
    pub done: u64,
    /// Failed.
    pub failed: u64,
    /// Dispatched and not yet finished.
    pub in_flight: u64,
    /// True while the loop runs (counts read from its run record).
    pub running: bool,
}

/// The counters of a running loop, as the loop-supervisor keeps them in
/// the loop bucket under `<eid>.<step_run_id>` (only the fields read here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct LoopRunView {
    /// Iterations in the collection.
    #[serde(default)]
    pub total: u64,
    /// Succeeded.
    #[serde(default)]
    pub done: u64,
    /// Failed.
    #[serde(default)]
    pub failed: u64,
    /// Indices dispatched and not yet finished.
    #[serde(default)]
    pub in_flight: Vec<u64>,
}

/// What [`graph_of`] is made from.
pub struct GraphInput<'a> {
    /// The execution's header.
    pub header: &'a ExecHeader,
    /// Its playbook (none before the plan is stored).
    pub playbook: Option<&'a Playbook>,
    /// Each step's record, by step name.
    pub records: &'a BTreeMap<String, StepRecord>,
    /// Each running loop run's record, by step-run id.
    pub loops: &'a BTreeMap<String, LoopRunView>,
}

/// The graph of an execution: steps placed, arcs marked, statuses merged.
pub fn graph_of(input: GraphInput<'_>) -> Graph {
    let h = input.header;
    let mut graph = Graph {
        execution_id: h.execution_id.clone(),
        status: status_name(h.status).into(),
        planned: input.playbook.is_some(),
        entry: None,
        layers: 0,
        steps: Vec::new(),
        arcs: Vec::new(),
    };
    let Some(playbook) = input.playbook else {
        return graph;
    };
    let index: BTreeMap<&str, usize> = playbook
        .workflow
        .iter()
        .enumerate()
        .map(|(i, s)| (s.step.as_str(), i))
        .collect();
    let entry = playbook.entry_step().map(|s| s.step.clone());
    let mut edges = Vec::new();
    for step in &playbook.workflow {
        for (i, arc) in step.next.iter().flat_map(|n| n.arcs.iter()).enumerate() {
            let to = index.get(arc.step.as_str()).copied().unwrap_or(usize::MAX);
            edges.push((index[step.step.as_str()], to));
            graph.arcs.push(GraphArc {
                from: step.step.clone(),
                to: arc.step.clone(),
                index: i,
                when: arc.when.clone(),
                back: false,
            });
        }
    }
    let entry_at = entry
        .as_deref()
        .and_then(|e| index.get(e).copied())
        .unwrap_or(0);
    let placed = layout(playbook.workflow.len(), entry_at, &edges);
    for (arc, back) in graph.arcs.iter_mut().zip(&placed.back) {
        arc.back = *back;
    }
    graph.steps = playbook
        .workflow
        .iter()
        .zip(&placed.steps)
        .map(|(step, at)| step_of(step, at, &input))
        .collect();
    graph.entry = entry;
    graph.layers = placed.layers;
    graph
}

/// One step with its status: running while it has a live token, else its
/// record's.
fn step_of(
    step: &noetl_core::Step,
    at: &super::layout::Placed,
    input: &GraphInput<'_>,
) -> GraphStep {
    let live: Vec<&str> = input
        .header
        .live
        .iter()
        .filter(|t| t.step == step.step)
        .map(|t| t.token_id.as_str())
        .collect();
    let record = input.records.get(&step.step);
    let status = match (live.is_empty(), record.map(|r| r.status)) {
        (false, _) => "running",
        (true, Some(StepStatus::Done)) => "done",
        (true, Some(StepStatus::Failed)) => "failed",
        (true, Some(StepStatus::Skipped)) => "skipped",
        (true, None) => "not_run",
    };
    let running_loop = live
        .iter()
        .rev()
        .find_map(|srid| input.loops.get(*srid))
        .map(|r| LoopProgress {
            total: r.total,
            done: r.done,
            failed: r.failed,
            in_flight: r.in_flight.len() as u64,
            running: true,
        });
    let last_loop = record
        .and_then(|r| r.loop_counts.clone())
        .and_then(|c| serde_json::from_value::<LoopCounts>(c).ok())
        .map(|c| LoopProgress {
            total: c.total,
            done: c.done,
            failed: c.failed,
            in_flight: 0,
            running: false,
        });
    GraphStep {
        name: step.step.clone(),
        desc: step.desc.clone(),
        layer: at.layer,
        order: at.order,
        tasks: step
            .tool
            .iter()
            .map(|t| GraphTask {
                name: t.name.clone(),
                kind: t.kind.clone(),
            })
            .collect(),
        loop_mode: step.loop_.as_ref().map(|l| mode_name(l.spec.mode)),
        status: status.into(),
        live: live.len(),
        step_run_id: live
            .last()
            .map(|s| s.to_string())
            .or_else(|| record.map(|r| r.last_step_run_id.clone())),
        error: record
            .and_then(|r| r.error.clone())
            .filter(|_| status == "failed"),
        handled: record.map(|r| r.handled.clone()).unwrap_or_default(),
        loop_progress: step.loop_.as_ref().and(running_loop.or(last_loop)),
    }
}

/// A loop mode as the DSL spells it.
fn mode_name(mode: noetl_core::LoopMode) -> String {
    serde_json::to_value(mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{mode:?}").to_lowercase())
}

/// Each step's record (steps never run have none).
async fn records(
    mesh: &Mesh,
    id: &str,
    playbook: &Playbook,
) -> Result<BTreeMap<String, StepRecord>, ApiError> {
    let mut out = BTreeMap::new();
    for step in &playbook.workflow {
        if let Some(r) = kv::get::<StepRecord>(mesh.exec_kv(), &Keys::step(id, &step.step)).await? {
            out.insert(step.step.clone(), r);
        }
    }
    Ok(out)
}

/// The run records of the loop steps that have a live token (a run that
/// has not started, or has ended and been purged, has none).
async fn loop_runs(
    mesh: &Mesh,
    h: &ExecHeader,
    playbook: &Playbook,
) -> Result<BTreeMap<String, LoopRunView>, ApiError> {
    let mut out = BTreeMap::new();
    for token in &h.live {
        if playbook
            .step(&token.step)
            .is_some_and(|s| s.loop_.is_some())
        {
            let key = Keys::loop_run(&h.execution_id, &token.token_id);
            if let Some(r) = kv::get::<LoopRunView>(mesh.loop_kv(), &key).await? {
                out.insert(token.token_id.clone(), r);
            }
        }
    }
    Ok(out)
}

/// `GET /api/console/executions/{id}/graph`.
pub async fn graph(
    State(state): State<AppState>,
    ExecutionId(id): ExecutionId,
) -> Result<Json<Graph>, ApiError> {
    let mesh = &state.mesh;
    let h = header(mesh, &id).await?;
    let plan = plan_of(mesh, &id).await?;
    let playbook = plan.as_ref().map(|p| &*p.playbook);
    let (records, loops) = match playbook {
        Some(p) => (records(mesh, &id, p).await?, loop_runs(mesh, &h, p).await?),
        None => Default::default(),
    };
    Ok(Json(graph_of(GraphInput {
        header: &h,
        playbook,
        records: &records,
        loops: &loops,
    })))
}

#[cfg(test)]
mod tests;
