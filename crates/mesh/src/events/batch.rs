//! A loop window's batches in the log (docs/architecture.md "Loop windows
//! in batches"): the `batch.completed` an executor writes for the ends of
//! a batch's iterations, and both batch events read back as the
//! per-iteration events they stand for ([`super::unfold`]).

use noetl_wire::Event;

use super::EventDraft;
use crate::event_type::EventType;

/// An iteration's end as a batch reports it ([`batch_completed`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchedEnd {
    /// The iteration.
    pub index: u64,
    /// When it ended (Unix epoch ms).
    pub at_ms: u64,
    /// Its `loop.iteration.done` / `.failed` payload in the compact form
    /// ([`crate::payloads::compact_end`]), its last task apart.
    pub end: crate::payloads::CompactedEnd,
}

/// Bytes a `batch.completed` spends around each end, and around its ends.
const END_FRAME: usize = 32;
const BATCH_FRAME: usize = 64;

/// Whether an end of `len` bytes (compact) of the loop run `loop_run_id`
/// fits a `batch.completed` (alone, at worst); a larger one is published
/// on its own, where its large fields are bounded as any event's are.
pub fn fits_a_batch(len: usize, loop_run_id: &str) -> bool {
    BATCH_FRAME + loop_run_id.len() + END_FRAME + len <= noetl_core::limits::MAX_EVENT_PAYLOAD_BYTES
}

/// The `batch.completed` events that report `ends` of the batch `draft`
/// names (its execution, loop run, step, trace and command): one event
/// while they fit the payload limit together, more when they do not. Each
/// is told apart by the indices it reports
/// ([`crate::ids::batch_key`]), so a report sent again is the same
/// event.
pub fn batch_completed(draft: EventDraft<'_>, ends: &[BatchedEnd]) -> Vec<Event> {
    let limit = noetl_core::limits::MAX_EVENT_PAYLOAD_BYTES;
    let mut out = Vec::new();
    let mut start = 0;
    while start < ends.len() {
        let mut size = BATCH_FRAME + draft.step_run_id.len();
        let mut end = start;
        while end < ends.len() {
            let more = ends[end].end.len() + 2 * END_FRAME;
            if end > start && size + more > limit {
                break;
            }
            size += more;
            end += 1;
        }
        out.push(completed_event(draft.clone(), &ends[start..end]));
        start = end;
    }
    out
}

/// One `batch.completed` of `ends`: each distinct last task written once,
/// in `tasks`, and named by its place from each end that carries it.
fn completed_event(draft: EventDraft<'_>, ends: &[BatchedEnd]) -> Event {
    use std::io::Write as _;
    let size: usize = ends.iter().map(|e| e.end.len() + 2 * END_FRAME).sum();
    let mut json = Vec::with_capacity(size + BATCH_FRAME);
    json.extend_from_slice(b"{\"loop_run_id\":");
    serde_json::to_writer(&mut json, draft.step_run_id).expect("a string serialises");
    // Each end's time is written after the first's: a few digits instead
    // of thirteen.
    let first = ends.iter().map(|e| e.at_ms).min().unwrap_or(0);
    let _ = write!(json, ",\"at\":{first}");
    // Each distinct task written once, in the order the ends first carry
    // it; each end's place for its task.
    let mut tasks: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
    let mut places: Vec<Option<usize>> = Vec::with_capacity(ends.len());
    for e in ends {
        let Some(task) = e.end.task.as_deref() else {
            places.push(None);
            continue;
        };
        let next = tasks.len();
        let place = *tasks.entry(task).or_insert(next);
        if place == next {
            json.extend_from_slice(if next == 0 { b",\"tasks\":[" } else { b"," });
            json.extend_from_slice(task);
        }
        places.push(Some(place));
    }
    if !tasks.is_empty() {
        json.push(b']');
    }
    json.extend_from_slice(b",\"ends\":[");
    for (k, (e, place)) in ends.iter().zip(&places).enumerate() {
        if k > 0 {
            json.push(b',');
        }
        json.push(b'{');
        let after = e.at_ms - first;
        if after > 0 {
            let _ = write!(json, "\"d\":{after},");
        }
        if let Some(place) = place {
            let _ = write!(json, "\"t\":{place},");
        }
        json.extend_from_slice(b"\"end\":");
        json.extend_from_slice(&e.end.end);
        json.push(b'}');
    }
    json.extend_from_slice(b"]}");
    let key = crate::ids::batch_key(ends.iter().map(|e| e.index));
    EventDraft {
        discriminator: &key,
        ..draft
    }
    .envelope(EventType::BatchCompleted, json)
}

/// The `loop.iteration.started` of each iteration of a `batch.accepted`.
pub(super) fn accepted(ev: Event) -> Vec<Event> {
    let Ok(batch) = serde_json::from_slice::<crate::payloads::BatchAccepted>(&ev.payload_json)
    else {
        return vec![ev];
    };
    batch
        .items
        .iter()
        .map(|item| {
            let index = item.index.to_string();
            let started = crate::payloads::IterationStarted {
                loop_run_id: batch.loop_run_id.clone(),
                index: item.index,
                claim: item.claim,
            };
            let mut one = EventDraft {
                execution_id: &ev.execution_id,
                step_run_id: &ev.step_run_id,
                step: &ev.step,
                trace_id: &ev.trace_id,
                discriminator: &index,
                ..Default::default()
            }
            .build(&started);
            one.ts_ms = ev.ts_ms;
            one.ts = ev.ts.clone();
            one
        })
        .collect()
}

/// The `loop.iteration.done` / `.failed` of each iteration of a
/// `batch.completed`, its payload as it would have been stored on its own
/// ([`crate::payloads::full_end`]).
pub(super) fn completed(ev: Event) -> Vec<Event> {
    use crate::payloads::BatchCompleted;
    let Ok(batch) = serde_json::from_slice::<BatchCompleted>(&ev.payload_json) else {
        return vec![ev];
    };
    let mut out = Vec::with_capacity(batch.ends.len());
    for end in &batch.ends {
        let Ok(ended) = crate::payloads::full_end(&batch, end) else {
            return vec![ev];
        };
        let index = ended.index.to_string();
        let parent = crate::ids::iteration_command_id(&batch.loop_run_id, ended.index);
        let draft = EventDraft {
            execution_id: &ev.execution_id,
            step_run_id: &ev.step_run_id,
            step: &ev.step,
            trace_id: &ev.trace_id,
            parent_id: &parent,
            discriminator: &index,
            ..Default::default()
        };
        // As the executor builds an end it publishes alone.
        let mut one = draft
            .clone()
            .build_whole(&ended)
            .unwrap_or_else(|| draft.build(&ended));
        one.ts_ms = end.at_ms(&batch);
        out.push(one);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::unfold;
    use crate::payloads::IterationStarted;
    use serde_json::Value;

    /// An iteration's end (carrying its last task's `task.done` when
    /// `last` says so) and the event an executor builds of it alone.
    fn iteration_end(
        index: u64,
        status: crate::payloads::Status,
        last: bool,
    ) -> (crate::payloads::IterationEnded, Event) {
        use crate::payloads::{IterationEnded, LastTask, TaskDone};
        let parent = crate::ids::iteration_command_id("r1", index);
        let i = index.to_string();
        let ended = IterationEnded {
            loop_run_id: "r1".into(),
            index,
            status,
            result: serde_json::json!({"i": index}),
            iter: serde_json::json!({"item": index}),
            reduce: Default::default(),
            error: Value::Null,
            handled: Vec::new(),
            last_task: last.then(|| {
                Box::new(LastTask {
                    task: "t".into(),
                    task_run_id: "tr".into(),
                    done: TaskDone {
                        index: Some(index),
                        duration_ms: 3,
                        ..TaskDone::ok(Value::Null, "continue")
                    },
                })
            }),
        };
        let mut ev = EventDraft {
            execution_id: "e1",
            step_run_id: "r1",
            step: "lp",
            trace_id: "t1",
            parent_id: &parent,
            discriminator: &i,
            ..Default::default()
        }
        .build_whole(&ended)
        .unwrap();
        ev.ts_ms = 1_000 + index;
        (ended, ev)
    }

    fn batched(ended: &crate::payloads::IterationEnded, at_ms: u64) -> BatchedEnd {
        BatchedEnd {
            index: ended.index,
            at_ms,
            end: crate::payloads::compact_end("r1", at_ms, ended),
        }
    }

    fn batch_draft() -> EventDraft<'static> {
        EventDraft {
            execution_id: "e1",
            step_run_id: "r1",
            step: "lp",
            trace_id: "t1",
            parent_id: "c1",
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_report_reads_back_as_each_iteration_s_own_end() {
        use crate::payloads::Status;
        let ends: Vec<_> = [
            (3, Status::Ok, true),
            (5, Status::Error, false),
            (9, Status::Ok, true),
        ]
        .into_iter()
        .map(|(i, s, last)| iteration_end(i, s, last))
        .collect();
        let batch: Vec<BatchedEnd> = ends.iter().map(|(e, ev)| batched(e, ev.ts_ms)).collect();
        let stored = batch_completed(batch_draft(), &batch);
        assert_eq!(stored.len(), 1, "three small ends fit one event");
        assert_eq!(stored[0].event_type, "batch.completed");
        // The same ends are the same event (a redelivered batch).
        assert_eq!(
            stored[0].event_id,
            batch_completed(batch_draft(), &batch)[0].event_id
        );
        // Each end is stored compact: no loop run, no default field.
        let text = String::from_utf8(stored[0].payload_json.clone()).unwrap();
        assert_eq!(text.matches("\"r1\"").count(), 1, "{text}");
        for absent in [
            "\"reduce\"",
            "\"attempt\"",
            "\"action\"",
            "null",
            "\"status\":\"ok\"",
        ] {
            assert!(!text.contains(absent), "{absent} in {text}");
        }
        // The first end's time once, each end's after it (the first's
        // left out: 0).
        assert_eq!(text.matches("\"at\":").count(), 1, "{text}");
        assert!(text.contains("\"at\":1003"), "{text}");
        assert!(
            text.contains("{\"d\":2,") && text.contains("{\"d\":6,"),
            "{text}"
        );
        // Read back, each is the end (and carried task.done) it stands
        // for, byte for byte as it would have been stored alone.
        let back: Vec<Event> = unfold(stored[0].clone()).collect();
        let want: Vec<Event> = ends.into_iter().flat_map(|(_, ev)| unfold(ev)).collect();
        assert_eq!(back, want);
        let types: Vec<&str> = back.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(
            types,
            [
                "task.done",
                "loop.iteration.done",
                "loop.iteration.failed",
                "task.done",
                "loop.iteration.done"
            ]
        );
        let done: crate::payloads::TaskDone = crate::payloads::decode(&back[0]).unwrap();
        assert_eq!(
            (done.index, done.attempt, done.duration_ms),
            (Some(3), 1, 3)
        );
        assert_eq!(done.action, "continue");
    }

    #[test]
    fn a_batch_written_before_the_compact_form_reads_back_the_same() {
        let (ended, ev) = iteration_end(4, crate::payloads::Status::Ok, true);
        let whole = BatchedEnd {
            index: 4,
            at_ms: ev.ts_ms,
            end: crate::payloads::CompactedEnd {
                end: serde_json::to_vec(&ended).unwrap(),
                task: None,
            },
        };
        let stored = batch_completed(batch_draft(), &[whole]);
        let back: Vec<Event> = stored.into_iter().flat_map(unfold).collect();
        assert_eq!(back, unfold(ev).collect::<Vec<_>>());
    }

    #[test]
    fn a_batch_written_with_each_end_s_whole_time_reads_back_the_same() {
        // As batches were written before the ends' times went after the
        // batch's: every end with its own `at`.
        let (ended, ev) = iteration_end(4, crate::payloads::Status::Ok, true);
        let compact = batched(&ended, ev.ts_ms).end;
        let mut json = br#"{"loop_run_id":"r1","tasks":["#.to_vec();
        json.extend_from_slice(compact.task.as_deref().unwrap());
        json.extend_from_slice(format!(r#"],"ends":[{{"at":{},"t":0,"end":"#, ev.ts_ms).as_bytes());
        json.extend_from_slice(&compact.end);
        json.extend_from_slice(b"}]}");
        let mut stored = batch_completed(batch_draft(), &[batched(&ended, ev.ts_ms)]).remove(0);
        stored.payload_json = json;
        let back: Vec<Event> = unfold(stored).collect();
        assert_eq!(back, unfold(ev).collect::<Vec<_>>());
    }

    #[test]
    fn a_batch_report_above_the_payload_limit_is_split_and_every_end_is_kept() {
        let big = "x".repeat(20_000);
        let ends: Vec<BatchedEnd> = (0..8)
            .map(|i| {
                let (mut ended, ev) = iteration_end(i, crate::payloads::Status::Ok, false);
                ended.result = serde_json::json!(big);
                batched(&ended, ev.ts_ms)
            })
            .collect();
        assert!(fits_a_batch(ends[0].end.len(), "r1"));
        assert!(!fits_a_batch(
            noetl_core::limits::MAX_EVENT_PAYLOAD_BYTES,
            "r1"
        ));
        let stored = batch_completed(batch_draft(), &ends);
        assert!(stored.len() >= 3, "{} events", stored.len());
        for ev in &stored {
            assert!(ev.payload_json.len() <= noetl_core::limits::MAX_EVENT_PAYLOAD_BYTES);
        }
        let ids: std::collections::BTreeSet<&str> =
            stored.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids.len(), stored.len(), "each part is its own event");
        let back: Vec<u64> = stored
            .into_iter()
            .flat_map(unfold)
            .map(|e| {
                crate::payloads::decode::<IterationStarted>(&e)
                    .unwrap()
                    .index
            })
            .collect();
        assert_eq!(back, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn a_batch_s_start_reads_back_as_each_iteration_s_start() {
        use crate::payloads::{BatchAccepted, BatchItem};
        let mut accepted = batch_draft().build(&BatchAccepted {
            loop_run_id: "r1".into(),
            items: vec![
                BatchItem {
                    index: 0,
                    claim: None,
                },
                BatchItem {
                    index: 1,
                    claim: Some(4),
                },
            ],
        });
        accepted.parent_id = String::new();
        let back: Vec<Event> = unfold(accepted.clone()).collect();
        let alone = |index: u64, claim| {
            let i = index.to_string();
            let mut ev = EventDraft {
                discriminator: &i,
                parent_id: "",
                ..batch_draft()
            }
            .build(&IterationStarted {
                loop_run_id: "r1".into(),
                index,
                claim,
            });
            ev.ts_ms = accepted.ts_ms;
            ev
        };
        assert_eq!(back, vec![alone(0, None), alone(1, Some(4))]);
        // One that does not decode is left whole.
        let mut bad = accepted;
        bad.payload_json = b"{}".to_vec();
        assert_eq!(unfold(bad).count(), 1);
    }

    #[test]
    fn a_reader_keeps_the_first_of_an_iteration_s_ends_that_batches_reported_twice() {
        use crate::events::Unfolder;
        use crate::payloads::Status;
        let end = |i| iteration_end(i, Status::Ok, false);
        let (e0, e1, e2) = (end(0), end(1), end(2));
        // A batch reported 0 and 1; run again before they were counted, it
        // reported 0, 1 and 2 (another report: another id); 2 was also
        // stored on its own; and an event stored alone twice.
        let first = batch_completed(batch_draft(), &[batched(&e0.0, 1), batched(&e1.0, 1)]);
        let again = batch_completed(
            batch_draft(),
            &[batched(&e0.0, 2), batched(&e1.0, 2), batched(&e2.0, 2)],
        );
        assert_ne!(first[0].event_id, again[0].event_id);
        let mut r = Unfolder::default();
        let read: Vec<Event> = [first[0].clone(), again[0].clone(), e2.1.clone()]
            .into_iter()
            .flat_map(|ev| r.unfold(ev))
            .collect();
        // Each iteration's end once, the first stored.
        let indices: Vec<(u64, u64)> = read
            .iter()
            .map(|e| {
                (
                    crate::events::payload(e)["index"].as_u64().unwrap(),
                    e.ts_ms,
                )
            })
            .collect();
        assert_eq!(indices, [(0, 1), (1, 1), (2, 2)]);
        assert_eq!(r.dropped(), 3);
        // Stored alone twice (JetStream's de-duplication failing): both
        // kept, for a check to see.
        let mut r = Unfolder::default();
        let twice = [e2.1.clone(), e2.1.clone()]
            .into_iter()
            .flat_map(|ev| r.unfold(ev));
        assert_eq!(twice.count(), 2);
        // Other events pass as they are.
        let mut r = Unfolder::default();
        let other = batch_draft().build(&crate::payloads::IterationStarted {
            loop_run_id: "r1".into(),
            index: 0,
            claim: None,
        });
        assert_eq!(r.unfold(other).len(), 1);
    }

    #[test]
    fn a_bounded_reader_drops_a_recent_repeat_and_reads_an_older_one_again() {
        use crate::events::Unfolder;
        use crate::payloads::Status;
        let ends: Vec<_> = (0..3)
            .map(|i| iteration_end(i, Status::Ok, false))
            .collect();
        let report = |n, of: &[usize]| {
            let items: Vec<_> = of.iter().map(|&i| batched(&ends[i].0, n)).collect();
            batch_completed(batch_draft(), &items)[0].clone()
        };
        let mut r = Unfolder::bounded(2);
        assert_eq!(r.unfold(report(1, &[0])).len(), 1);
        assert_eq!(r.unfold(report(2, &[1, 2])).len(), 2);
        // 1 and 2 are the last two remembered: their repeat is dropped.
        assert!(r.unfold(report(3, &[2, 1])).is_empty());
        assert_eq!(r.dropped(), 2);
        // 0 was forgotten: its repeat is read again.
        let again = r.unfold(report(4, &[0]));
        assert_eq!(crate::events::payload(&again[0])["index"], 0);
        assert_eq!(again.len(), 1);
        assert!(r.seen.len() <= 2 && r.order.len() <= 2, "bounded");
    }
}
