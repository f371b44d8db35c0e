//! The wire between the tool and a Python interpreter: the embedded runner
//! script, the request / response lines, and [`Pool`], which keeps warm
//! interpreters that each serve one request per stdin line (started ahead
//! of the first task with [`Pool::prewarm`]).

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

mod lane;

pub use lane::{FAST, LINE_WAIT};

/// The runner script, passed to the interpreter with `-c`: the compile
/// rule it shares with the syntax check ([`crate::syntax`]), then the loop.
pub const RUNNER: &str = concat!(include_str!("compile.py"), include_str!("runner.py"));

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
    /// Modules bound in the task's globals before it runs (`libs`).
    pub libs: &'a [crate::config::Import],
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
    /// Error kind: `python.exception`, `python.libs`, `python.result`,
    /// `python.protocol`.
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
    /// Microseconds the task took inside the interpreter.
    #[serde(default)]
    pub took_us: Option<u64>,
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// The runner's response.
    pub response: Response,
    /// Output written straight to the process's file descriptors 1 and 2
    /// (C extensions, subprocesses), bounded.
    pub process_stderr: String,
    /// How long the task ran: as the interpreter measured it, else from
    /// its request's start to its answer. [`Pool::submit`] judges a source
    /// fast by it.
    pub took: Duration,
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

/// How many idle interpreters a pool keeps, and how often one is reused.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    /// Idle interpreters kept warm (more run at once when tasks need them).
    pub max_idle: usize,
    /// Tasks one interpreter serves before it is replaced, bounding what a
    /// task's changes to interpreter-wide state (imports, `sys.path`...)
    /// can leak into later tasks.
    pub max_uses: u32,
    /// Interpreters that serve fast code at once, each given its next
    /// request while it runs one ([`Pool::submit`]).
    pub lanes: usize,
    /// The longest a fast task waits in line for a lane before it takes an
    /// interpreter of its own ([`LINE_WAIT`]).
    pub line_wait: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            // As many as an executor runs tasks at once by default
            // (`--concurrency` 16): fewer would kill and restart
            // interpreters (tens of ms each) under a steady load.
            max_idle: 16,
            // An interpreter takes 20-50 ms of CPU to start: replaced
            // every 200 tasks, the restarts halved a python loop's rate,
            // and a lane serves 1,000 tasks in a tenth of a second
            // (docs/performance.md "The python loop's interpreters",
            // "The python loop's lanes").
            max_uses: 10_000,
            // One per core: more would only take turns on them, each
            // coming back to a cold cache.
            lanes: crate::config::default_lanes(),
            line_wait: LINE_WAIT,
        }
    }
}

/// What a [`Pool`] runs.
#[derive(Debug, Clone)]
pub struct PoolParams {
    /// The interpreter.
    pub interpreter: PathBuf,
    /// The interpreters' whole environment (from [`crate::env::child_env`]).
    pub env: Vec<(OsString, OsString)>,
    /// Idle and reuse limits.
    pub limits: PoolLimits,
}

/// A pool of warm interpreters running the runner script. Each task gets
/// fresh globals in an interpreter that is already up, so it does not pay
/// interpreter start-up; an interpreter whose task times out is killed and
/// not reused.
#[derive(Debug, Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    interpreter: PathBuf,
    /// The whole environment of every interpreter (see [`crate::env`]).
    env: Vec<(OsString, OsString)>,
    limits: PoolLimits,
    idle: Mutex<Vec<Worker>>,
    /// Interpreters started so far (a statistic).
    spawned: AtomicU64,
    /// Fast tasks in line for a lane.
    line: Mutex<lane::Line>,
    /// Whether each source (by hash) ran fast the last time it ran.
    speed: Mutex<HashMap<u64, bool>>,
}

/// One running interpreter.
#[derive(Debug)]
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// What the process writes to fd 2, bounded; cleared per task.
    stderr: Arc<Mutex<Captured>>,
    /// Woken each time an end mark is read from fd 2.
    ended: Arc<tokio::sync::Notify>,
    uses: u32,
}

/// The end mark `runner.py` writes to fd 2 before each response.
const END: &[u8] = b"\x1eNOETL-END\n";

/// How long a response waits for the task's last fd 2 output (normally a
/// few microseconds behind it; bounded in case the task closed fd 2).
const STDERR_SETTLE: Duration = Duration::from_secs(1);

/// fd 2 of one interpreter as read so far, cut into one segment per
/// response at the end marks (a lane has several requests in one
/// interpreter, so a task's output is what came after the previous mark).
#[derive(Debug, Default)]
struct Captured {
    /// Output of the tasks whose end mark was read, oldest first, each
    /// bounded.
    done: VecDeque<Vec<u8>>,
    /// Output after the last end mark, bounded.
    current: Vec<u8>,
    /// Bytes that may be the start of an end mark split across reads.
    pending: Vec<u8>,
}

impl Captured {
    /// Take in one read's bytes, keeping at most `room_for` bytes of each
    /// task's output. Returns whether an end mark was read.
    fn take_in(&mut self, chunk: &[u8], room_for: usize) -> bool {
        let mut data = std::mem::take(&mut self.pending);
        data.extend_from_slice(chunk);
        let mut marked = false;
        let mut from = 0;
        while let Some(at) = find(&data[from..], END) {
            keep(&mut self.current, &data[from..from + at], room_for);
            self.done.push_back(std::mem::take(&mut self.current));
            from += at + END.len();
            marked = true;
        }
        // Hold back a tail that could begin a mark completed by the next read.
        let rest = &data[from..];
        let hold = (1..END.len().min(rest.len() + 1))
            .rev()
            .find(|&n| rest.ends_with(&END[..n]))
            .unwrap_or(0);
        keep(&mut self.current, &rest[..rest.len() - hold], room_for);
        self.pending = rest[rest.len() - hold..].to_vec();
        marked
    }

    /// Forget everything read so far (an interpreter starting a task of its
    /// own: nothing of an earlier one is pending).
    fn reset(&mut self) {
        self.done.clear();
        self.current.clear();
        self.pending.clear();
    }

    /// The oldest finished task's output, if its end mark was read.
    fn take_done(&mut self) -> Option<String> {
        self.done.pop_front().map(|b| text_of(&b))
    }

    /// Everything after the last end mark (a task that ended without one:
    /// its process died, or it closed fd 2).
    fn take_rest(&mut self) -> String {
        let mut b = std::mem::take(&mut self.current);
        b.append(&mut self.pending);
        text_of(&b)
    }
}

/// Append what fits of `bytes` to `to`, which holds at most `room_for`.
fn keep(to: &mut Vec<u8>, bytes: &[u8], room_for: usize) {
    let room = room_for.saturating_sub(to.len());
    to.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

/// Output bytes as text, bounded.
fn text_of(bytes: &[u8]) -> String {
    truncate(&String::from_utf8_lossy(bytes), OUTPUT_LIMIT)
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Pool {
    /// A pool running `interpreter -c RUNNER` with exactly the variables
    /// of `params.env` (nothing is inherited from the executor).
    pub fn new(params: PoolParams) -> Self {
        Self {
            inner: Arc::new(PoolInner {
                interpreter: params.interpreter,
                env: params.env,
                limits: params.limits,
                idle: Mutex::new(Vec::new()),
                spawned: AtomicU64::new(0),
                line: Mutex::default(),
                speed: Mutex::default(),
            }),
        }
    }

    /// Interpreters idle right now.
    pub fn idle(&self) -> usize {
        self.inner.idle.lock().expect("pool lock").len()
    }

    /// Process ids of the interpreters idle right now.
    pub fn idle_pids(&self) -> Vec<u32> {
        let idle = self.inner.idle.lock().expect("pool lock");
        idle.iter().filter_map(|w| w.child.id()).collect()
    }

    /// Interpreters started since the pool was created.
    pub fn spawned(&self) -> u64 {
        self.inner.spawned.load(Ordering::Relaxed)
    }

    /// Start interpreters until `n` are idle (at most the idle limit), so
    /// the first tasks find them warm. Must run inside a tokio runtime.
    /// Returns how many are idle; an interpreter that cannot start is left
    /// to the first task to report.
    pub fn prewarm(&self, n: usize) -> usize {
        let want = n.min(self.inner.limits.max_idle);
        while self.idle() < want {
            match self.spawn() {
                Ok(w) => self.inner.idle.lock().expect("pool lock").push(w),
                Err(e) => {
                    tracing::warn!(error = %e, "python tool: cannot pre-warm an interpreter");
                    break;
                }
            }
        }
        self.idle()
    }

    fn spawn(&self) -> Result<Worker, RunError> {
        let mut cmd = tokio::process::Command::new(&self.inner.interpreter);
        // SAFETY: `die_with_parent` makes only async-signal-safe calls, as a
        // pre_exec hook must. Interpreters are started from the runtime's
        // threads, which live as long as the executor: the kernel kills an
        // interpreter (even one busy in a task) when the executor dies.
        let parent = std::process::id();
        unsafe {
            cmd.pre_exec(move || noetl_sandbox::die_with_parent(parent));
        }
        let mut child = cmd
            .arg("-c")
            .arg(RUNNER)
            // Sealed: the executor's environment holds the credentials'
            // secret key and the NATS and object-store credentials.
            .env_clear()
            .envs(self.inner.env.iter().map(|(k, v)| (k, v)))
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
                        program: self.inner.interpreter.display().to_string(),
                        source,
                    }
                }
                _ => RunError::Io(source),
            })?;
        self.inner.spawned.fetch_add(1, Ordering::Relaxed);
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let stderr = Arc::new(Mutex::new(Captured::default()));
        let mut pipe = child.stderr.take().expect("stderr is piped");
        let sink = stderr.clone();
        let ended = Arc::new(tokio::sync::Notify::new());
        let wake = ended.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let more = sink
                    .lock()
                    .expect("stderr lock")
                    .take_in(&buf[..n], 2 * OUTPUT_LIMIT);
                if more {
                    wake.notify_waiters();
                }
            }
            // The pipe closed: nothing more will come; stop any wait.
            wake.notify_waiters();
        });
        Ok(Worker {
            child,
            stdin,
            stdout,
            stderr,
            ended,
            uses: 0,
        })
    }

    /// An idle interpreter that is still alive, or a new one.
    fn checkout(&self) -> Result<Worker, RunError> {
        loop {
            let w = self.inner.idle.lock().expect("pool lock").pop();
            match w {
                Some(mut w) => {
                    if matches!(w.child.try_wait(), Ok(None)) {
                        return Ok(w);
                    } // died while idle: drop it, try the next
                }
                None => return self.spawn(),
            }
        }
    }

    fn checkin(&self, w: Worker) {
        let w = if w.uses >= self.inner.limits.max_uses {
            // Killed; its replacement starts now, beside the tasks, rather
            // than inside the next task's time (an interpreter takes tens
            // of milliseconds to start).
            drop(w);
            if self.idle() >= self.inner.limits.max_idle {
                return;
            }
            match self.spawn() {
                Ok(fresh) => fresh,
                Err(e) => {
                    tracing::warn!(error = %e, "python tool: cannot replace a recycled interpreter");
                    return;
                }
            }
        } else {
            w
        };
        let mut idle = self.inner.idle.lock().expect("pool lock");
        if idle.len() < self.inner.limits.max_idle {
            idle.push(w);
        }
    }

    /// Run one request line in a warm interpreter of its own; on timeout
    /// the interpreter is killed (and a later task gets a new one).
    pub async fn run(&self, line: Vec<u8>, timeout: Duration) -> Result<RunOutput, RunError> {
        let mut w = self.checkout()?;
        w.stderr.lock().expect("stderr lock").reset();
        let started = tokio::time::Instant::now();
        let answer = tokio::time::timeout(timeout, async {
            send(&mut w, &line).await?;
            read_response(&mut w).await
        })
        .await;
        match answer {
            Err(_) => Err(RunError::Timeout(timeout)), // `w` dropped: killed
            Ok(Ok(Some(response))) => {
                let out = served(&mut w, response, started.elapsed()).await;
                self.checkin(w);
                Ok(out)
            }
            Ok(Ok(None)) => Err(exited(w).await),
            Ok(Err(e)) => Err(RunError::Io(e)),
        }
    }
}

/// Write one request line.
async fn send(w: &mut Worker, line: &[u8]) -> std::io::Result<()> {
    w.stdin.write_all(line).await?;
    w.stdin.flush().await
}

/// Read lines until the next answer (`None` on EOF). Lines without the
/// mark are output a C extension wrote straight to fd 1.
async fn read_response(w: &mut Worker) -> std::io::Result<Option<Response>> {
    let mut buf = String::new();
    loop {
        buf.clear();
        if w.stdout.read_line(&mut buf).await? == 0 {
            return Ok(None);
        }
        if let Some(rest) = buf.trim_end_matches(['\n', '\r']).strip_prefix(MARK) {
            return Ok(Some(serde_json::from_str(rest).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, e)
            })?));
        }
    }
}

/// Count a served request and pair its response with what the task wrote
/// to fd 2. The response can overtake that output (two pipes): wait for
/// the task's end mark, a moment at most.
async fn served(w: &mut Worker, response: Response, took: Duration) -> RunOutput {
    w.uses += 1;
    let settle = tokio::time::Instant::now() + STDERR_SETTLE;
    let process_stderr = loop {
        // Registered before the check, so a mark read in between still
        // wakes it.
        let notified = w.ended.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let done = w.stderr.lock().expect("stderr lock").take_done();
        if let Some(text) = done {
            break text;
        }
        if tokio::time::timeout_at(settle, notified).await.is_err() {
            // No mark (the task closed fd 2): what came is its output.
            break w.stderr.lock().expect("stderr lock").take_rest();
        }
    };
    RunOutput {
        took: response.took_us.map_or(took, Duration::from_micros),
        response,
        process_stderr,
    }
}

/// The error of an interpreter that closed its stdout without an answer:
/// it died. Its stderr reader gets a moment to collect the last words.
async fn exited(mut w: Worker) -> RunError {
    let status = match tokio::time::timeout(Duration::from_secs(2), w.child.wait()).await {
        Ok(Ok(s)) => s.to_string(),
        _ => "unknown status".to_string(),
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let stderr = w.stderr.lock().expect("stderr lock").take_rest();
    RunError::Exited { status, stderr }
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
    use super::{truncate, Captured, END};

    #[test]
    fn fd2_output_is_cut_per_task_at_end_marks_split_across_reads() {
        let mut stream = b"raw fd write\n".to_vec();
        stream.extend_from_slice(END);
        stream.extend_from_slice(END);
        stream.extend_from_slice(b"third \x1e task");
        stream.extend_from_slice(END);
        stream.extend_from_slice(b"still running");
        // Every split of the stream into two reads finds the same tasks.
        for cut in 0..stream.len() {
            let mut c = Captured::default();
            c.take_in(&stream[..cut], 1 << 20);
            c.take_in(&stream[cut..], 1 << 20);
            let tasks: Vec<String> = std::iter::from_fn(|| c.take_done()).collect();
            assert_eq!(
                tasks,
                ["raw fd write\n", "", "third \x1e task"],
                "cut at {cut}"
            );
            assert_eq!(c.take_rest(), "still running", "cut at {cut}");
        }
        // A task's output beyond the room is dropped; its mark still counts.
        let mut c = Captured::default();
        assert!(!c.take_in(b"0123456789", 4));
        assert!(c.take_in(END, 4));
        assert_eq!(c.take_done().as_deref(), Some("0123"));
        assert_eq!(c.take_done(), None);
    }

    #[test]
    fn truncation_keeps_char_boundaries() {
        assert_eq!(truncate("abc", 10), "abc");
        let t = truncate("ééé", 3);
        assert!(t.starts_with('é') && t.contains("truncated 4 bytes"), "{t}");
    }
}
