//! Building events: the envelope of docs/dsl.md "Events" with deterministic ids.

use std::ops::ControlFlow;

use noetl_wire::Event;
use serde_json::Value;

use crate::event_type::EventType;
use crate::id_set::{IdKey, IdSet};
use crate::ids::derive_id;
use crate::payloads::EventPayload;

mod batch;
mod reported;

pub use batch::{batch_completed, fits_a_batch, BatchedEnd};

/// The instant an RFC 3339 time names (as [`now_rfc3339`] writes them);
/// `None` when it does not parse.
pub fn parse_rfc3339(s: &str) -> Option<std::time::SystemTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(std::time::SystemTime::from)
}

/// RFC 3339 text as milliseconds since the Unix epoch; `None` when it
/// does not parse (or is before the epoch).
pub fn ms_of_rfc3339(s: &str) -> Option<u64> {
    let t = parse_rfc3339(s)?;
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// An event's time in ms since the Unix epoch: its `ts_ms`, else its
/// RFC 3339 `ts` read (a JSON-encoded event); 0 when it has neither.
pub fn time_ms(ev: &Event) -> u64 {
    if ev.ts_ms > 0 {
        return ev.ts_ms;
    }
    ms_of_rfc3339(&ev.ts).unwrap_or(0)
}

/// Current time, RFC 3339 with milliseconds, UTC.
pub fn now_rfc3339() -> String {
    rfc3339_of_ms(now_ms())
}

/// An instant in Unix epoch milliseconds as [`now_rfc3339`] writes times.
pub use crate::codec::rfc3339_of_ms;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The fields of an event besides its payload, before its id and
/// timestamp are fixed: [`EventDraft::build`] takes the payload, whose
/// type names the event's ([`EventPayload::kind`]).
#[derive(Debug, Clone, Default)]
pub struct EventDraft<'a> {
    /// Execution.
    pub execution_id: &'a str,
    /// Step-run, when applicable.
    pub step_run_id: &'a str,
    /// Task-run, when applicable.
    pub task_run_id: &'a str,
    /// Step name.
    pub step: &'a str,
    /// Task name.
    pub task: &'a str,
    /// Trace correlation.
    pub trace_id: &'a str,
    /// Causing event or message id.
    pub parent_id: &'a str,
    /// Makes ids unique when the other fields repeat (e.g. iteration index).
    pub discriminator: &'a str,
}

impl EventDraft<'_> {
    /// The event with `payload`, of the type the payload names; its id
    /// is derived from the fields, its timestamp is now.
    pub fn build<P: EventPayload>(self, payload: &P) -> Event {
        self.finish(payload.kind(), crate::payloads::to_value(payload))
    }

    /// [`Self::build`] when the payload fits an event whole; `None` when
    /// it would be stored with previews of its large fields
    /// ([`noetl_core::limits::bound_payload`]).
    pub fn build_whole<P: EventPayload>(self, payload: &P) -> Option<Event> {
        // Written straight from the payload, once: no JSON tree, no
        // second pass to measure it.
        let bytes = serde_json::to_vec(payload).expect("payload types serialise to JSON");
        if bytes.len() > noetl_core::limits::MAX_EVENT_PAYLOAD_BYTES {
            return None;
        }
        Some(self.envelope(payload.kind(), bytes))
    }

    /// A test's event of `kind` with a free-form payload: what an older
    /// or a foreign writer may have stored.
    #[cfg(test)]
    pub(crate) fn build_raw(self, kind: EventType, payload: Value) -> Event {
        self.finish(kind, payload)
    }

    fn finish(self, kind: EventType, payload: Value) -> Event {
        self.envelope(kind, bounded_json(payload))
    }

    /// The event of `kind` whose payload is the JSON `payload_json`.
    fn envelope(self, kind: EventType, payload_json: Vec<u8>) -> Event {
        let event_type = kind.wire_name();
        let event_id = derive_id(&[
            self.execution_id,
            event_type,
            self.step_run_id,
            self.task_run_id,
            self.discriminator,
        ]);
        Event {
            event_id,
            event_type: event_type.to_string(),
            // Readers write it as RFC 3339 (`codec::event_time`).
            ts: String::new(),
            ts_ms: now_ms(),
            execution_id: self.execution_id.to_string(),
            step_run_id: self.step_run_id.to_string(),
            task_run_id: self.task_run_id.to_string(),
            trace_id: self.trace_id.to_string(),
            parent_id: self.parent_id.to_string(),
            step: self.step.to_string(),
            task: self.task.to_string(),
            payload_json,
        }
    }
}

/// An event's payload as stored: a payload above the limit keeps previews
/// of its large fields (noetl_core::limits::MAX_EVENT_PAYLOAD_BYTES).
fn bounded_json(payload: Value) -> Vec<u8> {
    crate::codec::json_bytes(&noetl_core::limits::bound_payload(payload))
}

/// The form an event is stored in as protobuf (docs/architecture.md
/// "Events as stored"): without its `event_type` and `execution_id`,
/// which its subject names, and its `event_id`, which its `Nats-Msg-Id`
/// header is; [`decode_message`] restores them.
pub fn stored_form(ev: &Event) -> Event {
    Event {
        event_id: String::new(),
        event_type: String::new(),
        execution_id: String::new(),
        ts: if ev.ts_ms == 0 {
            ev.ts.clone()
        } else {
            String::new()
        },
        ..ev.clone()
    }
}

/// Decode an event message of the events stream (JSON or protobuf, whole
/// or in its [`stored_form`]): the fields the stored form leaves out come
/// from its `subject` (`<p>.evt.<execution_id>.<event_type>`) and its
/// `Nats-Msg-Id` header. A field the payload carries is kept as it is.
pub fn decode_message(
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
) -> Result<Event, crate::codec::DecodeError> {
    let mut ev = crate::codec::decode_event(payload)?;
    if ev.event_type.is_empty() || ev.execution_id.is_empty() {
        if let Some((eid, event_type)) = crate::subjects::event_parts(subject) {
            if ev.execution_id.is_empty() {
                ev.execution_id = eid.to_string();
            }
            if ev.event_type.is_empty() {
                ev.event_type = event_type.to_string();
            }
        }
    }
    if ev.event_id.is_empty() {
        if let Some(id) = headers.and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID)) {
            ev.event_id = id.as_str().to_string();
        }
    }
    if ev.event_type.is_empty() {
        return Err(crate::codec::DecodeError {
            what: "event",
            reason: format!("no event type in its payload or its subject {subject:?}"),
        });
    }
    Ok(ev)
}

/// The event types a stored event may carry inside it ([`unfold`]): a
/// reader that filters by type on the server must read every subject to
/// find these.
pub const CARRIED: [EventType; 5] = [
    EventType::TaskDone,
    EventType::StepStarted,
    EventType::LoopIterationStarted,
    EventType::LoopIterationDone,
    EventType::LoopIterationFailed,
];

/// The events a stored event stands for, as readers of the log know
/// them: the event itself, or, for the end of a step-run or iteration
/// that carries its last task's `task.done` inside it
/// ([`crate::payloads::LastTask`]), that `task.done` (the id, fields and
/// time it would have had stored on its own) followed by the end without
/// it. Both keep the stored event's sequence number where a reader pairs
/// them with one. An end whose `last_task` does not decode is left whole.
///
/// A batch of loop iterations (docs/architecture.md "Loop windows in
/// batches") stands for one event per iteration: `batch.accepted` for each
/// iteration's `loop.iteration.started`, `batch.completed` for each one's
/// `loop.iteration.done` / `.failed` (and the `task.done` it carries), each
/// with the id, fields and time it would have had stored on its own. A
/// batch event that does not decode is left whole.
///
/// A `next.selected` whose arcs carry the `step.started` of the step-runs
/// the router started itself ([`crate::payloads::SelectedArc::started`])
/// stands for itself without them, followed by each `step.started`, with
/// the id, fields and time it would have had stored on its own; so does
/// the entry's `token.created` that carries its step-run's `step.started`
/// ([`crate::payloads::TokenCreated::started`]).
pub fn unfold(ev: Event) -> impl Iterator<Item = Event> {
    let events = match EventType::of(&ev) {
        Some(EventType::BatchAccepted) => batch::accepted(ev),
        Some(EventType::BatchCompleted) => batch::completed(ev),
        Some(EventType::NextSelected) => split_started(ev),
        Some(EventType::TokenCreated) => split_entry_started(ev),
        _ => vec![ev],
    };
    events.into_iter().flat_map(|ev| {
        let (task_done, end) = split_last_task(ev);
        task_done.into_iter().chain(std::iter::once(end))
    })
}

/// How many iterations a follower of the live log remembers having read
/// ([`Unfolder::bounded`]: the API's SSE streams, `noetl events tail`), so
/// an iteration a batch reports again (its executor's ack lost) reaches it
/// once: about 150 bytes each, 2.4 MB at most per follower. A repeat
/// further back than that, or whose first report was read before the
/// follower started (an SSE reconnect), is read again.
pub const FOLLOWED_ITERATIONS: usize = 16_384;

/// [`unfold`] over a log read in stream order, each iteration's event
/// once. A batch's report is stored at least once per iteration, not
/// exactly once: a batch that comes again (redelivered after its
/// executor's ack was lost, or after one of its iterations failed to run)
/// runs what its loop run has not counted yet, and may report an
/// iteration whose end is stored already, in a report not yet counted,
/// in another report (its id is derived from the indices it carries).
/// The loop-supervisor counts each iteration once whatever it is told;
/// a reader of the log keeps the first of an iteration's events, as
/// stored, and drops a later event with its id when either came out of a
/// batch. Two copies of an event stored on its own (JetStream's
/// de-duplication failing) are both kept, for checks to see.
///
/// A reader of a finite range keeps every id ([`Unfolder::default`]); a
/// follower of a live log keeps the latest ones ([`Unfolder::bounded`]).
#[derive(Debug, Default)]
pub struct Unfolder {
    /// The ids of the iteration events read so far ([`Seen`]).
    seen: Seen,
    /// The ids of `seen` in the order read, when they are bounded.
    order: std::collections::VecDeque<IdKey>,
    /// The most ids kept (`None`: every one).
    capacity: Option<usize>,
    /// Iteration events dropped as read already.
    dropped: u64,
}

/// The ids an [`Unfolder`] has read ([`IdSet`]s: 16 bytes an engine id),
/// by whether each came out of a batch.
#[derive(Debug, Default)]
struct Seen {
    batch: IdSet,
    alone: IdSet,
}

impl Seen {
    /// Whether `id` was read, and if so whether out of a batch.
    fn get(&self, id: &IdKey) -> Option<bool> {
        if self.batch.contains_key(id) {
            Some(true)
        } else {
            self.alone.contains_key(id).then_some(false)
        }
    }

    fn insert(&mut self, id: IdKey, batch: bool) {
        match batch {
            true => self.batch.insert_key(id),
            false => self.alone.insert_key(id),
        };
    }

    /// How many ids are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.batch.len() + self.alone.len()
    }

    fn remove(&mut self, id: &IdKey) {
        self.batch.remove_key(id);
        self.alone.remove_key(id);
    }
}

impl Unfolder {
    /// An unfolder that remembers the last `capacity` iteration ids only:
    /// an iteration reported again further back than that is read again.
    pub fn bounded(capacity: usize) -> Self {
        Self {
            capacity: Some(capacity.max(1)),
            ..Self::default()
        }
    }

    /// Remember `id` (read first now, `batch` when out of a batch),
    /// forgetting the oldest beyond the capacity.
    fn remember(&mut self, id: IdKey, batch: bool) {
        let Some(capacity) = self.capacity else {
            self.seen.insert(id, batch);
            return;
        };
        self.order.push_back(id.clone());
        self.seen.insert(id, batch);
        while self.order.len() > capacity {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
    }

    /// The events stored event `ev` stands for ([`unfold`]), without the
    /// iteration events read already.
    pub fn unfold(&mut self, ev: Event) -> Vec<Event> {
        let kind = EventType::of(&ev);
        let batch = kind.is_some_and(EventType::is_batch);
        let iteration = batch
            || matches!(
                kind,
                Some(
                    EventType::LoopIterationStarted
                        | EventType::LoopIterationDone
                        | EventType::LoopIterationFailed
                )
            );
        if !iteration {
            return unfold(ev).collect();
        }
        let mut out = Vec::new();
        for e in unfold(ev) {
            let id = IdKey::of(&e.event_id);
            match self.seen.get(&id) {
                None => {
                    self.remember(id, batch);
                    out.push(e);
                }
                Some(from_batch) if batch || from_batch => self.dropped += 1,
                Some(_) => out.push(e),
            }
        }
        out
    }

    /// How many iteration events were dropped as read already.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

fn split_last_task(mut ev: Event) -> (Option<Event>, Event) {
    use EventType as T;
    let ends = matches!(
        EventType::of(&ev),
        Some(T::StepDone | T::StepFailed | T::LoopIterationDone | T::LoopIterationFailed)
    );
    if !ends || !contains(&ev.payload_json, b"\"last_task\"") {
        return (None, ev);
    }
    let mut payload = payload(&ev);
    let Some(last) = payload
        .as_object_mut()
        .and_then(|p| p.remove("last_task"))
        .and_then(|v| serde_json::from_value::<crate::payloads::LastTask>(v).ok())
    else {
        return (None, ev);
    };
    let mut task_done = EventDraft {
        execution_id: &ev.execution_id,
        step_run_id: &ev.step_run_id,
        task_run_id: &last.task_run_id,
        step: &ev.step,
        task: &last.task,
        trace_id: &ev.trace_id,
        parent_id: &ev.parent_id,
        ..Default::default()
    }
    .build(&last.done);
    task_done.ts_ms = ev.ts_ms;
    task_done.ts = ev.ts.clone();
    ev.payload_json = crate::codec::json_bytes(&payload);
    (Some(task_done), ev)
}

/// `next.selected` without the `step.started`s its arcs carry, then
/// those events (see [`unfold`]); left whole when its payload does not
/// decode.
fn split_started(mut ev: Event) -> Vec<Event> {
    if !contains(&ev.payload_json, b"\"started\"") {
        return vec![ev];
    }
    let mut payload = payload(&ev);
    let Some(arcs) = payload.get_mut("arcs").and_then(Value::as_array_mut) else {
        return vec![ev];
    };
    let mut started = Vec::new();
    for arc in arcs.iter_mut().filter_map(Value::as_object_mut) {
        let Some(body) = arc.shift_remove("started") else {
            continue;
        };
        let field = |k: &str| arc.get(k).and_then(Value::as_str).unwrap_or_default();
        let (token_id, step) = (field("token_id"), field("step"));
        let Ok(body) = serde_json::from_value::<crate::payloads::StepStarted>(body) else {
            return vec![ev];
        };
        started.push(carried_started(
            &ev,
            (token_id, step, &ev.step_run_id),
            &body,
        ));
    }
    if started.is_empty() {
        return vec![ev];
    }
    ev.payload_json = crate::codec::json_bytes(&payload);
    std::iter::once(ev).chain(started).collect()
}

/// `token.created` without the `step.started` it carries, then that
/// event (see [`unfold`]); left whole when its payload does not decode.
fn split_entry_started(mut ev: Event) -> Vec<Event> {
    if !contains(&ev.payload_json, b"\"started\"") {
        return vec![ev];
    }
    let Ok(mut created) = crate::payloads::decode_typed::<crate::payloads::TokenCreated>(&ev)
    else {
        return vec![ev];
    };
    let Some(body) = created.started.take() else {
        return vec![ev];
    };
    // The step-run's parent is the token's: the step-run that fired it
    // (none for the entry's).
    let parent = match created.parent.is_empty() {
        true => ev.step_run_id.as_str(),
        false => created.parent.as_str(),
    };
    let started = carried_started(&ev, (&created.token_id, &created.step, parent), &body);
    ev.payload_json = crate::codec::json_bytes(&crate::payloads::to_value(&created));
    vec![ev, started]
}

/// The `step.started` `body` of step-run `token_id` of `step`, fired by
/// `parent`, carried in `ev`: as it would have been stored alone, at
/// `ev`'s time.
fn carried_started(
    ev: &Event,
    (token_id, step, parent): (&str, &str, &str),
    body: &crate::payloads::StepStarted,
) -> Event {
    let mut e = EventDraft {
        execution_id: &ev.execution_id,
        step_run_id: token_id,
        step,
        trace_id: &ev.trace_id,
        parent_id: parent,
        ..Default::default()
    }
    .build(body);
    e.ts_ms = ev.ts_ms;
    e.ts = ev.ts.clone();
    e
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// [`decode_message`] of a received message.
pub fn decode(msg: &async_nats::Message) -> Result<Event, crate::codec::DecodeError> {
    decode_message(msg.subject.as_str(), msg.headers.as_ref(), &msg.payload)
}

impl crate::Mesh {
    /// Every event stored under `filter` (a subject pattern, e.g.
    /// [`crate::subjects::Subjects::events_of`]), in stream order, each
    /// decoded or its decode error, unfolded, each iteration's event once
    /// ([`Unfolder`]); read with one ordered consumer that is deleted
    /// afterwards (callers poll).
    pub async fn stored_events(
        &self,
        filter: &str,
    ) -> Result<Vec<Result<Event, crate::codec::DecodeError>>, crate::MeshError> {
        let read = self.stored_events_from(filter, None).await?;
        Ok(read.into_iter().map(|(_, ev)| ev).collect())
    }

    /// [`Self::stored_events`] from the start, or from `since_ms` (Unix
    /// epoch ms), each with its stream sequence number.
    ///
    /// Reads through what the stream's leader holds when the read starts:
    /// the ordered consumer is placed on any replica, and a follower that
    /// lags (catching up after a partition or a restart) would otherwise
    /// answer without the latest events. The leader names the last event
    /// under `filter` first, and the read goes on until it has it; a
    /// replica that does not catch up within [`CATCH_UP`] fails the read
    /// as transient.
    pub async fn stored_events_from(
        &self,
        filter: &str,
        since_ms: Option<u64>,
    ) -> Result<StoredEvents, crate::MeshError> {
        let from = since_ms.map_or(ReadFrom::Start, ReadFrom::SinceMs);
        let mut out = Vec::new();
        let mut unfolder = Unfolder::default();
        self.visit_stored_events(filter, from, |seq, ev| {
            match ev {
                Ok(ev) => out.extend(unfolder.unfold(ev).into_iter().map(|ev| (seq, Ok(ev)))),
                Err(e) => out.push((seq, Err(e))),
            }
            ControlFlow::Continue(())
        })
        .await?;
        Ok(out)
    }

    /// Every message stored under `filter` from `from`, in stream order,
    /// handed to `visit` with its stream sequence, decoded (not unfolded)
    /// or its decode error, through the last the stream's leader held when
    /// the read began (see [`Self::stored_events_from`]), or until `visit`
    /// breaks.
    pub async fn visit_stored_events(
        &self,
        filter: &str,
        from: ReadFrom,
        mut visit: impl FnMut(u64, Result<Event, crate::codec::DecodeError>) -> ControlFlow<()>,
    ) -> Result<(), crate::MeshError> {
        use crate::through::Short;
        use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
        let reader = format!("reader of {filter}");
        let failed = |e: &dyn std::fmt::Display| crate::MeshError::Consume {
            consumer: reader.clone(),
            message: e.to_string(),
        };
        let (stream, last) = self.events_and_last(filter, &reader).await?;
        let Some(last) = last.as_ref().map(LastStored::of) else {
            return Ok(());
        };
        let deliver_policy = match from {
            ReadFrom::Start => DeliverPolicy::All,
            ReadFrom::SinceMs(ms) if last.ms < ms => return Ok(()),
            ReadFrom::SinceMs(ms) => DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
                    .map_err(|e| failed(&e))?,
            },
            ReadFrom::AfterSeq(seq) if last.seq <= seq => return Ok(()),
            ReadFrom::AfterSeq(seq) => DeliverPolicy::ByStartSequence {
                start_sequence: seq.saturating_add(1),
            },
        };
        let consumer = stream
            .create_consumer(OrderedConfig {
                filter_subject: filter.to_string(),
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| failed(&e))?;
        // On the heap: reads sit deep inside handlers' futures, and a debug
        // build's future holds the consumer and its stream in each frame
        // (a test thread's stack overflowed with it inline).
        let read = Box::pin(crate::through::read(
            &stream,
            consumer,
            last.seq,
            CATCH_UP,
            |seq, m| visit(seq, decode(m)),
        ));
        read.await.map_err(|short| match short {
            Short::Stalled => failed(&format!(
                "the replica read has not reached stream sequence {} (the leader's last under \
                 the filter) within {CATCH_UP:?}",
                last.seq
            )),
            Short::Failed(e) => failed(&e),
        })
    }

    /// The last event stored under `filter`, as the event stream's leader
    /// holds it: where a read of what is stored now must get to, whichever
    /// replica its consumer lands on (docs/architecture.md "Reading the
    /// log"). `None` when nothing is stored under it.
    pub async fn last_stored_event(
        &self,
        filter: &str,
    ) -> Result<Option<LastStored>, crate::MeshError> {
        let (_, last) = self
            .events_and_last(filter, &format!("last event under {filter}"))
            .await?;
        Ok(last.as_ref().map(LastStored::of))
    }

    /// The subject of the last event stored under `filter`, as the event
    /// stream's leader holds it; `None` when nothing is stored under it.
    pub(crate) async fn last_stored_subject(
        &self,
        filter: &str,
    ) -> Result<Option<String>, crate::MeshError> {
        let (_, last) = self
            .events_and_last(filter, &format!("last event under {filter}"))
            .await?;
        Ok(last.map(|m| m.subject.to_string()))
    }

    /// The event stream, and the last message under `filter` as its
    /// leader holds it ([`crate::through::leader_last`]). Errors name
    /// `reader`.
    async fn events_and_last(
        &self,
        filter: &str,
        reader: &str,
    ) -> Result<
        (
            async_nats::jetstream::stream::Stream<()>,
            Option<async_nats::jetstream::message::StreamMessage>,
        ),
        crate::MeshError,
    > {
        let failed = |e: &dyn std::fmt::Display| crate::MeshError::Consume {
            consumer: reader.to_string(),
            message: e.to_string(),
        };
        let stream = self
            .js()
            .get_stream_no_info(self.subjects().events_stream())
            .await
            .map_err(|e| failed(&e))?;
        let last = crate::through::leader_last(&stream, filter)
            .await
            .map_err(|e| failed(&e))?;
        Ok((stream, last))
    }
}

/// The last message stored under a filter, as the stream's leader holds
/// it ([`crate::Mesh::last_stored_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastStored {
    /// Its stream sequence.
    pub seq: u64,
    /// When it was stored, Unix epoch ms.
    pub ms: u64,
}

impl LastStored {
    fn of(m: &async_nats::jetstream::message::StreamMessage) -> Self {
        Self {
            seq: m.sequence,
            ms: (m.time.unix_timestamp_nanos() / 1_000_000) as u64,
        }
    }
}

/// Where a read of the events ([`crate::Mesh::visit_stored_events`])
/// starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// The first event under the filter.
    Start,
    /// Events stored at or after this Unix epoch ms.
    SinceMs(u64),
    /// Events after this stream sequence.
    AfterSeq(u64),
}

/// How long a read of the events ([`crate::Mesh::stored_events_from`])
/// waits for its replica to deliver the next event it knows is stored.
pub const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(10);

impl crate::Mesh {
    /// Whether the router's `next.selected` answering a boundary of
    /// step-run `srid` of execution `eid` is stored (read on the rare path
    /// of a redelivered boundary that finds nothing of its own live).
    ///
    /// Read as stored, not unfolded: the answer to the step-run before
    /// carries this step-run's `step.started` when the router started it,
    /// and that event, unfolded, bears this step-run's id too.
    pub async fn boundary_answered(&self, eid: &str, srid: &str) -> Result<bool, crate::MeshError> {
        let subject = self
            .subjects()
            .event(eid, EventType::NextSelected.wire_name());
        self.any_stored_event(&subject, |ev| {
            EventType::of(ev) == Some(EventType::NextSelected) && ev.step_run_id == srid
        })
        .await
    }

    /// Whether an event stored under `filter` matches `pred`, each read as
    /// stored (not unfolded), one at a time, until the first that does.
    pub(crate) async fn any_stored_event(
        &self,
        filter: &str,
        pred: impl Fn(&Event) -> bool,
    ) -> Result<bool, crate::MeshError> {
        let mut found = false;
        self.visit_stored_events(filter, ReadFrom::Start, |_, ev| {
            found = ev.is_ok_and(|ev| pred(&ev));
            match found {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        })
        .await?;
        Ok(found)
    }

    /// The stream sequence of the last stored event of type `kind` of
    /// execution `eid` (one direct read of the stream), or `None` when it
    /// has none.
    pub async fn last_event_seq(
        &self,
        eid: &str,
        kind: EventType,
    ) -> Result<Option<u64>, crate::MeshError> {
        Ok(self.last_raw_event(eid, kind).await?.map(|m| m.sequence))
    }

    /// The last stored event of type `kind` of execution `eid` and its
    /// stream sequence (one direct read of the stream), or `None` when it
    /// has none.
    pub async fn last_event(
        &self,
        eid: &str,
        kind: EventType,
    ) -> Result<Option<(u64, Event)>, crate::MeshError> {
        let Some(m) = self.last_raw_event(eid, kind).await? else {
            return Ok(None);
        };
        let ev = decode_message(m.subject.as_str(), Some(&m.headers), &m.payload).map_err(|e| {
            crate::MeshError::Invalid(format!(
                "the last {} of execution {eid} (seq {}): {e}",
                kind.wire_name(),
                m.sequence
            ))
        })?;
        Ok(Some((m.sequence, ev)))
    }

    async fn last_raw_event(
        &self,
        eid: &str,
        kind: EventType,
    ) -> Result<Option<async_nats::jetstream::message::StreamMessage>, crate::MeshError> {
        let subject = self.subjects().event(eid, kind.wire_name());
        let reader = format!("last {} of execution {eid}", kind.wire_name());
        Ok(self.events_and_last(&subject, &reader).await?.1)
    }
}

/// Events as [`crate::Mesh::stored_events_from`] reads them: each with its
/// stream sequence number, decoded (and [`unfold`]ed: a step's end that
/// carries its last task's `task.done` is two events at one sequence) or
/// its decode error.
pub type StoredEvents = Vec<(u64, Result<Event, crate::codec::DecodeError>)>;

/// The payload of an event as JSON (`{}` when empty or invalid).
pub fn payload(event: &Event) -> Value {
    crate::codec::json_value(&event.payload_json)
        .ok()
        .filter(|v| !v.is_null())
        .unwrap_or_else(|| Value::Object(Default::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payloads::{IterationStarted, StepEnded};

    #[test]
    fn same_draft_same_id_and_the_payload_names_the_type() {
        let d = || EventDraft {
            execution_id: "e",
            step_run_id: "r",
            ..Default::default()
        };
        let done = StepEnded::done(serde_json::json!(1), Value::Null);
        let failed = StepEnded::failed(serde_json::json!({"kind": "x"}), Value::Null);
        assert_eq!(d().build(&done).event_id, d().build(&done).event_id);
        assert_eq!(d().build(&done).event_type, "step.done");
        assert_eq!(d().build(&failed).event_type, "step.failed");
        assert_ne!(d().build(&failed).event_id, d().build(&done).event_id);
        let mut other = d();
        other.discriminator = "1";
        assert_ne!(other.build(&done).event_id, d().build(&done).event_id);
        assert!(d().build(&done).ts_ms > 0);
    }

    #[test]
    fn the_stored_form_leaves_out_what_the_message_carries_and_reads_back_whole() {
        let ev = EventDraft {
            execution_id: "e1",
            step_run_id: "r1",
            step: "lp",
            ..Default::default()
        }
        .build(&IterationStarted {
            loop_run_id: "r1".into(),
            index: 3,
            claim: None,
        });
        let whole = crate::codec::encode(&ev);
        let stored = crate::codec::encode(&stored_form(&ev));
        assert!(
            stored.len() + 40 < whole.len(),
            "{} bytes stored, {} whole",
            stored.len(),
            whole.len()
        );
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, ev.event_id.as_str());
        let subject = "noetl.evt.e1.loop.iteration.started";
        let back = decode_message(subject, Some(&headers), &stored).unwrap();
        let mut want = ev.clone();
        want.ts = crate::codec::event_time(&ev);
        assert_eq!(back, want);
        // A whole event (as older versions stored them) reads as it is.
        let old = decode_message("noetl.evt.other.step.done", None, &whole).unwrap();
        assert_eq!(old.execution_id, "e1");
        assert_eq!(old.event_type, "loop.iteration.started");
        // Without a type anywhere, the event is refused, naming the subject.
        let e = decode_message("noetl.task.noop", None, &stored).unwrap_err();
        assert!(e.to_string().contains("noetl.task.noop"), "{e}");
    }

    #[test]
    fn a_next_selected_reads_back_with_the_step_started_its_arcs_carry() {
        use crate::payloads::{NextSelected, SelectedArc, StepStarted};
        let arc = |token: &str, started: Option<StepStarted>| SelectedArc {
            arc: 0,
            step: format!("to-{token}"),
            token_id: token.into(),
            args: serde_json::json!({"started": true}),
            started,
        };
        let selected = |arcs| {
            EventDraft {
                execution_id: "e1",
                step_run_id: "r1",
                step: "a",
                ..Default::default()
            }
            .build(&NextSelected {
                on: "step.done".into(),
                mode: Default::default(),
                arcs,
                error: None,
                set_ctx: None,
                set_ctx_ref: None,
            })
        };
        let ev = selected(vec![
            arc("t1", Some(StepStarted::admitted(None, true))),
            arc("t2", None),
        ]);
        let read: Vec<Event> = unfold(ev.clone()).collect();
        assert_eq!(read.len(), 2);
        let alone = EventDraft {
            execution_id: "e1",
            step_run_id: "t1",
            step: "to-t1",
            parent_id: "r1",
            ..Default::default()
        }
        .build(&StepStarted::admitted(None, true));
        assert_eq!(
            (&read[1].event_id, &read[1].payload_json, read[1].ts_ms),
            (&alone.event_id, &alone.payload_json, ev.ts_ms),
            "the id, payload and time it would have had stored alone"
        );
        assert_eq!(
            read[0],
            Event {
                ts_ms: ev.ts_ms,
                ..selected(vec![arc("t1", None), arc("t2", None)])
            },
            "the answer as written without it"
        );
        // An answer carrying none (or whose own args say "started") reads whole.
        let plain = selected(vec![arc("t2", None)]);
        assert_eq!(unfold(plain.clone()).collect::<Vec<_>>(), [plain]);
    }

    #[test]
    fn the_entry_token_created_reads_back_with_the_step_started_it_carries() {
        use crate::payloads::{StepStarted, TokenCreated};
        let created = |started: Option<StepStarted>| {
            let mut ev = EventDraft {
                execution_id: "e1",
                trace_id: "tr",
                ..Default::default()
            }
            .build(&TokenCreated {
                token_id: "t0".into(),
                step: "start".into(),
                arc: None,
                args: Value::Null,
                parent: String::new(),
                started,
            });
            ev.step = "start".into();
            ev
        };
        let ev = created(Some(StepStarted::admitted(None, false)));
        let read: Vec<Event> = unfold(ev.clone()).collect();
        assert_eq!(
            read.iter()
                .map(|e| e.event_type.as_str())
                .collect::<Vec<_>>(),
            ["token.created", "step.started"]
        );
        let alone = EventDraft {
            execution_id: "e1",
            step_run_id: "t0",
            step: "start",
            trace_id: "tr",
            ..Default::default()
        }
        .build(&StepStarted::admitted(None, false));
        assert_eq!(
            (
                &read[1].event_id,
                &read[1].payload_json,
                &read[1].step_run_id,
                &read[1].parent_id,
                read[1].ts_ms
            ),
            (
                &alone.event_id,
                &alone.payload_json,
                &alone.step_run_id,
                &alone.parent_id,
                ev.ts_ms
            ),
            "the id, payload, step-run, parent and time it would have had stored alone"
        );
        assert_eq!(
            read[0],
            Event {
                ts_ms: ev.ts_ms,
                ts: ev.ts.clone(),
                ..created(None)
            },
            "the token as written without it"
        );
        let plain = created(None);
        assert_eq!(unfold(plain.clone()).collect::<Vec<_>>(), [plain]);
    }

    #[test]
    fn the_ids_seen_say_whether_each_came_out_of_a_batch_until_forgotten() {
        let mut seen = Seen::default();
        let (a, b) = (
            IdKey::of("0123456789abcdef0123456789abcdef"),
            IdKey::of("fedcba9876543210fedcba9876543210"),
        );
        let other = IdKey::of("e1");
        assert_eq!(seen.get(&a), None);
        seen.insert(a.clone(), true);
        seen.insert(b.clone(), false);
        seen.insert(other.clone(), true);
        assert_eq!(
            (seen.get(&a), seen.get(&b), seen.get(&other)),
            (Some(true), Some(false), Some(true))
        );
        seen.remove(&a);
        seen.remove(&b);
        seen.remove(&other);
        assert_eq!(
            (seen.get(&a), seen.get(&b), seen.get(&other)),
            (None, None, None)
        );
    }
}
