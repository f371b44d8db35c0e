//! Concurrency and rate limits by key, as plain decisions over the records
//! the gates bucket (`<p>_gates`) keeps per key (docs/operations.md,
//! "Concurrency and rate limits"); [`crate::gates`] reads and writes them
//! under compare-and-set.
//!
//! A concurrency record holds the **holders** of the key (id, lease end)
//! and an ordered **waiting list** (id, expiry renewed each time the waiter
//! asks again). Expired holders and waiters, and those the caller knows
//! ended, are dropped on every decision; a waiter is admitted only while it
//! is within the first free slots of the list, so queued work starts in
//! order; a release hands the freed slots to the head of the list at once.
//! A rate record is a token bucket (`tokens`, `at_ms`) that may go into
//! debt: a call that finds no token reserves the next one and waits until
//! it is due, so waiting calls start one per interval, in order.

use serde::{Deserialize, Serialize};

/// How long a task's lease lasts without renewal: the executor renews it
/// while the task runs, so a crashed executor's slot frees within this.
pub const TASK_LEASE_MS: u64 = 30_000;

/// How long a waiting task keeps its place without asking again (on top of
/// the delay it was told to wait).
pub const WAIT_TTL_MS: u64 = 15_000;

/// An execution holder whose header cannot be read is dropped only after
/// this long (its header may still be being written).
pub const MISSING_GRACE_MS: u64 = 60_000;

/// Longest delay a waiting task is told to wait before asking again.
pub const MAX_RETRY_MS: u64 = 2_000;

/// Who holds a slot or waits for one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The execution.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub execution_id: String,
    /// The step (empty for an execution's own slot).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub step: String,
    /// The step-run (empty for an execution's own slot).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub step_run_id: String,
}

/// A holder of a slot, or a waiter in line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The lease's id: the execution id, or the task command's id.
    pub id: String,
    /// Whose it is (for `noetl exec why`).
    #[serde(default, flatten)]
    pub owner: Owner,
    /// Holders: the lease's end; waiters: when the place is given up
    /// (Unix epoch ms). 0: no expiry (executions).
    #[serde(default)]
    pub until_ms: u64,
    /// Since when it holds or waits.
    #[serde(default)]
    pub since_ms: u64,
    /// Rate waiters: when the token reserved for it is due.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub due_ms: u64,
    /// Execution holders promoted from the waiting list whose entry token
    /// may not be published yet (the router's sweep publishes it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending_start: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Entry {
    /// How the entry is named to people: the execution, and the step
    /// when it is a task's.
    pub fn label(&self) -> String {
        match (
            self.owner.execution_id.is_empty(),
            self.owner.step.is_empty(),
        ) {
            (true, _) => self.id.clone(),
            (false, true) => self.owner.execution_id.clone(),
            (false, false) => format!("{} (step {})", self.owner.execution_id, self.owner.step),
        }
    }

    /// Whether its lease or place has run out by `now_ms` (0: never).
    pub fn expired(&self, now_ms: u64) -> bool {
        self.until_ms != 0 && self.until_ms <= now_ms
    }
}

/// One concurrency key: its holders and its waiting list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConcRecord {
    /// The key as rendered (the KV key is its hash).
    pub key: String,
    /// The limit last asked with.
    pub limit: u32,
    /// A holder's lease (0: executions, held until they end).
    #[serde(default)]
    pub lease_ms: u64,
    /// Who holds a slot.
    #[serde(default)]
    pub holders: Vec<Entry>,
    /// Who waits, in order.
    #[serde(default)]
    pub waiting: Vec<Entry>,
}

/// One rate key: a token bucket and the calls waiting for their token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RateRecord {
    /// The key as rendered.
    pub key: String,
    /// Tokens added per second.
    pub per_second: f64,
    /// Tokens the bucket holds at most.
    pub burst: u32,
    /// Tokens at `at_ms` (negative: reserved by waiters).
    pub tokens: f64,
    /// When `tokens` was counted (Unix epoch ms).
    pub at_ms: u64,
    /// Calls that reserved a token not yet due, in order.
    #[serde(default)]
    pub waiting: Vec<Entry>,
}

/// What a request for a slot or a token gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Go: the slot (or token) is the caller's.
    Acquired,
    /// Not yet: ask again after `retry_after_ms`.
    Wait {
        /// 1-based place in the waiting list.
        position: usize,
        /// When to ask again.
        retry_after_ms: u64,
        /// Who holds the key's slots (empty for a rate).
        held_by: Vec<Entry>,
    },
    /// At the limit, and the caller does not queue.
    Rejected {
        /// Who holds the key's slots.
        held_by: Vec<Entry>,
    },
}

/// A request for a concurrency slot.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    /// The key as rendered.
    pub key: &'a str,
    /// The lease's id (the same id asking again reuses its lease or place).
    pub id: &'a str,
    /// Whose it is.
    pub owner: &'a Owner,
    /// Slots of the key.
    pub limit: u32,
    /// Now (Unix epoch ms).
    pub now_ms: u64,
    /// A holder's lease (0: held until released).
    pub lease_ms: u64,
    /// How long a waiter keeps its place without asking again (0: until
    /// it is dropped as ended).
    pub wait_ttl_ms: u64,
    /// Wait in line when at the limit (else [`Verdict::Rejected`]).
    pub queue: bool,
    /// Ids known to have ended: dropped from holders and waiters.
    pub gone: &'a [String],
}

/// Drop expired entries and those in `gone`.
fn prune(rec: &mut ConcRecord, now_ms: u64, gone: &[String]) {
    let keep = |e: &Entry| !e.expired(now_ms) && !gone.contains(&e.id);
    rec.holders.retain(keep);
    rec.waiting.retain(keep);
}

/// Give free slots to the head of the waiting list; returns those promoted.
fn promote(rec: &mut ConcRecord, now_ms: u64) -> Vec<Entry> {
    let mut promoted = Vec::new();
    while rec.holders.len() < rec.limit as usize && !rec.waiting.is_empty() {
        let mut e = rec.waiting.remove(0);
        e.until_ms = lease_end(rec.lease_ms, now_ms);
        e.since_ms = now_ms;
        e.pending_start = rec.lease_ms == 0;
        rec.holders.push(e.clone());
        promoted.push(e);
    }
    promoted
}

fn lease_end(lease_ms: u64, now_ms: u64) -> u64 {
    if lease_ms == 0 {
        0
    } else {
        now_ms.saturating_add(lease_ms)
    }
}

/// How long a waiter at `position` waits before asking again: the further
/// back, the longer, up to [`MAX_RETRY_MS`].
pub fn retry_hint(position: usize) -> u64 {
    (100 + 50 * position.saturating_sub(1) as u64).min(MAX_RETRY_MS)
}

/// What [`acquire`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The record as it must be written.
    pub record: ConcRecord,
    /// The asker's verdict.
    pub verdict: Verdict,
    /// Waiters ahead of the asker given a slot freed by the dropped
    /// entries (executions among them must now be started).
    pub promoted: Vec<Entry>,
}

/// Decide a request for a slot: the record as it must be written, the
/// verdict, and who was promoted. Asking again with the same id renews a
/// held lease (or a waiter's place) instead of taking another.
pub fn acquire(rec: Option<&ConcRecord>, ask: &Ask<'_>) -> Decision {
    let mut r = rec.cloned().unwrap_or_default();
    r.key = ask.key.to_string();
    r.limit = ask.limit.max(1);
    r.lease_ms = ask.lease_ms;
    prune(&mut r, ask.now_ms, ask.gone);
    // Slots freed by dropped entries go to the head of the line first.
    let promoted = promote(&mut r, ask.now_ms);
    let decided = |record: ConcRecord, verdict: Verdict| Decision {
        record,
        verdict,
        promoted: promoted.clone(),
    };
    if let Some(h) = r.holders.iter_mut().find(|h| h.id == ask.id) {
        h.until_ms = lease_end(ask.lease_ms, ask.now_ms);
        return decided(r, Verdict::Acquired);
    }
    // After the promotion either nobody waits or no slot is free.
    let free = (r.limit as usize).saturating_sub(r.holders.len());
    let place = r.waiting.iter().position(|w| w.id == ask.id);
    let index = place.unwrap_or(r.waiting.len());
    if index < free {
        r.holders.push(Entry {
            id: ask.id.to_string(),
            owner: ask.owner.clone(),
            until_ms: lease_end(ask.lease_ms, ask.now_ms),
            since_ms: ask.now_ms,
            ..Default::default()
        });
        return decided(r, Verdict::Acquired);
    }
    if !ask.queue {
        let held_by = r.holders.clone();
        return decided(r, Verdict::Rejected { held_by });
    }
    let position = index + 1;
    let retry_after_ms = retry_hint(position);
    let until_ms = if ask.wait_ttl_ms == 0 {
        0
    } else {
        ask.now_ms + retry_after_ms + ask.wait_ttl_ms
    };
    match place {
        Some(i) => r.waiting[i].until_ms = until_ms,
        None => r.waiting.push(Entry {
            id: ask.id.to_string(),
            owner: ask.owner.clone(),
            until_ms,
            since_ms: ask.now_ms,
            ..Default::default()
        }),
    }
    let held_by = r.holders.clone();
    let wait = Verdict::Wait {
        position,
        retry_after_ms,
        held_by,
    };
    decided(r, wait)
}

/// What a release (or a sweep) did.
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    /// The record as it must be written.
    pub record: ConcRecord,
    /// Waiters given a slot, in order.
    pub promoted: Vec<Entry>,
    /// Whether anything changed (else nothing needs writing).
    pub changed: bool,
}

/// Release `id`'s slot (or place in line; `""`: none, a sweep), drop the
/// expired and `gone`, and promote the head of the waiting list into the
/// free slots. Releasing what is not held changes nothing else.
pub fn release(rec: &ConcRecord, id: &str, now_ms: u64, gone: &[String]) -> Released {
    let mut r = rec.clone();
    r.holders.retain(|h| h.id != id);
    r.waiting.retain(|w| w.id != id);
    prune(&mut r, now_ms, gone);
    let promoted = promote(&mut r, now_ms);
    Released {
        changed: r != *rec,
        record: r,
        promoted,
    }
}

/// A holder's lease, as its holder knows it (to renew it, or to claim it
/// again when the record lost it).
#[derive(Debug, Clone)]
pub struct Lease<'a> {
    /// The key as rendered.
    pub key: &'a str,
    /// The lease's id.
    pub id: &'a str,
    /// Whose it is.
    pub owner: &'a Owner,
    /// Slots of the key.
    pub limit: u32,
    /// The lease's length.
    pub lease_ms: u64,
}

/// What a renewal found.
#[derive(Debug, Clone, PartialEq)]
pub enum Renewed {
    /// The lease was held: it is extended.
    Held(ConcRecord),
    /// The record had lost it (purged with its record, or expired and
    /// dropped while the holder was cut off): it is claimed again, over
    /// the limit if need be, since the work it stands for is running; the
    /// holders that came in meanwhile keep their slots, and the next
    /// asking waits until the count is under the limit again.
    Reclaimed(ConcRecord),
}

/// Extend `lease`, or claim it again when `rec` (absent when the record
/// itself is gone) no longer has it.
pub fn renew(rec: Option<&ConcRecord>, lease: &Lease<'_>, now_ms: u64) -> Renewed {
    let mut r = rec.cloned().unwrap_or_else(|| ConcRecord {
        key: lease.key.to_string(),
        limit: lease.limit,
        lease_ms: lease.lease_ms,
        ..Default::default()
    });
    let until_ms = lease_end(r.lease_ms, now_ms);
    if let Some(h) = r.holders.iter_mut().find(|h| h.id == lease.id) {
        h.until_ms = until_ms;
        return Renewed::Held(r);
    }
    r.waiting.retain(|w| w.id != lease.id);
    r.holders.push(Entry {
        id: lease.id.to_string(),
        owner: lease.owner.clone(),
        until_ms,
        since_ms: now_ms,
        ..Default::default()
    });
    Renewed::Reclaimed(r)
}

/// Clear the `pending_start` flag of `ids` (their entry was published).
pub fn mark_started(rec: &ConcRecord, ids: &[String]) -> Option<ConcRecord> {
    let mut r = rec.clone();
    for h in r.holders.iter_mut().filter(|h| ids.contains(&h.id)) {
        h.pending_start = false;
    }
    (r != *rec).then_some(r)
}

/// A request for a rate token.
#[derive(Debug, Clone)]
pub struct RateAsk<'a> {
    /// The key as rendered.
    pub key: &'a str,
    /// The call's id (asking again finds the token reserved for it).
    pub id: &'a str,
    /// Whose it is.
    pub owner: &'a Owner,
    /// Tokens per second (> 0).
    pub per_second: f64,
    /// Bucket size (>= 1).
    pub burst: u32,
    /// Now (Unix epoch ms).
    pub now_ms: u64,
    /// How long a reservation is kept after it is due.
    pub wait_ttl_ms: u64,
}

/// Decide a request for a rate token: take one when the bucket has it,
/// else reserve the next one and wait until it is due.
pub fn take(rec: Option<&RateRecord>, ask: &RateAsk<'_>) -> (RateRecord, Verdict) {
    let burst = f64::from(ask.burst.max(1));
    let per_second = if ask.per_second > 0.0 {
        ask.per_second
    } else {
        1.0
    };
    let mut r = rec.cloned().unwrap_or(RateRecord {
        tokens: burst,
        at_ms: ask.now_ms,
        ..Default::default()
    });
    r.key = ask.key.to_string();
    r.per_second = per_second;
    r.burst = ask.burst.max(1);
    r.waiting.retain(|w| !w.expired(ask.now_ms));
    if let Some(i) = r.waiting.iter().position(|w| w.id == ask.id) {
        let due = r.waiting[i].due_ms;
        if due <= ask.now_ms {
            r.waiting.remove(i);
            return (r, Verdict::Acquired);
        }
        r.waiting[i].until_ms = due + ask.wait_ttl_ms;
        return (r, rate_wait(i + 1, due - ask.now_ms));
    }
    let elapsed = ask.now_ms.saturating_sub(r.at_ms) as f64 / 1000.0;
    r.tokens = (r.tokens + elapsed * per_second).min(burst);
    r.at_ms = r.at_ms.max(ask.now_ms);
    r.tokens -= 1.0;
    if r.tokens >= 0.0 {
        return (r, Verdict::Acquired);
    }
    let wait_ms = ((-r.tokens) / per_second * 1000.0).ceil() as u64;
    // Counted from the bucket's clock: an ask stamped before a lost
    // compare-and-set (its `now` older than the bucket's) must not be due
    // earlier than the debt allows.
    let due_ms = r.at_ms + wait_ms.max(1);
    r.waiting.push(Entry {
        id: ask.id.to_string(),
        owner: ask.owner.clone(),
        until_ms: due_ms + ask.wait_ttl_ms,
        since_ms: ask.now_ms,
        due_ms,
        pending_start: false,
    });
    let position = r.waiting.len();
    (r, rate_wait(position, due_ms - ask.now_ms))
}

fn rate_wait(position: usize, retry_after_ms: u64) -> Verdict {
    Verdict::Wait {
        position,
        retry_after_ms,
        held_by: Vec::new(),
    }
}

/// `execution.queued`: an execution waits for a slot of its playbook's
/// concurrency key; its entry step starts when one frees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionQueued {
    /// The key as rendered.
    pub key: String,
    /// The key's limit.
    pub limit: u32,
    /// The executions holding its slots.
    pub holders: Vec<String>,
    /// 1-based place in line.
    pub position: usize,
    /// `queue` or `cancel-oldest`.
    pub on_limit: String,
    /// An execution asked to cancel to make room (`cancel-oldest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelling: Option<String>,
    /// The step its entry token is for (live, not published, while it
    /// waits): what a fold of the log needs to keep that token live.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub entry_step: String,
}

/// What the log says of one running execution under an execution key,
/// for [`from_log`].
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    /// The execution.
    pub execution_id: String,
    /// Its entry went out (`workflow.initialized` is stored): it holds a
    /// slot; else it waits (its last `execution.queued`).
    pub started: bool,
    /// Of a started one: its entry's work was taken up (a `task.started`
    /// or a `step.started` of its own is stored). The router writes the
    /// entry's events before it sends the work; stopped between the two,
    /// only the log is left, so a started one without this holds its slot
    /// with its start owed (`pending_start`: the router's sweep sends the
    /// entry again, idempotently).
    pub taken_up: bool,
    /// The stream sequence of that event: the order of holders and line.
    pub seq: u64,
    /// That event's time (Unix epoch ms).
    pub at_ms: u64,
}

/// An execution key's record as the events of the running executions
/// under it determine it (docs/architecture.md, "The event log"): those
/// whose entry went out hold a slot, even over `limit` (they run); the
/// others wait in line in the order they queued. A waiter that fits under
/// the limit is promoted by the next decision over the record
/// ([`acquire`], [`release`]), which starts it. A holder whose entry's
/// work the log does not show taken up keeps its start owed.
pub fn from_log(key: &str, limit: u32, logged: &[Logged]) -> ConcRecord {
    let mut sorted: Vec<&Logged> = logged.iter().collect();
    sorted.sort_by_key(|l| l.seq);
    let entry = |l: &Logged| Entry {
        id: l.execution_id.clone(),
        owner: Owner {
            execution_id: l.execution_id.clone(),
            ..Default::default()
        },
        since_ms: l.at_ms,
        pending_start: l.started && !l.taken_up,
        ..Default::default()
    };
    ConcRecord {
        key: key.to_string(),
        limit: limit.max(1),
        lease_ms: 0,
        holders: sorted
            .iter()
            .filter(|l| l.started)
            .map(|l| entry(l))
            .collect(),
        waiting: sorted
            .iter()
            .filter(|l| !l.started)
            .map(|l| entry(l))
            .collect(),
    }
}

crate::payloads::payload_of! { ExecutionQueued => ExecutionQueued }

#[cfg(test)]
mod tests;
