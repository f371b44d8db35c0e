//! noetl-tool-python: the `python` tool kind.
//!
//! A task's `code` runs in a warm interpreter from a [`runner::Pool`]
//! ([`PythonConfig::warm`] of them started with the tool; no start-up per
//! task; an interpreter is killed and replaced on timeout and recycled
//! after [`runner::PoolLimits::max_uses`] tasks; a source that runs fast
//! goes to a few lanes, [`runner::Pool::submit`]) with fresh globals
//! `args` (the task's rendered `args:`, `{}` by default, and each
//! identifier key of it as a global of its own), `_prev`, `iter`, `ctx`
//! and `workload`. The result is the global `result` if the code sets it,
//! else what `main()` returns (called with `args` when it takes a
//! parameter), else `None`.
//!
//! Outcomes: `ok` with `outcome.py.{stdout, stderr}` (bounded); errors of kind
//! `python.exception` (with `outcome.py.exception_type` and
//! `outcome.py.traceback`), `python.result` (result not JSON-serialisable),
//! `timeout` (retryable; the process is killed), `python.unavailable`,
//! `python.exited` (the process died without answering), `python.config`.

pub mod config;
pub mod playbook;
pub mod runner;
pub mod syntax;

/// The sealing of the interpreters (shared with the `shell` tool).
pub use noetl_sandbox as env;

use std::time::Duration;

use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::{json, Map, Value};

pub use config::{PythonConfig, PythonTask};
use runner::{Pool, PoolLimits, PoolParams, Request, RunError, RunOutput, OUTPUT_LIMIT};

/// The `python` tool.
#[derive(Debug, Clone)]
pub struct PythonTool {
    config: PythonConfig,
    process: Pool,
}

impl Default for PythonTool {
    fn default() -> Self {
        Self::new()
    }
}

impl PythonTool {
    /// The tool configured from the environment (`NOETL_PYTHON`,
    /// `NOETL_PYTHON_WARM`, `NOETL_PYTHON_ENV`, `NOETL_PYTHON_LANES`).
    pub fn new() -> Self {
        Self::with_config(PythonConfig::from_env())
    }

    /// The tool with explicit settings. Inside a tokio runtime,
    /// `config.warm` interpreters are started right away (outside one, the
    /// pool starts them as tasks need them). Interpreters start from an
    /// empty environment plus [`env::ALLOWED`] and `config.pass_env`, read
    /// from this process's environment now; a listed name that is never
    /// passed ([`env::NEVER_PREFIXES`]) is logged as a warning. This
    /// process is made non-dumpable ([`env::seal_process`]) so that they
    /// cannot read its environment or memory through `/proc` either.
    pub fn with_config(config: PythonConfig) -> Self {
        if !env::seal_process() {
            tracing::warn!("python tool: cannot make this process non-dumpable; python tasks of the same user may read its environment through /proc");
        }
        let sealed = env::child_env(std::env::vars_os(), &config.pass_env);
        for name in &sealed.refused {
            tracing::warn!(
                name = %name,
                "NOETL_PYTHON_ENV lists a variable that is never passed to python tasks (secret key, NATS or object-store credentials)"
            );
        }
        let process = Pool::new(PoolParams {
            interpreter: config.interpreter.clone(),
            env: sealed.vars,
            limits: PoolLimits {
                lanes: config.lanes,
                ..PoolLimits::default()
            },
        });
        if config.warm > 0 && tokio::runtime::Handle::try_current().is_ok() {
            process.prewarm(config.warm);
        }
        Self { config, process }
    }

    /// Interpreters idle in the warm pool right now.
    pub fn idle_interpreters(&self) -> usize {
        self.process.idle()
    }

    /// Process ids of the interpreters idle in the warm pool right now.
    pub fn idle_interpreter_pids(&self) -> Vec<u32> {
        self.process.idle_pids()
    }

    /// Interpreters this tool has started so far.
    pub fn spawned_interpreters(&self) -> u64 {
        self.process.spawned()
    }

    /// Replica-wide settings.
    pub fn config(&self) -> &PythonConfig {
        &self.config
    }
}

impl Tool for PythonTool {
    fn kind(&self) -> &'static str {
        "python"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        let process = self.process.clone();
        let default_timeout = self.config.default_timeout;
        Box::pin(async move { ToolReturn::from(run(&process, call, default_timeout).await) })
    }
}

async fn run(process: &Pool, call: ToolCall, default_timeout: Duration) -> Outcome {
    let task = match PythonTask::from_config(&call.config) {
        Ok(t) => t,
        Err(e) => return Outcome::error("python.config", e.to_string(), false),
    };
    let timeout = match config::timeout_of(&call.spec, default_timeout) {
        Ok(t) => t,
        Err(e) => return Outcome::error("python.config", e.to_string(), false),
    };
    let args = match task.args {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v) => v,
    };
    let libs = match task.libs.as_ref().map(config::imports).transpose() {
        Ok(l) => l.unwrap_or_default(),
        Err(e) => return Outcome::error("python.config", e.to_string(), false),
    };
    let iter = call.iter.unwrap_or(Value::Null);
    let line = Request {
        code: &task.code,
        args: &args,
        libs: &libs,
        prev: &call.prev,
        iter: &iter,
        ctx: &call.ctx,
        workload: &call.workload,
    }
    .to_line();
    match process.submit(&task.code, line, timeout).await {
        Ok(out) => outcome_of(out),
        Err(e) => {
            let (kind, retryable, py) = match &e {
                RunError::Timeout(t) => ("timeout", true, json!({"timeout_s": t.as_secs_f64()})),
                RunError::Unavailable { .. } => ("python.unavailable", false, json!({})),
                RunError::Exited { stderr, status } => (
                    "python.exited",
                    false,
                    json!({"stderr": stderr, "exit_status": status}),
                ),
                RunError::Io(_) => ("python.io", true, json!({})),
            };
            Outcome::error(kind, e.to_string(), retryable).with_helper("py", py)
        }
    }
}

fn outcome_of(out: RunOutput) -> Outcome {
    let RunOutput {
        response: r,
        process_stderr,
        ..
    } = out;
    let stderr = match (r.stderr.is_empty(), process_stderr.is_empty()) {
        (_, true) => r.stderr,
        (true, false) => process_stderr,
        (false, false) => runner::truncate(&format!("{}{process_stderr}", r.stderr), OUTPUT_LIMIT),
    };
    let mut py = Map::new();
    py.insert("stdout".into(), Value::String(r.stdout));
    py.insert("stderr".into(), Value::String(stderr));
    if r.ok {
        return Outcome::ok(r.result).with_helper("py", Value::Object(py));
    }
    if let Some(t) = &r.exception_type {
        py.insert("exception_type".into(), Value::String(t.clone()));
    }
    if let Some(tb) = r.traceback {
        py.insert("traceback".into(), Value::String(tb));
    }
    let kind = r.kind.unwrap_or_else(|| "python.exception".into());
    let message = r.message.unwrap_or_else(|| kind.clone());
    let mut outcome = Outcome::error(kind, message, false);
    // The traceback's last lines travel with the error itself, so that
    // `task.done`, `noetl run` and `noetl exec show` can show where it
    // failed (the whole traceback stays in `outcome.py.traceback`).
    if let (Some(e), Some(tb)) = (
        outcome.error.as_mut(),
        py.get("traceback").and_then(Value::as_str),
    ) {
        e.extra
            .insert("traceback".into(), Value::String(traceback_tail(tb)));
    }
    outcome.with_helper("py", Value::Object(py))
}

/// Lines of a traceback kept with its error.
pub const TRACEBACK_TAIL_LINES: usize = 6;

/// The last [`TRACEBACK_TAIL_LINES`] lines of a traceback: the innermost
/// frames and the exception, after a `...[truncated]` line when lines were
/// dropped (the executor's redaction then masks the end of a multi-line
/// secret, a PEM key, that the cut left first).
pub fn traceback_tail(tb: &str) -> String {
    let lines: Vec<&str> = tb.trim_end().lines().collect();
    let from = lines.len().saturating_sub(TRACEBACK_TAIL_LINES);
    let tail = lines[from..].join("\n");
    if from == 0 {
        return tail;
    }
    format!("{TRACEBACK_CUT}\n{tail}")
}

/// The line before a traceback tail that dropped lines: the note of a cut
/// that the executor's redaction looks for.
const TRACEBACK_CUT: &str = "...[truncated]";

#[cfg(test)]
mod tail_tests {
    use super::*;

    #[test]
    fn a_traceback_keeps_its_last_lines() {
        let tb = "Traceback (most recent call last):\n  a\n  b\n  c\n  d\n  e\n  f\nNameError: name 'totl' is not defined\n";
        let tail = traceback_tail(tb);
        assert_eq!(tail.lines().count(), TRACEBACK_TAIL_LINES + 1);
        assert!(tail.starts_with("...[truncated]\n  b\n"), "{tail}");
        assert!(tail.ends_with("NameError: name 'totl' is not defined"));
        assert_eq!(traceback_tail("ValueError: x"), "ValueError: x");
    }
}
