//! `noetl exec why ID`: for a running execution, what each open token
//! waits for, in words. [`explain`] is a plain function of what was read:
//! the header's live tokens, the execution's events (as a [`Tree`], and
//! the joins and time limits they record), each step's tasks and kinds
//! from the plan, and the work queue of each kind; [`run`] only reads,
//! and keeps of the log only what those read ([`Kept`]).

mod explain;
mod gates;
mod reason;
mod words;

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;

use noetl_mesh::event_type::EventType;
use noetl_mesh::events;
use noetl_mesh::replay::LogReader;
use noetl_mesh::state::ExecStatus;
use noetl_mesh::Mesh;
use noetl_wire::Event;

use super::common::MeshArgs;
use super::tree::{Tree, TreeFold};

use explain::{explain, kinds_involved, Situation};
use words::{ended, notes};

/// Arguments of `noetl exec why`.
#[derive(clap::Args)]
pub struct WhyArgs {
    /// Execution id.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// Print `{"execution_id", "status", "waits": [...]}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// `noetl exec why`.
pub async fn run(a: WhyArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let Some(header) = mesh.header_or_running(&a.id).await? else {
        return Ok(super::exec_shared::no_execution(&mesh, &a.id).await);
    };
    let (tree, events) = read(&mesh, &a.id).await?;
    let plan = mesh.plans().get(&mesh, &a.id).await.ok();
    let playbook = plan.as_ref().map(|p| &*p.playbook);
    let paused = mesh.pause_record(&a.id).await?;
    let waiters = mesh.waiters(&a.id).await?;
    let mut queues = BTreeMap::new();
    let mut gates = Vec::new();
    if header.status == ExecStatus::Running {
        gates = gates::read(&mesh, &a.id, events::now_ms()).await?;
        for kind in kinds_involved(&header, playbook) {
            let q = mesh.queue_of(&kind).await?;
            queues.insert(kind, q);
        }
    }
    let waits = if header.status == ExecStatus::Running {
        explain(&Situation {
            header: &header,
            tree: &tree,
            events: &events,
            playbook,
            queues: &queues,
            paused: paused.as_ref(),
            waiters: &waiters,
            gates: &gates,
            now_ms: events::now_ms(),
        })
    } else {
        Vec::new()
    };
    let notes = notes(&header, &events, paused.as_ref());
    let status = super::exec_shared::status_name(header.status);
    if a.json {
        let out = serde_json::json!({
            "execution_id": a.id, "status": status, "waits": waits, "notes": notes,
        });
        println!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    if header.status != ExecStatus::Running {
        println!("{}", ended(&header));
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "execution {} is running ({} open token(s))",
        a.id,
        header.live.len()
    );
    for w in &waits {
        println!("- {}", w.text);
    }
    for n in &notes {
        println!("note: {n}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Execution `id`'s tree and the events [`explain`] and [`notes`] read
/// ([`Kept`]), its log read a chunk at a time ([`LogReader`], passing
/// over a message that does not decode): never the whole log.
async fn read(mesh: &Mesh, id: &str) -> anyhow::Result<(Tree, Vec<Event>)> {
    let mut kept = Kept::new(id);
    let mut log = LogReader::of(mesh, id).lenient();
    while let Some(l) = log.next().await? {
        kept.apply(l.event);
    }
    Ok(kept.finish())
}

/// What `why` keeps of a log as it reads it: the tree, and only the
/// events [`explain`] and [`notes`] read, in the log's order: the joins'
/// arrivals (`step.skipped`) and the starts that end them, the
/// execution's deadline and a cancel requested, and each step-run's last
/// `task.done` (a delayed retry).
struct Kept {
    tree: TreeFold,
    events: Vec<Event>,
    /// Each step-run's last `task.done`, by step-run.
    last_done: HashMap<String, Event>,
}

impl Kept {
    fn new(id: &str) -> Self {
        Self {
            tree: TreeFold::new(id),
            events: Vec::new(),
            last_done: HashMap::new(),
        }
    }

    /// The log's next event.
    fn apply(&mut self, ev: Event) {
        self.tree.apply(&ev);
        use EventType as T;
        match EventType::of(&ev) {
            Some(T::TaskDone) => {
                self.last_done.insert(ev.step_run_id.clone(), ev);
            }
            Some(
                T::StepSkipped
                | T::StepStarted
                | T::StepScheduled
                | T::ExecutionDeadline
                | T::ExecutionCancelRequested,
            ) => self.events.push(ev),
            _ => {}
        }
    }

    /// The tree, and the events kept (each step-run's last `task.done`
    /// after the others: only its own step-run's are compared with it).
    fn finish(self) -> (Tree, Vec<Event>) {
        let mut events = self.events;
        events.extend(self.last_done.into_values());
        (self.tree.finish(), events)
    }
}

#[cfg(test)]
mod tests;
