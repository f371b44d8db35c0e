//! An execution's summary (status, `ctx`, each step's status), as
//! `noetl exec status` and the API show it. Its own module: of an ended
//! execution whose records are missing it is the fold of the events, the
//! records written back from them on the way ([`crate::rebuild`]), and of
//! a running one whose header is missing the fold alone; the state
//! records themselves do not use either.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::fold::Folded;
use crate::keys::Keys;
use crate::replay::Until;
use crate::state::{user_ctx, ExecHeader, ExecStatus, ExecSummary, StepRecord, StepStatus};

impl crate::Mesh {
    /// Build the summary of an execution (`None` if unknown).
    pub async fn exec_summary(&self, eid: &str) -> Result<Option<ExecSummary>, crate::MeshError> {
        let Some(header) = self.exec_header(eid).await? else {
            return self.running_from_log(eid).await;
        };
        let plan = self.plans().get(self, eid).await;
        let ctx = crate::kv::get::<Value>(self.ctx_kv(), eid).await?;
        if header.status.is_terminal() && (plan.is_err() || ctx.is_none()) {
            // Lost after the services last needed them (a purge, a storage
            // fault): the summary is the events', and the records are
            // written back from them, as `noetl admin rebuild` does
            // (docs/operations.md "Rebuild"). Not read back: purged again
            // meanwhile, they would read as empty.
            match self.ended_from_log(eid, &header).await {
                Ok(Some(summary)) => return Ok(Some(summary)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(execution_id = %eid, error = %e, "records of an ended execution are missing and could not be rebuilt")
                }
            }
        }
        let mut steps = BTreeMap::new();
        if let Ok(plan) = plan {
            for step in &plan.playbook.workflow {
                let rec: Option<StepRecord> =
                    crate::kv::get(self.exec_kv(), &Keys::step(eid, &step.step)).await?;
                steps.insert(step.step.clone(), rec.map(|r| r.status));
            }
        }
        let paused = match header.status {
            ExecStatus::Running => self.pause_record(eid).await?,
            _ => None,
        };
        let queued = header.status == ExecStatus::Running && self.is_queued(eid).await?;
        let ctx = user_ctx(ctx.unwrap_or_else(|| Value::Object(Default::default())));
        Ok(Some(ExecSummary {
            paused,
            queued,
            ..summary_of(&header, ctx, &steps)
        }))
    }

    /// The summary of ended execution `eid` as its events give it, its
    /// missing records written back from them; `None` when it has no
    /// events.
    async fn ended_from_log(
        &self,
        eid: &str,
        header: &ExecHeader,
    ) -> Result<Option<ExecSummary>, crate::MeshError> {
        let (folded, log) = crate::rebuild::fold_read_again(self, eid).await?;
        if folded.events == 0 {
            return Ok(None);
        }
        crate::rebuild::write_folded(self, eid, &log, &folded).await?;
        Ok(Some(self.of_fold(eid, header, &folded).await?))
    }

    /// The summary of `eid` when its header is missing: the fold of its
    /// events when they say it runs (purged while it runs: the services
    /// write the header back at its next event, which may be an hour
    /// away), not an unknown execution; `None` when it is unknown, or
    /// ended with its records removed (`noetl admin compact`). Read only:
    /// the services write the records back.
    async fn running_from_log(&self, eid: &str) -> Result<Option<ExecSummary>, crate::MeshError> {
        let Some(folded) = self.running_fold(eid).await? else {
            return Ok(None);
        };
        let Some(header) = folded.header.as_ref() else {
            return Ok(None); // a running fold has one
        };
        Ok(Some(ExecSummary {
            paused: folded.pause.owed().cloned(),
            queued: self.is_queued(eid).await?,
            ..self.of_fold(eid, header, &folded).await?
        }))
    }

    /// The header of `eid`: the stored one, or, when it is missing and
    /// the events say the execution runs, the one they give (read only:
    /// the services write it back at the execution's next event). What
    /// a reader that must not take a purge for an unknown execution reads
    /// (the API's execution routes).
    pub async fn header_or_running(
        &self,
        eid: &str,
    ) -> Result<Option<ExecHeader>, crate::MeshError> {
        match self.exec_header(eid).await? {
            Some(h) => Ok(Some(h)),
            None => Ok(self.running_fold(eid).await?.and_then(|f| f.header)),
        }
    }

    /// Every execution's header as the lists show them (`noetl exec list`,
    /// `GET /api/executions`): the exec bucket's ([`Self::executions`]),
    /// and for each execution its events say runs whose header is missing
    /// (purged, before its next event writes it back) the one its events
    /// give (read only). Besides the bucket's scan, one listing of the
    /// events stream's subjects ([`crate::rebuild::running`]); a fold only
    /// for a header that is missing.
    pub async fn listed_executions(
        &self,
    ) -> Result<Vec<(String, Result<ExecHeader, crate::MeshError>)>, crate::MeshError> {
        let mut all = self.executions().await?;
        let stored: std::collections::HashSet<String> =
            all.iter().map(|(key, _)| key.clone()).collect();
        for eid in crate::rebuild::running(self).await? {
            let key = Keys::header(&eid);
            if stored.contains(&key) {
                continue;
            }
            if let Some(h) = self.running_fold(&eid).await?.and_then(|f| f.header) {
                all.push((key, Ok(h)));
            }
        }
        Ok(all)
    }

    /// The header of `eid`: the stored one, else the one its events give,
    /// running or ended (read only; `None` when the log has none of it).
    /// What a late copy of a command reads: after `noetl admin compact`,
    /// only the events still say that its execution ended.
    pub async fn header_or_logged(
        &self,
        eid: &str,
    ) -> Result<Option<ExecHeader>, crate::MeshError> {
        if let Some(h) = self.exec_header(eid).await? {
            return Ok(Some(h));
        }
        if !self.in_log(eid).await? {
            return Ok(None);
        }
        Ok(crate::replay::fold_log(self, eid, Until::End).await?.header)
    }

    /// Whether `eid` names an execution: its header is stored, or its
    /// events remain (its KV state compacted or purged). A request under
    /// a chosen id asks this first, so an execution whose state was
    /// compacted is not started again under its id.
    pub async fn is_known(&self, eid: &str) -> Result<bool, crate::MeshError> {
        if self.exec_header(eid).await?.is_some() {
            return Ok(true);
        }
        self.in_log(eid).await
    }

    /// Whether the event log holds execution `eid`: its first event, or
    /// an end (one refused before it started has only that). Audit
    /// records filed under an id no execution has do not count.
    ///
    /// Asked for every new execution, so it reads once when it can: the
    /// last engine event under the id (every type but the one-token
    /// `audit`), which is none for an id never used and, when it is a
    /// start or an `execution.*`, answers alone. Any other event (a
    /// signal sent before the start) leaves the question to the two reads
    /// of the start and the end.
    pub async fn in_log(&self, eid: &str) -> Result<bool, crate::MeshError> {
        let subjects = self.subjects();
        let engine = subjects.events_matching(Some(eid), "*.>");
        let Some(last) = self.last_stored_subject(&engine).await? else {
            return Ok(false);
        };
        if crate::subjects::event_parts(&last).is_some_and(|(_, t)| answers_in_log(t)) {
            return Ok(true);
        }
        let started = subjects.events_matching(Some(eid), "playbook.initialized");
        let ended = subjects.events_matching(Some(eid), "execution.*");
        let (started, ended) = tokio::join!(
            self.last_stored_event(&started),
            self.last_stored_event(&ended)
        );
        Ok(started?.is_some() || ended?.is_some())
    }

    /// Whether the events of `eid` say it ended: its last end is stored
    /// after its last `execution.resumed` (four direct reads). What a late
    /// message asks when the execution's state is gone, before it writes
    /// any back ([`crate::runtime::HandlerError::Over`]).
    pub async fn ended_in_log(&self, eid: &str) -> Result<bool, crate::MeshError> {
        use crate::event_type::EventType as T;
        let (completed, failed, cancelled, resumed) = tokio::join!(
            self.last_event_seq(eid, T::ExecutionCompleted),
            self.last_event_seq(eid, T::ExecutionFailed),
            self.last_event_seq(eid, T::ExecutionCancelled),
            self.last_event_seq(eid, T::ExecutionResumed),
        );
        let ended = [completed?, failed?, cancelled?]
            .into_iter()
            .flatten()
            .max();
        let resumed = resumed?.unwrap_or(0);
        Ok(ended.is_some_and(|e| e > resumed))
    }

    /// The fold of `eid`'s events when they say it runs; `None` when it
    /// has none (one direct read) or they say it ended.
    async fn running_fold(&self, eid: &str) -> Result<Option<Folded>, crate::MeshError> {
        let started = crate::event_type::EventType::PlaybookInitialized;
        if self.last_event_seq(eid, started).await?.is_none() {
            return Ok(None);
        }
        let folded = crate::replay::fold_log(self, eid, Until::End).await?;
        Ok(folded.is_running().then_some(folded))
    }

    /// The summary of `header` with the step states and `ctx` of `folded`,
    /// each step of its plan (stored, or the one the events name) listed.
    async fn of_fold(
        &self,
        eid: &str,
        header: &ExecHeader,
        folded: &Folded,
    ) -> Result<ExecSummary, crate::MeshError> {
        let playbook = match self.plans().get(self, eid).await {
            Ok(plan) => Some(plan.playbook.clone()),
            Err(_) => (crate::rebuild::plan_of(self, eid, folded).await?)
                .ok()
                .map(|plan| plan.playbook),
        };
        let steps: BTreeMap<String, Option<StepStatus>> = (playbook.iter())
            .flat_map(|p| p.workflow.iter())
            .map(|s| (s.step.clone(), folded.steps.get(&s.step).map(|r| r.status)))
            .collect();
        Ok(summary_of(
            header,
            Value::Object(folded.ctx.clone()),
            &steps,
        ))
    }
}

/// Whether an event of type `event_type` says its execution is in the log
/// ([`crate::Mesh::in_log`]): its start, or any `execution.*` (an end among them).
fn answers_in_log(event_type: &str) -> bool {
    event_type == crate::event_type::EventType::PlaybookInitialized.wire_name()
        || event_type
            .strip_prefix("execution.")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('.'))
}

/// The summary of `header` with `ctx` (as users see it) and each step's
/// status (`None`: not run); not paused, not queued.
fn summary_of(
    header: &ExecHeader,
    ctx: Value,
    steps: &BTreeMap<String, Option<StepStatus>>,
) -> ExecSummary {
    let steps = steps
        .iter()
        .map(|(step, status)| {
            let s = match status {
                Some(StepStatus::Done) => "done",
                Some(StepStatus::Failed) => "failed",
                Some(StepStatus::Skipped) => "skipped",
                None => "not_run",
            };
            (step.clone(), s.to_string())
        })
        .collect();
    ExecSummary {
        execution_id: header.execution_id.clone(),
        status: header.status,
        playbook: header.playbook.clone(),
        ctx,
        steps,
        error: header.error.clone(),
        started_at: header.started_at.clone(),
        ended_at: header.ended_at.clone(),
        paused: None,
        queued: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_or_an_execution_event_answers_that_the_log_holds_the_execution() {
        for t in [
            "playbook.initialized",
            "execution.completed",
            "execution.cancel_requested",
            "execution.queued",
        ] {
            assert!(answers_in_log(t), "{t}");
        }
        for t in [
            "signal.received",
            "message.dead_lettered",
            "workflow.initialized",
            "execution",
            "execution.",
            "audit",
        ] {
            assert!(!answers_in_log(t), "{t}");
        }
    }

    #[test]
    fn a_summary_names_every_step_and_those_without_a_record_not_run() {
        let mut header = ExecHeader::running("e1".to_string(), Vec::new());
        header.end(ExecStatus::Failed, "boom", "2026-12-03T00:00:00Z");
        let steps = BTreeMap::from([
            ("a".to_string(), Some(StepStatus::Done)),
            ("b".to_string(), Some(StepStatus::Failed)),
            ("c".to_string(), Some(StepStatus::Skipped)),
            ("d".to_string(), None),
        ]);
        let s = summary_of(&header, serde_json::json!({ "k": 1 }), &steps);
        assert_eq!(s.status, ExecStatus::Failed);
        assert_eq!(s.error.as_deref(), Some("boom"));
        assert_eq!(s.ctx, serde_json::json!({ "k": 1 }));
        let got: Vec<(&str, &str)> = s
            .steps
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "done"),
                ("b", "failed"),
                ("c", "skipped"),
                ("d", "not_run")
            ]
        );
        assert!(s.paused.is_none() && !s.queued);
    }
}
