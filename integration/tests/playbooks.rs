//! Runs every runnable example in `playbooks/`, `playbooks/seeds/` and
//! `playbooks/legacy/migrated/` (what `noetl migrate` made of the legacy
//! examples; those with a sibling `<name>.expect.json`) through the real mesh and
//! checks status, ctx (`ctx`: values that must be there; `ctx_absent`: keys
//! that must not), step statuses and the ordered event subsequence the
//! expectation names; and checks that each migrated legacy example ends
//! exactly as its hand-written canonical twin in `playbooks/legacy/canonical/`.
//! The http examples call servers the test starts (`$ECHO_URL`, `$TLS_URL`
//! in an expectation's workload).

use std::time::Duration;

use noetl_integration::{is_subsequence, repo_root, types, Cluster};
use serde_json::Value;

/// Test-owned servers the examples' workloads name: a workload string
/// `$ECHO_URL` / `$TLS_URL` becomes the base URL of the plain-HTTP echo /
/// the self-signed HTTPS server.
struct Servers {
    echo: String,
    tls: String,
}

impl Servers {
    async fn start() -> Self {
        Self {
            echo: noetl_integration::echo::start_echo().await,
            tls: noetl_integration::echo::start_self_signed_tls(),
        }
    }

    fn resolve(&self, workload: Value) -> Value {
        match workload {
            Value::String(s) if s == "$ECHO_URL" => Value::String(self.echo.clone()),
            Value::String(s) if s == "$TLS_URL" => Value::String(self.tls.clone()),
            Value::Object(m) => m.into_iter().map(|(k, v)| (k, self.resolve(v))).collect(),
            other => other,
        }
    }

    /// The workload of `<name>.expect.json` in `dir`, resolved (null when
    /// there is none).
    fn workload_of(&self, dir: &std::path::Path, name: &str) -> Value {
        std::fs::read_to_string(dir.join(format!("{name}.expect.json")))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|e| e.get("workload").cloned())
            .map_or(Value::Null, |w| self.resolve(w))
    }
}

fn subset(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => e
            .iter()
            .all(|(k, v)| a.get(k).map(|av| subset(v, av)).unwrap_or(false)),
        (Value::Number(e), Value::Number(a)) => e.as_f64() == a.as_f64(),
        _ => expected == actual,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_runnable_example_behaves_as_expected() {
    let root = repo_root();
    let mut cases: Vec<_> = ["playbooks", "playbooks/seeds", "playbooks/legacy/migrated"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join(d)).expect("playbooks dir"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".expect.json"))
        .collect();
    cases.sort();
    let seeds = cases
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("seeds")))
        .count();
    assert!(cases.len() >= 15, "too few playbooks/*.expect.json found");
    assert!(seeds >= 3, "too few playbooks/seeds/*.expect.json found");
    let cluster = Cluster::start().await;
    let servers = Servers::start().await;
    let mut failures = Vec::new();
    for expect_path in &cases {
        let name = expect_path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".expect.json")
            .to_string();
        let folder = expect_path
            .parent()
            .unwrap()
            .strip_prefix(&root)
            .unwrap()
            .display()
            .to_string();
        let rel = format!("{folder}/{name}.yaml");
        let expect: Value =
            serde_json::from_str(&std::fs::read_to_string(expect_path).unwrap()).unwrap();
        let workload = servers.resolve(expect.get("workload").cloned().unwrap_or(Value::Null));
        let (summary, events) = cluster.run_file(&rel, workload).await;
        let status = serde_json::to_value(summary.status).unwrap();
        let mut problems = Vec::new();
        // The log is the truth: its events give every stored record.
        let replay = cluster.replay_settled(&summary.execution_id).await;
        if !replay.equal {
            problems.push(format!(
                "replay differs: {}",
                serde_json::to_string(&replay.differences).unwrap()
            ));
        }
        if let Some(s) = expect.get("status") {
            if s != &status {
                problems.push(format!(
                    "status {status} != expected {s} (error: {:?})",
                    summary.error
                ));
            }
        }
        if let Some(ctx) = expect.get("ctx") {
            if !subset(ctx, &summary.ctx) {
                problems.push(format!("ctx {} does not contain {ctx}", summary.ctx));
            }
        }
        if let Some(Value::Array(absent)) = expect.get("ctx_absent") {
            for key in absent.iter().filter_map(Value::as_str) {
                if summary.ctx.get(key).is_some() {
                    problems.push(format!("ctx has {key:?}, which must be absent"));
                }
            }
        }
        if let Some(Value::Object(steps)) = expect.get("steps") {
            for (step, want) in steps {
                let got = summary
                    .steps
                    .get(step)
                    .map(String::as_str)
                    .unwrap_or("<missing>");
                if Some(got) != want.as_str() {
                    problems.push(format!("step {step}: {got} != expected {want}"));
                }
            }
        }
        if let Some(Value::Array(seq)) = expect.get("events") {
            let want: Vec<&str> = seq.iter().filter_map(Value::as_str).collect();
            let got = types(&events);
            if !is_subsequence(&got, &want) {
                problems.push(format!("events {got:?} lack subsequence {want:?}"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!("{rel}:\n  {}", problems.join("\n  ")));
        }
    }
    cluster.stop().await;
    assert!(
        failures.is_empty(),
        "{} example(s) misbehaved:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// What `noetl migrate` made of each runnable legacy example ends as its
/// hand-written canonical twin: the same status, `ctx` and step statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrated_legacy_playbooks_end_as_their_canonical_twins() {
    let root = repo_root();
    let mut names: Vec<String> = std::fs::read_dir(root.join("playbooks/legacy/canonical"))
        .expect("playbooks/legacy/canonical")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert!(names.len() >= 6, "too few canonical twins: {names:?}");
    let cluster = Cluster::start().await;
    let servers = Servers::start().await;
    let mut failures = Vec::new();
    for name in &names {
        let migrated = format!("playbooks/legacy/migrated/{name}.yaml");
        let workload = servers.workload_of(&root.join("playbooks/legacy/migrated"), name);
        let (m, _) = cluster.run_file(&migrated, workload.clone()).await;
        let (c, _) = cluster
            .run_file(&format!("playbooks/legacy/canonical/{name}.yaml"), workload)
            .await;
        if (&m.status, &m.ctx, &m.steps) != (&c.status, &c.ctx, &c.steps) {
            failures.push(format!(
                "{migrated}: {:?} ctx {} steps {:?}; its twin: {:?} ctx {} steps {:?}",
                m.status, m.ctx, m.steps, c.status, c.ctx, c.steps
            ));
        }
    }
    cluster.stop().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhandled_failure_fails_the_execution_and_handled_failure_routes() {
    let cluster = Cluster::start().await;
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: failures }
workflow:
  - step: start
    tool:
      - name: boom
        kind: python
        code: "raise ValueError('nope')"
    next:
      arcs:
        - step: handler
          when: "{{ event.name == 'step.failed' and workload.handle }}"
  - step: handler
    tool:
      - name: note
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { handled: true } }
"#;
    let eid = cluster
        .submit(yaml, "failures.yaml", serde_json::json!({"handle": false}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "failed");
    assert!(
        s.error.as_deref().unwrap_or("").contains("ValueError"),
        "{:?}",
        s.error
    );
    assert_eq!(s.steps["start"], "failed");
    assert_eq!(s.steps["handler"], "not_run");
    let events = cluster.settled_events(&eid).await;
    assert!(types(&events).contains(&"execution.failed"));

    let eid = cluster
        .submit(yaml, "failures.yaml", serde_json::json!({"handle": true}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    assert_eq!(s.ctx["handled"], true);
    assert_eq!(s.steps["start"], "failed");
    assert_eq!(s.steps["handler"], "done");
    cluster.stop().await;
}

/// Whoever sees an execution end also sees how its last step ended: in
/// the execution bucket's history, the last step's record is written
/// before the header turns terminal, the end being decided from the
/// router's remembered revisions (no read first) as every other boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_step_s_record_is_written_before_the_header_ends_the_execution() {
    use futures::StreamExt;
    use noetl_mesh::state::{ExecHeader, StepRecord, StepStatus};
    let cluster = Cluster::start().await;
    let mut watch = cluster
        .mesh
        .exec_kv()
        .watch_all()
        .await
        .expect("watch the execution bucket");
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: record_then_end }
workflow:
  - step: start
    tool: [{ name: n, kind: noop }]
    next: { arcs: [{ step: last }] }
  - step: last
    tool: [{ name: n, kind: noop }]
"#;
    let mut eids = Vec::new();
    for _ in 0..8 {
        eids.push(
            cluster
                .submit(yaml, "record_then_end.yaml", serde_json::json!({}))
                .await,
        );
    }
    for id in &eids {
        let s = cluster.wait(id, Duration::from_secs(30)).await;
        assert_eq!(serde_json::to_value(s.status).unwrap(), "completed", "{id}");
    }
    // The revision at which each execution's last step was recorded done,
    // and the first at which its header was terminal.
    let (mut recorded, mut ended) = (
        std::collections::HashMap::new(),
        std::collections::HashMap::new(),
    );
    while ended.len() < eids.len() {
        let entry = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("every end seen in the bucket's history")
            .expect("the watch goes on")
            .expect("an entry");
        let Some(eid) = eids.iter().find(|e| entry.key.starts_with(e.as_str())) else {
            continue;
        };
        if entry.key == noetl_mesh::keys::Keys::step(eid, "last") {
            let r: StepRecord = serde_json::from_slice(&entry.value).expect("a step record");
            if r.status == StepStatus::Done {
                recorded.entry(eid.clone()).or_insert(entry.revision);
            }
        } else if entry.key == noetl_mesh::keys::Keys::header(eid) {
            let h: ExecHeader = serde_json::from_slice(&entry.value).expect("a header");
            if h.status.is_terminal() {
                ended.entry(eid.clone()).or_insert(entry.revision);
            }
        }
    }
    for id in &eids {
        let record = recorded.get(id).copied();
        assert!(
            record.is_some_and(|r| r < ended[id]),
            "{id}: the last step recorded at {record:?}, the header terminal at {}",
            ended[id]
        );
    }
    cluster.stop().await;
}

/// The router starts a step-run whose admission reads nothing itself (no
/// admission policy, not a join), the entry's too; only the other tokens
/// reach the scheduler: here the token of a step with an admission policy
/// and both tokens of a join, and in a second execution the entry token of
/// a step with a policy. Every step-run still has its `step.started`, and
/// the log replays to the records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_tokens_whose_admission_reads_something_go_to_the_scheduler() {
    use futures::StreamExt;
    let cluster = Cluster::start().await;
    // A core subscription sees every token published on the work stream.
    let mut published = cluster
        .mesh
        .client()
        .subscribe(cluster.mesh.subjects().tokens_all())
        .await
        .expect("subscribe to the token subjects");
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: started_by_the_router }
workflow:
  - step: start
    tool: [{ name: n, kind: noop }]
    next:
      spec: { mode: inclusive }
      arcs: [{ step: left }, { step: right }]
  - step: left
    tool: [{ name: n, kind: noop }]
    next: { arcs: [{ step: merge }] }
  - step: right
    spec:
      policy:
        admit:
          rules:
            - else: { then: { allow: true } }
    tool: [{ name: n, kind: noop }]
    next: { arcs: [{ step: merge }] }
  - step: merge
    spec: { join: all }
    next: { arcs: [{ step: end }] }
  - step: end
"#;
    let gated_entry = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: gated_entry }
workflow:
  - step: start
    spec:
      policy:
        admit:
          rules:
            - else: { then: { allow: true } }
    tool: [{ name: n, kind: noop }]
"#;
    let eid = cluster
        .submit(yaml, "started_by_the_router.yaml", serde_json::json!({}))
        .await;
    let gated = cluster
        .submit(gated_entry, "gated_entry.yaml", serde_json::json!({}))
        .await;
    for id in [&eid, &gated] {
        let s = cluster.wait(id, Duration::from_secs(30)).await;
        assert_eq!(
            serde_json::to_value(s.status).unwrap(),
            "completed",
            "{id}: {:?}",
            s.error
        );
    }
    let (mut scheduled, mut gated_tokens) = (Vec::new(), Vec::new());
    while let Ok(Some(msg)) =
        tokio::time::timeout(Duration::from_millis(300), published.next()).await
    {
        let token: noetl_wire::Token =
            noetl_wire::codec::decode("token", &msg.payload).expect("a token");
        if token.execution_id == eid {
            scheduled.push(token.step);
        } else if token.execution_id == gated {
            gated_tokens.push(token.step);
        }
    }
    scheduled.sort();
    assert_eq!(
        gated_tokens,
        ["start"],
        "an entry step with a policy is admitted by the scheduler"
    );
    cluster.assert_replays(&gated).await;
    let events = cluster.settled_events(&eid).await;
    let logged: Vec<String> = events
        .iter()
        .map(|e| format!("{} {}", e.event_type, e.step))
        .collect();
    assert_eq!(
        scheduled,
        ["merge", "merge", "right"],
        "the log: {logged:#?}"
    );
    for step in ["start", "left", "right", "merge", "end"] {
        assert_eq!(
            events
                .iter()
                .filter(|e| e.event_type == "step.started" && e.step == step)
                .count(),
            1,
            "one step.started for {step}: {:?}",
            types(&events)
        );
    }
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}
