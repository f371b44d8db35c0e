//! What the API reads from the mesh beyond one KV get: stored events with
//! their stream sequences, and a step's last result.

use async_nats::jetstream::consumer::{pull::OrderedConfig, Consumer, DeliverPolicy};
use noetl_mesh::keys::Keys;
use noetl_mesh::{event_type::EventType, kv, Mesh, MeshError};
use serde_json::Value;

use crate::shape::events::Seen;

/// Where an ordered consumer of the event stream starts.
pub fn start_after(after: u64) -> DeliverPolicy {
    if after == 0 {
        DeliverPolicy::All
    } else {
        DeliverPolicy::ByStartSequence {
            start_sequence: after.saturating_add(1),
        }
    }
}

/// An ordered consumer on the event stream: `filter`, starting at
/// `policy` (the server drops it a few seconds after its last pull).
pub async fn consumer(
    mesh: &Mesh,
    filter: String,
    policy: DeliverPolicy,
) -> Result<Consumer<OrderedConfig>, MeshError> {
    let stream_name = mesh.subjects().events_stream();
    let setup = |e: &dyn std::fmt::Display| MeshError::Setup {
        what: format!("an ordered consumer on stream {stream_name}"),
        message: e.to_string(),
    };
    let stream = mesh
        .js()
        .get_stream(&stream_name)
        .await
        .map_err(|e| setup(&e))?;
    stream
        .create_consumer(OrderedConfig {
            filter_subject: filter,
            deliver_policy: policy,
            ..Default::default()
        })
        .await
        .map_err(|e| setup(&e))
}

/// What [`stored`] reads.
pub struct Stored {
    /// Subject filter (`<p>.evt.<eid>.>`...).
    pub filter: String,
    /// Only events after this sequence (0: from the first).
    pub after: u64,
    /// Keep the last this many (the count is of all read).
    pub keep_last: usize,
}

/// The events stored under `s.filter` after `s.after`, in stream order:
/// how many there are, and the last `s.keep_last` of them, each iteration's
/// event once in what is read ([`noetl_mesh::events::Unfolder`]). A message
/// that does not decode is skipped (and logged).
pub async fn stored(mesh: &Mesh, s: Stored) -> Result<(usize, Vec<Seen>), MeshError> {
    let mut out = std::collections::VecDeque::new();
    let mut count = 0;
    let mut unfolder = noetl_mesh::events::Unfolder::default();
    let from = noetl_mesh::events::ReadFrom::AfterSeq(s.after);
    mesh.visit_stored_events(&s.filter, from, |seq, decoded| {
        match decoded {
            Ok(event) => {
                for event in unfolder.unfold(event) {
                    count += 1;
                    out.push_back(Seen { seq, event });
                    if out.len() > s.keep_last {
                        out.pop_front();
                    }
                }
            }
            Err(e) => {
                tracing::warn!(filter = %s.filter, seq, error = %e, "skipping an event that does not decode")
            }
        }
        std::ops::ControlFlow::Continue(())
    })
    .await?;
    Ok((count, out.into()))
}

/// A step's last result: the one kept in the execution's KV (a step other
/// steps read by name, a loop's counts), else the `result` of the step's
/// last `step.done` event. `None` when it has none (not run, or not done).
pub async fn step_result(mesh: &Mesh, eid: &str, step: &str) -> Result<Option<Value>, MeshError> {
    if let Some(v) = kv::get::<Value>(mesh.exec_kv(), &Keys::result(eid, step)).await? {
        return Ok(Some(v));
    }
    let (_, done) = stored(
        mesh,
        Stored {
            filter: mesh.subjects().event(eid, EventType::StepDone.wire_name()),
            after: 0,
            keep_last: usize::MAX,
        },
    )
    .await?;
    Ok(done
        .iter()
        .rev()
        // (a step's end read unfolded: its last task's `task.done` too)
        .find(|s| s.event.step == step && s.event.event_type == EventType::StepDone.wire_name())
        .map(|s| noetl_mesh::events::payload(&s.event))
        .and_then(|p| p.get("result").cloned()))
}
