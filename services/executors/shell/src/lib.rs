//! noetl-tool-shell: the `shell` tool kind (docs/tools.md, "`shell`").
//!
//! A task runs `command` (a script run by `/bin/sh -c`, or a list: the
//! program and its arguments, run without a shell) or `cmds` (scripts run
//! one after another until one fails, NoETL's form). Each process starts
//! sealed as a python interpreter does ([`noetl_sandbox`]): from an empty
//! environment plus the allow-list, the names in `NOETL_SHELL_ENV` and the
//! task's own `env`, never the secret key, NATS or object-store
//! credentials; in a process group of its own, killed whole on timeout and
//! when the command ends; and with `SIGKILL` on the executor's death.
//!
//! `outcome.result = {returncode, stdout, stderr}` (each stream bounded by
//! [`OUTPUT_LIMIT`]), also on error; `outcome.shell = {returncode,
//! command}`. Errors: `shell.exit` (a non-zero status, unless `check:
//! false`), `timeout` (retryable; the process group is killed),
//! `shell.spawn` (the program cannot start), `shell.config`.

pub mod config;

use std::ffi::OsString;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt};

pub use config::{ConfigError, Program, ShellTask, DEFAULT_TIMEOUT};

/// Bytes of each of stdout and stderr kept in an outcome; the rest is read
/// and dropped, and the kept text ends with a note of how much was.
pub const OUTPUT_LIMIT: usize = 1024 * 1024;

/// The `shell` tool.
#[derive(Debug, Clone)]
pub struct ShellTool {
    /// The environment every process starts with (before the task's `env`).
    env: Arc<Vec<(OsString, OsString)>>,
    default_timeout: Duration,
}

impl Default for ShellTool {
    fn default() -> Self {
        Self::new()
    }
}

impl ShellTool {
    /// The tool configured from the environment: processes get the
    /// allow-list ([`noetl_sandbox::ALLOWED`]) and the names listed in
    /// `NOETL_SHELL_ENV`; a listed name that is never passed is logged as
    /// a warning. This process is made non-dumpable
    /// ([`noetl_sandbox::seal_process`]) so that they cannot read its
    /// environment or memory through `/proc` either.
    pub fn new() -> Self {
        let extra = std::env::var_os("NOETL_SHELL_ENV")
            .map(|v| noetl_sandbox::parse_list(&v))
            .unwrap_or_default();
        Self::with_env(std::env::vars_os(), &extra)
    }

    /// The tool passing, from `parent`, the allow-list and `extra` (names,
    /// or prefixes ending in `*`).
    pub fn with_env<I>(parent: I, extra: &[String]) -> Self
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        if !noetl_sandbox::seal_process() {
            tracing::warn!("shell tool: cannot make this process non-dumpable; shell tasks of the same user may read its environment through /proc");
        }
        let sealed = noetl_sandbox::child_env(parent, extra);
        for name in &sealed.refused {
            tracing::warn!(
                name = %name,
                "NOETL_SHELL_ENV lists a variable that is never passed to shell tasks (secret key, NATS or object-store credentials)"
            );
        }
        Self {
            env: Arc::new(sealed.vars),
            default_timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Tool for ShellTool {
    fn kind(&self) -> &'static str {
        "shell"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        let tool = self.clone();
        Box::pin(async move { ToolReturn::from(tool.run(call).await) })
    }
}

/// What one process left.
struct Ran {
    /// Exit status; `-N` when killed by signal N; `None` on timeout.
    returncode: Option<i32>,
    stdout: Captured,
    stderr: Captured,
}

/// One stream, bounded.
#[derive(Default)]
struct Captured {
    kept: Vec<u8>,
    dropped: usize,
}

impl Captured {
    fn text(&self) -> String {
        let mut s = String::from_utf8_lossy(&self.kept).into_owned();
        if self.dropped > 0 {
            s.push_str(&format!("\n...[truncated {} bytes]", self.dropped));
        }
        s
    }
}

/// Why a process did not run.
#[derive(Debug, thiserror::Error)]
enum SpawnError {
    #[error("cannot start {program:?}: {source}")]
    Start {
        program: String,
        source: std::io::Error,
    },
    #[error("waiting for {program:?} failed: {source}")]
    Wait {
        program: String,
        source: std::io::Error,
    },
}

impl ShellTool {
    async fn run(&self, call: ToolCall) -> Outcome {
        let task = match ShellTask::from_config(&call.config) {
            Ok(t) => t,
            Err(e) => return Outcome::error("shell.config", e.to_string(), false),
        };
        let timeout = match config::timeout_of(&call.spec, self.default_timeout) {
            Ok(t) => t,
            Err(e) => return Outcome::error("shell.config", e.to_string(), false),
        };
        if let Some(cwd) = task.cwd.as_ref().filter(|d| !d.is_dir()) {
            let e = format!("`cwd` {} is not a directory", cwd.display());
            return Outcome::error("shell.config", e, false);
        }
        let started = Instant::now();
        let (mut stdout, mut stderr) = (String::new(), String::new());
        let mut last = (0, String::new());
        for program in &task.programs {
            let left = timeout.saturating_sub(started.elapsed());
            let ran = match self.spawn(&task, program, left).await {
                Ok(r) => r,
                Err(e) => return Outcome::error("shell.spawn", e.to_string(), false),
            };
            stdout.push_str(&ran.stdout.text());
            stderr.push_str(&ran.stderr.text());
            let result =
                |code: Option<i32>| json!({"returncode": code, "stdout": stdout, "stderr": stderr});
            let helper = |code: Option<i32>| json!({"returncode": code, "command": program.label});
            let Some(code) = ran.returncode else {
                let message = format!(
                    "shell command {:?} ran past its timeout of {}s; its process group was killed",
                    program.label,
                    timeout.as_secs_f64()
                );
                let mut o = Outcome::error(noetl_core::lifecycle::TIMEOUT, message, true)
                    .with_helper("shell", helper(None));
                o.result = result(None);
                return o;
            };
            last = (code, program.label.clone());
            if code != 0 && task.check {
                let how = match code {
                    c if c < 0 => format!("was killed by signal {}", -c),
                    c => format!("exited with status {c}"),
                };
                let mut o = Outcome::error(
                    "shell.exit",
                    format!("shell command {:?} {how}", program.label),
                    false,
                )
                .with_helper("shell", helper(Some(code)));
                o.result = result(Some(code));
                return o;
            }
            if code != 0 {
                break; // `check: false`: stop at the first failure, as NoETL does
            }
        }
        Outcome::ok(json!({"returncode": last.0, "stdout": stdout, "stderr": stderr}))
            .with_helper("shell", json!({"returncode": last.0, "command": last.1}))
    }

    /// Run one process to its end or `timeout`, capturing its output.
    async fn spawn(
        &self,
        task: &ShellTask,
        program: &Program,
        timeout: Duration,
    ) -> Result<Ran, SpawnError> {
        let mut cmd = tokio::process::Command::new(&program.program);
        cmd.args(&program.args)
            // Sealed: the executor's environment holds the credentials'
            // secret key and the NATS and object-store credentials.
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(task.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(cwd) = &task.cwd {
            cmd.current_dir(cwd);
        }
        // SAFETY: `die_with_parent` makes only async-signal-safe calls, as
        // a pre_exec hook must. The process is spawned from a runtime
        // worker thread, which lives as long as the executor: its death
        // (PR_SET_PDEATHSIG follows the thread) is the executor's.
        let parent = std::process::id();
        unsafe {
            cmd.pre_exec(move || noetl_sandbox::die_with_parent(parent));
        }
        let mut child = cmd.spawn().map_err(|source| SpawnError::Start {
            program: program.program.clone(),
            source,
        })?;
        // Killed whole if this future is dropped (the step-run's deadline).
        let group = Group(child.id());
        let out = child.stdout.take().expect("stdout is piped");
        let err = child.stderr.take().expect("stderr is piped");
        let waited = async {
            let status = tokio::time::timeout(timeout, child.wait()).await;
            // What the command left running in its group would hold the
            // pipes open: it ends with the command (and on timeout, the
            // command with it).
            group.kill();
            match status {
                Ok(s) => s.map(Some),
                Err(_) => child.wait().await.map(|_| None),
            }
        };
        let (status, stdout, stderr) = tokio::join!(waited, capture(out), capture(err));
        let status = status.map_err(|source| SpawnError::Wait {
            program: program.program.clone(),
            source,
        })?;
        Ok(Ran {
            returncode: status.map(returncode),
            stdout,
            stderr,
        })
    }
}

/// The process group of a running command, killed when dropped.
struct Group(Option<u32>);

impl Group {
    fn kill(&self) {
        if let Some(pgid) = self.0 {
            noetl_sandbox::kill_group(pgid);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The exit status, or `-N` for a process killed by signal N.
fn returncode(status: std::process::ExitStatus) -> i32 {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return -signal;
        }
    }
    status.code().unwrap_or(-1)
}

/// Read a stream to its end, keeping the first [`OUTPUT_LIMIT`] bytes.
async fn capture(mut r: impl AsyncRead + Unpin) -> Captured {
    let mut c = Captured::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return c,
            Ok(n) => {
                let room = OUTPUT_LIMIT.saturating_sub(c.kept.len()).min(n);
                c.kept.extend_from_slice(&buf[..room]);
                c.dropped += n - room;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_text_notes_what_was_dropped() {
        let c = Captured {
            kept: b"abc".to_vec(),
            dropped: 5,
        };
        assert_eq!(c.text(), "abc\n...[truncated 5 bytes]");
        let c = Captured {
            kept: vec![0xff, b'a'],
            dropped: 0,
        };
        assert_eq!(c.text(), "\u{fffd}a");
    }
}
