//! Subject, stream and bucket names: the only place they are spelled.

/// Names derived from the configured prefix (default `noetl`).
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
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
}
