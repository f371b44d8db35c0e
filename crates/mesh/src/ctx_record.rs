//! The `ctx` record of an execution (bucket `noetl_ctx`, key `<eid>`) as
//! the event log keeps it: the router creates it when the execution
//! starts, so a record missing while the execution runs was lost, and is
//! written back from the events ([`restore`]) by whoever reads or writes
//! it next (docs/architecture.md "The event log").

use serde_json::Value;

use crate::fold::Folded;
use crate::replay::{fold_log, Until};
use crate::state::{APPLIED_KEY, APPLIED_MAX};
use crate::{kv, Mesh, MeshError};

/// `ctx`'s stored form: the user's keys and the last writes applied.
pub fn stored(folded: &Folded) -> Value {
    let mut obj = folded.ctx.clone();
    let writes = folded.applied_writes();
    let keep = &writes[writes.len().saturating_sub(APPLIED_MAX)..];
    obj.insert(
        APPLIED_KEY.to_string(),
        Value::Array(keep.iter().cloned().map(Value::String).collect()),
    );
    Value::Object(obj)
}

/// What [`restore`] found.
#[derive(Debug, PartialEq)]
enum Restored {
    /// The events do not say the execution runs: nothing written.
    NotRunning,
    /// Written back from the events.
    Written,
    /// A record written meanwhile stands.
    Present,
}

/// The `ctx` record of a running execution, missing from KV (the router
/// creates it when the execution starts, so a missing one was lost),
/// written back from its events (create-only: a `ctx` written meanwhile
/// wins).
async fn restore(mesh: &Mesh, eid: &str) -> Result<Restored, MeshError> {
    let folded = fold_log(mesh, eid, Until::End).await?;
    if !folded.is_running() {
        return Ok(Restored::NotRunning);
    }
    if kv::create(mesh.ctx_kv(), eid, &stored(&folded)).await? {
        tracing::warn!(execution_id = %eid, events = folded.events, "ctx was missing: rebuilt from the events");
        return Ok(Restored::Written);
    }
    Ok(Restored::Present)
}

/// The stored `ctx` record of `eid`, written back from the events when it
/// was lost ([`restore`]); `None` for an execution its events do not say
/// is running and whose record is missing. A record purged again between
/// its rebuild and the read is rebuilt again, not read as empty.
pub async fn read(mesh: &Mesh, eid: &str) -> Result<Option<Value>, MeshError> {
    for _ in 0..kv::RESTORES {
        if let Some(stored) = kv::get::<Value>(mesh.ctx_kv(), eid).await? {
            return Ok(Some(stored));
        }
        if restore(mesh, eid).await? == Restored::NotRunning {
            return Ok(None);
        }
    }
    Err(kv::conflict(mesh.ctx_kv(), eid, kv::RESTORES))
}

/// [`kv::update`] of an execution's `ctx` record that first writes a
/// lost record back from the events ([`restore`]): the router creates
/// the record when the execution starts, so one missing while its writers
/// run was lost. The usual write costs nothing more (the missing record is
/// seen inside the compare-and-set); a write to an execution its events do
/// not say is running starts from an empty `ctx`, as before. `f` never
/// sees a missing record of a running execution: one purged again between
/// its rebuild and the write is rebuilt again, or `f` would start a new
/// `ctx` without the keys and the writes applied the events hold.
pub async fn update<F>(mesh: &Mesh, eid: &str, mut f: F) -> Result<Option<Value>, MeshError>
where
    F: FnMut(Option<&Value>) -> kv::Cas<Value>,
{
    for _ in 0..kv::RESTORES {
        let mut missing = false;
        let stored = kv::update(mesh.ctx_kv(), eid, |cur: Option<&Value>| {
            missing = cur.is_none();
            if missing {
                return kv::Cas::Keep;
            }
            f(cur)
        })
        .await?;
        if !missing {
            return Ok(stored);
        }
        if restore(mesh, eid).await? == Restored::NotRunning {
            return kv::update(mesh.ctx_kv(), eid, f).await;
        }
    }
    Err(kv::conflict(mesh.ctx_kv(), eid, kv::RESTORES))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_type::EventType;
    use crate::events::EventDraft;
    use serde_json::json;

    #[test]
    fn stored_ctx_keeps_the_user_s_keys_and_the_last_writes_applied() {
        let ev = |run: &str, n: u64| {
            let mut e = EventDraft {
                execution_id: "e1",
                step_run_id: "s",
                ..Default::default()
            }
            .build_raw(
                EventType::TaskDone,
                crate::fold::tests::task_done_payload(json!({"set_ctx": {"n": n}})),
            );
            e.task_run_id = run.into();
            e
        };
        let events: Vec<_> = (0..300u64).map(|i| ev(&format!("t{i}"), i)).collect();
        let folded = Folded::of(events.iter().enumerate().map(|(i, e)| (i as u64, e))).unwrap();
        let ctx = stored(&folded);
        assert_eq!(ctx["n"], json!(299));
        let applied = ctx[APPLIED_KEY].as_array().unwrap();
        assert_eq!(applied.len(), APPLIED_MAX);
        assert_eq!(applied.last().unwrap(), "t299");
        assert_eq!(crate::state::user_ctx(ctx), json!({"n": 299}));
    }
}
