//! The step's record and the header's compare-and-set for one boundary:
//! [`transition`] decides the header after a boundary (pure), the rest
//! writes it, from this process's cached copy when it can decide.

use noetl_mesh::{
    event_type::EventType,
    keys::Keys,
    kv::{self, Cas, RevisionCache},
    payloads::BoundaryView,
    runtime::HandlerError,
    state::{ExecHeader, ExecStatus, StepRecord, StepStatus, TokenRecord},
    Mesh, MeshError,
};
use noetl_wire::Event;
use std::sync::Arc;

use super::Caches;
use noetl_mesh::fold::step_record;

/// A step-run's boundary, as [`transition`] applies it to the header.
pub(super) struct Boundary<'a> {
    /// The step-run whose token ends.
    pub(super) step_run_id: &'a str,
    /// The tokens its arcs fired.
    pub(super) tokens: &'a [TokenRecord],
    /// Set when it failed and nothing handled the failure: the execution
    /// fails with this message.
    pub(super) failure: Option<&'a str>,
    /// The time, RFC 3339.
    pub(super) now: &'a str,
    /// The status the step's record takes.
    pub(super) status: StepStatus,
}

/// The header after boundary `b`, or `None` when its token is no longer
/// live (a redelivered boundary changes nothing). The step-run's token
/// ends; while the execution runs, an unhandled failure fails it (no token
/// stays live) and otherwise the fired tokens become live; with none live
/// left the execution is completed. A terminal execution only loses the
/// token.
pub(super) fn transition(h: &ExecHeader, b: &Boundary<'_>) -> Option<ExecHeader> {
    if !h.is_live(b.step_run_id) {
        return None;
    }
    let mut h = h.clone();
    if h.status != ExecStatus::Running {
        h.live.retain(|t| t.token_id != b.step_run_id);
        return Some(h);
    }
    match b.failure {
        // The failing step-run's token stays with the others in
        // `stopped`: a resume runs them again.
        Some(message) => h.end(ExecStatus::Failed, message, b.now),
        None => {
            h.live.retain(|t| t.token_id != b.step_run_id);
            h.live.extend(b.tokens.iter().cloned());
            if h.live.is_empty() {
                h.status = ExecStatus::Completed;
                h.ended_at = Some(b.now.to_string());
            }
        }
    }
    Some(h)
}
/// The step's record (its status, last step-run, loop counts, error) and
/// the header's compare-and-set. The record is written only while this
/// step-run's token is live (a redelivery after the header moved on must
/// not overwrite a later run's record; a token absorbed by a join says
/// nothing about the step's status), and before the header can turn
/// terminal, so whoever sees the execution end also sees how its last step
/// ended: the two writes go out together, and a transition that would end
/// the execution is held back until the record is written. A crash between
/// them repeats both, with the same content. Returns the header now stored
/// and whether this event changed it.
///
/// The usual boundary needs no read ([`apply_from_cache`]); the header is
/// read first only when this process's copy cannot decide.
pub(super) async fn record_and_apply(
    mesh: &Mesh,
    caches: &Caches,
    (ev, kind): (&Event, Option<EventType>),
    view: &BoundaryView,
    boundary: &Boundary<'_>,
) -> Result<(Arc<ExecHeader>, bool), HandlerError> {
    if !view.join {
        let from_cache = apply_from_cache(FromCache {
            mesh,
            caches,
            ev,
            record: step_record(ev, kind, view, boundary.status),
            boundary,
        })
        .await?;
        if let Some(header) = from_cache {
            return Ok((header, true));
        }
    }
    let headers = caches.headers.as_ref();
    let key = Keys::header(&ev.execution_id);
    let mut read = kv::read::<ExecHeader>(mesh.exec_kv(), &key).await?;
    // The header is gone from KV while the execution's events go on:
    // write it back from the events (this boundary, not answered yet,
    // keeps its token live there), then apply this. Read again whoever
    // wrote it: another replica handling a boundary of the same execution
    // may have written it back first (then this restore's create-only
    // write finds it there). Purged again before that read, it is written
    // back again: only events that make no header refuse the boundary.
    let mut tries = 0;
    while read.is_none() {
        use noetl_mesh::rebuild::{restore_header_found, HeaderFound};
        match restore_header_found(mesh, &ev.execution_id).await? {
            HeaderFound::None => break,
            // A late copy of a boundary of an ended execution whose state
            // was compacted: answered from the events, nothing written.
            HeaderFound::Ended(h) => return Ok((Arc::new(*h), false)),
            HeaderFound::Written | HeaderFound::There => {}
        }
        tries += 1;
        read = kv::read::<ExecHeader>(mesh.exec_kv(), &key).await?;
        if read.is_none() && tries >= kv::RESTORES {
            return Err(kv::conflict(mesh.exec_kv(), &key, tries).into());
        }
    }
    match read {
        // Not live (a redelivery after the header moved on): the header
        // just read is the answer; `transition` would change nothing.
        Some((h, _)) if !h.is_live(&ev.step_run_id) => return Ok((Arc::new(h), false)),
        Some((h, rev)) => headers.remember(&key, h, rev),
        // No header, and its events do not make one: nothing to record;
        // refused, naming the event.
        None => return Err(no_header(ev)),
    }
    if view.join {
        let done = apply_boundary(mesh, headers, ev, boundary, Ending::Allowed).await?;
        return Ok((done.header, done.applied));
    }
    let (written, first) = tokio::join!(
        write_step_record(
            mesh,
            caches,
            ev,
            step_record(ev, kind, view, boundary.status)
        ),
        apply_boundary(mesh, headers, ev, boundary, Ending::HeldBack)
    );
    written?;
    let first = first?;
    if !first.held_back {
        return Ok((first.header, first.applied));
    }
    let done = apply_boundary(mesh, headers, ev, boundary, Ending::Allowed).await?;
    Ok((done.header, done.applied))
}

/// What [`apply_from_cache`] needs.
pub(super) struct FromCache<'a> {
    mesh: &'a Mesh,
    caches: &'a Caches,
    ev: &'a Event,
    /// The step's record after this boundary.
    record: StepRecord,
    boundary: &'a Boundary<'a>,
}

/// A boundary applied without reading the header first: when this process
/// holds the header as it last wrote or read it, with the step-run's token
/// live, the step's record and the header are written together (the
/// record first when the boundary ends the execution), each only if still
/// at the revision this process saw last. Returns the header now stored, or
/// `None` (the header not written) when the copy cannot decide or the
/// header had moved on: the caller then reads it and decides again.
///
/// Within one router process the copy is never stale (every header write
/// of the process goes through it), so the outcome is the read's. With
/// several router replicas, a copy made stale by an execution another
/// replica ended (cancelled, failed, timed out) may write the record of a
/// step that did end before the header write is refused: the record is
/// then true, but later than the end.
pub(super) async fn apply_from_cache(
    c: FromCache<'_>,
) -> Result<Option<Arc<ExecHeader>>, HandlerError> {
    let FromCache {
        mesh,
        caches,
        ev,
        record,
        boundary,
    } = c;
    let header_key = Keys::header(&ev.execution_id);
    let Some((cached, revision)) = caches.headers.cached(&header_key) else {
        return Ok(None);
    };
    let Some(next) = transition(&cached, boundary) else {
        return Ok(None); // not live here: read
    };
    let record_key = Keys::step(&ev.execution_id, &ev.step);
    let record_revision = caches.records.get(&record_key);
    let store = mesh.exec_kv();
    let (recorded, applied) = if next.status.is_terminal() {
        // The end waits for the record (whoever sees the execution end
        // sees how its last step ended): one write after the other, the
        // record whatever its revision when it had moved on (the token is
        // live, so this boundary's is the step's latest record).
        let recorded = match kv::write_at(store, &record_key, &record, record_revision).await? {
            Some(r) => r,
            None => kv::put(store, &record_key, &record).await?,
        };
        (
            Ok(Some(recorded)),
            kv::write_at(store, &header_key, &next, Some(revision)).await,
        )
    } else {
        tokio::join!(
            kv::write_at(store, &record_key, &record, record_revision),
            kv::write_at(store, &header_key, &next, Some(revision)),
        )
    };
    let recorded = recorded?;
    let Some(header_revision) = applied? else {
        caches.headers.forget(&header_key);
        match recorded {
            Some(r) => caches.records.remember(&record_key, r),
            None => caches.records.forget(&record_key),
        }
        return Ok(None);
    };
    let next = Arc::new(next);
    caches
        .headers
        .remember(&header_key, next.clone(), header_revision);
    match recorded {
        Some(r) => caches.records.remember(&record_key, r),
        // The record moved on (written by an earlier run this process does
        // not remember): the token was live, so this boundary's is the
        // step's latest record.
        None => write_step_record(mesh, caches, ev, record).await?,
    }
    Ok(Some(next))
}

/// Write the step's record for `ev`, whatever its revision.
pub(super) async fn write_step_record(
    mesh: &Mesh,
    caches: &Caches,
    ev: &Event,
    record: StepRecord,
) -> Result<(), MeshError> {
    let key = Keys::step(&ev.execution_id, &ev.step);
    let revision = kv::put(mesh.exec_kv(), &key, &record).await?;
    caches.records.remember(&key, revision);
    Ok(())
}

/// Whether a header write may end the execution.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    Allowed,
    /// Not yet (the step's record is being written): keep the header and
    /// say so.
    HeldBack,
}

/// What [`apply_boundary`] did.
pub(super) struct Applied {
    /// The header now stored.
    pub(super) header: Arc<ExecHeader>,
    /// This event changed it.
    pub(super) applied: bool,
    /// It would have ended the execution, and was held back.
    pub(super) held_back: bool,
}

/// The header compare-and-set of a boundary: applied only while the
/// step-run's token is live ([`transition`]), so a redelivered event
/// changes nothing the second time.
pub(super) async fn apply_boundary(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    ev: &Event,
    boundary: &Boundary<'_>,
    ending: Ending,
) -> Result<Applied, HandlerError> {
    let mut applied = false;
    let mut held_back = false;
    let header = kv::update_cached(
        mesh.exec_kv(),
        &Keys::header(&ev.execution_id),
        headers,
        |h: Option<&ExecHeader>| {
            applied = false;
            held_back = false;
            match h.and_then(|h| transition(h, boundary)) {
                Some(next) if ending == Ending::HeldBack && next.status.is_terminal() => {
                    held_back = true;
                    Cas::Keep
                }
                Some(next) => {
                    applied = true;
                    Cas::Write(next)
                }
                None => Cas::Keep,
            }
        },
    )
    .await?;
    match header {
        Some(header) => Ok(Applied {
            header,
            applied,
            held_back,
        }),
        // Gone since it was read (purged again): transient, so the
        // redelivery writes it back from the events and applies this.
        None => Err(HandlerError::Mesh(MeshError::Kv {
            bucket: mesh.exec_kv().name.clone(),
            key: Keys::header(&ev.execution_id),
            message: format!(
                "the header went missing while {} was applied; retried",
                ev.event_type
            ),
        })),
    }
}

/// The refusal of a boundary of an execution that has no header.
fn no_header(ev: &Event) -> HandlerError {
    HandlerError::Refused(format!(
        "{} for execution {} which has no header",
        ev.event_type, ev.execution_id
    ))
}
