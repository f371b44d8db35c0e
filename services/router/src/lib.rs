//! noetl-router: starts executions and routes tokens along `next.arcs`.
//!
//! Two consumers:
//! - `router-requests` on `<p>.exec.request`: validates the playbook, stores
//!   the plan and the execution header, emits `playbook.initialized`,
//!   `workflow.initialized`, `token.created` and publishes the entry token.
//! - `router-events` on the boundary events (`step.done`, `step.failed`,
//!   `step.skipped`, `loop.done`): evaluates the step's arcs once per
//!   step-run, updates the live-token set and ends the execution when no
//!   token is live.
//!
//! - `router-timers` on `execution.deadline` and `step.deadline`: fails what
//!   is still running when its deadline is due (see [`timers`]).
//!
//! A background sweep (every 5 s, [`gates`]) keeps executions queued behind
//! a concurrency key moving after a crash.
//!
//! Exactly-once effect under redelivery: the header's live set (which holds
//! each live token with its args and the step-run that fired it) changes
//! only while the step-run's own token is in it, in one compare-and-set;
//! tokens are published afterwards with deterministic ids, and a redelivered
//! boundary republishes exactly the tokens its first handling recorded.

mod boundary;
mod children;
mod deadline;
mod ending;
mod entry;
pub mod gates;
mod parsed;
mod request;
mod resume;
pub mod timers;

use std::sync::Arc;

use noetl_mesh::{
    handler::Typed,
    runtime::{self, ConsumerLoop, ServiceParams},
    topology::{ConsumerSpec, StreamKind},
    MeshError,
};

pub use boundary::BoundaryHandler;
pub use request::RequestHandler;

/// Run the router until `params.shutdown` is cancelled, then drain.
pub async fn serve(params: ServiceParams) -> Result<(), MeshError> {
    let mesh = params.mesh.clone();
    let s = mesh.subjects().clone();
    let requests = mesh
        .consumer(&ConsumerSpec {
            durable: "router-requests".into(),
            stream: StreamKind::Work,
            filter_subjects: vec![s.exec_request()],
            max_ack_pending: 10_000,
        })
        .await?;
    let boundaries = mesh
        .consumer(&ConsumerSpec {
            durable: "router-events".into(),
            stream: StreamKind::Events,
            // Derived from the handler's own match (boundary::handling_of).
            filter_subjects: boundary::subscribed()
                .map(|k| s.events_of_type(k.wire_name()))
                .collect(),
            max_ack_pending: 10_000,
        })
        .await?;
    // Timers wait (NAKed until due) on their own consumer, so any number
    // of them never holds back boundary events.
    let timers = mesh
        .consumer(&ConsumerSpec {
            durable: "router-timers".into(),
            stream: StreamKind::Events,
            // Derived from the handler's own match (timers::timer_of).
            filter_subjects: timers::subscribed()
                .map(|k| s.events_of_type(k.wire_name()))
                .collect(),
            max_ack_pending: 1_000_000,
        })
        .await?;
    // One header cache for every header writer of this process: the
    // boundary handler's copy is then never stale because of a timer.
    let headers = Arc::new(noetl_mesh::kv::RevisionCache::new(4096));
    let c = runtime::run(
        mesh.clone(),
        ConsumerLoop {
            name: "router-timers".into(),
            consumer: timers,
            concurrency: params.concurrency,
            handler: Arc::new(Typed::new(timers::TimerHandler::new(
                mesh.clone(),
                headers.clone(),
            ))),
            shutdown: params.shutdown.clone(),
        },
    );
    let a = runtime::run(
        mesh.clone(),
        ConsumerLoop {
            name: "router-requests".into(),
            consumer: requests,
            concurrency: params.concurrency,
            handler: Arc::new(Typed::new(RequestHandler {
                mesh: mesh.clone(),
                headers: headers.clone(),
                parsed: Default::default(),
            })),
            shutdown: params.shutdown.clone(),
        },
    );
    let b = runtime::run(
        mesh.clone(),
        ConsumerLoop {
            name: "router-events".into(),
            consumer: boundaries,
            concurrency: params.concurrency,
            handler: Arc::new(Typed::new(BoundaryHandler::sharing(mesh.clone(), headers))),
            shutdown: params.shutdown.clone(),
        },
    );
    // Executions queued behind a concurrency key that a crash left
    // waiting (their slot's holder ended without releasing it).
    let d = gates::sweep_loop(mesh.clone(), params.shutdown.clone());
    // Terminal executions whose events outlived NOETL_EVENTS_MAX_AGE_S.
    let e = retention_loop(mesh.clone(), params.shutdown.clone());
    let (ra, rb, rc, rd, re) = tokio::join!(a, b, c, d, e);
    ra.and(rb).and(rc).and(rd).and(re)
}

/// Sweep expired executions away ([`noetl_mesh::retention`]) every
/// `NOETL_RETENTION_SWEEP_S` (never when 0) until `shutdown`; a failed
/// sweep is logged and the next one tries again.
async fn retention_loop(
    mesh: noetl_mesh::Mesh,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), MeshError> {
    let every = mesh.config().retention_sweep;
    if every.is_zero() {
        return Ok(());
    }
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
        match mesh.sweep_retention(noetl_mesh::events::now_ms()).await {
            Ok(s) if !s.executions.is_empty() => tracing::info!(
                executions = s.executions.len(),
                events = s.events,
                "retention: removed executions that ended over NOETL_EVENTS_MAX_AGE_S ago"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention sweep failed; trying again"),
        }
    }
}
