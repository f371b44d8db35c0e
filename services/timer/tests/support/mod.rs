//! What the timer's tests share: the mesh in process on a private
//! nats-server (`noetl_integration::Cluster`), timer replicas on their own
//! connections, registered playbooks, and the executions a schedule
//! started, read back from the execution headers and plans.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use noetl_integration::Cluster;
use noetl_mesh::{state::ExecHeader, Mesh, MeshConfig};
use noetl_timer::cron::tick_text;
use noetl_timer::record::FiringState;
use noetl_timer::{ScheduleRecord, Schedules, Settings, TimerParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A playbook that completes at once.
pub const QUICK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: timer_quick
  path: tests/quick
workflow:
  - step: start
    tool:
      - name: hello
        kind: noop
        result: "tick {{ workload.noetl_schedule.tick }}"
"#;

/// A playbook whose one step sleeps `{{ workload.seconds }}` seconds.
pub const SLOW: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: timer_slow
  path: tests/slow
workload:
  seconds: 2
workflow:
  - step: nap
    tool:
      - name: sleep
        kind: python
        args: { seconds: "{{ workload.seconds }}" }
        code: |
          import time
          time.sleep(float(seconds))
          result = {"slept": seconds}
"#;

/// The test settings: a short poll, a grace of half a second.
pub fn settings() -> Settings {
    Settings {
        poll: Duration::from_millis(200),
        grace: Duration::from_millis(500),
    }
}

/// A running mesh with both playbooks registered.
pub async fn cluster() -> Cluster {
    let c = Cluster::start().await;
    for (path, name, yaml) in [
        ("tests/quick", "timer_quick", QUICK),
        ("tests/slow", "timer_slow", SLOW),
    ] {
        c.mesh.catalog().register(path, name, yaml).await.unwrap();
    }
    c
}

/// The schedules of the cluster's mesh.
pub fn schedules(c: &Cluster) -> Schedules {
    Schedules::new(c.mesh.schedules_kv().clone())
}

/// A schedule of `tests/quick`, created now, with default policies.
pub fn record(name: &str, cron: &str) -> ScheduleRecord {
    ScheduleRecord {
        name: name.into(),
        playbook: "tests/quick".into(),
        version: None,
        cron: cron.into(),
        tz: "UTC".into(),
        workload: Default::default(),
        overlap: Default::default(),
        catch_up: Default::default(),
        paused: false,
        created_at: tick_text(Utc::now()),
        resumed_at: None,
        state: FiringState::default(),
    }
}

/// One timer replica, on its own connection: stop it gracefully or
/// abort it (a crash).
pub struct Timer {
    /// Cancelled by [`Timer::stop`].
    pub shutdown: CancellationToken,
    /// The task.
    pub task: JoinHandle<Result<(), noetl_mesh::MeshError>>,
}

impl Timer {
    /// Start a replica.
    pub async fn start(c: &Cluster) -> Self {
        let config = MeshConfig {
            nats_url: c.server.url(),
            data_dir: c.data_dir.path().to_path_buf(),
            ..MeshConfig::default()
        };
        let mesh = Mesh::connect(config).await.expect("timer joins the mesh");
        let shutdown = CancellationToken::new();
        let params = TimerParams {
            service: noetl_mesh::runtime::ServiceParams {
                mesh,
                concurrency: 1,
                shutdown: shutdown.clone(),
            },
            settings: settings(),
        };
        let task = tokio::spawn(noetl_timer::serve_with(params));
        Self { shutdown, task }
    }

    /// Stop and wait for the end.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Every execution header, by execution id.
pub async fn headers(mesh: &Mesh) -> BTreeMap<String, ExecHeader> {
    noetl_mesh::kv::values_matching::<ExecHeader>(mesh.exec_kv(), "*")
        .await
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.unwrap()))
        .collect()
}

/// The executions started by schedule `name`, by tick: read from each
/// execution's plan (`workload.noetl_schedule`), checked against the
/// execution id the tick derives.
pub async fn runs_of(mesh: &Mesh, name: &str) -> BTreeMap<String, ExecHeader> {
    let mut out = BTreeMap::new();
    for (eid, h) in headers(mesh).await {
        let plan = mesh.plans().get(mesh, &eid).await.unwrap();
        let sched = &plan.workload["noetl_schedule"];
        if sched["name"].as_str() != Some(name) {
            continue;
        }
        let tick = sched["tick"].as_str().unwrap().to_string();
        assert_eq!(
            eid,
            noetl_timer::record::execution_id(name, &tick),
            "the run of {tick} has the tick's id"
        );
        assert!(out.insert(tick, h).is_none());
    }
    out
}

/// Wait until `pred` holds of the runs of `name` (panics after 15 s).
pub async fn wait_runs(
    mesh: &Mesh,
    name: &str,
    what: &str,
    pred: impl Fn(&BTreeMap<String, ExecHeader>) -> bool,
) -> BTreeMap<String, ExecHeader> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let runs = runs_of(mesh, name).await;
        if pred(&runs) {
            return runs;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: runs of {name} so far: {:?}",
            runs.keys()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Parse a tick.
pub fn at(s: &str) -> DateTime<Utc> {
    noetl_timer::policy::instant(s).unwrap()
}
