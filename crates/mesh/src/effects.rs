//! What a handler's decision asks the mesh to do, as values
//! (docs/architecture.md, "One handler shape"): a pure decision returns a
//! list of [`Effect`]s, and [`apply`] carries them out in order. Every
//! message an effect publishes has a deterministic id, so applying the
//! same list again (a redelivered message) publishes nothing new:
//! JetStream drops the copies.

use noetl_wire::{Event, LoopCommand, TaskCommand, Token};

use crate::{codec, event_type::EventType, Batch, Mesh, MeshError};

/// One thing to publish.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Emit an event on its execution's event subject.
    Emit(Event),
    /// Publish a task command on its kind's subject; when no executor
    /// serves the kind, its `task.unserved` timer too.
    Task {
        /// The tool kind that runs it (the workbook's kind resolved).
        kind: String,
        /// The task's name, for the timer.
        task: String,
        /// The command.
        cmd: TaskCommand,
    },
    /// Publish a task command on its kind's subject without a
    /// `task.unserved` timer: a delayed retry an executor hands back to
    /// its own kind, a cursor loop's claim.
    Command {
        /// The tool kind that runs it.
        kind: String,
        /// The command.
        cmd: TaskCommand,
    },
    /// Publish a loop command for the loop-supervisor.
    Loop(LoopCommand),
    /// Publish a token for the scheduler.
    Token(Token),
}

impl Effect {
    /// The message id the effect publishes under (its idempotency key).
    pub fn id(&self) -> &str {
        match self {
            Effect::Emit(e) => &e.event_id,
            Effect::Task { cmd, .. } | Effect::Command { cmd, .. } => &cmd.command_id,
            Effect::Loop(c) => &c.command_id,
            Effect::Token(t) => &t.token_id,
        }
    }
}

/// Publish `effects`, events first, then wait for every ack (the first
/// error wins; the handler's message is then retried and publishes them
/// again).
///
/// Cause before effect: work (a token, a task, a loop command) is
/// published only once the events of the list are stored ([`order`]):
/// one wait per list, however events and work interleave in it (a loop's
/// window is an event and a command per iteration). Events for readers
/// only ([`EventType::for_readers_only`]) are not waited for: a list whose
/// events are all such goes out in one batch. Publishes
/// are not waited for one by one, and a nats-server that goes down loses
/// the ones in flight while the client sends the later ones after it
/// reconnects; without the wait a token could be stored, run and end while
/// the `next.selected` announcing it was lost, and the state folded from
/// the log (docs/architecture.md, "The event log") would not know the
/// token. An ack that never comes fails the handler, whose message is
/// redelivered and publishes the lot again under the same ids.
pub async fn apply(mesh: &Mesh, effects: Vec<Effect>) -> Result<(), MeshError> {
    let Ordered { events, wait, work } = order(effects);
    let mut batch = Batch::new();
    for effect in events {
        batch.push(publish_one(mesh, effect).await?);
    }
    if wait {
        std::mem::take(&mut batch).wait().await?;
    }
    for effect in work {
        batch.push(publish_one(mesh, effect).await?);
    }
    batch.wait().await
}

/// A handler's effects in the order [`apply`] publishes them.
#[derive(Debug, PartialEq)]
pub struct Ordered {
    /// The events, in their order.
    pub events: Vec<Effect>,
    /// Whether the events' acks are awaited before the work goes out: some
    /// event is one a fold reads, and there is work.
    pub wait: bool,
    /// The work (tokens, tasks, loop commands), in its order.
    pub work: Vec<Effect>,
}

/// Split `effects` into events and work, each in its order, and say
/// whether the work must wait for the events ([`Ordered::wait`]).
pub fn order(effects: Vec<Effect>) -> Ordered {
    let (events, work): (Vec<Effect>, Vec<Effect>) = effects
        .into_iter()
        .partition(|e| matches!(e, Effect::Emit(_)));
    let causes = events.iter().any(|e| match e {
        Effect::Emit(ev) => !EventType::of(ev).is_some_and(EventType::for_readers_only),
        _ => false,
    });
    Ordered {
        wait: causes && !work.is_empty(),
        events,
        work,
    }
}

/// Publish one effect without waiting for its ack.
async fn publish_one(mesh: &Mesh, effect: Effect) -> Result<crate::PendingAck, MeshError> {
    Ok(match effect {
        Effect::Emit(ev) => mesh.emit(&ev).await?,
        Effect::Task { kind, task, cmd } => mesh.publish_task_of_kind(&kind, &task, &cmd).await?,
        Effect::Command { kind, cmd } => mesh.publish_command(&kind, &cmd).await?,
        Effect::Loop(cmd) => {
            mesh.publish(
                mesh.subjects().loop_cmd(&cmd.execution_id),
                &cmd.command_id,
                codec::encode(&cmd),
            )
            .await?
        }
        Effect::Token(token) => mesh.publish_token(&token).await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_effect_publishes_under_its_deterministic_id() {
        let ev = Event {
            event_id: "ev1".into(),
            ..Default::default()
        };
        assert_eq!(Effect::Emit(ev).id(), "ev1");
        let cmd = TaskCommand {
            command_id: "c1".into(),
            ..Default::default()
        };
        let task = Effect::Task {
            kind: "python".into(),
            task: "t".into(),
            cmd,
        };
        assert_eq!(task.id(), "c1");
        let lc = LoopCommand {
            command_id: "l1".into(),
            ..Default::default()
        };
        assert_eq!(Effect::Loop(lc).id(), "l1");
        let token = Token {
            token_id: "t1".into(),
            ..Default::default()
        };
        assert_eq!(Effect::Token(token).id(), "t1");
    }

    fn event(kind: EventType, id: &str) -> Effect {
        Effect::Emit(Event {
            event_id: id.into(),
            event_type: kind.wire_name().into(),
            ..Default::default()
        })
    }

    fn token(id: &str) -> Effect {
        Effect::Token(Token {
            token_id: id.into(),
            ..Default::default()
        })
    }

    fn ids(v: &[Effect]) -> Vec<&str> {
        v.iter().map(Effect::id).collect()
    }

    #[test]
    fn events_go_first_and_the_work_waits_once_for_those_a_fold_reads() {
        // A loop window: an event and a command per iteration, the events
        // for readers only: one batch, nothing awaited in between.
        let window = order(vec![
            event(EventType::LoopIterationStarted, "s0"),
            token("w0"),
            event(EventType::LoopIterationStarted, "s1"),
            token("w1"),
        ]);
        assert_eq!(ids(&window.events), ["s0", "s1"]);
        assert_eq!(ids(&window.work), ["w0", "w1"]);
        assert!(!window.wait);
        // The scheduler's start: no fold orders step.started against the
        // task, so it goes in the same batch.
        let start = order(vec![event(EventType::StepStarted, "a"), token("t")]);
        assert_eq!(ids(&start.events), ["a"]);
        assert!(!start.wait);
        // The router's answer names the tokens it fired: the fold needs
        // it before the tokens' own events, so the tokens wait for it.
        let routed = order(vec![event(EventType::NextSelected, "n"), token("t")]);
        assert!(routed.wait);
        // Events alone, or work alone: nothing to wait for in between.
        assert!(!order(vec![event(EventType::StepDone, "d")]).wait);
        assert!(!order(vec![token("t")]).wait);
        // A type no service writes is taken as read by a fold.
        let unknown = Effect::Emit(Event {
            event_id: "x".into(),
            event_type: "something.else".into(),
            ..Default::default()
        });
        assert!(order(vec![unknown, token("t")]).wait);
    }

    #[test]
    fn only_start_events_are_for_readers_only() {
        let readers: Vec<&str> = EventType::ALL
            .into_iter()
            .filter(|k| k.for_readers_only())
            .map(EventType::wire_name)
            .collect();
        assert_eq!(
            readers,
            [
                "step.scheduled",
                "step.started",
                "task.started",
                "loop.iteration.started",
                "batch.accepted"
            ]
        );
    }
}
