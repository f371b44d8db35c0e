//! Lanes: a few interpreters that serve fast code back to back.
//!
//! A loop's iterations run the same small code, and on a busy machine an
//! interpreter woken for each of them spends most of its time coming back
//! to a cold cache (docs/performance.md "The python loop's lanes"). So a
//! source that ran in under [`FAST`] last time goes in line: up to
//! [`PoolLimits::lanes`](super::PoolLimits::lanes) interpreters take the
//! line's tasks in order, each holding its next requests in its stdin
//! while it runs one, so that it goes on without sleeping. A task waits in
//! line at most [`PoolLimits::line_wait`](super::PoolLimits::line_wait);
//! then it takes an interpreter of its own, as code that is not fast
//! always does.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{exited, read_response, send, served, Pool, RunError, RunOutput, Worker};

/// A source whose last run took less than this goes in line.
pub const FAST: Duration = Duration::from_millis(2);

/// The longest a task waits in line, by default, before it takes an
/// interpreter of its own (a lane held up by a task that turned out slow).
pub const LINE_WAIT: Duration = Duration::from_millis(5);

/// Requests one lane's interpreter holds at once: the one it runs and
/// those sent behind it, so that it finds its next request waiting even
/// when the lane's driver is slow to be scheduled on a busy machine (2
/// measured slower than 4; 8 and 16 no faster: docs/performance.md).
const DEPTH: usize = 4;

/// The largest request a lane sends ahead. Requests sent ahead wait in the
/// interpreter's stdin pipe while the interpreter may be writing a large
/// answer that the lane is not reading yet: together (`DEPTH - 1` of them)
/// they must fit the pipe (64 KiB), or both sides would wait on each other.
const AHEAD_MAX: usize = 8 * 1024;

/// Sources remembered as fast or not; forgotten all at once beyond this.
const SPEED_MAX: usize = 4096;

/// Fast tasks in line, and the lanes serving them.
#[derive(Debug, Default)]
pub(super) struct Line {
    waiting: VecDeque<Job>,
    lanes: usize,
    next_id: u64,
}

/// A task in line.
#[derive(Debug)]
struct Job {
    id: u64,
    source: u64,
    line: Vec<u8>,
    timeout: Duration,
    reply: oneshot::Sender<Result<RunOutput, RunError>>,
}

fn source_key(code: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    code.hash(&mut h);
    h.finish()
}

impl Pool {
    /// Run the request `line` of the source `code`: in line for a lane
    /// when that source ran fast last time, else in an interpreter of its
    /// own ([`Pool::run`]). `timeout` counts from when the task starts.
    pub async fn submit(
        &self,
        code: &str,
        line: Vec<u8>,
        timeout: Duration,
    ) -> Result<RunOutput, RunError> {
        let source = source_key(code);
        if self.inner.limits.lanes == 0 || !self.ran_fast(source) {
            return self.run_alone(source, line, timeout).await;
        }
        let (reply, mut answer) = oneshot::channel();
        let (id, start_lane) = {
            let mut l = self.inner.line.lock().expect("line lock");
            let id = l.next_id;
            l.next_id += 1;
            l.waiting.push_back(Job {
                id,
                source,
                line,
                timeout,
                reply,
            });
            let start = l.lanes < self.inner.limits.lanes;
            if start {
                l.lanes += 1;
            }
            (id, start)
        };
        if start_lane {
            tokio::spawn(self.clone().lane());
        }
        if let Ok(done) = tokio::time::timeout(self.inner.limits.line_wait, &mut answer).await {
            return done.unwrap_or_else(|_| Err(lane_lost()));
        }
        // Waited too long: out of the line, unless a lane took it already.
        let mine = {
            let mut l = self.inner.line.lock().expect("line lock");
            let at = l.waiting.iter().position(|j| j.id == id);
            at.and_then(|at| l.waiting.remove(at))
        };
        match mine {
            Some(job) => self.run_alone(source, job.line, timeout).await,
            None => answer.await.unwrap_or_else(|_| Err(lane_lost())),
        }
    }

    async fn run_alone(
        &self,
        source: u64,
        line: Vec<u8>,
        timeout: Duration,
    ) -> Result<RunOutput, RunError> {
        let out = self.run(line, timeout).await;
        if let Ok(out) = &out {
            self.note_speed(source, out.took);
        }
        out
    }

    fn ran_fast(&self, source: u64) -> bool {
        let speed = self.inner.speed.lock().expect("speed lock");
        speed.get(&source).copied().unwrap_or(false)
    }

    fn note_speed(&self, source: u64, took: Duration) {
        let mut speed = self.inner.speed.lock().expect("speed lock");
        if speed.len() >= SPEED_MAX && !speed.contains_key(&source) {
            speed.clear();
        }
        speed.insert(source, took < FAST);
    }

    /// Jobs back at the head of the line, in their order (sent ahead to an
    /// interpreter that was killed or died before it read them).
    fn back_in_line(&self, jobs: impl DoubleEndedIterator<Item = Job>) {
        let mut l = self.inner.line.lock().expect("line lock");
        for job in jobs.rev() {
            l.waiting.push_front(job);
        }
    }

    /// The next jobs a lane sends, or `None` when the line is empty and
    /// nothing is in flight: the lane then ends (decided under the line's
    /// lock, so that a task put in line meanwhile starts a lane of its own).
    fn take_jobs(&self, in_flight: usize, room_for_uses: usize) -> Option<Vec<Job>> {
        let mut l = self.inner.line.lock().expect("line lock");
        let mut jobs = Vec::new();
        while in_flight + jobs.len() < DEPTH.min(room_for_uses.max(1)) {
            let ahead = in_flight + jobs.len() > 0;
            match l.waiting.front() {
                // Cancelled while in line: never run.
                Some(j) if j.reply.is_closed() => drop(l.waiting.pop_front()),
                Some(j) if ahead && j.line.len() > AHEAD_MAX => break,
                Some(_) => jobs.extend(l.waiting.pop_front()),
                None => break,
            }
        }
        if in_flight == 0 && jobs.is_empty() {
            l.lanes -= 1;
            return None;
        }
        Some(jobs)
    }

    /// Send `jobs` to `w` behind those in `sent`, in order; when the first
    /// one goes to an idle interpreter, when it started. A job that cannot
    /// be sent (the interpreter is gone: reading its answer says how) goes
    /// back in line with those after it.
    async fn send_all(
        &self,
        w: &mut Worker,
        sent: &mut VecDeque<Job>,
        jobs: Vec<Job>,
    ) -> Option<Instant> {
        let mut started = None;
        let mut jobs = jobs.into_iter();
        while let Some(job) = jobs.next() {
            if sent.is_empty() {
                started = Some(Instant::now());
            }
            if send(w, &job.line).await.is_err() {
                self.back_in_line(std::iter::once(job).chain(jobs));
                break;
            }
            sent.push_back(job);
        }
        started
    }

    /// Serve the line until it is empty: send each interpreter its next
    /// request while it runs one, and answer each task in turn.
    async fn lane(self) {
        let mut worker: Option<Worker> = None;
        let mut sent: VecDeque<Job> = VecDeque::new();
        // When the oldest request in flight began to run.
        let mut head_started = Instant::now();
        loop {
            let room = worker.as_ref().map_or(usize::MAX, |w| {
                (self.inner.limits.max_uses.saturating_sub(w.uses) as usize)
                    .saturating_sub(sent.len())
            });
            let Some(jobs) = self.take_jobs(sent.len(), room) else {
                if let Some(w) = worker {
                    self.checkin(w);
                }
                return;
            };
            let w = match worker.as_mut() {
                Some(w) => w,
                None => match self.checkout() {
                    Ok(w) => {
                        w.stderr.lock().expect("stderr lock").reset();
                        worker.insert(w)
                    }
                    Err(e) => {
                        // Each task in turn tries to start one and is told why not.
                        let mut jobs = jobs.into_iter();
                        if let Some(first) = jobs.next() {
                            let _ = first.reply.send(Err(e));
                        }
                        self.back_in_line(jobs);
                        continue;
                    }
                },
            };
            if let Some(started) = self.send_all(w, &mut sent, jobs).await {
                head_started = started;
            }
            let Some(head) = sent.front_mut() else {
                // Nothing could be sent: start over with a new interpreter.
                drop(worker.take());
                continue;
            };
            let deadline = head_started + head.timeout;
            let answer = tokio::select! {
                answer = tokio::time::timeout_at(deadline, read_response(w)) => Some(answer),
                () = head.reply.closed() => None,
            };
            let head = sent.pop_front().expect("a request in flight");
            let Some(answer) = answer else {
                // The task was cancelled (its caller is gone): stop it as a
                // task of its own would be stopped, by killing its
                // interpreter; the requests behind it go back in line.
                drop(worker.take());
                self.back_in_line(sent.drain(..));
                continue;
            };
            match answer {
                Ok(Ok(Some(response))) => {
                    let out = served(w, response, head_started.elapsed()).await;
                    self.note_speed(head.source, out.took);
                    head_started = Instant::now();
                    let _ = head.reply.send(Ok(out));
                    if w.uses >= self.inner.limits.max_uses && sent.is_empty() {
                        self.checkin(worker.take().expect("a worker"));
                    }
                }
                failed => {
                    // Timed out (the interpreter is killed first) or dead:
                    // the requests sent ahead never began; they go back in
                    // line for the next interpreter.
                    let w = worker.take().expect("a worker");
                    let err = match failed {
                        Err(_) => {
                            drop(w);
                            RunError::Timeout(head.timeout)
                        }
                        Ok(Ok(None)) => exited(w).await,
                        Ok(Err(e)) => {
                            drop(w);
                            RunError::Io(e)
                        }
                        Ok(Ok(Some(_))) => unreachable!("answered above"),
                    };
                    self.back_in_line(sent.drain(..));
                    let _ = head.reply.send(Err(err));
                }
            }
        }
    }
}

fn lane_lost() -> RunError {
    RunError::Io(std::io::Error::other(
        "the python lane running this task stopped",
    ))
}
