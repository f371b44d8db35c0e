//! What every handler shares: the mesh, the tokens, the auth mode, and the
//! signal that ends open event streams when the API drains.

use std::sync::Arc;
use std::time::Instant;

use noetl_mesh::Mesh;
use tokio_util::sync::CancellationToken;

use crate::auth::ModeCell;
use crate::tokens::Tokens;

/// The handlers' state (cheap to clone).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// What [`AppState`] holds.
pub struct Shared {
    /// The mesh this API reads and publishes to.
    pub mesh: Mesh,
    /// Its tokens.
    pub tokens: Tokens,
    /// Whether requests need a token (changes as tokens are made and
    /// revoked: `server::follow_tokens`).
    pub mode: ModeCell,
    /// When the API started (`uptime_seconds`).
    pub started: Instant,
    /// Cancelled when the API drains: open event streams end.
    pub draining: CancellationToken,
    /// The step statuses of an execution as of one revision of its header:
    /// a status read of an execution whose header has not moved reads only
    /// the header. The router writes a step's record with, or before, the
    /// header change that ends the step; should a record land just after
    /// a running execution's header moved, the cached status is corrected
    /// by the header's next change, and always by the execution's end
    /// (an ending is held back until the record is written).
    pub step_statuses: StepStatusCache,
    /// The executions' status as this replica follows it
    /// ([`crate::view`]): a status read of one it holds costs no round
    /// trip.
    pub view: std::sync::Arc<crate::view::StatusView>,
    /// Each execution's steps in workflow order (the status answer's
    /// `completed_steps`), by execution, with the resume count they were
    /// read at: the plan cache holds far fewer plans than a replica
    /// answers for, and a plan is read whole.
    pub step_order: noetl_mesh::cache::Bounded<String, (u32, std::sync::Arc<Vec<String>>)>,
    /// The executions' `ctx` records as this replica follows them
    /// ([`crate::view::follow_ctx`]): the status answer's `variables`.
    pub ctx_view: std::sync::Arc<crate::view::StatusView>,
    /// Timeouts and the connection limit.
    pub limits: crate::limits::Limits,
    /// Reads of a whole log at once on this replica (time travel,
    /// [`crate::handlers::history`]; [`LOG_FOLDS`]): each holds a chunk of
    /// the log and its folds, and a console scrubbing a long execution
    /// asks for one state after another.
    pub log_folds: tokio::sync::Semaphore,
}

/// Whole-log reads a replica runs at once ([`Shared::log_folds`]); more
/// wait for one to end.
pub const LOG_FOLDS: usize = 2;

/// Step statuses by (execution id, header revision).
pub type StepStatusCache = noetl_mesh::cache::Bounded<
    (String, u64),
    std::sync::Arc<std::collections::BTreeMap<String, Option<noetl_mesh::state::StepStatus>>>,
>;

impl AppState {
    /// A state over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}
