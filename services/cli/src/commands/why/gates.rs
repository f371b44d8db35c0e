//! What `noetl exec why` reads of the gates bucket (`<p>_gates`): the
//! places an execution, or its tasks, hold in the waiting lists of
//! concurrency keys and rate limits ([`noetl_mesh::gate`]).
//! [`waits_of`] is a plain function of the records read.

use noetl_mesh::gate::Entry;
use noetl_mesh::gates::{self, Record};
use noetl_mesh::Mesh;

/// One place an execution (or one of its step-runs) waits in.
#[derive(Debug, Clone, PartialEq)]
pub enum GateWait {
    /// The execution is queued behind its playbook's concurrency key.
    Execution {
        /// The key.
        key: String,
        /// Its limit.
        limit: u32,
        /// The executions holding its slots.
        held_by: Vec<String>,
        /// 1-based place in line.
        position: usize,
    },
    /// A task of the step-run waits for a slot of its step's key.
    Task {
        /// The step-run.
        step_run_id: String,
        /// The key.
        key: String,
        /// Its limit.
        limit: u32,
        /// Who holds its slots (execution, step).
        held_by: Vec<String>,
    },
    /// A task of the step-run waits for its rate token.
    Rate {
        /// The step-run.
        step_run_id: String,
        /// The key.
        key: String,
        /// When its token is due (Unix epoch ms).
        due_ms: u64,
    },
}

fn mine(e: &Entry, eid: &str, now_ms: u64) -> bool {
    e.owner.execution_id == eid && (e.until_ms == 0 || e.until_ms > now_ms)
}

fn live_labels(holders: &[Entry], now_ms: u64) -> Vec<String> {
    holders
        .iter()
        .filter(|h| h.until_ms == 0 || h.until_ms > now_ms)
        .map(Entry::label)
        .collect()
}

/// The places `eid` waits in, from the gate records.
pub fn waits_of(records: &[Record], eid: &str, now_ms: u64) -> Vec<GateWait> {
    let mut out = Vec::new();
    for r in records {
        match r {
            Record::Execution(c) => {
                if let Some(i) = c.waiting.iter().position(|w| mine(w, eid, now_ms)) {
                    out.push(GateWait::Execution {
                        key: c.key.clone(),
                        limit: c.limit,
                        held_by: live_labels(&c.holders, now_ms),
                        position: i + 1,
                    });
                }
            }
            Record::Task(c) => {
                for w in c.waiting.iter().filter(|w| mine(w, eid, now_ms)) {
                    out.push(GateWait::Task {
                        step_run_id: w.owner.step_run_id.clone(),
                        key: c.key.clone(),
                        limit: c.limit,
                        held_by: live_labels(&c.holders, now_ms),
                    });
                }
            }
            Record::Rate(rate) => {
                for w in rate.waiting.iter().filter(|w| mine(w, eid, now_ms)) {
                    out.push(GateWait::Rate {
                        step_run_id: w.owner.step_run_id.clone(),
                        key: rate.key.clone(),
                        due_ms: w.due_ms,
                    });
                }
            }
        }
    }
    out
}

/// Read the gate records and keep the places `eid` waits in (records that
/// do not decode are skipped with a warning).
pub async fn read(mesh: &Mesh, eid: &str, now_ms: u64) -> anyhow::Result<Vec<GateWait>> {
    let mut records = Vec::new();
    for (key, r) in gates::list(mesh.gates_kv()).await? {
        match r {
            Ok(r) => records.push(r),
            Err(e) => tracing::warn!(%key, error = %e, "gate record skipped"),
        }
    }
    Ok(waits_of(&records, eid, now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_mesh::gate::{ConcRecord, Owner, RateRecord};

    fn entry(id: &str, eid: &str, step: &str, run: &str, until_ms: u64) -> Entry {
        Entry {
            id: id.into(),
            owner: Owner {
                execution_id: eid.into(),
                step: step.into(),
                step_run_id: run.into(),
            },
            until_ms,
            ..Default::default()
        }
    }

    #[test]
    fn an_execution_finds_its_places_and_who_holds_the_key() {
        let records = vec![
            Record::Execution(ConcRecord {
                key: "cust-a".into(),
                limit: 2,
                holders: vec![entry("e1", "e1", "", "", 0), entry("e2", "e2", "", "", 0)],
                waiting: vec![entry("e3", "e3", "", "", 0), entry("e4", "e4", "", "", 0)],
                ..Default::default()
            }),
            Record::Task(ConcRecord {
                key: "api".into(),
                limit: 1,
                lease_ms: 30_000,
                holders: vec![entry("c1", "e9", "fetch", "r9", 5_000)],
                waiting: vec![
                    entry("c2", "e4", "fetch", "r4", 5_000),
                    entry("c3", "e4", "fetch", "r5", 500),
                ],
            }),
            Record::Rate(RateRecord {
                key: "slow".into(),
                waiting: vec![Entry {
                    due_ms: 1_500,
                    ..entry("c4", "e4", "call", "r6", 9_000)
                }],
                ..Default::default()
            }),
        ];
        let w = waits_of(&records, "e4", 1_000);
        assert_eq!(
            w,
            vec![
                GateWait::Execution {
                    key: "cust-a".into(),
                    limit: 2,
                    held_by: vec!["e1".into(), "e2".into()],
                    position: 2
                },
                GateWait::Task {
                    step_run_id: "r4".into(),
                    key: "api".into(),
                    limit: 1,
                    held_by: vec!["e9 (step fetch)".into()]
                },
                GateWait::Rate {
                    step_run_id: "r6".into(),
                    key: "slow".into(),
                    due_ms: 1_500
                },
            ],
            "the expired place (r5) is not reported"
        );
        assert!(waits_of(&records, "e1", 1_000).is_empty());
    }
}
