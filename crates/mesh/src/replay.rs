//! `noetl exec replay`: read an execution's events, fold them
//! ([`crate::fold`]) and compare what they determine with the records the
//! engine keeps in KV (docs/operations.md "Replay"). The comparison is a
//! plain function ([`differences`]); reading is the only I/O.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use noetl_wire::Event;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::events::ReadFrom;
use crate::fold::{Folded, Origin};
use crate::keys::Keys;
use crate::state::{ExecHeader, StepRecord};
use crate::{Mesh, MeshError};

/// One event as read from the stream: its sequence number and the event.
#[derive(Debug, Clone)]
pub struct Logged {
    /// Its sequence number in the events stream.
    pub seq: u64,
    /// The event, whole ([`crate::events::decode`]).
    pub event: Event,
}

/// Where to stop reading: every event, or those up to a sequence number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Until {
    /// Every event stored.
    #[default]
    End,
    /// Events with a sequence number up to this one.
    Seq(u64),
    /// Events at or before this time (Unix epoch ms).
    TimeMs(u64),
}

impl Until {
    /// A stream sequence number (`1234`) or an RFC 3339 time
    /// (`2026-11-28T10:00:00Z`); `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        if let Ok(seq) = s.parse::<u64>() {
            return Some(Self::Seq(seq));
        }
        let t = crate::events::parse_rfc3339(s)?;
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Some(Self::TimeMs(ms))
    }

    /// True when `l` is at or before where this stops.
    pub fn keeps(self, l: &Logged) -> bool {
        match self {
            Self::End => true,
            Self::Seq(s) => l.seq <= s,
            Self::TimeMs(t) => l.event.ts_ms <= t,
        }
    }
}

/// Every stored event of execution `eid`, in stream order, each decoded
/// whole (an event that does not decode is an error naming its sequence),
/// up to `until`: a [`LogReader`]'s events, collected.
pub async fn read_log(mesh: &Mesh, eid: &str, until: Until) -> Result<Vec<Logged>, MeshError> {
    let mut log = LogReader::of(mesh, eid);
    let mut out = Vec::new();
    while let Some(l) = log.next().await? {
        if until.keeps(&l) {
            out.push(l);
        }
    }
    Ok(out)
}

/// Every message stored under execution `eid`'s events, in stream order,
/// as stored: a batch's events, the `step.started` a `next.selected`
/// carries and the `task.done` an end carries are left inside it
/// ([`crate::events::unfold`] reads them out). For a reader that unfolds
/// one message at a time: it then holds one batch's events at once, not
/// the log's (a loop of 100,000 iterations is a few thousand messages
/// stored and 300,000 events unfolded). A message that does not decode
/// is an error naming its sequence.
pub async fn read_stored_log(mesh: &Mesh, eid: &str) -> Result<Vec<Logged>, MeshError> {
    let mut reader = LogReader::of(mesh, eid);
    reader.chunk = usize::MAX;
    reader.refill().await?;
    Ok(std::mem::take(&mut reader.stored).collect())
}

/// Messages a [`LogReader`] reads at once.
const CHUNK: usize = 1_000;

/// A log read forward one event at a time, a thousand stored messages at
/// once, each unfolded ([`crate::events::Unfolder`]) only when reached:
/// what it holds is one chunk of messages as stored and one message's
/// events, never the whole log (300,000 events for a loop of 100,000
/// iterations; docs/architecture.md "Reading a long log"). The events it
/// gives, and their order, are those of one read of the whole log
/// ([`crate::Mesh::stored_events_from`]). It reads through the last
/// message stored when its second chunk is read (a first chunk shorter
/// than a chunk is the whole log).
pub struct LogReader<'m> {
    mesh: &'m Mesh,
    filter: String,
    from: ReadFrom,
    end: u64,
    chunk: usize,
    lenient: bool,
    exhausted: bool,
    stored: std::vec::IntoIter<Logged>,
    seq: u64,
    events: std::vec::IntoIter<Event>,
    unfolder: crate::events::Unfolder,
    /// Which stored messages are unfolded and given ([`LogReader::stored_where`]).
    keep: Option<StoredFilter>,
}

/// A filter of stored messages, before they are unfolded.
type StoredFilter = Box<dyn FnMut(&Event) -> bool + Send>;

impl<'m> LogReader<'m> {
    /// The log of execution `eid` from its start.
    pub fn of(mesh: &'m Mesh, eid: &str) -> Self {
        Self::under(mesh, mesh.subjects().events_of(eid), ReadFrom::Start)
    }

    /// The events of every execution stored at or after `since_ms` (Unix
    /// epoch ms).
    pub fn since(mesh: &'m Mesh, since_ms: u64) -> Self {
        Self::under(
            mesh,
            mesh.subjects().events_of("*"),
            ReadFrom::SinceMs(since_ms),
        )
    }

    fn under(mesh: &'m Mesh, filter: String, from: ReadFrom) -> Self {
        Self {
            mesh,
            filter,
            from,
            end: u64::MAX,
            chunk: CHUNK,
            lenient: false,
            exhausted: false,
            stored: Vec::new().into_iter(),
            seq: 0,
            events: Vec::new().into_iter(),
            unfolder: Default::default(),
            keep: None,
        }
    }

    /// Give only the events of the stored messages `keep` takes, each
    /// unfolded only if taken: a reader of one step-run's events, or of
    /// types never carried inside another event
    /// ([`crate::events::CARRIED`]), passes over the rest without
    /// unfolding it.
    pub fn stored_where(mut self, keep: impl FnMut(&Event) -> bool + Send + 'static) -> Self {
        self.keep = Some(Box::new(keep));
        self
    }

    /// The sequence number of the last stored message read, given or not
    /// (0 before any): where a second pass stops to read what this one
    /// read ([`LogReader::through`]).
    pub fn read_through(&self) -> u64 {
        self.seq
    }

    /// Stop after stream sequence `seq`: a second pass over the log reads
    /// what the first read, not what was stored since.
    pub fn through(mut self, seq: u64) -> Self {
        self.end = seq;
        self
    }

    /// Pass over a message that does not decode instead of failing the
    /// read: for a report that shows what it can.
    pub fn lenient(mut self) -> Self {
        self.lenient = true;
        self
    }

    /// The next event, `None` past the last; a message that does not
    /// decode is an error naming its sequence (unless lenient).
    pub async fn next(&mut self) -> Result<Option<Logged>, MeshError> {
        loop {
            if let Some(event) = self.events.next() {
                return Ok(Some(Logged {
                    seq: self.seq,
                    event,
                }));
            }
            if let Some(message) = self.stored.next() {
                self.seq = message.seq;
                if self.keep.as_mut().is_some_and(|keep| !keep(&message.event)) {
                    continue;
                }
                self.events = self.unfolder.unfold(message.event).into_iter();
                continue;
            }
            if self.exhausted {
                return Ok(None);
            }
            self.refill().await?;
        }
    }

    /// Read the next chunk of stored messages.
    async fn refill(&mut self) -> Result<(), MeshError> {
        let (filter, end, max, lenient) = (&self.filter, self.end, self.chunk, self.lenient);
        let mut out = Vec::new();
        let (mut failed, mut last) = (None, None);
        self.mesh
            .visit_stored_events(filter, self.from, |seq, ev| {
                if seq > end {
                    return ControlFlow::Break(());
                }
                last = Some(seq);
                match ev {
                    Ok(event) => out.push(Logged { seq, event }),
                    Err(_) if lenient => {}
                    Err(e) => {
                        failed = Some(MeshError::Invalid(format!(
                            "event seq {seq} under {filter}: {e}"
                        )));
                        return ControlFlow::Break(());
                    }
                }
                if out.len() >= max {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .await?;
        if let Some(e) = failed {
            return Err(e);
        }
        let full = out.len() >= max;
        self.stored = out.into_iter();
        let Some(last) = last else {
            self.exhausted = true;
            return Ok(());
        };
        if !full || last >= self.end {
            self.exhausted = true;
            return Ok(());
        }
        if self.end == u64::MAX {
            match self.mesh.last_stored_event(&self.filter).await? {
                Some(stored) => self.end = stored.seq,
                None => self.exhausted = true,
            }
        }
        self.from = ReadFrom::AfterSeq(last);
        Ok(())
    }
}

/// The fields an event carries a value in by reference, and the field the
/// value stands for once read back ([`crate::patches`]).
const CARRIED: [(&str, &str); 5] = [
    ("set_ctx_ref", "set_ctx"),
    ("reduce_ref", "reduce"),
    ("workload_ref", "workload"),
    ("command_ref", "command"),
    ("parent_command_ref", "parent_command"),
];

/// True when `ev` carries a value by reference ([`hydrate`] reads it).
pub fn carries_reference(ev: &Event) -> bool {
    let p = crate::events::payload(ev);
    CARRIED
        .iter()
        .any(|(reference, _)| p.get(reference).is_some_and(|v| !v.is_null()))
}

/// Put back what an event carries by reference (a large `set_ctx` patch,
/// reducer results, the workload, a waiter's command, a child's
/// continuation of its parent), read from the object store, so the
/// fold sees every value whole.
pub async fn hydrate(mesh: &Mesh, ev: &mut Event) -> Result<(), MeshError> {
    let mut payload = crate::events::payload(ev);
    let Value::Object(map) = &mut payload else {
        return Ok(());
    };
    let mut changed = false;
    for (reference, field) in CARRIED {
        if let Some(r) = map.remove(reference).filter(|r| !r.is_null()) {
            let value: Value = crate::patches::read(mesh.results(), &r).await?;
            map.insert(field.to_string(), value);
            changed = true;
        }
    }
    if changed {
        ev.payload_json = crate::codec::json_bytes(&payload);
    }
    Ok(())
}

/// One exported event: a JSON line as `noetl events tail --json` prints
/// it (`seq` and the event's fields, its payload inline).
pub fn export_line(l: &Logged) -> Result<String, MeshError> {
    let bytes = crate::codec::event_json(&l.event).map_err(MeshError::Decode)?;
    let mut v: Value = serde_json::from_slice(&bytes).expect("event JSON is JSON");
    v["seq"] = Value::from(l.seq);
    Ok(v.to_string())
}

/// An exported event read back (`noetl exec replay --from FILE`); `line`
/// is its line number, for errors.
pub fn import_line(text: &str, line: usize) -> Result<Logged, MeshError> {
    let bad = |why: String| MeshError::Invalid(format!("line {line}: {why}"));
    let mut v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let seq = v
        .as_object_mut()
        .and_then(|m| m.remove("seq"))
        .and_then(|s| s.as_u64())
        .ok_or_else(|| bad("no `seq`".into()))?;
    let mut event =
        crate::codec::decode_event(v.to_string().as_bytes()).map_err(|e| bad(e.to_string()))?;
    event.ts_ms = crate::events::time_ms(&event);
    Ok(Logged { seq, event })
}

/// Read, hydrate and fold the log of `eid` up to `until`.
pub async fn fold_log(mesh: &Mesh, eid: &str, until: Until) -> Result<Folded, MeshError> {
    Ok(fold_stored(mesh, eid, until, &mut |_| false).await?.0)
}

/// The fold of execution `eid`'s events up to `until` ([`fold_log`]), and
/// the events `keep` keeps of them, for a caller that reads some of them
/// again: the log is read by a [`LogReader`] and each event hydrated only
/// when the fold reaches it, so what is held at once is a thousand
/// messages, a batch's events and what `keep` keeps, never the whole log
/// (a resume of a loop of 100,000 iterations held the router at 230 MB
/// that way: docs/reliability.md "Resume of a long loop"). The events the
/// fold sees, and their order, are [`hydrated_log`]'s.
pub async fn fold_stored(
    mesh: &Mesh,
    eid: &str,
    until: Until,
    keep: &mut (dyn FnMut(&Event) -> bool + Send),
) -> Result<(Folded, Vec<Logged>), MeshError> {
    let mut folded = Folded::default();
    let mut kept = Vec::new();
    let mut log = LogReader::of(mesh, eid);
    while let Some(mut l) = log.next().await? {
        if !until.keeps(&l) {
            continue;
        }
        hydrate(mesh, &mut l.event).await?;
        folded.apply(l.seq, &l.event)?;
        if keep(&l.event) {
            kept.push(l);
        }
    }
    Ok((folded, kept))
}

/// [`read_log`] with every value an event carries by reference read back
/// ([`hydrate`]): what the fold takes.
pub async fn hydrated_log(mesh: &Mesh, eid: &str, until: Until) -> Result<Vec<Logged>, MeshError> {
    let mut log = read_log(mesh, eid, until).await?;
    for l in &mut log {
        hydrate(mesh, &mut l.event).await?;
    }
    Ok(log)
}

/// The events of `eid` that `keep` takes, in stream order, each hydrated
/// ([`hydrate`]): the log read a chunk at a time ([`LogReader`]), so what
/// is held is what is kept, not the whole log. For the engine's own
/// rebuilds of one record from a long log (a loop run's `ctx` claims, an
/// iteration's checkpoint), which read a few of its events.
pub async fn hydrated_where(
    mesh: &Mesh,
    eid: &str,
    mut keep: impl FnMut(&Event) -> bool,
) -> Result<Vec<Event>, MeshError> {
    let mut log = LogReader::of(mesh, eid);
    let mut kept = Vec::new();
    while let Some(mut l) = log.next().await? {
        if keep(&l.event) {
            hydrate(mesh, &mut l.event).await?;
            kept.push(l.event);
        }
    }
    Ok(kept)
}

/// The records the engine keeps for one execution, as read from KV.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stored {
    /// The header.
    pub header: Option<ExecHeader>,
    /// Step records by key (`<eid>.step.<step>`).
    pub steps: BTreeMap<String, StepRecord>,
    /// `ctx` as users see it.
    pub ctx: Map<String, Value>,
    /// Waiters by signal (`<eid>.wait.<signal>`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub waiters: BTreeMap<String, crate::waiter::Waiter>,
    /// The pause record is there.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// The fields of the plan record (`<eid>.plan`) the events determine
    /// ([`plan_fields`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<Map<String, Value>>,
}

/// Read the records of `eid` from KV.
pub async fn read_stored(mesh: &Mesh, eid: &str) -> Result<Stored, MeshError> {
    let header = crate::kv::get(mesh.exec_kv(), &Keys::header(eid)).await?;
    let mut steps = BTreeMap::new();
    for (key, record) in
        crate::kv::values_matching::<StepRecord>(mesh.exec_kv(), &Keys::steps_of(eid)).await?
    {
        steps.insert(key, record?);
    }
    let ctx = match mesh.exec_ctx(eid).await? {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let waiters = mesh
        .waiters(eid)
        .await?
        .into_iter()
        .map(|w| (w.signal.clone(), w))
        .collect();
    let paused = mesh.pause_record(eid).await?.is_some();
    let plan: Option<Value> = crate::kv::get(mesh.exec_kv(), &Keys::plan(eid)).await?;
    let plan = plan.as_ref().map(plan_fields);
    Ok(Stored {
        header,
        steps,
        ctx,
        waiters,
        paused,
        plan,
    })
}

/// A record the log and KV disagree on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// What: `header.status`, `step "fetch"`, `ctx.total`...
    pub what: String,
    /// What the events give (`null`: nothing).
    pub from_events: Value,
    /// What KV holds (`null`: nothing).
    pub stored: Value,
    /// The event that should have produced the stored value (the last
    /// that changed the record), if any did.
    pub event: Option<Origin>,
}

/// Header fields compared (times are the events' own and differ from the
/// header's by the moment between them: not compared).
fn header_fields(h: &ExecHeader) -> Map<String, Value> {
    let Value::Object(mut m) = crate::payloads::to_value(h) else {
        unreachable!("a header is an object")
    };
    m.remove("started_at");
    m.remove("ended_at");
    m.remove("execution_id");
    // Fields left out when empty compare as present and empty.
    for (k, empty) in [
        ("stopped", Value::Array(Vec::new())),
        ("resumes", Value::from(0)),
        ("resumed_at_ms", Value::from(0)),
        ("error", Value::Null),
        ("parent_execution_id", Value::from("")),
    ] {
        m.entry(k).or_insert(empty);
    }
    m
}

/// Every record on which `folded` and `stored` disagree, header first,
/// then steps by name, then `ctx` by key, then (of a running execution)
/// waiters by signal and the pause.
pub fn differences(eid: &str, folded: &Folded, stored: &Stored) -> Vec<Difference> {
    let mut out = Vec::new();
    let header_origin = folded.origins.header.clone();
    match (&folded.header, &stored.header) {
        (None, None) => {}
        (Some(f), Some(s)) => {
            let (f, s) = (header_fields(f), header_fields(s));
            for (k, fv) in &f {
                if s.get(k) != Some(fv) {
                    out.push(Difference {
                        what: format!("header.{k}"),
                        from_events: fv.clone(),
                        stored: s.get(k).cloned().unwrap_or(Value::Null),
                        event: header_origin.clone(),
                    });
                }
            }
        }
        (f, s) => out.push(Difference {
            what: "header".into(),
            from_events: crate::payloads::to_value(f),
            stored: crate::payloads::to_value(s),
            event: header_origin.clone(),
        }),
    }
    let folded_steps: BTreeMap<String, (&String, &StepRecord)> = folded
        .steps
        .iter()
        .map(|(name, r)| (Keys::step(eid, name), (name, r)))
        .collect();
    let keys: std::collections::BTreeSet<&String> =
        folded_steps.keys().chain(stored.steps.keys()).collect();
    for key in keys {
        let f = folded_steps.get(key);
        let s = stored.steps.get(key);
        if f.map(|(_, r)| *r) == s {
            continue;
        }
        let name = f.map(|(n, _)| (*n).clone()).unwrap_or_else(|| {
            key.rsplit_once(".step.")
                .map_or(key.clone(), |(_, n)| n.to_string())
        });
        out.push(Difference {
            what: format!("step {name:?}"),
            from_events: crate::payloads::to_value(&f.map(|(_, r)| r)),
            stored: crate::payloads::to_value(&s),
            event: folded.origins.steps.get(&name).cloned(),
        });
    }
    let keys: std::collections::BTreeSet<&String> =
        folded.ctx.keys().chain(stored.ctx.keys()).collect();
    for key in keys {
        let (f, s) = (folded.ctx.get(key), stored.ctx.get(key));
        if same_json(f, s) {
            continue;
        }
        out.push(Difference {
            what: format!("ctx.{key}"),
            from_events: f.cloned().unwrap_or(Value::Null),
            stored: s.cloned().unwrap_or(Value::Null),
            event: folded.origins.ctx.get(key).cloned(),
        });
    }
    out.extend(plan_differences(folded, stored));
    // Waiters and the pause of a running execution only: an ended one's
    // are left behind, and owed by nothing.
    if folded.is_running() {
        let owed = folded.waits.all();
        let signals: std::collections::BTreeSet<&String> =
            owed.keys().chain(stored.waiters.keys()).collect();
        for signal in signals {
            // A delivery is the waiter's last moment, not in the log.
            let s = stored.waiters.get(signal).map(|w| crate::waiter::Waiter {
                delivered: None,
                ..w.clone()
            });
            let f = owed.get(signal);
            if f == s.as_ref() {
                continue;
            }
            out.push(Difference {
                what: format!("waiter {signal:?}"),
                from_events: crate::payloads::to_value(&f),
                stored: crate::payloads::to_value(&s),
                event: None,
            });
        }
        let paused = folded.pause.owed().is_some();
        if paused != stored.paused {
            out.push(Difference {
                what: "paused".into(),
                from_events: Value::Bool(paused),
                stored: Value::Bool(stored.paused),
                event: None,
            });
        }
    }
    out
}

/// The fields of a stored plan (`crate::plan::PlanRecord`, as stored)
/// its events determine: its playbook's digest, workload, start and a
/// child's fields (absent ones as their defaults).
pub fn plan_fields(plan: &Value) -> Map<String, Value> {
    let digest = crate::patches::digest(&plan["playbook"]);
    let return_step = plan["return_step"].as_str().unwrap_or_default().to_string();
    fields_of_plan(
        digest,
        &plan["workload"],
        plan["started_ms"].as_u64().unwrap_or(0),
        (&plan["parent_iter"], &return_step),
    )
}

/// The compared fields, by name.
fn fields_of_plan(
    digest: String,
    workload: &Value,
    started_ms: u64,
    (parent_iter, return_step): (&Value, &String),
) -> Map<String, Value> {
    Map::from_iter([
        ("digest".to_string(), Value::String(digest)),
        ("workload".to_string(), workload.clone()),
        ("started_ms".to_string(), Value::from(started_ms)),
        ("parent_iter".to_string(), parent_iter.clone()),
        (
            "return_step".to_string(),
            Value::String(return_step.clone()),
        ),
    ])
}

/// Where the plan the events name (`playbook.initialized`, or the last
/// `execution.resumed` that names one) and the stored plan differ: its
/// playbook (by digest), workload, start and a child's fields. A plan the
/// events do not name (written before the log was complete, or changed by
/// an older resume) is not compared; a missing one only while the
/// execution runs.
fn plan_differences(folded: &Folded, stored: &Stored) -> Vec<Difference> {
    let Some(id) = folded
        .plan
        .as_ref()
        .filter(|_| !folded.plan_changed_by_resume)
    else {
        return Vec::new();
    };
    let event = folded.origins.plan.clone();
    let f = fields_of_plan(
        id.digest.clone(),
        &folded.workload,
        id.started_ms,
        (&id.parent_iter, &id.return_step),
    );
    let Some(s) = &stored.plan else {
        return match folded.is_running() {
            true => vec![Difference {
                what: "plan".into(),
                from_events: Value::Object(f),
                stored: Value::Null,
                event,
            }],
            false => Vec::new(),
        };
    };
    f.into_iter()
        .filter(|(k, v)| !same_json(Some(v), s.get(k)))
        .map(|(k, v)| Difference {
            what: format!("plan.{k}"),
            from_events: v,
            stored: s.get(&k).cloned().unwrap_or(Value::Null),
            event: event.clone(),
        })
        .collect()
}

/// JSON equality with numbers compared by value (`2` and `2.0` are one).
pub(crate) fn same_json(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => x.as_f64() == y.as_f64(),
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(Some(p), Some(q)))
        }
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            x.len() == y.len() && x.iter().all(|(k, v)| same_json(Some(v), y.get(k)))
        }
        (x, y) => x == y,
    }
}

/// What `noetl exec replay` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The execution.
    pub execution_id: String,
    /// Events folded.
    pub events: usize,
    /// The last one's sequence number.
    pub last_seq: u64,
    /// True when every record the events determine equals the stored one.
    pub equal: bool,
    /// Where they differ (empty when equal).
    pub differences: Vec<Difference>,
}

/// Fold the log of `eid` and compare it with KV.
pub async fn check(mesh: &Mesh, eid: &str) -> Result<Report, MeshError> {
    let folded = fold_log(mesh, eid, Until::End).await?;
    let stored = read_stored(mesh, eid).await?;
    let differences = differences(eid, &folded, &stored);
    Ok(Report {
        execution_id: eid.to_string(),
        events: folded.events,
        last_seq: folded.last_seq,
        equal: differences.is_empty(),
        differences,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ExecStatus, StepStatus};
    use serde_json::json;

    fn record(status: StepStatus, srid: &str) -> StepRecord {
        StepRecord {
            status,
            last_step_run_id: srid.into(),
            loop_counts: None,
            error: None,
            handled: Vec::new(),
        }
    }

    #[test]
    fn equal_records_have_no_difference_and_each_kind_of_difference_is_named() {
        let mut folded = Folded::default();
        folded.header = Some(ExecHeader {
            status: ExecStatus::Completed,
            ..ExecHeader::running("e1", Vec::new())
        });
        folded
            .steps
            .insert("start".into(), record(StepStatus::Done, "r1"));
        folded.ctx.insert("n".into(), json!(2));
        let mut stored = Stored {
            header: folded.header.clone(),
            steps: [(Keys::step("e1", "start"), record(StepStatus::Done, "r1"))].into(),
            ctx: [("n".to_string(), json!(2.0))].into_iter().collect(),
            ..Stored::default()
        };
        assert_eq!(differences("e1", &folded, &stored), vec![]);

        stored.header.as_mut().unwrap().status = ExecStatus::Failed;
        stored
            .steps
            .insert(Keys::step("e1", "other"), record(StepStatus::Failed, "r9"));
        stored.ctx.insert("n".into(), json!(3));
        let what: Vec<String> = differences("e1", &folded, &stored)
            .into_iter()
            .map(|d| d.what)
            .collect();
        assert_eq!(what, ["header.status", "step \"other\"", "ctx.n"]);
    }

    #[test]
    fn the_plan_the_events_name_is_compared_with_the_stored_one() {
        let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: p }\nworkflow:\n  - step: start\n    tool: { kind: noop }\n";
        let playbook = noetl_core::load::load_playbook(yaml, "p.yaml")
            .unwrap()
            .playbook;
        let mut plan =
            crate::plan::PlanRecord::new("e1".into(), "p.yaml".into(), playbook, json!({"n": 1}));
        plan.started_ms = 10;
        let mut folded = Folded::default();
        folded.header = Some(ExecHeader::running("e1", Vec::new()));
        folded.plan = Some(crate::payloads::PlanIdentity {
            digest: crate::patches::digest(&*plan.playbook),
            playbook_ref: json!({"key": "plans/x"}),
            catalog_path: None,
            catalog_version: None,
            started_ms: 10,
            parent_iter: Value::Null,
            return_step: String::new(),
        });
        folded.workload = json!({"n": 1.0});
        let mut stored = Stored {
            header: folded.header.clone(),
            plan: Some(plan_fields(&serde_json::to_value(&plan).unwrap())),
            ..Stored::default()
        };
        let what = |folded: &Folded, stored: &Stored| -> Vec<String> {
            differences("e1", folded, stored)
                .into_iter()
                .map(|d| d.what)
                .collect()
        };
        assert!(what(&folded, &stored).is_empty());
        // A resume's start and workload not in the events.
        plan.started_ms = 50;
        plan.workload = json!({"n": 2});
        stored.plan = Some(plan_fields(&serde_json::to_value(&plan).unwrap()));
        assert_eq!(what(&folded, &stored), ["plan.workload", "plan.started_ms"]);
        // Missing while it runs; not compared once it ended, nor when an
        // older resume changed it by key only.
        stored.plan = None;
        assert_eq!(what(&folded, &stored), ["plan"]);
        folded.plan_changed_by_resume = true;
        assert!(what(&folded, &stored).is_empty());
        folded.plan_changed_by_resume = false;
        folded.header.as_mut().unwrap().status = ExecStatus::Completed;
        stored.header = folded.header.clone();
        assert!(what(&folded, &stored).is_empty());
    }

    #[test]
    fn a_running_executions_waiters_and_pause_are_compared() {
        let mut folded = Folded::default();
        folded.header = Some(ExecHeader::running("e1", Vec::new()));
        let p = crate::waiter::WaitStarted {
            signal: "go".into(),
            since: "2026-11-28T10:00:00.000Z".into(),
            timeout_at_ms: None,
            schema: None,
            command: Some("cmd".into()),
            command_ref: None,
        };
        let ev = crate::events::EventDraft {
            execution_id: "e1",
            step_run_id: "s1",
            task_run_id: "t1",
            step: "approve",
            task: "ask",
            ..Default::default()
        }
        .build(&p);
        folded.apply(1, &ev).unwrap();
        let mut waiter = folded.waits.owed("go").unwrap().clone();
        let mut stored = Stored {
            header: folded.header.clone(),
            ..Stored::default()
        };
        let what = |stored: &Stored| -> Vec<String> {
            differences("e1", &folded, stored)
                .into_iter()
                .map(|d| d.what)
                .collect()
        };
        assert_eq!(what(&stored), ["waiter \"go\""]);
        // A delivered waiter is the same waiter.
        waiter.delivered = Some(json!({"status": "ok"}));
        stored.waiters.insert("go".into(), waiter);
        assert!(what(&stored).is_empty());
        stored.paused = true;
        assert_eq!(what(&stored), ["paused"]);
    }

    #[test]
    fn an_exported_line_reads_back_as_the_event_and_its_sequence() {
        let ev = crate::events::EventDraft {
            execution_id: "e1",
            step_run_id: "r1",
            step: "s",
            ..Default::default()
        }
        .build_raw(
            crate::event_type::EventType::TaskDone,
            json!({"set_ctx": {"n": 1}}),
        );
        let line = export_line(&Logged {
            seq: 7,
            event: ev.clone(),
        })
        .unwrap();
        let back = import_line(&line, 1).unwrap();
        assert_eq!(back.seq, 7);
        assert_eq!(back.event.ts_ms, ev.ts_ms);
        assert_eq!(
            (
                back.event.event_type.as_str(),
                back.event.step_run_id.as_str()
            ),
            ("task.done", "r1")
        );
        assert_eq!(
            crate::events::payload(&back.event),
            json!({"set_ctx": {"n": 1}})
        );
        let e = import_line("{\"event_type\": \"x\"}", 3).unwrap_err();
        assert!(e.to_string().contains("line 3: no `seq`"), "{e}");
    }

    #[test]
    fn until_keeps_events_up_to_a_sequence_or_a_time() {
        let logged = |seq, ts_ms| Logged {
            seq,
            event: Event {
                ts_ms,
                ..Default::default()
            },
        };
        assert!(Until::End.keeps(&logged(9, 9)));
        assert!(Until::Seq(5).keeps(&logged(5, 100)));
        assert!(!Until::Seq(5).keeps(&logged(6, 1)));
        assert!(Until::TimeMs(100).keeps(&logged(6, 100)));
        assert!(!Until::TimeMs(100).keeps(&logged(1, 101)));
    }

    #[test]
    fn until_parses_a_sequence_number_or_a_time_and_nothing_else() {
        assert_eq!(Until::parse("12"), Some(Until::Seq(12)));
        assert_eq!(
            Until::parse("1970-01-01T00:00:01Z"),
            Some(Until::TimeMs(1000))
        );
        assert_eq!(Until::parse("yesterday"), None);
        assert_eq!(Until::parse("-3"), None);
    }
}
