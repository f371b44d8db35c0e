//! Compact execution state in the `noetl_exec` bucket. The router is its only
//! writer for headers, step records and run records; every write is a KV
//! compare-and-set. Keys:
//!
//! | key | value |
//! |---|---|
//! | `<eid>` | [`ExecHeader`] |
//! | `<eid>.plan` | [`crate::plan::PlanRecord`] (immutable) |
//! | `<eid>.step.<step>` | [`StepRecord`] |
//! | `<eid>.result.<step>` | the step's last compact result (written by executors) |
//!
//! The `ctx` object (bucket `noetl_ctx`, key `<eid>`) carries one reserved
//! key, [`APPLIED_KEY`], stripped by [`user_ctx`] before anyone sees it.

use std::collections::BTreeMap;

use crate::keys::Keys;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::status::ExecStatus;
pub use crate::token::TokenRecord;

/// The compact header of one execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecHeader {
    /// Execution id.
    pub execution_id: String,
    /// Current status.
    pub status: ExecStatus,
    /// `metadata.name` of the playbook.
    pub playbook: String,
    /// Where it came from (file name or catalog path).
    pub source: String,
    /// Tokens created whose step-run has not reached a handled boundary
    /// (O(live tokens), not O(steps)). Each records the step-run that fired
    /// it, so a redelivered boundary republishes exactly the same tokens.
    pub live: Vec<TokenRecord>,
    /// The terminal event (`execution.completed` / `execution.failed`) was
    /// published; later stragglers do not publish it again.
    #[serde(default)]
    pub terminal_emitted: bool,
    /// Start time.
    pub started_at: String,
    /// End time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The parent execution, for child playbooks.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_execution_id: String,
    /// The tokens that were live when the execution failed or was
    /// cancelled (the failing step-run's among them): what a resume runs
    /// again (`noetl exec resume`, docs/operations.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped: Vec<TokenRecord>,
    /// How many times it was resumed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumes: u32,
    /// When it was last resumed (Unix epoch ms; 0: never): timers set
    /// before then belong to the run that stopped.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub resumed_at_ms: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_ms(n: &u64) -> bool {
    *n == 0
}

/// Status of a step (its latest run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Finished successfully.
    Done,
    /// Failed.
    Failed,
    /// Admission denied.
    Skipped,
}

/// What the router knows of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Latest status.
    pub status: StepStatus,
    /// Latest step-run id.
    pub last_step_run_id: String,
    /// Loop counters of the latest run, if it was a loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_counts: Option<Value>,
    /// Error of the latest run, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Task errors of the latest run a policy rule handled (it went on:
    /// `continue`, `jump`, `break`), from its boundary event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handled: Vec<crate::handled::HandledError>,
}

/// Whether an execution of status `status` whose header names `playbook`
/// ended before its first step: refused or cancelled before the router
/// planned a playbook for it (such a header names none).
fn ended_before_start(playbook: &str, status: ExecStatus) -> bool {
    playbook.is_empty() && status.is_terminal()
}

impl ExecHeader {
    /// It ended before its first step: refused or cancelled before a
    /// playbook was planned for it ([`ExecSummary::ended_before_start`]).
    pub fn ended_before_start(&self) -> bool {
        ended_before_start(&self.playbook, self.status)
    }

    /// The header of a running execution with `live` tokens (playbook,
    /// source and times empty: set them with struct update syntax).
    pub fn running(execution_id: impl Into<String>, live: Vec<TokenRecord>) -> Self {
        Self {
            execution_id: execution_id.into(),
            status: ExecStatus::Running,
            playbook: String::new(),
            source: String::new(),
            live,
            terminal_emitted: false,
            started_at: String::new(),
            ended_at: None,
            error: None,
            parent_execution_id: String::new(),
            stopped: Vec::new(),
            resumes: 0,
            resumed_at_ms: 0,
        }
    }

    /// End a running execution with `status` and `error` at `now`: its
    /// live tokens are kept as [`Self::stopped`], for a resume.
    pub fn end(&mut self, status: ExecStatus, error: &str, now: &str) {
        self.status = status;
        self.error = Some(error.to_string());
        self.stopped = std::mem::take(&mut self.live);
        self.ended_at = Some(now.to_string());
    }

    /// True while `token_id` is live.
    pub fn is_live(&self, token_id: &str) -> bool {
        self.live.iter().any(|t| t.token_id == token_id)
    }
}

/// The header of the resumed execution: running again with `tokens` live,
/// its error, end and stopped tokens cleared, its resume counted.
pub fn resumed_header(h: &ExecHeader, tokens: Vec<TokenRecord>, now_ms: u64) -> ExecHeader {
    ExecHeader {
        status: ExecStatus::Running,
        live: tokens,
        stopped: Vec::new(),
        terminal_emitted: false,
        ended_at: None,
        error: None,
        resumes: h.resumes + 1,
        resumed_at_ms: now_ms,
        ..h.clone()
    }
}

/// Reserved key inside the stored `ctx` object: the ids of the writes
/// already applied to it (task runs' `set_ctx` patches, loop runs' reducer
/// results), recorded in the same compare-and-set as the write, so a
/// redelivered command or event never applies its write twice. Users never
/// see it: [`user_ctx`] strips it wherever `ctx` is read.
pub const APPLIED_KEY: &str = "__noetl_applied";

/// How many applied write ids the stored `ctx` remembers (oldest dropped
/// first). Redeliveries come within the ack wait, long before this many
/// other writes.
pub const APPLIED_MAX: usize = 256;

/// `ctx` as users see it: the stored object without [`APPLIED_KEY`].
pub fn user_ctx(mut ctx: Value) -> Value {
    if let Value::Object(m) = &mut ctx {
        m.remove(APPLIED_KEY);
    }
    ctx
}

/// True when the write `id` was already applied to the stored `ctx` object.
pub fn ctx_applied(ctx: &serde_json::Map<String, Value>, id: &str) -> bool {
    ctx.get(APPLIED_KEY)
        .and_then(Value::as_array)
        .is_some_and(|ids| ids.iter().any(|v| v.as_str() == Some(id)))
}

/// Record the write `id` as applied in the stored `ctx` object (bounded to
/// the last [`APPLIED_MAX`] ids).
pub fn mark_ctx_applied(ctx: &mut serde_json::Map<String, Value>, id: &str) {
    let mut ids = match ctx.remove(APPLIED_KEY) {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    ids.push(Value::String(id.to_string()));
    if ids.len() > APPLIED_MAX {
        let extra = ids.len() - APPLIED_MAX;
        ids.drain(..extra);
    }
    ctx.insert(APPLIED_KEY.to_string(), Value::Array(ids));
}

/// Where an iteration's pipeline is, stored by the executor (bucket loop,
/// [`Keys::checkpoint`]) after each task that wrote `iter`, so a
/// redelivered command resumes there instead of repeating tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Task runs taken so far (a later checkpoint has more).
    pub steps_taken: u64,
    /// The next task.
    pub pc: usize,
    /// Its attempt.
    pub attempt: u32,
    /// `_prev` (a reference when large).
    pub prev: Value,
    /// The iteration's `iter`.
    pub iter: serde_json::Map<String, Value>,
    /// Its reducer contributions so far.
    pub reduce: serde_json::Map<String, Value>,
    /// Results of its tasks read by name (`TaskCommand.results_json`;
    /// large ones by reference).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub results: serde_json::Map<String, Value>,
    /// Task errors a policy rule handled so far in the iteration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handled: Vec<crate::handled::HandledError>,
}

/// Who first wrote one `ctx` key in a parallel loop run (bucket ctx,
/// [`Keys::owners`], a map from key to owner).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtxOwner {
    /// The writing task, for the conflict message (`step[index].task`).
    pub writer: String,
    /// A hash of the value it wrote.
    pub hash: String,
    /// Its task run id.
    pub run: String,
}

/// The owners of the `ctx` keys of one loop run, by key.
pub type CtxOwners = std::collections::BTreeMap<String, CtxOwner>;

/// What a claim on `ctx` keys decides ([`claim_ctx_keys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtxClaim {
    /// Every key is already this writer's or holds the same value.
    Held,
    /// New keys were claimed: store these owners.
    Write(CtxOwners),
    /// A key holds a different value from another task run: the message.
    Conflict(String),
}

/// The write-once rule for `ctx` keys in a parallel loop: the first writer
/// of each key (`hashes`: key and hash of the value) owns it; the same
/// value again, or the same task run again (a redelivered command whose
/// template rendered differently), is fine; a different value from another
/// task run is a `ctx.conflict` naming the key and both writers.
pub fn claim_ctx_keys(
    owners: Option<&CtxOwners>,
    hashes: &[(String, String)],
    writer: &str,
    run: &str,
) -> CtxClaim {
    let mut owners = owners.cloned().unwrap_or_default();
    let mut changed = false;
    for (k, h) in hashes {
        match owners.get(k) {
            Some(o) if &o.hash == h || o.run == run => {}
            Some(o) => {
                return CtxClaim::Conflict(format!(
                    "ctx.conflict: key {k:?} was written by {} and now differently by {writer} (set_ctx in a parallel loop is write-once per key; declare a reducer in loop.spec.policy.reducers to aggregate)",
                    o.writer
                ))
            }
            None => {
                let owner = CtxOwner {
                    writer: writer.to_string(),
                    hash: h.clone(),
                    run: run.to_string(),
                };
                owners.insert(k.clone(), owner);
                changed = true;
            }
        }
    }
    if changed {
        CtxClaim::Write(owners)
    } else {
        CtxClaim::Held
    }
}

/// What a reader other than the loop-supervisor needs of a loop run's
/// record (the loop-supervisor's own type has every field): which
/// iterations have been counted.
#[derive(Debug, Clone, Deserialize)]
pub struct LoopProgress {
    /// Next index to dispatch.
    pub next: u64,
    /// Indices dispatched and not yet counted.
    pub in_flight: Vec<u64>,
    /// A cursor loop run's claims not yet applied.
    #[serde(default)]
    pub cursor: Option<CursorProgress>,
}

/// What an executor reads of a cursor loop run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CursorProgress {
    /// Claims issued and not yet applied (their `seq`).
    #[serde(default)]
    pub claims: Vec<ClaimSeq>,
}

/// One claim in flight, as [`CursorProgress`] reads it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClaimSeq {
    /// The claim's sequence number.
    pub seq: u64,
}

impl LoopProgress {
    /// True once iteration `index` was counted: dispatched and no longer
    /// in flight. Its work is over; a late copy of its command is stale.
    pub fn counted(&self, index: u64) -> bool {
        index < self.next && !self.in_flight.contains(&index)
    }

    /// True once claim `seq` of a cursor loop run was applied (or the run
    /// is no cursor loop): a late copy of its command is stale.
    pub fn claim_applied(&self, seq: u64) -> bool {
        self.cursor
            .as_ref()
            .is_none_or(|c| !c.claims.iter().any(|s| s.seq == seq))
    }
}

/// The summary `noetl run --json` and `noetl exec status --json` print.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecSummary {
    /// Execution id.
    pub execution_id: String,
    /// Status.
    pub status: ExecStatus,
    /// Playbook name.
    pub playbook: String,
    /// Final (or current) `ctx`.
    pub ctx: Value,
    /// Each step's status: done / failed / skipped / not_run.
    pub steps: BTreeMap<String, String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Start and end times.
    pub started_at: String,
    /// End time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// The pause of a running execution (`noetl exec pause`): it runs
    /// nothing new until unpaused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<crate::pause::PauseRecord>,
    /// A running execution waiting in line behind its playbook's
    /// concurrency key (`executor.spec.policy.concurrency`): its entry step
    /// starts when a slot frees.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
}

impl ExecSummary {
    /// The status as people read it ([`shown_status`]).
    pub fn shown_status(&self) -> &'static str {
        shown_status(self.status, self.paused.is_some(), self.queued)
    }

    /// It ended before its first step, as [`ExecHeader::ended_before_start`].
    pub fn ended_before_start(&self) -> bool {
        ended_before_start(&self.playbook, self.status)
    }
}

/// The status of an execution as people read it (`noetl exec status`,
/// `show`, `list`; the console): the execution-wide states `noetl exec
/// why` knows of a running execution, `paused` (a pause record) before
/// `queued` (waiting in line behind its concurrency key), else the
/// header's status (`running`, `completed`, `failed`, `cancelled`). An
/// ended execution is never shown paused or queued.
pub fn shown_status(status: ExecStatus, paused: bool, queued: bool) -> &'static str {
    match (status, paused, queued) {
        (ExecStatus::Running, true, _) => "paused",
        (ExecStatus::Running, false, true) => "queued",
        (s, _, _) => s.as_str(),
    }
}

impl crate::Mesh {
    /// Every execution's header (one scan of the exec bucket's one-token
    /// keys). A header that does not decode comes back as its error.
    pub async fn executions(
        &self,
    ) -> Result<Vec<(String, Result<ExecHeader, crate::MeshError>)>, crate::MeshError> {
        crate::kv::values_matching(self.exec_kv(), "*").await
    }

    /// Read an execution's header.
    pub async fn exec_header(&self, eid: &str) -> Result<Option<ExecHeader>, crate::MeshError> {
        crate::kv::get(self.exec_kv(), &Keys::header(eid)).await
    }

    /// Read an execution's `ctx` as users see it (`{}` when none was
    /// written; the engine's reserved [`APPLIED_KEY`] is left out).
    pub async fn exec_ctx(&self, eid: &str) -> Result<Value, crate::MeshError> {
        Ok(user_ctx(
            crate::kv::get::<Value>(self.ctx_kv(), eid)
                .await?
                .unwrap_or_else(|| Value::Object(Default::default())),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_ended_header_without_a_playbook_ended_before_its_first_step() {
        let refused = ExecHeader {
            status: ExecStatus::Failed,
            ..ExecHeader::running("e1", Vec::new())
        };
        assert!(refused.ended_before_start());
        assert!(!ExecHeader::running("e1", Vec::new()).ended_before_start());
        let ran = ExecHeader {
            playbook: "hello".into(),
            ..refused.clone()
        };
        assert!(!ran.ended_before_start());
    }

    #[test]
    fn a_running_execution_shows_paused_before_queued_and_an_ended_one_neither() {
        use ExecStatus::*;
        let shown = |s, p, q| shown_status(s, p, q);
        assert_eq!(shown(Running, false, false), "running");
        assert_eq!(shown(Running, true, false), "paused");
        assert_eq!(shown(Running, false, true), "queued");
        assert_eq!(
            shown(Running, true, true),
            "paused",
            "a pause holds it first"
        );
        for s in [Completed, Failed, Cancelled] {
            assert_eq!(shown(s, true, true), s.as_str());
        }
    }

    #[test]
    fn applied_ids_are_bounded_and_hidden_from_users() {
        let mut m = serde_json::Map::new();
        m.insert("n".into(), json!(1));
        for i in 0..APPLIED_MAX + 10 {
            mark_ctx_applied(&mut m, &format!("t{i}"));
        }
        assert!(!ctx_applied(&m, "t0"), "the oldest ids are dropped");
        assert!(ctx_applied(&m, &format!("t{}", APPLIED_MAX + 9)));
        assert_eq!(m[APPLIED_KEY].as_array().unwrap().len(), APPLIED_MAX);
        assert_eq!(user_ctx(Value::Object(m)), json!({"n": 1}));
    }

    fn hashes(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, h)| (k.to_string(), h.to_string()))
            .collect()
    }

    #[test]
    fn ctx_keys_are_write_once_per_loop_run() {
        let CtxClaim::Write(owners) = claim_ctx_keys(None, &hashes(&[("a", "h1")]), "s[0].t", "r0")
        else {
            panic!("the first writer claims the key");
        };
        assert_eq!(owners["a"].writer, "s[0].t");
        // The same value from another run, or the same run with another
        // value (a redelivery), holds.
        let same = claim_ctx_keys(Some(&owners), &hashes(&[("a", "h1")]), "s[1].t", "r1");
        assert_eq!(same, CtxClaim::Held);
        let again = claim_ctx_keys(Some(&owners), &hashes(&[("a", "h9")]), "s[0].t", "r0");
        assert_eq!(again, CtxClaim::Held);
        // Another run with another value conflicts, naming both writers.
        let CtxClaim::Conflict(m) =
            claim_ctx_keys(Some(&owners), &hashes(&[("a", "h2")]), "s[2].t", "r2")
        else {
            panic!("a different value conflicts");
        };
        assert!(m.contains("ctx.conflict") && m.contains("s[0].t") && m.contains("s[2].t"));
        // A new key next to a held one is claimed.
        let CtxClaim::Write(more) = claim_ctx_keys(
            Some(&owners),
            &hashes(&[("a", "h1"), ("b", "h3")]),
            "s[3].t",
            "r3",
        ) else {
            panic!("a new key is claimed");
        };
        assert_eq!(more.len(), 2);
        assert_eq!(more["b"].run, "r3");
    }
}
