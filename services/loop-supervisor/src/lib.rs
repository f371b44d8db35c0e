//! noetl-loop-supervisor: runs a loop step's pipeline once per element.
//!
//! - `loop-commands` on `<p>.loop.>`: renders `loop.in`, stores the
//!   collection, creates the loop-run state (create-only) and dispatches the
//!   first window of iterations (1 for `sequential`, `max_in_flight` for
//!   `parallel`) as task commands carrying an isolated `iter`.
//! - `loop-events` on `loop.iteration.done|failed`: counts each iteration
//!   once (an index leaves the in-flight window exactly once, under CAS),
//!   dispatches the next ones, and when nothing is left emits exactly one
//!   `loop.done` (deterministic id) — plus `step.failed` for a `fail_fast`
//!   loop with failures, or a loop whose reducers or collection failed.
//!   State is O(in-flight), not O(items).
//!
//! State is always written before the messages it implies are published;
//! a redelivered message whose state change is already stored publishes
//! them again (deterministic ids: JetStream drops what already went out),
//! so a crash or a failed publish in between never stalls a loop.

//!
//! The modules, from the record up: `state` (the loop run's record and
//! its pure transitions, with `state::cursor` for cursor loops and
//! `state::from_log` for a run folded from its events), `rebuild` (a run
//! the loop bucket lost, written back from the event log),
//! `collection` (the stored elements and their cache), `reducers` (folding
//! the aggregates into `ctx`), `messages` (what a loop run publishes, as
//! effects), `commit` (the group commit of iteration reports), `finish`
//! (ending a loop), `dispatch` (the window of iterations in flight),
//! `start` (a loop command), `reports` (iteration and claim reports) and
//! `handlers` (the two handlers the consumers run).

use std::sync::Arc;

use noetl_mesh::{
    handler::Typed,
    runtime::{self, ConsumerLoop, ServiceParams},
    topology::{ConsumerSpec, StreamKind},
    MeshError,
};

pub mod admin;
mod collection;
mod commit;
mod dispatch;
mod finish;
mod handlers;
mod messages;
mod rebuild;
mod reducers;
mod reports;
mod start;
mod state;

pub use collection::CHUNK;
pub use handlers::{IterationReports, LoopCommands, Shared};
pub use reducers::MAX_CTX_BYTES;
pub use start::DEFAULT_MAX_IN_FLIGHT;
pub use state::{items_gone, timed_out, LoopRun};

/// Run the loop-supervisor until `params.shutdown` is cancelled, then drain.
pub async fn serve(params: ServiceParams) -> Result<(), MeshError> {
    let mesh = params.mesh.clone();
    let s = mesh.subjects().clone();
    let commands = mesh
        .consumer(&ConsumerSpec {
            durable: "loop-commands".into(),
            stream: StreamKind::Work,
            filter_subjects: vec![s.loops_all()],
            max_ack_pending: 10_000,
        })
        .await?;
    let iterations = mesh
        .consumer(&ConsumerSpec {
            durable: "loop-events".into(),
            stream: StreamKind::Events,
            // Derived from the handler's own match (handlers::report_of).
            filter_subjects: handlers::subscribed()
                .map(|k| s.events_of_type(k.wire_name()))
                .collect(),
            max_ack_pending: 10_000,
        })
        .await?;
    let shared = Arc::new(Shared::default());
    let a = runtime::run(
        mesh.clone(),
        ConsumerLoop {
            name: "loop-commands".into(),
            consumer: commands,
            concurrency: params.concurrency,
            handler: Arc::new(Typed::new(LoopCommands::new(mesh.clone(), shared.clone()))),
            shutdown: params.shutdown.clone(),
        },
    );
    let b = runtime::run(
        mesh.clone(),
        ConsumerLoop {
            name: "loop-events".into(),
            consumer: iterations,
            concurrency: params.concurrency,
            handler: Arc::new(Typed::new(IterationReports::new(mesh.clone(), shared))),
            shutdown: params.shutdown.clone(),
        },
    );
    let (ra, rb) = tokio::join!(a, b);
    ra.and(rb)
}
