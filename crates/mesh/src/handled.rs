//! Task errors a policy rule handled: an error outcome after which the
//! step-run went on (`continue`, `jump`, `break`) instead of failing. They
//! leave their step `done`, so they must be kept somewhere a user looks:
//! the executor collects them along the step-run's pipeline (the task
//! command carries them from one executor to the next), the step-run's
//! boundary event carries them, and the step's record keeps them
//! (docs/architecture.md "The event log"). A leaf module: the event
//! payloads and the KV records both read it.

use serde::{Deserialize, Serialize};

/// Distinct handled errors kept per step-run (or loop iteration): a jump
/// loop that fails the same way a thousand times keeps one entry, counted;
/// distinct errors past this many are counted in the last one kept.
pub const KEPT: usize = 5;

/// Characters of a message kept (the rest is cut, with `…`).
pub const MESSAGE_CHARS: usize = 500;

/// One task error a policy rule handled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandledError {
    /// The task whose outcome was an error.
    pub task: String,
    /// The error's kind (`python.exception`, `http.status`...).
    pub kind: String,
    /// What went wrong (at most [`MESSAGE_CHARS`] characters).
    pub message: String,
    /// What the policy did about it: `continue`, `jump` or `break`.
    pub action: String,
    /// How many task runs of this step-run ended with this same error
    /// (for the last entry kept: with this one or one not kept).
    #[serde(default = "one")]
    pub times: u64,
}

fn one() -> u64 {
    1
}

/// Whether a task run that ended with status `error` and policy action
/// `action` (as `task.done` names it) is a handled error: the step-run
/// went on.
pub fn is_handled(action: &str) -> bool {
    matches!(action, "continue" | "jump" | "break")
}

impl HandledError {
    /// A handled error of `task` (`kind: message`), `action` taken.
    pub fn new(task: &str, kind: &str, message: &str, action: &str) -> Self {
        Self {
            task: task.to_string(),
            kind: kind.to_string(),
            message: cut(message),
            action: action.to_string(),
            times: 1,
        }
    }

    /// `task: kind: message` (the kind once when the message starts with
    /// it), with ` (N times)` when it repeated.
    pub fn text(&self) -> String {
        let what = if self.kind.is_empty() || self.message.starts_with(&self.kind) {
            self.message.clone()
        } else {
            format!("{}: {}", self.kind, self.message)
        };
        let times = if self.times > 1 {
            format!(" ({} times)", self.times)
        } else {
            String::new()
        };
        format!("{}: {what}{times}", self.task)
    }
}

/// Add `e` to `list`: counted with the same error of the same task when
/// there is one, else appended while fewer than [`KEPT`] are kept, else
/// counted in the last one kept.
pub fn note(list: &mut Vec<HandledError>, e: HandledError) {
    let same =
        |h: &&mut HandledError| (&h.task, &h.kind, &h.message) == (&e.task, &e.kind, &e.message);
    if let Some(h) = list.iter_mut().find(same) {
        h.times += e.times;
    } else if list.len() < KEPT {
        list.push(e);
    } else if let Some(last) = list.last_mut() {
        last.times += e.times;
    }
}

/// `message`, cut to [`MESSAGE_CHARS`] characters.
fn cut(message: &str) -> String {
    match message.char_indices().nth(MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &message[..at]),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_error() -> HandledError {
        HandledError::new(
            "calc",
            "python.exception",
            "NameError: name 'totl' is not defined",
            "continue",
        )
    }

    #[test]
    fn only_an_error_the_step_run_went_on_after_is_handled() {
        for action in ["continue", "jump", "break"] {
            assert!(is_handled(action), "{action}");
        }
        for action in ["fail", "retry", ""] {
            assert!(!is_handled(action), "{action}");
        }
    }

    #[test]
    fn the_same_error_is_counted_and_distinct_ones_are_kept_up_to_the_limit() {
        let mut list = Vec::new();
        note(&mut list, name_error());
        note(&mut list, name_error());
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].times, 2);
        assert_eq!(
            list[0].text(),
            "calc: python.exception: NameError: name 'totl' is not defined (2 times)"
        );
        for i in 0..KEPT + 3 {
            note(
                &mut list,
                HandledError::new("fetch", "http.status", &format!("{i}"), "jump"),
            );
        }
        assert_eq!(list.len(), KEPT, "bounded");
        let counted: u64 = list.iter().map(|h| h.times).sum();
        assert_eq!(counted, 2 + KEPT as u64 + 3, "nothing goes uncounted");
    }

    #[test]
    fn a_long_message_is_cut_and_a_kind_already_in_it_is_said_once() {
        let long = "x".repeat(MESSAGE_CHARS * 2);
        let e = HandledError::new("t", "shell", &long, "continue");
        assert_eq!(e.message.chars().count(), MESSAGE_CHARS + 1);
        assert!(e.message.ends_with('…'));
        let e = HandledError::new("t", "timeout", "timeout: after 5 s", "break");
        assert_eq!(e.text(), "t: timeout: after 5 s");
    }
}
