//! Cursor loops (docs/dsl.md, "Cursor loops") against the machine's
//! PostgreSQL: a queue table drained by claims that run on the postgres
//! executor, every row processed exactly once, whatever is redelivered.

use std::collections::BTreeMap;
use std::time::Duration;

use noetl_integration::{Cluster, ClusterOptions};
use noetl_mesh::{credentials::Credential, event_type::EventType, state::ExecStatus};
use noetl_wire::Event;
use serde_json::{json, Value};

async fn pg() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(
        "host=127.0.0.1 port=5432 user=postgres dbname=test",
        tokio_postgres::NoTls,
    )
    .await
    .expect("the machine's PostgreSQL on 127.0.0.1:5432");
    tokio::spawn(conn);
    client
}

/// A throw-away schema with `queue` (n pending rows) and `processed` (one
/// row per iteration that ran, duplicates allowed so they show).
async fn queue(db: &tokio_postgres::Client, n: i32) -> String {
    let schema = format!("noetl_cursor_{}", uuid::Uuid::new_v4().simple());
    db.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.queue (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending',
             claims int NOT NULL DEFAULT 0, runs int NOT NULL DEFAULT 0, claimed_by text);
         INSERT INTO {schema}.queue (id) SELECT generate_series(1, {n});
         CREATE TABLE {schema}.processed (id int NOT NULL, idx int NOT NULL);"
    ))
    .await
    .unwrap();
    schema
}

/// Each row of `<schema>.queue`: id, status, claims, runs.
async fn queue_rows(db: &tokio_postgres::Client, schema: &str) -> Vec<(i32, String, i32, i32)> {
    let rows = db
        .query(
            &format!("SELECT id, status, claims, runs FROM {schema}.queue ORDER BY id"),
            &[],
        )
        .await
        .unwrap();
    (rows.iter())
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

async fn cluster(opts: ClusterOptions) -> Cluster {
    let cluster = Cluster::start_with(opts).await;
    cluster
        .mesh
        .vault()
        .put(&Credential {
            name: "db".into(),
            kind: "postgres_credential".into(),
            data: json!({"host": "127.0.0.1", "port": 5432, "user": "postgres",
                         "password": "pw-cursor-never-shown", "database": "test"}),
        })
        .await
        .unwrap();
    cluster
}

/// The playbook's claim: up to `__frame_max_rows` pending rows, counting
/// each claim of a row (a claim that runs again takes other rows).
fn plain_claim(schema: &str) -> String {
    format!(
        "          WITH c AS (
            SELECT id FROM {schema}.queue WHERE status = 'pending'
            ORDER BY id FOR UPDATE SKIP LOCKED LIMIT {{{{ __frame_max_rows }}}}
          )
          UPDATE {schema}.queue q SET status = 'claimed', claims = claims + 1
          FROM c WHERE q.id = c.id RETURNING q.id
"
    )
}

/// The claim docs/dsl.md recommends ("A claim that runs again takes the
/// same rows"): the rows marked with this claim's `__frame_claim`, done or
/// not, or else pending rows, marked and counted.
fn marked_claim(schema: &str) -> String {
    format!(
        "          WITH mine AS (
            SELECT id FROM {schema}.queue WHERE claimed_by = '{{{{ __frame_claim }}}}'
          ), c AS (
            SELECT id FROM {schema}.queue
            WHERE status = 'pending' AND NOT EXISTS (SELECT 1 FROM mine)
            ORDER BY id FOR UPDATE SKIP LOCKED LIMIT {{{{ __frame_max_rows }}}}
          ), taken AS (
            UPDATE {schema}.queue q
            SET status = 'claimed', claims = claims + 1, claimed_by = '{{{{ __frame_claim }}}}'
            FROM c WHERE q.id = c.id RETURNING q.id
          )
          SELECT id FROM taken UNION ALL SELECT id FROM mine ORDER BY id
"
    )
}

/// A cursor loop over `<schema>.queue`: claims `max_rows` rows at a time,
/// `window` claim workers; an iteration records itself and marks its row
/// done, except that a row whose id is a multiple of `requeue` goes back
/// to `pending` on its first run (0: never).
fn playbook(schema: &str, window: u32, max_rows: u32, requeue: i32) -> String {
    let again = if requeue > 0 {
        format!("CASE WHEN id % {requeue} = 0 AND runs = 0 THEN 'pending' ELSE 'done' END")
    } else {
        "'done'".to_string()
    };
    let claim = plain_claim(schema);
    format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: drain_queue }}
keychain: [{{ name: db, kind: postgres_credential }}]
workflow:
  - step: start
    loop:
      cursor:
        kind: postgres
        auth: db
        claim: |
{claim}      iterator: job
      spec:
        mode: cursor
        max_in_flight: {window}
        frame: {{ max_rows: {max_rows}, lease_seconds: 120, heartbeat_seconds: 30 }}
        policy:
          reducers: {{ processed: sum }}
    tool:
      - name: work
        kind: postgres
        auth: db
        command: |
          INSERT INTO {schema}.processed (id, idx) VALUES ({{{{ iter.job.id }}}}, {{{{ iter.index }}}});
          UPDATE {schema}.queue SET status = {again}, runs = runs + 1 WHERE id = {{{{ iter.job.id }}}}
        spec:
          policy:
            rules:
              - else:
                  then: {{ do: continue, set_ctx: {{ processed: 1 }} }}
    next:
      arcs:
        - step: end
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: end
"#
    )
}

fn payload(e: &Event) -> Value {
    serde_json::from_slice(&e.payload_json).unwrap()
}

/// Iterations in flight at most, from the event order: `started` opens
/// an index, its `done` / `failed` closes it.
fn max_in_flight(events: &[Event]) -> usize {
    let (mut open, mut max) = (0usize, 0usize);
    for e in events {
        match EventType::of(e) {
            Some(EventType::LoopIterationStarted) => {
                open += 1;
                max = max.max(open);
            }
            Some(EventType::LoopIterationDone) | Some(EventType::LoopIterationFailed) => open -= 1,
            _ => {}
        }
    }
    max
}

/// Drain `n` rows and check: every row done and claimed once (twice for
/// the requeued ones), one `processed` row per iteration, iteration indices
/// 0..total each once, `loop.done` counting them, and no more iterations
/// at once than the window.
async fn drain(opts: ClusterOptions, n: i32, window: u32, max_rows: u32, requeue: i32) {
    drain_purged(opts, n, window, max_rows, requeue, Fault::None).await
}

/// What befalls a drained loop mid-run ([`drain_purged`]).
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Every record of the loop run in the loop bucket (its record, its
    /// frames) purged once three iterations have ended.
    Purge,
    /// Its frames (the rows of its claims) alone purged then: the run
    /// stands.
    PurgeFrames,
    /// The purge, then every claim reported so far sent again as a new
    /// command (as a run rebuilt from the events may send it): the
    /// playbook's claim takes any pending rows, so a claim that ran again
    /// would take rows its duplicate report could never start.
    PurgeThenClaimAgain,
    /// Once three iterations have ended, every claim reported so far sent
    /// again unmarked (as a loop-supervisor older than the mark sends it,
    /// or as a check that read the log too early lets it through), so its
    /// SQL runs again; the playbook's claim returns the rows marked with
    /// its identity, done or not, before taking any other.
    ClaimAgainUnchecked,
}

/// [`drain`] with `fault`; under one, each iteration takes 0.3 s.
async fn drain_purged(
    opts: ClusterOptions,
    n: i32,
    window: u32,
    max_rows: u32,
    requeue: i32,
    fault: Fault,
) {
    let db = pg().await;
    let schema = queue(&db, n).await;
    let cluster = cluster(opts).await;
    let mut yaml = playbook(&schema, window, max_rows, requeue);
    if fault != Fault::None {
        yaml = yaml.replace("INSERT INTO", "SELECT pg_sleep(0.3); INSERT INTO");
    }
    if fault == Fault::ClaimAgainUnchecked {
        yaml = yaml.replace(&plain_claim(&schema), &marked_claim(&schema));
    }
    let eid = cluster.submit(&yaml, "drain_queue.yaml", json!({})).await;
    match fault {
        Fault::None => {}
        Fault::ClaimAgainUnchecked => {
            iterations_ended(&cluster, &eid, 3).await;
            claim_again(&cluster, &eid, max_rows, false).await;
        }
        _ => purge_mid_run(&cluster, &eid, fault == Fault::PurgeFrames).await,
    }
    if fault == Fault::PurgeThenClaimAgain {
        claim_again(&cluster, &eid, max_rows, true).await;
    }
    let s = cluster.wait(&eid, Duration::from_secs(120)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    let events = cluster.settled_events(&eid).await;

    let requeued = if requeue > 0 { n / requeue } else { 0 };
    let total = (n + requeued) as u64;
    // The table: every row done, claimed once per run.
    let rows = queue_rows(&db, &schema).await;
    assert_eq!(rows.len(), n as usize);
    for (id, status, claims, runs) in rows {
        let want = if requeue > 0 && id % requeue == 0 {
            2
        } else {
            1
        };
        assert_eq!(
            (status.as_str(), claims, runs),
            ("done", want, want),
            "row {id}"
        );
    }
    // One processed row per iteration; each index once.
    let processed = db
        .query(
            &format!("SELECT id, idx FROM {schema}.processed ORDER BY idx"),
            &[],
        )
        .await
        .unwrap();
    let idx: Vec<i32> = processed.iter().map(|r| r.get(1)).collect();
    assert_eq!(idx, (0..total as i32).collect::<Vec<_>>());
    let mut per_id: BTreeMap<i32, i32> = BTreeMap::new();
    for r in &processed {
        *per_id.entry(r.get(0)).or_default() += 1;
    }
    assert_eq!(per_id.len(), n as usize);

    // The events: one loop.done with the counts, one start per iteration,
    // the claims' rows adding up, the window respected.
    let done: Vec<&Event> = events
        .iter()
        .filter(|e| e.event_type == EventType::LoopDone.wire_name())
        .collect();
    assert_eq!(done.len(), 1, "exactly one loop.done");
    let counts = &payload(done[0])["counts"];
    assert_eq!(counts, &json!({"total": total, "done": total, "failed": 0}));
    let started = events
        .iter()
        .filter(|e| e.event_type == EventType::LoopIterationStarted.wire_name())
        .count();
    assert_eq!(started as u64, total);
    let claims: Vec<Value> = events
        .iter()
        .filter(|e| e.event_type == EventType::LoopClaimed.wire_name())
        .map(payload)
        .collect();
    let claimed: u64 = claims.iter().map(|c| c["count"].as_u64().unwrap()).sum();
    assert_eq!(claimed, total, "{claims:?}");
    assert!(
        claims
            .iter()
            .all(|c| c["count"].as_u64().unwrap() <= max_rows as u64),
        "a claim takes at most max_rows: {claims:?}"
    );
    assert!(
        claims.iter().any(|c| c["count"] == 0),
        "the loop ended on an empty claim"
    );
    let mut seqs: Vec<u64> = claims.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len(), claims.len(), "each claim reported once");
    assert!(max_in_flight(&events) <= window as usize);
    assert_eq!(
        s.ctx["processed"],
        json!(total),
        "the reducer counted each iteration once"
    );
    // The credential went nowhere.
    assert!(!format!("{events:?}{s:?}").contains("pw-cursor-never-shown"));

    cluster.stop().await;
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

/// Once three iterations have ended, purge every key of the execution in
/// the loop bucket: the run's record and its frames, or (`frames_only`)
/// its frames alone.
async fn purge_mid_run(cluster: &Cluster, eid: &str, frames_only: bool) {
    iterations_ended(cluster, eid, 3).await;
    let kv = cluster.mesh.loop_kv();
    let mut keys = noetl_mesh::kv::keys_under(kv, eid).await.unwrap();
    if frames_only {
        keys.retain(|k| k.contains(".frame."));
    }
    for k in &keys {
        kv.purge(k).await.unwrap();
    }
    let frames = keys.iter().any(|k| k.contains(".frame."));
    let run = keys.iter().any(|k| !k.contains(".frame."));
    assert!(
        frames && run != frames_only,
        "purged (frames only: {frames_only}): {keys:?}"
    );
}

/// Wait until `n` iterations of execution `eid` have ended.
async fn iterations_ended(cluster: &Cluster, eid: &str, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ended = cluster
            .events(eid)
            .await
            .iter()
            .filter(|e| EventType::of(e) == Some(EventType::LoopIterationDone))
            .count();
        if ended >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "no iteration ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Publish every claim reported so far again, each as a new command (a
/// fresh command id, so JetStream's de-duplication does not drop it),
/// `marked` sent again as a loop-supervisor's redispatch marks it.
async fn claim_again(cluster: &Cluster, eid: &str, max_rows: u32, marked: bool) {
    let claims: Vec<(String, u64)> = cluster
        .events(eid)
        .await
        .iter()
        .filter(|e| EventType::of(e) == Some(EventType::LoopClaimed))
        .map(|e| (e.step_run_id.clone(), payload(e)["seq"].as_u64().unwrap()))
        .collect();
    assert!(!claims.is_empty(), "claims were reported before the purge");
    for (srid, seq) in claims {
        let cmd = noetl_wire::TaskCommand {
            command_id: format!("{srid}-claim-{seq}-again"),
            execution_id: eid.to_string(),
            step: "start".into(),
            step_run_id: srid.clone(),
            attempt: 1,
            claim: Some(noetl_wire::ClaimRef {
                loop_run_id: srid,
                seq,
                max_rows: max_rows as u64,
                again: marked,
                identity: String::new(),
            }),
            ..Default::default()
        };
        let ack = cluster
            .mesh
            .publish_command("postgres", &cmd)
            .await
            .unwrap();
        ack.wait().await.unwrap();
    }
}

/// A cursor loop that stops at a failed row (rows 5, 12 and 19 fail, at
/// once, until the workload says `fixed`; four rows a claim, two
/// iterations at a time, so rows 6 to 8 wait when 5 fails), resumed once
/// the cause is fixed: the resumed
/// run runs the rows its stopped run claimed and did not finish (the
/// failed row, the rows it claimed that were still waiting, the rows of a
/// claim that came back after it stopped) before it claims anew. Every
/// row is then done, claimed once and run once, and the reducer counts
/// each once. With `purge`, every loop key of the execution is purged
/// while the resumed run works: it is folded back from its events,
/// starting from what it took of the stopped run. With `twice`, a first
/// resume fails again at row 5 and the second takes the rows the first
/// took. Before, the resumed run
/// claimed anew only: the rows the stopped run had claimed stayed
/// `claimed`, and the loop ended without them.
async fn resumed_drain(purge: bool, twice: bool) {
    let n = 20;
    let db = pg().await;
    let schema = queue(&db, n).await;
    let cluster = cluster(ClusterOptions::default()).await;
    let yaml = playbook(&schema, 2, 4, 0)
        .replace(&plain_claim(&schema), &marked_claim(&schema))
        .replace(
            "metadata: { name: drain_queue }",
            "metadata: { name: drain_queue }\nworkload: { fixed: false }",
        )
        .replace(
            "            rules:\n",
            "            rules:\n              - when: \"{{ outcome.status == 'error' }}\"\n                then: { do: fail }\n",
        )
        .replace(
            "INSERT INTO",
            "SELECT 1 / (CASE WHEN {{ iter.job.id }} % 7 = 5 AND NOT {{ workload.fixed }} THEN 0 ELSE 1 END);
          SELECT pg_sleep(0.1);
          INSERT INTO",
        );
    let eid = cluster.submit(&yaml, "drain_queue.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let left: i64 = db
        .query_one(
            &format!("SELECT count(*) FROM {schema}.queue WHERE status = 'claimed' AND id <> 5"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        left > 0,
        "the stopped run left claimed rows besides the failed one"
    );

    if twice {
        // Resumed before the cause is fixed: row 5 runs again first and
        // fails again, and this run stops with rows 6 to 8 still taken.
        cluster.resume_set(&eid, json!({"fixed": false})).await;
        let s = cluster.wait(&eid, Duration::from_secs(60)).await;
        assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    }
    cluster.resume_set(&eid, json!({"fixed": true})).await;
    if purge {
        // Two of the resumed run's iterations ended: purge its record and
        // frames (and whatever else of the execution the bucket holds).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let events = cluster.events(&eid).await;
            let at = events
                .iter()
                .position(|e| e.event_type == "execution.resumed")
                .unwrap_or(events.len());
            let ended = events[at..]
                .iter()
                .filter(|e| EventType::of(e) == Some(EventType::LoopIterationDone))
                .count();
            if ended >= 2 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the resumed run never ran"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let kv = cluster.mesh.loop_kv();
        let keys = noetl_mesh::kv::keys_under(kv, &eid).await.unwrap();
        assert!(keys.iter().any(|k| k.contains(".frame.")), "{keys:?}");
        for k in &keys {
            kv.purge(k).await.unwrap();
        }
    }
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    cluster.assert_replays(&eid).await;
    let events = cluster.settled_events(&eid).await;

    let rows = queue_rows(&db, &schema).await;
    assert_eq!(rows.len(), n as usize);
    for (id, status, claims, runs) in rows {
        assert_eq!((status.as_str(), claims, runs), ("done", 1, 1), "row {id}");
    }
    let processed = db
        .query(
            &format!("SELECT id FROM {schema}.processed ORDER BY id"),
            &[],
        )
        .await
        .unwrap();
    let ids: Vec<i32> = processed.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, (1..=n).collect::<Vec<_>>(), "each row run once");
    let done = events
        .iter()
        .rfind(|e| e.event_type == EventType::LoopDone.wire_name())
        .expect("loop.done");
    assert_eq!(
        payload(done)["counts"],
        json!({"total": n, "done": n, "failed": 0}),
        "the resumed run counts the rows its stopped run finished"
    );
    assert_eq!(s.ctx["processed"], json!(n), "{s:?}");

    cluster.stop().await;
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_cursor_loop_runs_the_rows_its_stopped_run_claimed_and_left() {
    resumed_drain(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_cursor_loop_purged_while_it_runs_is_folded_from_what_it_took_of_the_stopped_run()
{
    resumed_drain(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_loop_run_purged_mid_run_is_rebuilt_from_its_events_and_drains_exactly_once() {
    drain_purged(ClusterOptions::default(), 12, 2, 2, 0, Fault::Purge).await;
}

/// The rows of claims the run still holds purged while the run stands (a
/// partial purge, or a run written back between the purge of its record
/// and of its frames): claims of 4 rows for a window of 2, so rows wait in
/// their frame for a slot, and two loop-supervisors, so one reads a frame
/// it has not read before from the bucket, finds it gone and writes it
/// back from the events. (Without that the loop fails: its rows cannot be
/// read.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_loop_whose_frames_alone_are_purged_mid_run_drains_exactly_once() {
    let opts = ClusterOptions {
        replicas: 2,
        ..Default::default()
    };
    drain_purged(opts, 12, 2, 4, 0, Fault::PurgeFrames).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_sent_again_after_its_run_was_purged_runs_no_sql() {
    // Without the check, each claim sent again takes pending rows under a
    // claim whose report is stored already: those rows stay claimed and
    // the loop ends without them.
    drain_purged(
        ClusterOptions::default(),
        12,
        2,
        2,
        0,
        Fault::PurgeThenClaimAgain,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_sql_runs_again_after_its_rows_were_done_takes_no_other_row() {
    // The claims go again unchecked once rows are done; the claim that
    // docs/dsl.md recommends returns its own rows again, its report is a
    // duplicate, and every row is processed exactly once. The plain claim
    // would take pending rows under a claim already reported.
    drain_purged(
        ClusterOptions::default(),
        12,
        2,
        2,
        0,
        Fault::ClaimAgainUnchecked,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parallel_cursor_loop_drains_a_queue_exactly_once() {
    let opts = ClusterOptions {
        replicas: 2,
        ..Default::default()
    };
    drain(opts, 40, 4, 3, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_put_back_by_an_iteration_are_claimed_again_before_the_loop_ends() {
    drain(ClusterOptions::default(), 20, 3, 2, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivered_claims_and_reports_create_no_duplicate_iteration() {
    // Every consumer handles every message twice: claim commands, their
    // `loop.claimed` reports, iteration reports.
    let opts = ClusterOptions {
        deliver_twice: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    drain(opts, 12, 3, 2, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_claim_fails_the_loop_step_naming_the_claim() {
    let cluster = cluster(ClusterOptions::default()).await;
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: bad_claim }
keychain: [{ name: db, kind: postgres_credential }]
workflow:
  - step: start
    loop:
      cursor: { auth: db, claim: "UPDATE no_such_table_xyz SET a = 1 RETURNING a" }
      iterator: job
      spec: { mode: cursor }
    tool: [ { name: work, kind: noop } ]
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
"#;
    let eid = cluster.submit(yaml, "bad_claim.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let events = cluster.settled_events(&eid).await;
    let failed = events
        .iter()
        .find(|e| e.event_type == EventType::StepFailed.wire_name())
        .expect("step.failed");
    let error = &payload(failed)["error"];
    assert_eq!(error["kind"], "postgres.sql", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("claim of cursor loop \"start\"") && message.contains("no_such_table_xyz"),
        "{message}"
    );
    cluster.stop().await;
}

/// The mix's claim ([`noetl_integration::mix::cursor_claim`]), rendered
/// for `claim` and run once on `db`: the ids it returns.
async fn run_claim(db: &tokio_postgres::Client, table: &str, claim: &str) -> Vec<i32> {
    let sql = noetl_integration::mix::cursor_claim(table)
        .replace("{{ execution_id }}", "e1")
        .replace("{{ __frame_claim }}", claim)
        .replace("{{ __frame_max_rows }}", "2");
    let rows = db.query(&sql, &[]).await.expect("the mix's claim runs");
    rows.iter().map(|r| r.get(0)).collect()
}

#[tokio::test]
async fn the_mix_claim_run_again_after_its_rows_were_done_returns_the_same_rows() {
    // A claim can run again after its report was applied and some of its
    // rows processed (a redelivery that read the log before its first
    // report committed; a run record a lost write took back). Only its
    // first report counts, so a rerun that took other rows would leave
    // them claimed: the claim must return what it took, done or not.
    let db = pg().await;
    let schema = queue(&db, 0).await;
    let table = format!("{schema}.work");
    db.batch_execute(&format!(
        "CREATE TABLE {table} (execution_id text NOT NULL, id integer NOT NULL,
             status text NOT NULL DEFAULT 'pending', claimed_by text,
             PRIMARY KEY (execution_id, id));
         INSERT INTO {table} (execution_id, id) SELECT 'e1', g FROM generate_series(0, 5) g;
         INSERT INTO {table} (execution_id, id) SELECT 'e2', g FROM generate_series(0, 5) g;"
    ))
    .await
    .unwrap();
    assert_eq!(run_claim(&db, &table, "run.1").await, [0, 1]);
    assert_eq!(run_claim(&db, &table, "run.2").await, [2, 3]);
    assert_eq!(
        run_claim(&db, &table, "run.1").await,
        [0, 1],
        "a rerun before any row is done"
    );
    db.batch_execute(&format!(
        "UPDATE {table} SET status = 'done' WHERE execution_id = 'e1' AND id = 0"
    ))
    .await
    .unwrap();
    assert_eq!(
        run_claim(&db, &table, "run.1").await,
        [0, 1],
        "a rerun after one of its rows was done takes no other row"
    );
    assert_eq!(run_claim(&db, &table, "run.3").await, [4, 5]);
    assert_eq!(
        run_claim(&db, &table, "run.4").await,
        Vec::<i32>::new(),
        "drained"
    );
    let left: i64 = db
        .query_one(
            &format!(
                "SELECT count(*) FROM {table} WHERE execution_id = 'e2' AND status <> 'pending'"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "another execution's rows are not taken");
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_loop_resumed_twice_runs_the_rows_the_first_resume_took_and_left() {
    resumed_drain(false, true).await;
}
