//! What one open token waits for ([`Wait`]) and why ([`Reason`]).

use noetl_mesh::served::QueueCounts;
use serde::Serialize;

/// What one open token waits for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Wait {
    /// The step.
    pub step: String,
    /// The token (also its step-run id); empty for a join's arrivals.
    pub token_id: String,
    /// The reason, for tools.
    pub reason: Reason,
    /// The reason, in words.
    pub text: String,
}

/// Why a token has not moved on.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// The execution is paused: the token waits for the unpause.
    Paused {
        /// Who paused it.
        by: String,
        /// Since when (RFC 3339).
        since: String,
    },
    /// The scheduler has not taken the token yet.
    Scheduler,
    /// The execution waits in line behind its playbook's concurrency key
    /// (`executor.spec.policy.concurrency`): its entry step starts when a
    /// slot frees.
    ConcurrencyQueue {
        /// The key.
        key: String,
        /// Its limit.
        limit: u32,
        /// The executions holding its slots.
        held_by: Vec<String>,
        /// 1-based place in line.
        position: usize,
    },
    /// A task waits for a slot of its step's concurrency key.
    Concurrency {
        /// The task.
        task: String,
        /// The key.
        key: String,
        /// Its limit.
        limit: u32,
        /// Who holds its slots.
        held_by: Vec<String>,
    },
    /// A task waits for its step's rate limit.
    Rate {
        /// The task.
        task: String,
        /// The key.
        key: String,
        /// When its token is due (RFC 3339).
        until: String,
    },
    /// A join waits for more of its inputs.
    Join {
        /// Inputs arrived so far.
        arrived: u64,
        /// Inputs it waits for in all.
        inputs: u64,
    },
    /// A task was sent to an executor of its kind and waits in the queue.
    Queued {
        /// The task.
        task: String,
        /// Its tool kind.
        tool: String,
        /// The kind's queue, when its consumer exists.
        queue: Option<QueueCounts>,
    },
    /// A task failed and its policy retries it after a delay.
    Retry {
        /// The task.
        task: String,
        /// The next attempt.
        attempt: u32,
        /// When it is sent again (RFC 3339).
        at: String,
    },
    /// A task runs on an executor.
    Running {
        /// The task.
        task: String,
        /// Its tool kind.
        tool: String,
        /// The attempt.
        attempt: u64,
    },
    /// A `wait` task waits for a signal.
    Signal {
        /// The task.
        task: String,
        /// The signal it waits for.
        signal: String,
        /// When it times out (RFC 3339), if it does.
        timeout_at: Option<String>,
    },
    /// A loop: iterations in flight.
    Loop {
        /// Iterations in all.
        total: u64,
        /// Dispatched and not reported.
        in_flight: u64,
        /// Reported done.
        done: u64,
        /// Reported failed.
        failed: u64,
    },
}
