//! A cursor loop's claim (docs/dsl.md, "Cursor loops"). The
//! loop-supervisor asks for one with a task command carrying a
//! [`ClaimRef`]; the executor of the claim's kind runs the loop's
//! `cursor.claim` like a task of the step (its templates, its keychain,
//! the step-run's deadline) and reports the rows it returned, or why it
//! failed, in one `loop.claimed` event. The loop-supervisor turns the rows
//! into iterations: it runs no SQL itself.

use std::collections::HashMap;
use std::sync::Arc;

use noetl_core::tool::{AuthCredential, Objects, Tool, ToolCall};
use noetl_core::{template::Scope, LoopCursor, Outcome, Step, Task};
use noetl_mesh::{
    events::{now_ms, EventDraft},
    keys::Keys,
    objects::PutParams,
    payloads::{self, ClaimEnded, Status},
    plan::PlanRecord,
    scope, MeshError,
};
use noetl_wire::{ClaimRef, TaskCommand};
use serde_json::{json, Map, Value};

use crate::call::{call_tool, call_tool_within, render_config};
use noetl_mesh::runtime::HandlerError;

/// The variable a claim reads for its batch size.
pub const FRAME_MAX_ROWS: &str = "__frame_max_rows";

/// The variable a claim reads for its own identity: the same text each
/// time the same claim runs again (a redelivered command after a crash),
/// another for every other claim, so a claim that marks the rows it takes
/// with it can take the same rows again (docs/dsl.md, "Cursor loops").
pub const FRAME_CLAIM: &str = "__frame_claim";

/// The value of [`FRAME_CLAIM`] for `claim`: the identity it carries (a
/// stopped run's claim sent again by the run that continues it), else its
/// loop run and sequence number.
pub fn claim_identity(claim: &ClaimRef) -> String {
    if claim.identity.is_empty() {
        noetl_mesh::ids::claim_identity(&claim.loop_run_id, claim.seq)
    } else {
        claim.identity.clone()
    }
}

/// What of the executor a claim uses.
pub(crate) struct Env<'a> {
    pub mesh: &'a noetl_mesh::Mesh,
    pub tools: &'a HashMap<String, Arc<dyn Tool>>,
    pub objects: &'a Arc<dyn Objects>,
}

/// One claim command, with what it runs in.
pub(crate) struct ClaimRun<'a> {
    pub exec: Env<'a>,
    pub plan: &'a PlanRecord,
    pub step: &'a Step,
    pub cmd: &'a TaskCommand,
    pub claim: &'a ClaimRef,
}

impl ClaimRun<'_> {
    /// Run the claim and publish its `loop.claimed` event.
    pub(crate) async fn run(&self) -> Result<(), HandlerError> {
        let eid = self.cmd.execution_id.as_str();
        let Some(cursor) = self.step.loop_.as_ref().and_then(|l| l.cursor.as_ref()) else {
            return Err(HandlerError::Refused(format!(
                "claim command of execution {eid} names step {:?}, which is no cursor loop",
                self.step.step
            )));
        };
        let payload = match self.rows(cursor).await? {
            Ok(rows) => {
                let count = rows.len() as u64;
                let rows = Value::Array(rows);
                let id = Keys::frame_object(&self.claim.loop_run_id, self.claim.seq);
                let limit = self
                    .plan
                    .max_payload_bytes(self.exec.mesh.config().inline_limit);
                let rows = self
                    .exec
                    .mesh
                    .results()
                    .offload(
                        PutParams {
                            execution_id: eid,
                            step: &self.step.step,
                            id: &id,
                            value: &rows,
                        },
                        limit,
                    )
                    .await
                    .map_err(MeshError::from)?;
                ClaimEnded {
                    loop_run_id: self.claim.loop_run_id.clone(),
                    seq: self.claim.seq,
                    status: Status::Ok,
                    rows,
                    count,
                    error: Value::Null,
                }
            }
            Err(error) => {
                tracing::warn!(execution_id = %eid, step = %self.step.step, %error, "cursor claim failed");
                ClaimEnded {
                    loop_run_id: self.claim.loop_run_id.clone(),
                    seq: self.claim.seq,
                    status: Status::Error,
                    rows: Value::Null,
                    count: 0,
                    error,
                }
            }
        };
        let seq = self.claim.seq.to_string();
        let ev = EventDraft {
            execution_id: eid,
            step_run_id: &self.claim.loop_run_id,
            step: &self.step.step,
            trace_id: &self.cmd.trace_id,
            discriminator: &seq,
            ..Default::default()
        }
        .build(&payload);
        self.exec.mesh.emit(&ev).await?.wait().await?;
        Ok(())
    }

    /// The rows the claim returned, or the error that fails the loop step
    /// (`{kind, message}`). `Err` of the outer result: retry the command.
    async fn rows(&self, cursor: &LoopCursor) -> Result<Result<Vec<Value>, Value>, HandlerError> {
        let step = &self.step.step;
        let fail = |kind: &str, message: String| {
            Ok(Err(payloads::error_body(
                kind,
                format!("claim of cursor loop {step:?}: {message}"),
            )))
        };
        let Some(tool) = self.exec.tools.get(&cursor.kind) else {
            return fail(
                "loop.cursor",
                format!("this executor does not serve kind {:?}", cursor.kind),
            );
        };
        let task = claim_task(cursor);
        let read = match self.read(cursor, &task).await? {
            Ok(read) => read,
            Err((kind, message)) => return fail(kind, message),
        };
        let config = match render_config(&task, tool.raw_fields(), &read.scope) {
            Ok(c) => c,
            Err(message) => return fail("template", message),
        };
        let auth = match crate::task::auth(&config, &read.credentials) {
            Ok(a) => a,
            Err(why) => return fail("auth", why),
        };
        let secrets = read.credentials.secrets.clone();
        let call = self.tool_call(&task, config, auth, read);
        let mut outcome = match self.call(tool, call).await {
            Ok(outcome) => outcome,
            Err(timeout) => return Ok(Err(timeout)),
        };
        crate::secrets::redact_outcome(&mut outcome, &secrets);
        Ok(claimed_rows(outcome).map_err(|(kind, message)| {
            payloads::error_body(&kind, format!("claim of cursor loop {step:?}: {message}"))
        }))
    }

    /// What the claim's templates read: `ctx`, the results of the steps
    /// they name, the step's args, and the keychain when they read it or
    /// the cursor has `auth`. `Err` inside: a credential cannot be used
    /// (`(kind, message)`); outside: retry the command.
    async fn read(
        &self,
        cursor: &LoopCursor,
        task: &Task,
    ) -> Result<Result<Read, (&'static str, String)>, HandlerError> {
        let mesh = &self.exec.mesh;
        let eid = self.cmd.execution_id.as_str();
        let task_json = serde_json::to_value(task).unwrap_or_default();
        let roots = scope::roots(scope::strings(&task_json));
        let names: Vec<&str> = roots
            .iter()
            .map(String::as_str)
            .filter(|r| self.plan.step(r).is_some())
            .collect();
        let loaded = scope::load(mesh, eid, &roots, &names).await?;
        let args = noetl_mesh::codec::args(&self.cmd.args_json).map_err(|e| {
            HandlerError::Refused(format!("claim command of execution {eid}: args: {e}"))
        })?;
        let args = scope::hydrate_args(mesh, &args).await?;
        let mut sc = Scope::new()
            .workload(self.plan.workload.clone())
            .ctx(loaded.ctx.clone())
            .args(args.clone())
            .execution_id(eid.to_string())
            .var(FRAME_MAX_ROWS, Value::from(self.claim.max_rows))
            .var(FRAME_CLAIM, Value::from(claim_identity(self.claim)))
            .task(task.name.clone())
            .attempt(1);
        sc = sc.declare_all(self.plan.step_name_set());
        for (name, result) in loaded.steps {
            sc = sc.step_result(name, result);
        }
        if !self.plan.parent_iter.is_null() {
            sc = sc.iter(json!({"parent": self.plan.parent_iter}));
        }
        let mut credentials = crate::secrets::Resolved::default();
        if cursor.auth.is_some() || roots.contains("keychain") {
            match crate::secrets::resolve(mesh, self.plan).await {
                Ok(r) => {
                    if roots.contains("keychain") {
                        sc = sc.keychain(Value::Object(r.scope.clone()));
                    }
                    credentials = r;
                }
                Err(e) if e.kind().is_retryable() => return Err(HandlerError::Mesh(e.into())),
                Err(e) => return Ok(Err(("keychain", e.to_string()))),
            }
        }
        Ok(Ok(Read {
            scope: sc,
            ctx: loaded.ctx,
            args,
            credentials,
        }))
    }

    /// The claim's tool call, its config rendered.
    fn tool_call(
        &self,
        task: &Task,
        config: Map<String, Value>,
        auth: Option<AuthCredential>,
        read: Read,
    ) -> ToolCall {
        let no_defaults = Value::Object(Map::new());
        ToolCall {
            execution_id: self.cmd.execution_id.clone(),
            step: self.step.step.clone(),
            task: task.name.clone(),
            kind: task.kind.clone(),
            spec: noetl_core::merge::effective_task_spec(
                &no_defaults,
                &self.plan.playbook,
                self.step,
                task,
            ),
            config,
            args: read.args,
            prev: Value::Null,
            iter: None,
            ctx: read.ctx,
            workload: self.plan.workload.clone(),
            attempt: 1,
            auth,
            nested_auth: Default::default(),
            objects: Some(self.exec.objects.clone()),
        }
    }

    /// Call the claim's tool, within the step-run's deadline if it has
    /// one; `Err` is the timeout error when the deadline cut it short.
    async fn call(&self, tool: &Arc<dyn Tool>, call: ToolCall) -> Result<Outcome, Value> {
        let at = match self.cmd.deadline_ms {
            0 => return Ok(call_tool(tool, call).await.outcome),
            at => at,
        };
        let left = std::time::Duration::from_millis(at.saturating_sub(now_ms()));
        match call_tool_within(tool, call, left).await {
            Some(r) => Ok(r.outcome),
            None => {
                let d = noetl_core::lifecycle::Deadline {
                    at_ms: at,
                    what: self.cmd.deadline_of.clone(),
                };
                let e = noetl_core::lifecycle::timeout_error(&d, &self.step.step, Some("claim"));
                Err(e.to_value())
            }
        }
    }
}

/// What a claim's templates read ([`ClaimRun::read`]).
struct Read {
    /// Their scope.
    scope: Scope,
    /// `ctx`, for the tool call.
    ctx: Value,
    /// The step's args, hydrated.
    args: Value,
    /// Credentials, for `auth` (empty unless read).
    credentials: crate::secrets::Resolved,
}

/// The claim as a task of its step: the cursor's `claim` statement as the
/// `command` of its kind, with its `auth`.
fn claim_task(cursor: &LoopCursor) -> Task {
    let mut config = Map::new();
    config.insert("command".into(), Value::String(cursor.claim.clone()));
    if let Some(auth) = &cursor.auth {
        config.insert("auth".into(), auth.clone());
    }
    Task {
        name: "claim".into(),
        kind: cursor.kind.clone(),
        spec: Default::default(),
        config,
    }
}

/// The rows of a claim's outcome: its result's `rows` list; an error
/// outcome, or a result without a `rows` list, is the claim's error
/// (`(kind, message)`).
pub fn claimed_rows(outcome: Outcome) -> Result<Vec<Value>, (String, String)> {
    if let Some(e) = outcome.error {
        return Err((e.kind, e.message));
    }
    match outcome.result {
        Value::Object(mut m) => match m.remove("rows") {
            Some(Value::Array(rows)) => Ok(rows),
            _ => Err((
                "loop.cursor".into(),
                "the claim returned no `rows` list: it must be one statement that returns the claimed rows (`... RETURNING ...`)".into(),
            )),
        },
        other => Err((
            "loop.cursor".into(),
            format!(
                "the claim returned {}, not rows",
                noetl_mesh::codec::json_type(&other)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_s_identity_is_the_same_when_it_runs_again_and_another_for_another() {
        let claim = |seq| ClaimRef {
            loop_run_id: "lr1".into(),
            seq,
            ..Default::default()
        };
        assert_eq!(claim_identity(&claim(3)), claim_identity(&claim(3)));
        assert_ne!(claim_identity(&claim(3)), claim_identity(&claim(4)));
        let other_run = ClaimRef {
            loop_run_id: "lr2".into(),
            ..claim(3)
        };
        assert_ne!(claim_identity(&claim(3)), claim_identity(&other_run));
        // A stopped run's claim sent again by the run that continues it.
        let carried = ClaimRef {
            loop_run_id: "lr2".into(),
            identity: claim_identity(&claim(3)),
            ..claim(3)
        };
        assert_eq!(claim_identity(&carried), claim_identity(&claim(3)));
    }

    #[test]
    fn a_claim_s_rows_are_its_result_s_rows() {
        let ok = Outcome::ok(json!({"rows": [{"id": 1}, {"id": 2}], "row_count": 2}));
        assert_eq!(
            claimed_rows(ok),
            Ok(vec![json!({"id": 1}), json!({"id": 2})])
        );
        let none = Outcome::ok(json!({"rows": [], "row_count": 0}));
        assert_eq!(claimed_rows(none), Ok(vec![]));
    }

    #[test]
    fn a_failed_claim_or_one_without_rows_is_an_error() {
        let e = claimed_rows(Outcome::error("postgres.sql", "boom", false)).unwrap_err();
        assert_eq!(e, ("postgres.sql".into(), "boom".into()));
        let e =
            claimed_rows(Outcome::ok(json!({"row_count": 3, "command": "UPDATE"}))).unwrap_err();
        assert_eq!(e.0, "loop.cursor");
        assert!(e.1.contains("RETURNING"), "{}", e.1);
        let e = claimed_rows(Outcome::ok(json!(3))).unwrap_err();
        assert!(e.1.contains("not rows"), "{}", e.1);
    }
}
