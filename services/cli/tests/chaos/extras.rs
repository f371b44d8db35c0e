//! What a chaos run adds beside the playbooks of the mix: a schedule that
//! fires every second (each tick must start exactly one execution, none
//! missed, through kills of every service, the timers included, and of
//! the nats-server), and a `wait` step signalled while the kills go on
//! (each signal consumed once: the step goes on once, with its data).

use noetl_mesh::event_type::EventType;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use noetl_mesh::signal::SignalError;
use noetl_mesh::state::ExecStatus;
use noetl_mesh::{codec, Mesh};
use noetl_timer::cron::tick_text;
use noetl_timer::modes::{CatchUp, Overlap};
use noetl_timer::{ScheduleRecord, Schedules};
use noetl_wire::ExecutionRequest;
use serde_json::json;

use crate::patiently;

/// The schedule of every run.
pub const SCHEDULE: &str = "chaos_tick";

const TICK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_tick, path: chaos/tick }
workflow:
  - step: start
    tool:
      - { name: n, kind: noop }
"#;

/// A step that waits for signal `go`; its data's `n` goes into `ctx`.
const WAIT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_wait }
workflow:
  - step: start
    tool:
      - name: hold
        kind: wait
        signal: go
        schema: { type: object, required: [n], properties: { n: { type: integer } } }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { got: "{{ outcome.result.n }}" } }
"#;

/// Register the tick playbook and add the schedule (every second, every
/// missed tick caught up, runs may overlap).
pub async fn add_schedule(mesh: &Mesh) {
    let catalog = mesh.catalog();
    patiently("register the tick playbook", || {
        catalog.register("chaos/tick", "chaos_tick", TICK)
    })
    .await;
    let record = ScheduleRecord {
        name: SCHEDULE.into(),
        playbook: "chaos/tick".into(),
        version: None,
        cron: "* * * * * *".into(),
        tz: "UTC".into(),
        workload: Default::default(),
        overlap: Overlap::Allow,
        catch_up: CatchUp::Last(10_000),
        paused: false,
        created_at: tick_text(Utc::now()),
        resumed_at: None,
        state: Default::default(),
    };
    let schedules = Schedules::new(mesh.schedules_kv().clone());
    patiently("add the schedule", || schedules.add(&record)).await;
}

/// Stop the schedule firing (before the checks), once the timers have
/// fired the ticks up to `healed` (when every process runs again): a
/// timer or server down near the run's end leaves ticks to catch up, and
/// a run whose timers were down most of it would otherwise show fewer
/// ticks than its check asks for. Waits at most 30 s; the check reports
/// what did not fire.
pub async fn pause_schedule(mesh: &Mesh, healed: DateTime<Utc>) {
    let schedules = Schedules::new(mesh.schedules_kv().clone());
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        let r = patiently("read the schedule", || schedules.get(SCHEDULE)).await;
        if r.state
            .last_tick
            .as_deref()
            .is_some_and(|t| at(t) >= healed)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    patiently("pause the schedule", || {
        schedules.set_paused(SCHEDULE, true, Utc::now())
    })
    .await;
}

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .expect("a stored tick")
        .with_timezone(&Utc)
}

/// Every tick from the schedule's creation to the last it fired must have
/// started exactly one execution, each completed; nothing else ran.
pub async fn check_schedule(mesh: &Mesh, deadline: Instant) -> Vec<String> {
    let schedules = Schedules::new(mesh.schedules_kv().clone());
    let r = patiently("read the schedule", || schedules.get(SCHEDULE)).await;
    let Some(last) = r.state.last_tick.clone() else {
        return vec![format!("schedule {SCHEDULE}: no tick fired")];
    };
    let spec = r.spec().expect("the schedule's cron");
    let created = at(&r.created_at);
    let expected: Vec<String> = spec
        .ticks_in(created + chrono::Duration::seconds(1), at(&last), 100_000)
        .expect("ticks")
        .into_iter()
        .filter(|t| *t > created)
        .map(tick_text)
        .collect();
    let mut anomalies = Vec::new();
    if expected.len() < 5 {
        anomalies.push(format!(
            "schedule {SCHEDULE}: only {} ticks fired",
            expected.len()
        ));
    }
    for tick in &expected {
        let eid = r.execution_id(tick);
        if !crate::ended(mesh, &eid, deadline).await {
            anomalies.push(format!(
                "schedule {SCHEDULE}: tick {tick} ({eid}) did not end"
            ));
            continue;
        }
        let h = patiently("read a tick's header", || mesh.exec_header(&eid)).await;
        if h.as_ref().map(|h| h.status) != Some(ExecStatus::Completed) {
            anomalies.push(format!(
                "schedule {SCHEDULE}: tick {tick} ({eid}) ended {:?}",
                h.map(|h| h.status)
            ));
        }
    }
    let all = patiently("list executions", || mesh.executions()).await;
    let ticks = all
        .iter()
        .filter_map(|(_, h)| h.as_ref().ok())
        .filter(|h| h.playbook == "chaos_tick")
        .count();
    // A tick in the first second after the schedule was created fires
    // when the timer looks in time, and is skipped as missed otherwise
    // (no catch-up): either count is right, none other.
    let in_first_second = spec
        .ticks_in(created, created + chrono::Duration::seconds(1), 10)
        .expect("ticks")
        .into_iter()
        .filter(|t| *t > created)
        .count();
    if ticks < expected.len() || ticks > expected.len() + in_first_second {
        anomalies.push(format!(
            "schedule {SCHEDULE}: {ticks} executions for {} ticks (and {in_first_second} in its first second)",
            expected.len()
        ));
    }
    anomalies
}

/// Start an execution of the wait playbook under `eid`.
pub async fn submit_wait(mesh: &Mesh, eid: &str) {
    let req = ExecutionRequest {
        execution_id: eid.to_string(),
        playbook_yaml: WAIT.into(),
        source_name: "chaos/wait".into(),
        ..Default::default()
    };
    let bytes = codec::encode(&req);
    patiently("submit a wait", || async {
        mesh.publish(mesh.subjects().exec_request(), eid, bytes.clone())
            .await?
            .wait()
            .await
    })
    .await;
}

/// Signal `go` with `{n}` to `eid` until a delivery succeeds or the
/// execution has ended: how many deliveries succeeded.
pub fn signaller(mesh: Mesh, eid: String, n: u64) -> tokio::task::JoinHandle<u32> {
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            match mesh.signal(&eid, "go", json!({ "n": n }), "chaos").await {
                Ok(_) => return 1,
                Err(SignalError::Invalid { .. }) => return 0,
                Err(_) => {}
            }
            let ended = mesh
                .exec_header(&eid)
                .await
                .ok()
                .flatten()
                .is_some_and(|h| h.status.is_terminal());
            if ended {
                return 0;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        0
    })
}

/// A signalled wait completed once, with the data of the one delivery.
pub async fn check_wait(
    mesh: &Mesh,
    eid: &str,
    n: u64,
    delivered: u32,
    deadline: Instant,
) -> Vec<String> {
    if !crate::ended(mesh, eid, deadline).await {
        return vec![format!("wait {eid}: did not end")];
    }
    let summary = patiently("read a wait's summary", || mesh.exec_summary(eid)).await;
    let mut anomalies = Vec::new();
    match summary {
        Some(s) if s.status == ExecStatus::Completed && s.ctx["got"] == json!(n) => {}
        other => anomalies.push(format!(
            "wait {eid}: ended as {other:?}, expected completed with got={n}"
        )),
    }
    if delivered > 1 {
        anomalies.push(format!(
            "wait {eid}: the signal was delivered {delivered} times"
        ));
    }
    let events = crate::events_of(mesh, eid).await.unwrap_or_default();
    let received = events
        .iter()
        .filter(|e| e.event_type == EventType::SignalReceived.wire_name())
        .count();
    if received > 1 {
        anomalies.push(format!("wait {eid}: {received} signal.received events"));
    }
    anomalies
}
