//! The event types of the mesh (seeds 001 §9, 002 §8; docs/dsl.md
//! "Events"): one variant each, its wire name written once, in
//! [`EventType::wire_name`]. Services route on events with an exhaustive
//! `match` over [`EventType`], so a new type is a compile error wherever it
//! must be handled, and payload structs say which types they belong to
//! (`payloads::EventPayload`).

/// One event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    /// A message of this execution could not be handled and went to the
    /// dead-letter stream; the router fails the execution on it.
    MessageDeadLettered,
    /// Execution accepted, playbook loaded.
    PlaybookInitialized,
    /// Workflow layer started.
    WorkflowInitialized,
    /// A token was created.
    TokenCreated,
    /// A step was admitted and dispatched.
    StepScheduled,
    /// A step-run started.
    StepStarted,
    /// Admission denied the token.
    StepSkipped,
    /// A task attempt started.
    TaskStarted,
    /// A task attempt produced its outcome.
    TaskDone,
    /// A step-run finished successfully.
    StepDone,
    /// A step-run failed.
    StepFailed,
    /// Arcs were selected.
    NextSelected,
    /// A loop run started.
    LoopStarted,
    /// An iteration was dispatched.
    LoopIterationStarted,
    /// An iteration finished.
    LoopIterationDone,
    /// An iteration failed.
    LoopIterationFailed,
    /// All iterations of a loop run finished.
    LoopDone,
    /// A cursor loop's claim ran: its rows, or why it failed.
    LoopClaimed,
    /// Iterations of a loop window went out to the executors as one
    /// command (the loop-supervisor); read unfolded as their
    /// `loop.iteration.started` ([`crate::events::unfold`]).
    BatchAccepted,
    /// The iterations of a batch that ended in it (an executor); read
    /// unfolded as their `loop.iteration.done` / `.failed`.
    BatchCompleted,
    /// Terminal success.
    ExecutionCompleted,
    /// Terminal failure.
    ExecutionFailed,
    /// A client asked to cancel the execution (`noetl exec cancel`).
    ExecutionCancelRequested,
    /// The execution was cancelled: no new step starts.
    ExecutionCancelled,
    /// A timer: the execution's deadline (`executor.spec.limits.timeout_s`).
    ExecutionDeadline,
    /// A timer: a step-run's deadline (`lifecycle`, or the execution's).
    StepDeadline,
    /// A timer: a task command waits for a kind no executor serves.
    TaskUnserved,
    /// Who started, cancelled or changed what ([`crate::audit`]).
    Audit,
    /// The execution was paused: no new step or iteration starts.
    ExecutionPaused,
    /// The execution was unpaused: what its pause held goes on.
    ExecutionUnpaused,
    /// A `wait` task started waiting for a signal: its waiter
    /// ([`crate::signal`]).
    WaitStarted,
    /// A timer: a `wait` task's timeout ([`crate::signal`]).
    WaitTimeout,
    /// A signal continued a `wait` task.
    SignalReceived,
    /// A client asked to resume a failed or cancelled execution
    /// (`noetl exec resume`); the router carries it out.
    ExecutionResumeRequested,
    /// The execution runs again from where it stopped (or from a step).
    ExecutionResumed,
    /// A resume from an earlier step supersedes this step's last run.
    StepSuperseded,
    /// An execution waits for a slot of its concurrency key
    /// (`executor.spec.policy.concurrency`) before its entry step starts.
    ExecutionQueued,
}

impl EventType {
    /// Every event type, in the order of the docs.
    pub const ALL: [EventType; 37] = [
        Self::MessageDeadLettered,
        Self::PlaybookInitialized,
        Self::WorkflowInitialized,
        Self::TokenCreated,
        Self::StepScheduled,
        Self::StepStarted,
        Self::StepSkipped,
        Self::TaskStarted,
        Self::TaskDone,
        Self::StepDone,
        Self::StepFailed,
        Self::NextSelected,
        Self::LoopStarted,
        Self::LoopIterationStarted,
        Self::LoopIterationDone,
        Self::LoopIterationFailed,
        Self::LoopDone,
        Self::LoopClaimed,
        Self::BatchAccepted,
        Self::BatchCompleted,
        Self::ExecutionCompleted,
        Self::ExecutionFailed,
        Self::ExecutionCancelRequested,
        Self::ExecutionCancelled,
        Self::ExecutionDeadline,
        Self::StepDeadline,
        Self::TaskUnserved,
        Self::Audit,
        Self::ExecutionPaused,
        Self::ExecutionUnpaused,
        Self::WaitStarted,
        Self::WaitTimeout,
        Self::SignalReceived,
        Self::ExecutionResumeRequested,
        Self::ExecutionResumed,
        Self::StepSuperseded,
        Self::ExecutionQueued,
    ];

    /// Whether events of this type are for readers only: no fold of the
    /// log (the records of docs/architecture.md "The event log", loop
    /// runs, joins, held tokens, checkpoints, gates, replay's decisions)
    /// orders them against the work they announce and no service consumes
    /// them, so where one lands in the stream relative to that work
    /// changes no record ([`crate::effects::apply`]). `step.started` (and
    /// the `step.scheduled` of older logs) is read by the held tokens'
    /// check only as some `step.*` event of a step-run, which the
    /// step-run's own boundary also is; as the admission
    /// ([`crate::payloads::is_admission`]) it is read by a join's fold only
    /// in its order among the scheduler's decisions for the step (each
    /// decision's handler waits for its acks before the next token is
    /// taken), and by `replay --playbook` as the admission decision, at its
    /// place in the log. A cursor loop's `loop.iteration.started` (or the
    /// `batch.accepted` that carries it) is read by its run's fold: the
    /// loop-supervisor awaits those itself before their iterations go out
    /// (a loop over `in` does not wait for them).
    pub const fn for_readers_only(self) -> bool {
        matches!(
            self,
            Self::StepScheduled
                | Self::StepStarted
                | Self::TaskStarted
                | Self::LoopIterationStarted
                | Self::BatchAccepted
        )
    }

    /// Whether this type ends an execution (`execution.completed`,
    /// `execution.failed`, `execution.cancelled`); a later
    /// `execution.resumed` makes it run again.
    pub const fn ends_execution(self) -> bool {
        matches!(
            self,
            Self::ExecutionCompleted | Self::ExecutionFailed | Self::ExecutionCancelled
        )
    }

    /// Whether events of this type are a batch of loop iterations
    /// (`batch.accepted`, `batch.completed`), which readers get as the
    /// iterations' own events ([`crate::events::unfold`]).
    pub const fn is_batch(self) -> bool {
        matches!(self, Self::BatchAccepted | Self::BatchCompleted)
    }

    /// The name on the wire and in subjects (`step.done`).
    pub const fn wire_name(self) -> &'static str {
        match self {
            Self::MessageDeadLettered => "message.dead_lettered",
            Self::PlaybookInitialized => "playbook.initialized",
            Self::WorkflowInitialized => "workflow.initialized",
            Self::TokenCreated => "token.created",
            Self::StepScheduled => "step.scheduled",
            Self::StepStarted => "step.started",
            Self::StepSkipped => "step.skipped",
            Self::TaskStarted => "task.started",
            Self::TaskDone => "task.done",
            Self::StepDone => "step.done",
            Self::StepFailed => "step.failed",
            Self::NextSelected => "next.selected",
            Self::LoopStarted => "loop.started",
            Self::LoopIterationStarted => "loop.iteration.started",
            Self::LoopIterationDone => "loop.iteration.done",
            Self::LoopIterationFailed => "loop.iteration.failed",
            Self::LoopDone => "loop.done",
            Self::LoopClaimed => "loop.claimed",
            Self::BatchAccepted => "batch.accepted",
            Self::BatchCompleted => "batch.completed",
            Self::ExecutionCompleted => "execution.completed",
            Self::ExecutionFailed => "execution.failed",
            Self::ExecutionCancelRequested => "execution.cancel_requested",
            Self::ExecutionCancelled => "execution.cancelled",
            Self::ExecutionDeadline => "execution.deadline",
            Self::StepDeadline => "step.deadline",
            Self::TaskUnserved => "task.unserved",
            Self::Audit => "audit",
            Self::ExecutionPaused => "execution.paused",
            Self::ExecutionUnpaused => "execution.unpaused",
            Self::WaitStarted => "wait.started",
            Self::WaitTimeout => "wait.timeout",
            Self::SignalReceived => "signal.received",
            Self::ExecutionResumeRequested => "execution.resume_requested",
            Self::ExecutionResumed => "execution.resumed",
            Self::StepSuperseded => "step.superseded",
            Self::ExecutionQueued => "execution.queued",
        }
    }

    /// The type a wire name names (`None` for a name no service writes).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.wire_name() == name)
    }

    /// The type of an event (`None` for one no service writes).
    pub fn of(event: &noetl_wire::Event) -> Option<Self> {
        Self::parse(&event.event_type)
    }
}

/// An event name of NoETL's spec that this engine emits under its own
/// names (docs/dsl.md "Events", "The spec's names"): which of ours it is,
/// and why it is not one of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecName {
    /// The spec's name (`command.issued`).
    pub name: &'static str,
    /// Ours: what `noetl events tail --type <name>` follows (empty: none
    /// is emitted).
    pub ours: &'static [EventType],
    /// Why the engine has no event of that name.
    pub why: &'static str,
}

/// Every event name of the spec that is not one of ours.
pub const SPEC_NAMES: &[SpecName] = {
    use EventType as T;
    &[
        SpecName {
            name: "token.enqueued",
            ours: &[T::TokenCreated, T::NextSelected],
            why: "a token is created and published in one pass of the router: token.created says both for the entry and a resume's tokens, next.selected for the tokens arcs fire",
        },
        SpecName {
            name: "token.claimed",
            ours: &[T::StepStarted, T::StepSkipped, T::StepScheduled],
            why: "the scheduler takes a token and decides its admission at once: step.started (admitted, its rule in it; step.scheduled in logs before 2026-11-29) or step.skipped",
        },
        SpecName {
            name: "next.enqueued",
            ours: &[T::NextSelected],
            why: "the router evaluates the arcs and places their tokens in one pass: next.selected names each fired arc's token (older logs: a token.created per token, its `arc` set)",
        },
        SpecName {
            name: "command.issued",
            ours: &[T::StepStarted, T::LoopIterationStarted],
            why: "a step-run's first command goes out with step.started, an iteration's with loop.iteration.started; commands are work-queue messages, not events",
        },
        SpecName {
            name: "command.claimed",
            ours: &[T::TaskStarted],
            why: "an executor takes a command and starts its task at once",
        },
        SpecName {
            name: "command.started",
            ours: &[T::TaskStarted],
            why: "task.started is one per task attempt",
        },
        SpecName {
            name: "command.completed",
            ours: &[T::TaskDone],
            why: "task.done with status ok",
        },
        SpecName {
            name: "command.failed",
            ours: &[T::TaskDone],
            why: "task.done with status error (its action says whether it is retried)",
        },
        SpecName {
            name: "step.enter",
            ours: &[T::StepStarted],
            why: "the step-run starts when the scheduler admits it: one event says both",
        },
        SpecName {
            name: "step.exit",
            ours: &[T::StepDone, T::StepFailed, T::StepSkipped],
            why: "a step-run's end is its boundary event",
        },
        SpecName {
            name: "call.done",
            ours: &[T::StepDone],
            why: "a step-run's successful end",
        },
        SpecName {
            name: "call.error",
            ours: &[T::StepFailed],
            why: "a step-run's failed end",
        },
        SpecName {
            name: "playbook.completed",
            ours: &[T::ExecutionCompleted],
            why: "an execution, not a playbook, ends",
        },
        SpecName {
            name: "playbook.failed",
            ours: &[T::ExecutionFailed],
            why: "an execution, not a playbook, ends",
        },
        SpecName {
            name: "batch.processing",
            ours: &[T::BatchAccepted],
            why: "an executor takes a batch and runs it: batch.accepted says it went out, each iteration's end says it ran",
        },
        SpecName {
            name: "batch.failed",
            ours: &[T::BatchCompleted],
            why: "a batch does not fail as a whole: batch.completed reports each iteration's end, failed ones among them",
        },
    ]
};

/// The spec's name `name`, when it is not one of ours.
pub fn spec_name(name: &str) -> Option<&'static SpecName> {
    SPEC_NAMES.iter().find(|s| s.name == name)
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.wire_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips_through_its_wire_name_and_names_are_unique() {
        let mut names = std::collections::BTreeSet::new();
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.wire_name()), Some(t));
            assert!(names.insert(t.wire_name()), "{t} twice");
        }
        assert_eq!(EventType::parse("step.exploded"), None);
    }

    #[test]
    fn every_spec_name_is_not_ours_and_maps_to_ours() {
        for s in SPEC_NAMES {
            assert_eq!(EventType::parse(s.name), None, "{} is ours", s.name);
            assert!(!s.why.is_empty());
        }
        assert_eq!(
            spec_name("command.completed").unwrap().ours,
            &[EventType::TaskDone]
        );
        assert_eq!(
            spec_name("batch.failed").unwrap().ours,
            &[EventType::BatchCompleted]
        );
        assert_eq!(spec_name("step.done"), None);
    }
}
