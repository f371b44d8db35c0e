//! Subject, stream and bucket names: the only place they are spelled.

/// Names derived from the configured prefix (default `noetl`).
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

/// What a work or event subject under the prefix names
/// ([`Subjects::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// `<p>.token.<eid>`.
    Token {
        /// Execution id.
        eid: &'a str,
    },
    /// `<p>.loop.<eid>`.
    Loop {
        /// Execution id.
        eid: &'a str,
    },
    /// `<p>.evt.<eid>.<event_type>`.
    Event {
        /// Execution id.
        eid: &'a str,
        /// Event type (may contain dots: `loop.iteration.done`).
        event_type: &'a str,
    },
    /// `<p>.task.<kind>`.
    Task {
        /// Tool kind.
        kind: &'a str,
    },
}

impl<'a> Parsed<'a> {
    /// The execution the subject names, if any.
    pub fn execution(self) -> Option<&'a str> {
        match self {
            Self::Token { eid } | Self::Loop { eid } | Self::Event { eid, .. } => Some(eid),
            Self::Task { .. } => None,
        }
    }
}

/// The execution id and event type an event subject
/// (`<p>.evt.<eid>.<event_type>`) names, whatever its prefix (one token:
/// the configuration allows no dot in it); `None` for any other subject.
pub fn event_parts(subject: &str) -> Option<(&str, &str)> {
    let (_, rest) = subject.split_once('.')?;
    let rest = rest.strip_prefix("evt.")?;
    let (eid, event_type) = rest.split_once('.')?;
    (!eid.is_empty() && !event_type.is_empty()).then_some((eid, event_type))
}

impl Subjects {
    /// Names under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    /// The prefix itself.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Parse a token, loop, event or task subject under this prefix (the
    /// inverse of [`Subjects::token`], [`Subjects::loop_cmd`],
    /// [`Subjects::event`], [`Subjects::task`]); `None` for anything else.
    pub fn parse<'a>(&self, subject: &'a str) -> Option<Parsed<'a>> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('.')?;
        let (head, rest) = rest.split_once('.')?;
        let nonempty = |s: &'a str| Some(s).filter(|s| !s.is_empty());
        match head {
            "token" => Some(Parsed::Token {
                eid: nonempty(rest)?,
            }),
            "loop" => Some(Parsed::Loop {
                eid: nonempty(rest)?,
            }),
            "task" => Some(Parsed::Task {
                kind: nonempty(rest)?,
            }),
            "evt" => {
                let (eid, event_type) = rest.split_once('.')?;
                Some(Parsed::Event {
                    eid: nonempty(eid)?,
                    event_type: nonempty(event_type)?,
                })
            }
            _ => None,
        }
    }

    /// `<p>.exec.request`: execution requests (JSON or protobuf).
    pub fn exec_request(&self) -> String {
        format!("{}.exec.request", self.prefix)
    }
    /// `<p>.token.<eid>`: tokens of one execution.
    pub fn token(&self, eid: &str) -> String {
        format!("{}.token.{eid}", self.prefix)
    }
    /// `<p>.token.>`.
    pub fn tokens_all(&self) -> String {
        format!("{}.token.>", self.prefix)
    }
    /// `<p>.task.<kind>`: task commands for one tool kind.
    pub fn task(&self, kind: &str) -> String {
        format!("{}.task.{kind}", self.prefix)
    }
    /// `<p>.task.>`.
    pub fn tasks_all(&self) -> String {
        format!("{}.task.>", self.prefix)
    }
    /// `<p>.loop.<eid>`: loop-supervisor commands.
    pub fn loop_cmd(&self, eid: &str) -> String {
        format!("{}.loop.{eid}", self.prefix)
    }
    /// `<p>.loop.>`.
    pub fn loops_all(&self) -> String {
        format!("{}.loop.>", self.prefix)
    }
    /// `<p>.evt.<eid>.<event_type>`.
    pub fn event(&self, eid: &str, event_type: &str) -> String {
        format!("{}.evt.{eid}.{event_type}", self.prefix)
    }
    /// `<p>.evt.<eid>.>`: all events of one execution.
    pub fn events_of(&self, eid: &str) -> String {
        format!("{}.evt.{eid}.>", self.prefix)
    }
    /// `<p>.evt.>`: every event.
    pub fn events_all(&self) -> String {
        format!("{}.evt.>", self.prefix)
    }
    /// `<p>.evt.*.<event_type>`: one event type of every execution.
    pub fn events_of_type(&self, event_type: &str) -> String {
        format!("{}.evt.*.{event_type}", self.prefix)
    }
    /// `<p>.evt.<eid or *>.<types>`: events of one execution (or all) whose
    /// type matches the subject pattern `types` (`step.>`, `loop.done`).
    pub fn events_matching(&self, eid: Option<&str>, types: &str) -> String {
        format!("{}.evt.{}.{types}", self.prefix, eid.unwrap_or("*"))
    }
    /// `<p>.dlq.<kind>`: dead letters from one consumer kind.
    pub fn dead_letter(&self, consumer: &str) -> String {
        format!("{}.dlq.{consumer}", self.prefix)
    }
    /// `<p>.dlq.>`.
    pub fn dead_letters_all(&self) -> String {
        format!("{}.dlq.>", self.prefix)
    }

    fn upper(&self) -> String {
        self.prefix.to_ascii_uppercase().replace('-', "_")
    }
    /// Event log stream (`NOETL_EVENTS`).
    pub fn events_stream(&self) -> String {
        format!("{}_EVENTS", self.upper())
    }
    /// Work-queue stream for commands (`NOETL_WORK`).
    pub fn work_stream(&self) -> String {
        format!("{}_WORK", self.upper())
    }
    /// Dead-letter stream (`NOETL_DLQ`).
    pub fn dlq_stream(&self) -> String {
        format!("{}_DLQ", self.upper())
    }
    /// KV bucket of compact execution state (`noetl_exec`).
    pub fn exec_bucket(&self) -> String {
        format!("{}_exec", self.prefix)
    }
    /// KV bucket of `ctx` views (`noetl_ctx`).
    pub fn ctx_bucket(&self) -> String {
        format!("{}_ctx", self.prefix)
    }
    /// KV bucket of loop-run state (`noetl_loop`).
    pub fn loop_bucket(&self) -> String {
        format!("{}_loop", self.prefix)
    }
    /// Playbook catalog bucket (`noetl_catalog`).
    pub fn catalog_bucket(&self) -> String {
        format!("{}_catalog", self.prefix)
    }
    /// Encrypted credentials bucket (`noetl_credentials`).
    pub fn credentials_bucket(&self) -> String {
        format!("{}_credentials", self.prefix)
    }
    /// API tokens bucket (`noetl_tokens`): the SHA-256 of each token of
    /// `noetl serve api`, its name and role (never the token).
    pub fn tokens_bucket(&self) -> String {
        format!("{}_tokens", self.prefix)
    }
    /// Cron schedules bucket (`noetl_schedules`): one record per schedule
    /// (its settings and firing state), written by `noetl schedule` and
    /// `noetl serve timer`.
    pub fn schedules_bucket(&self) -> String {
        format!("{}_schedules", self.prefix)
    }
    /// Concurrency and rate limits bucket (`noetl_gates`): one record per
    /// key, its holders, waiting list or token bucket
    /// ([`crate::gate`]).
    pub fn gates_bucket(&self) -> String {
        format!("{}_gates", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::{event_parts, Parsed, Subjects};

    #[test]
    fn subjects_parse_back_to_what_built_them() {
        let s = Subjects::new("noetl");
        assert_eq!(s.parse(&s.token("e1")), Some(Parsed::Token { eid: "e1" }));
        assert_eq!(s.parse(&s.loop_cmd("e1")), Some(Parsed::Loop { eid: "e1" }));
        assert_eq!(
            s.parse(&s.event("e1", "loop.iteration.done")),
            Some(Parsed::Event {
                eid: "e1",
                event_type: "loop.iteration.done"
            })
        );
        assert_eq!(
            s.parse(&s.task("python")),
            Some(Parsed::Task { kind: "python" })
        );
        assert_eq!(
            s.parse(&s.event("e1", "x")).unwrap().execution(),
            Some("e1")
        );
        assert_eq!(s.parse(&s.task("python")).unwrap().execution(), None);
    }

    #[test]
    fn other_subjects_do_not_parse() {
        let s = Subjects::new("noetl");
        for bad in [
            "other.token.e1",
            "noetl.token.",
            "noetl.evt.e1",
            "noetl.evt..x",
            "noetl.exec.request",
            "noetltoken.e1",
            &s.dead_letter("router-events"),
        ] {
            assert_eq!(s.parse(bad), None, "{bad}");
        }
        // Another prefix's subjects are not ours.
        assert_eq!(Subjects::new("noetl2").parse("noetl.token.e1"), None);
    }

    #[test]
    fn event_parts_read_any_prefix() {
        let s = Subjects::new("team-a");
        let subject = s.event("e1", "loop.iteration.done");
        assert_eq!(event_parts(&subject), Some(("e1", "loop.iteration.done")));
        for bad in [
            "noetl.evt.e1",
            "noetl.evt..x",
            "noetl.token.e1.x",
            "evt.e1.x",
        ] {
            assert_eq!(event_parts(bad), None, "{bad}");
        }
    }
}
