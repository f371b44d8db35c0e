//! The wire between the tool and a Python interpreter: the embedded runner
//! script, the request / response lines, and [`Process`], which runs one
//! request in a fresh interpreter. A warm pool can replace [`Process`] with
//! interpreters that stay up: the runner already serves one request per
//! stdin line, so the protocol does not change.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// The runner script, passed to the interpreter with `-c`.
pub const RUNNER: &str = include_str!("runner.py");

/// Prefix of a protocol line on the runner's stdout.
pub const MARK: &str = "\x1eNOETL-RESULT ";

/// Bytes of user output (stdout, stderr, traceback) kept in an outcome.
pub const OUTPUT_LIMIT: usize = 4096;

/// One request to the runner.
#[derive(Debug, Serialize)]
pub struct Request<'a> {
    /// Python source.
    pub code: &'a str,
    /// The task's `args`.
    pub args: &'a Value,
    /// `_prev`.
    #[serde(rename = "_prev")]
    pub prev: &'a Value,
    /// `iter` (null outside loops).
    pub iter: &'a Value,
    /// `ctx`.
    pub ctx: &'a Value,
    /// `workload`.
    pub workload: &'a Value,
}

impl Request<'_> {
    /// The request as one JSON line.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("JSON values always serialise");
        line.push(b'\n');
        line
    }
}

/// The runner's answer to one request.
#[derive(Debug, Clone, Deserialize)]
pub struct Response {
    /// True when the code ran and its result serialised.
    pub ok: bool,
    /// The result (null on error).
    #[serde(default)]
    pub result: Value,
    /// Error kind: `python.exception`, `python.result`, `python.protocol`.
    #[serde(default)]
    pub kind: Option<String>,
    /// Exception type name.
    #[serde(default, rename = "type")]
    pub exception_type: Option<String>,
    /// `"<Type>: <message>"`.
    #[serde(default)]
    pub message: Option<String>,
    /// Traceback of the task's own frames (bounded).
    #[serde(default)]
    pub traceback: Option<String>,
    /// What the task printed to `sys.stdout` (bounded).
    #[serde(default)]
    pub stdout: String,
    /// What the task printed to `sys.stderr` (bounded).
    #[serde(default)]
    pub stderr: String,
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// The runner's response.
    pub response: Response,
    /// Output written straight to the process's file descriptors 1 and 2
    /// (C extensions, subprocesses), bounded.
    pub process_stderr: String,
}

/// Why a run produced no response.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The interpreter could not be started.
    #[error("python interpreter `{program}` is not available ({source}); install python3 or set NOETL_PYTHON to an interpreter")]
    Unavailable {
        /// The program tried.
        program: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The run exceeded its timeout; the process was killed.
    #[error("python task exceeded its timeout of {}s and was killed", .0.as_secs_f64())]
    Timeout(Duration),
    /// The process ended without a response (crash, `os._exit`, OOM kill...).
    #[error("python process ended without a result ({status})")]
    Exited {
        /// Exit status as text.
        status: String,
        /// What it wrote to stderr, bounded.
        stderr: String,
    },
    /// Talking to the process failed.
    #[error("python process I/O failed: {0}")]
    Io(#[source] std::io::Error),
}

/// Runs each request in a fresh interpreter process.
#[derive(Debug, Clone)]
pub struct Process {
    interpreter: PathBuf,
}

impl Process {
    /// Runs `interpreter -c RUNNER`.
    pub fn new(interpreter: impl Into<PathBuf>) -> Self {
        Self {
            interpreter: interpreter.into(),
        }
    }

    /// Run one request line; the process is killed when `timeout` passes.
    pub async fn run(&self, line: Vec<u8>, timeout: Duration) -> Result<RunOutput, RunError> {
        let mut child = tokio::process::Command::new(&self.interpreter)
            .arg("-c")
            .arg(RUNNER)
            .env("PYTHONIOENCODING", "utf-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                    RunError::Unavailable {
                        program: self.interpreter.display().to_string(),
                        source,
                    }
                }
                _ => RunError::Io(source),
            })?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // Write concurrently with reading so a large request cannot deadlock.
        let writer = tokio::spawn(async move {
            let r = stdin.write_all(&line).await;
            drop(stdin); // EOF: the runner exits after this request
            r
        });
        let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(out) => out.map_err(RunError::Io)?,
            Err(_) => {
                writer.abort();
                // Dropping the wait future dropped the child: kill_on_drop.
                return Err(RunError::Timeout(timeout));
            }
        };
        if let Ok(Err(e)) = writer.await {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(RunError::Io(e));
            }
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let process_stderr = truncate(&String::from_utf8_lossy(&output.stderr), OUTPUT_LIMIT);
        let response = stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(MARK))
            .and_then(|l| serde_json::from_str::<Response>(l).ok());
        match response {
            Some(response) => Ok(RunOutput {
                response,
                process_stderr,
            }),
            None => Err(RunError::Exited {
                status: output.status.to_string(),
                stderr: process_stderr,
            }),
        }
    }
}

/// `s` cut to at most `limit` bytes on a character boundary, with a marker
/// saying how much was dropped.
pub fn truncate(s: &str, limit: usize) -> String {
    if s.len() <= limit {
        return s.to_string();
    }
    let mut end = limit;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n...[truncated {} bytes]", &s[..end], s.len() - end)
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncation_keeps_char_boundaries() {
        assert_eq!(truncate("abc", 10), "abc");
        let t = truncate("ééé", 3);
        assert!(t.starts_with('é') && t.contains("truncated 4 bytes"), "{t}");
    }
}
