//! Server-Sent Events over the event stream: each event's `id:` is its
//! stream sequence, so a client that reconnects with `Last-Event-ID`
//! resumes after it. A reader task pulls from an ordered consumer and
//! hands the events to the response; it ends when the client goes, when
//! the API drains, or when there is nothing more to send. A read that
//! fails ends it with an `error` event naming the stream, the last `id:`
//! sent and how to resume ([`error_text`]).

use std::convert::Infallible;

use async_nats::jetstream::consumer::DeliverPolicy;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use noetl_mesh::{
    event_type::EventType,
    events::{Unfolder, CATCH_UP, FOLLOWED_ITERATIONS},
    through::read_through,
    Mesh,
};
use noetl_wire::Event;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::shape::events::{streamed, type_matches, Seen};

/// Events buffered between the reader and a slow client.
const BUFFER: usize = 64;

/// What one stream sends.
pub struct Follow {
    /// Subject filter.
    pub filter: String,
    /// Where it starts.
    pub start: DeliverPolicy,
    /// The sequence it starts after (0: none), for an execution's stream.
    pub after: u64,
    /// Keep waiting for new events once the stored ones are sent.
    pub follow: bool,
    /// An execution's stream: it ends after that execution's terminal event
    /// (or, following, once caught up with an execution already ended).
    pub execution: Option<String>,
    /// Send only event types matching this pattern (an execution's stream
    /// reads all its events, so it sees its terminal event whatever the
    /// filter; the mesh's stream filters by subject instead).
    pub only: Option<String>,
    /// Stop after this many events (0: send none).
    pub limit: Option<u64>,
    /// Ends the stream when the API drains.
    pub draining: CancellationToken,
}

/// The response: the events as Server-Sent Events, with keep-alive
/// comments while it waits.
pub fn sse(mesh: Mesh, f: Follow) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let (tx, rx) = mpsc::channel(BUFFER);
    tokio::spawn(async move {
        let scope = scope_of(&f);
        let mut last = f.after;
        if let Err(why) = pump(&mesh, f, &tx, &mut last).await {
            let text = error_text(&scope, last, &why);
            tracing::warn!(error = %text, "event stream ended early");
            let _ = tx.send(SseEvent::default().event("error").data(text)).await;
        }
    });
    let events =
        futures::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
        );
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// What a stream follows, as its `error` event names it.
fn scope_of(f: &Follow) -> String {
    match &f.execution {
        Some(eid) => format!("execution {eid}"),
        None => format!("events under {}", f.filter),
    }
}

/// The `error` event of a stream of `scope` that broke because of `cause`
/// after its last `id:` `last` (or the `Last-Event-ID` it resumed after;
/// 0: none): what broke, where it stopped and how to go on.
fn error_text(scope: &str, last: u64, cause: &str) -> String {
    match last {
        0 => format!(
            "the event stream of {scope} broke before any event with an id: {cause}; \
             reconnect to read it from the start"
        ),
        n => format!(
            "the event stream of {scope} broke after event seq {n}: {cause}; \
             reconnect with Last-Event-ID: {n} to resume after it"
        ),
    }
}

fn is_terminal(event_type: &str) -> bool {
    matches!(
        EventType::parse(event_type),
        Some(
            EventType::ExecutionCompleted
                | EventType::ExecutionFailed
                | EventType::ExecutionCancelled
        )
    )
}

/// The SSE event of `seen`; with its sequence as `id:` when `resumable`
/// (the last event its stored message stands for).
fn sse_event(seen: &Seen, resumable: bool) -> SseEvent {
    let data = serde_json::to_string(&streamed(seen)).unwrap_or_default();
    let event = SseEvent::default()
        .event(seen.event.event_type.clone())
        .data(data);
    match resumable {
        true => event.id(seen.seq.to_string()),
        false => event,
    }
}

/// The stream sequence of execution `eid`'s terminal event, if stored.
async fn terminal_seq(mesh: &Mesh, eid: &str) -> Option<u64> {
    for t in [
        EventType::ExecutionCompleted,
        EventType::ExecutionFailed,
        EventType::ExecutionCancelled,
    ] {
        if let Ok(Some(seq)) = mesh.last_event_seq(eid, t).await {
            return Some(seq);
        }
    }
    None
}

/// True when a following stream of execution `eid` that has sent
/// everything up to `position` has nothing more to wait for: its
/// terminal event is at or before `position` (sent, or resumed past), or
/// it ended and its terminal event is no longer stored.
///
/// The header is read first: the router marks the end emitted only after
/// publishing the terminal event, so when the mark is seen the event is
/// already stored and the look-up below finds it (read the other way
/// round, an event published between the two reads would be skipped).
async fn finished(mesh: &Mesh, eid: &str, position: u64) -> bool {
    let emitted = matches!(mesh.exec_header(eid).await,
        Ok(Some(h)) if h.status.is_terminal() && h.terminal_emitted);
    match terminal_seq(mesh, eid).await {
        Some(seq) => seq <= position,
        None => emitted,
    }
}

/// The events stored event `event` stands for that match `only`, each
/// with whether it is the last of them all (it gets the `id:`). A step's
/// end carrying its last task's `task.done` stands for the two, a batch of
/// loop iterations for each iteration's (a type that names the batch gets
/// them all), a `next.selected` or `token.created` for itself and the
/// `step.started` it carries (`noetl_mesh::events::unfold`); only the last
/// has an `id:`, so a client that reconnects between them resumes before
/// them all. An iteration already read from another batch report in this
/// stream is not sent again (`unfolder`: the last `FOLLOWED_ITERATIONS`
/// iterations). Also whether any of them, matched or not, is an
/// execution's terminal event.
fn readable(
    unfolder: &mut Unfolder,
    event: Event,
    only: Option<&str>,
) -> (Vec<(Event, bool)>, bool) {
    let batch = EventType::of(&event)
        .filter(|t| t.is_batch())
        .map(EventType::wire_name);
    let mut read = unfolder.unfold(event).into_iter().peekable();
    let (mut group, mut terminal) = (Vec::new(), false);
    while let Some(event) = read.next() {
        terminal |= is_terminal(&event.event_type);
        if only.is_none_or(|p| {
            type_matches(p, &event.event_type) || batch.is_some_and(|b| type_matches(p, b))
        }) {
            group.push((event, read.peek().is_none()));
        }
    }
    (group, terminal)
}

/// Whether a stored message whose events are `group` long ends the page
/// before it: a page holds at most `limit` events, so one that would pass
/// it waits for the next page (which starts after the last `id:` sent),
/// unless it comes first (a batch may stand for more than a page alone).
fn passes_limit(limit: Option<u64>, sent: u64, group: usize) -> bool {
    limit.is_some_and(|n| sent > 0 && sent + group as u64 > n)
}

/// Without `follow`, a stream sends what is stored now: through the last
/// event the stream's leader holds under the filter, since the consumer may
/// land on a replica that lags and says nothing is pending before it has it
/// (docs/architecture.md "Reading the log"). `None` when nothing is stored
/// after `f.after`: nothing to send.
async fn stored_through(mesh: &Mesh, f: &Follow) -> Result<Option<u64>, String> {
    Ok(
        match mesh
            .last_stored_event(&f.filter)
            .await
            .map_err(|e| format!("finding the last stored event: {e}"))?
        {
            Some(last) if last.seq > f.after => Some(last.seq),
            _ => None,
        },
    )
}

/// Send the events of the message at stream sequence `seq` (`group`, from
/// [`readable`]), counting them in `sent` and keeping in `last` the
/// sequence of the one with an `id:`; `false` when the client went away.
async fn send_group(
    tx: &mpsc::Sender<SseEvent>,
    group: Vec<(Event, bool)>,
    seq: u64,
    last: &mut u64,
    sent: &mut u64,
) -> bool {
    for (event, resumable) in group {
        let seen = Seen { seq, event };
        if tx.send(sse_event(&seen, resumable)).await.is_err() {
            return false;
        }
        if resumable {
            *last = seq;
        }
        *sent += 1;
    }
    true
}

// Over 80 lines on purpose: the one read loop of a stream (open, wait, decode, send, stop);
// its decisions (readable, passes_limit, read_through) are functions with tests.
/// Pull events into `tx` until there is nothing more to send, keeping in
/// `last` the sequence of the last event sent with an `id:`; the cause
/// (sent to the client in an `error` event) when the stream fails.
async fn pump(
    mesh: &Mesh,
    f: Follow,
    tx: &mpsc::Sender<SseEvent>,
    last: &mut u64,
) -> Result<(), String> {
    if f.limit == Some(0) {
        return Ok(());
    }
    let through = match f.follow {
        true => None,
        false => match stored_through(mesh, &f).await? {
            Some(seq) => Some(seq),
            None => return Ok(()),
        },
    };
    let mut consumer = crate::read::consumer(mesh, f.filter.clone(), f.start)
        .await
        .map_err(|e| format!("creating a consumer: {e}"))?;
    if let (true, Some(eid)) = (f.follow, &f.execution) {
        let pending = consumer
            .info()
            .await
            .map_err(|e| format!("reading the consumer's state: {e}"))?
            .num_pending;
        if pending == 0 && finished(mesh, eid, f.after).await {
            return Ok(());
        }
    }
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("reading the stream: {e}"))?;
    let mut sent = 0u64;
    let mut unfolder = Unfolder::bounded(FOLLOWED_ITERATIONS);
    loop {
        let stalled = async {
            match through {
                Some(_) => tokio::time::sleep(CATCH_UP).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            _ = f.draining.cancelled() => return Ok(()),
            _ = tx.closed() => return Ok(()),
            next = messages.next() => next,
            _ = stalled => return Err(format!(
                "the read has not reached stream sequence {} (the last stored under {}) \
                 within {CATCH_UP:?}: its replica lags",
                through.unwrap_or_default(),
                f.filter
            )),
        };
        let Some(m) = next else { return Ok(()) };
        let m = m.map_err(|e| format!("reading the stream: {e}"))?;
        let info = m
            .info()
            .map_err(|e| format!("reading a message's stream position: {e}"))?;
        let (seq, caught_up) = (info.stream_sequence, info.pending == 0);
        let read_all = through.is_some_and(|t| read_through(seq, info.pending, t));
        let mut terminal = false;
        match noetl_mesh::events::decode(&m) {
            Ok(event) => {
                let (group, ends) = readable(&mut unfolder, event, f.only.as_deref());
                terminal |= f.execution.is_some() && ends;
                if passes_limit(f.limit, sent, group.len())
                    || !send_group(tx, group, seq, last, &mut sent).await
                {
                    return Ok(());
                }
            }
            Err(e) => {
                tracing::warn!(subject = %m.subject, seq, error = %e, "skipping an event that does not decode");
            }
        }
        if terminal || f.limit.is_some_and(|n| sent >= n) || read_all {
            return Ok(());
        }
        if caught_up {
            if let Some(eid) = &f.execution {
                if finished(mesh, eid, seq).await {
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_event_names_the_stream_the_last_id_and_how_to_resume() {
        let follow = |execution: Option<&str>| Follow {
            filter: "noetl.events.e1.>".into(),
            start: DeliverPolicy::All,
            after: 0,
            follow: true,
            execution: execution.map(str::to_string),
            only: None,
            limit: None,
            draining: CancellationToken::new(),
        };
        let one = scope_of(&follow(Some("e1")));
        assert_eq!(one, "execution e1");
        let all = scope_of(&follow(None));
        assert_eq!(all, "events under noetl.events.e1.>");
        let text = error_text(&one, 42, "reading the stream: connection closed");
        assert!(text.contains("execution e1"), "{text}");
        assert!(text.contains("after event seq 42"), "{text}");
        assert!(text.contains("connection closed"), "{text}");
        assert!(text.contains("Last-Event-ID: 42"), "{text}");
        let first = error_text(&all, 0, "creating a consumer: timed out");
        assert!(first.contains("events under noetl.events.e1.>"), "{first}");
        assert!(first.contains("before any event"), "{first}");
        assert!(first.contains("reconnect"), "{first}");
        assert!(!first.contains('\n'), "one line: {first}");
    }

    #[test]
    fn a_page_never_passes_its_limit_unless_one_stored_message_does_alone() {
        assert!(!passes_limit(None, 10_000, 64), "no limit");
        assert!(!passes_limit(Some(5), 3, 2), "exactly the limit");
        assert!(passes_limit(Some(5), 4, 2), "one past it: the next page");
        assert!(!passes_limit(Some(5), 0, 64), "first: sent whole");
    }

    #[test]
    fn a_stored_message_reads_as_its_events_the_last_with_the_id() {
        use noetl_mesh::events::EventDraft;
        use noetl_mesh::payloads::{StepStarted, TokenCreated};
        let created = EventDraft {
            execution_id: "e1",
            ..Default::default()
        }
        .build(&TokenCreated {
            token_id: "t0".into(),
            step: "start".into(),
            arc: None,
            args: serde_json::Value::Null,
            parent: String::new(),
            started: Some(StepStarted::admitted(None, false)),
        });
        let kinds = |group: &[(Event, bool)]| {
            group
                .iter()
                .map(|(e, last)| (e.event_type.clone(), *last))
                .collect::<Vec<_>>()
        };
        let (all, terminal) = readable(&mut Unfolder::default(), created.clone(), None);
        assert_eq!(
            kinds(&all),
            [
                ("token.created".to_string(), false),
                ("step.started".to_string(), true)
            ]
        );
        assert!(!terminal);
        let (only, _) = readable(&mut Unfolder::default(), created, Some("token.*"));
        assert_eq!(kinds(&only), [("token.created".to_string(), false)]);
    }

    #[test]
    fn an_iteration_a_batch_reports_again_is_sent_once() {
        use noetl_mesh::events::{batch_completed, BatchedEnd, EventDraft};
        use noetl_mesh::payloads::{compact_end, IterationEnded, Status};
        let end = |index: u64, at_ms: u64| BatchedEnd {
            index,
            at_ms,
            end: compact_end(
                "r1",
                at_ms,
                &IterationEnded {
                    loop_run_id: "r1".into(),
                    index,
                    status: Status::Ok,
                    result: serde_json::json!({"i": index}),
                    iter: serde_json::Value::Null,
                    reduce: Default::default(),
                    error: serde_json::Value::Null,
                    handled: Vec::new(),
                    last_task: None,
                },
            ),
        };
        let report = |ends: &[BatchedEnd]| {
            let draft = EventDraft {
                execution_id: "e1",
                step_run_id: "r1",
                step: "lp",
                parent_id: "c1",
                ..Default::default()
            };
            batch_completed(draft, ends).remove(0)
        };
        let mut unfolder = Unfolder::bounded(FOLLOWED_ITERATIONS);
        let (first, _) = readable(&mut unfolder, report(&[end(0, 1), end(1, 1)]), None);
        let indices = |group: &[(Event, bool)]| {
            group
                .iter()
                .map(|(e, last)| (noetl_mesh::events::payload(e)["index"].clone(), *last))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            indices(&first),
            [(serde_json::json!(0), false), (serde_json::json!(1), true)]
        );
        // The batch ran again and reported 1 (already sent) with 2.
        let (again, _) = readable(&mut unfolder, report(&[end(1, 2), end(2, 2)]), None);
        assert_eq!(indices(&again), [(serde_json::json!(2), true)]);
    }
}
