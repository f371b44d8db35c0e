//! Compaction of executions that have ended: their KV state (header, step
//! records, plan, `ctx`, loop runs) removed, their events kept in the event
//! stream. Which executions may go is a plain function ([`cleanable`]);
//! [`crate::Mesh::forget_execution`] removes one.

use crate::keys::Keys;
use crate::state::ExecHeader;
use crate::{Mesh, MeshError};

/// The executions among `headers` whose KV state may be removed: ended at
/// least `older_than_ms` before `now_ms`, with no execution of their tree
/// (parent or child) still running. Sorted by id.
pub fn cleanable(headers: &[ExecHeader], now_ms: u64, older_than_ms: u64) -> Vec<String> {
    let running = |id: &str| {
        headers
            .iter()
            .any(|h| h.execution_id == id && !h.status.is_terminal())
    };
    let running_child = |id: &str| {
        headers
            .iter()
            .any(|h| h.parent_execution_id == id && !h.status.is_terminal())
    };
    let mut out: Vec<String> = headers
        .iter()
        .filter(|h| h.status.is_terminal())
        .filter(|h| {
            let ended = h.ended_at.as_deref().and_then(crate::events::parse_rfc3339);
            let ended_ms = ended
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64);
            ended_ms.is_some_and(|e| e.saturating_add(older_than_ms) <= now_ms)
        })
        .filter(|h| h.parent_execution_id.is_empty() || !running(&h.parent_execution_id))
        .filter(|h| !running_child(&h.execution_id))
        .map(|h| h.execution_id.clone())
        .collect();
    out.sort();
    out
}

impl Mesh {
    /// Remove execution `eid`'s KV state: its keys in the exec, ctx and
    /// loop buckets (the header last, so a reader never sees step records
    /// without it). Its events stay in the event stream.
    pub async fn forget_execution(&self, eid: &str) -> Result<(), MeshError> {
        crate::kv::purge_under(self.loop_kv(), eid).await?;
        // The loop bucket has no `<eid>` key itself; the others do.
        for store in [self.ctx_kv(), self.exec_kv()] {
            crate::kv::purge_under(store, eid).await?;
            let key = Keys::header(eid);
            store.purge(&key).await.map_err(|e| MeshError::Kv {
                bucket: store.name.clone(),
                key,
                message: e.to_string(),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ExecStatus;

    fn header(id: &str, status: ExecStatus, ended: Option<&str>, parent: &str) -> ExecHeader {
        let mut h: ExecHeader = serde_json::from_value(serde_json::json!({
            "execution_id": id,
            "status": "running",
            "playbook": "p",
            "source": "p@v1",
            "live": [],
            "started_at": "2026-01-01T00:00:00Z",
        }))
        .expect("a header");
        h.status = status;
        h.ended_at = ended.map(str::to_string);
        h.parent_execution_id = parent.to_string();
        h
    }

    #[test]
    fn only_executions_ended_long_enough_ago_with_no_running_tree_go() {
        let now = 1_767_229_200_000; // 2026-01-01T01:00:00Z
        let old = Some("2026-01-01T00:00:00Z");
        let recent = Some("2026-01-01T00:59:00Z");
        let headers = [
            header("done", ExecStatus::Completed, old, ""),
            header("failed", ExecStatus::Failed, old, ""),
            header("fresh", ExecStatus::Completed, recent, ""),
            header("running", ExecStatus::Running, None, ""),
            header("child_of_running", ExecStatus::Completed, old, "running"),
            header("parent", ExecStatus::Cancelled, old, ""),
            header("child", ExecStatus::Running, None, "parent"),
        ];
        let ten_minutes = 10 * 60 * 1000;
        assert_eq!(cleanable(&headers, now, ten_minutes), ["done", "failed"]);
        assert_eq!(
            cleanable(&headers, now, 0),
            ["done", "failed", "fresh"],
            "0: every ended one"
        );
    }
}
