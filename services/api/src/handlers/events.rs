//! `GET /api/executions/{id}/events` and `GET /api/events`: the event
//! stream as Server-Sent Events.

use std::convert::Infallible;

use async_nats::jetstream::consumer::DeliverPolicy;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, Sse};
use futures::Stream;

use crate::contract::events::{EventsQuery, StreamedEvent};
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::{ExecutionId, Params};
use crate::handlers::header;
use crate::read::start_after;
use crate::shape::events::{resume_point, type_matches, type_subject};
use crate::state::AppState;
use crate::stream::{sse, Follow};

/// `/api/events` without `follow`: events per response by default.
pub const DEFAULT_LIMIT: u64 = 1000;
/// `/api/events` without `follow`: most events per response.
pub const MAX_LIMIT: u64 = 10_000;

/// Where to resume, and the type filter, from the request.
fn start(headers: &HeaderMap, q: &EventsQuery) -> Result<(u64, String), ApiError> {
    let last = headers
        .get("last-event-id")
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let after = resume_point(last, q.after).map_err(ApiError::BadRequest)?;
    let types = type_subject(q.event_type.as_deref()).map_err(ApiError::BadRequest)?;
    Ok((after, types))
}

/// One execution's events: from its start (or after `Last-Event-ID` /
/// `after`); with `follow`, new ones until its terminal event.
#[utoipa::path(get, path = "/api/executions/{id}/events", tag = "events",
    params(("id" = String, Path, description = "Execution id"), EventsQuery,
           ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this sequence")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "`text/event-stream`: `id:` the sequence, `event:` the type, `data:` the event", content_type = "text/event-stream", body = StreamedEvent),
        (status = 400, description = "A bad `Last-Event-ID` or `type`", body = ErrorBody),
        (status = 404, description = "No such execution", body = ErrorBody)))]
pub async fn execution_events(
    State(state): State<AppState>,
    ExecutionId(id): ExecutionId,
    Params(q): Params<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let (after, types) = start(&headers, &q)?;
    header(&state.mesh, &id).await?;
    let follow = Follow {
        filter: state.mesh.subjects().events_of(&id),
        start: start_after(after),
        after,
        follow: q.follow,
        only: Some(types),
        execution: Some(id),
        limit: q.limit,
        draining: state.draining.clone(),
    };
    Ok(sse(state.mesh.clone(), follow))
}

/// Every execution's events: without `follow`, the stored ones after
/// `after` (at most `limit`); with it, new ones (or from after
/// `Last-Event-ID` / `after`) as they come.
#[utoipa::path(get, path = "/api/events", tag = "events",
    params(EventsQuery,
           ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this sequence")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "`text/event-stream`, as for one execution", content_type = "text/event-stream", body = StreamedEvent),
        (status = 400, description = "A bad `Last-Event-ID` or `type`", body = ErrorBody)))]
pub async fn all_events(
    State(state): State<AppState>,
    Params(q): Params<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let (after, types) = start(&headers, &q)?;
    let start = match (after, q.follow) {
        (0, true) => DeliverPolicy::New,
        (after, _) => start_after(after),
    };
    let limit = if q.follow {
        q.limit
    } else {
        Some(q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT))
    };
    // A `task.done` may be stored inside its step's end, an iteration's
    // start and end inside its batch's (docs/architecture.md "Events as
    // stored"): a type that names one reads every subject.
    let carried = noetl_mesh::events::CARRIED
        .iter()
        .any(|t| type_matches(&types, t.wire_name()));
    let subject = match carried {
        true => ">",
        false => types.as_str(),
    };
    let follow = Follow {
        filter: state.mesh.subjects().events_matching(None, subject),
        start,
        after,
        follow: q.follow,
        only: Some(types.clone()),
        execution: None,
        limit,
        draining: state.draining.clone(),
    };
    Ok(sse(state.mesh.clone(), follow))
}
