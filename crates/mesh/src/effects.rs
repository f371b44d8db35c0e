//! What a handler's decision asks the mesh to do, as values
//! (docs/architecture.md, "One handler shape"): a pure decision returns a
//! list of [`Effect`]s, and [`apply`] carries them out in order. Every
//! message an effect publishes has a deterministic id, so applying the
//! same list again (a redelivered message) publishes nothing new:
//! JetStream drops the copies.

use noetl_wire::{Event, LoopCommand, TaskCommand, Token};

use crate::{codec, Batch, Mesh, MeshError};

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

/// Publish `effects` in order, then wait for every ack (the first error
/// wins; the handler's message is then retried and publishes them again).
///
/// Cause before effect: work (a token, a task, a loop command) is
/// published only once every event listed before it is stored. Publishes
/// are not waited for one by one, and a nats-server that goes down loses
/// the ones in flight while the client sends the later ones after it
/// reconnects; without the wait a token could be stored, run and end while
/// the `token.created` announcing it was lost, and the state folded from
/// the log (docs/architecture.md, "The event log") would not know the
/// token. An ack that never comes fails the handler, whose message is
/// redelivered and publishes the lot again under the same ids.
pub async fn apply(mesh: &Mesh, effects: Vec<Effect>) -> Result<(), MeshError> {
    let mut batch = Batch::new();
    let mut events_unconfirmed = false;
    for effect in effects {
        let is_event = matches!(effect, Effect::Emit(_));
        if !is_event && events_unconfirmed {
            std::mem::take(&mut batch).wait().await?;
            events_unconfirmed = false;
        }
        events_unconfirmed |= is_event;
        batch.push(publish_one(mesh, effect).await?);
    }
    batch.wait().await
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
}
