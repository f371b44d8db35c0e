//! What the chaos suite and the fault harness share around a run of the
//! playbook [`mix`](crate::mix): submitting through faults, waiting for an
//! execution's end, and checking every execution a run started with
//! [`check`](crate::check).

use std::time::{Duration, Instant};

use noetl_mesh::state::{ExecHeader, ExecSummary};
use noetl_mesh::{codec, Mesh};
use noetl_wire::{Event, ExecutionRequest};

use crate::{check, mix, sink::Sink};

/// Retry a read or a publish through a server restart or a partition, for
/// up to `NOETL_PATIENCE_SECS` (default 60 s); then panic naming `what`.
pub async fn patiently<T, E: std::fmt::Display, F>(what: &str, mut f: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Result<T, E>>,
{
    let secs = crate::seeded::env_u64("NOETL_PATIENCE_SECS").unwrap_or(60);
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Submit `case` as execution `eid` (source `<suite>/<case>`), retrying
/// until the request stream acknowledges it.
pub async fn submit(mesh: &Mesh, suite: &str, eid: &str, case: &mix::Case, api: &str) {
    let req = ExecutionRequest {
        execution_id: eid.to_string(),
        playbook_yaml: case.yaml.clone(),
        source_name: format!("{suite}/{}", case.name),
        workload_json: codec::json_bytes(&mix::workload(api)),
        ..Default::default()
    };
    let bytes = codec::encode(&req);
    patiently("submit an execution", || async {
        mesh.publish(mesh.subjects().exec_request(), eid, bytes.clone())
            .await?
            .wait()
            .await
    })
    .await;
}

/// Every event of `eid` in the stream, in order.
pub async fn events_of(mesh: &Mesh, eid: &str) -> Result<Vec<Event>, String> {
    let stored = mesh
        .stored_events(&mesh.subjects().events_of(eid))
        .await
        .map_err(|e| e.to_string())?;
    stored
        .into_iter()
        .map(|e| e.map_err(|e| e.to_string()))
        .collect()
}

/// Wait until `eid` is terminal and its terminal event is stored; false
/// when it is still running at `deadline`.
pub async fn ended(mesh: &Mesh, eid: &str, deadline: Instant) -> bool {
    loop {
        let header: Option<ExecHeader> = mesh.exec_header(eid).await.ok().flatten();
        if header
            .as_ref()
            .is_some_and(|h| h.status.is_terminal() && h.terminal_emitted)
        {
            return true;
        }
        if header.is_none() {
            // Purged as it ended (the chaos purger saw it running): written
            // back from its events, as `noetl admin rebuild` does.
            let _ =
                noetl_mesh::rebuild::rebuild(mesh, eid, noetl_mesh::rebuild::Mode::Missing).await;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One execution a run started: its id and its case in the mix.
pub struct Started {
    /// Execution id.
    pub eid: String,
    /// Index into [`mix::mix`].
    pub case: usize,
}

/// A new execution id for every case of the mix.
pub fn wave(cases: &[mix::Case]) -> Vec<Started> {
    (0..cases.len())
        .map(|case| Started {
            eid: noetl_mesh::ids::new_execution_id(),
            case,
        })
        .collect()
}

/// The anomalies of every execution in `started` (each must end by
/// `deadline` as [`check::check`] wants it), and the tool calls repeated
/// after a crash.
pub async fn check_started(
    mesh: &Mesh,
    sink: &Sink,
    cases: &[mix::Case],
    started: &[Started],
    deadline: Instant,
) -> (Vec<String>, u32) {
    let mut anomalies = Vec::new();
    let mut repeated_calls = 0;
    for s in started {
        let case = &cases[s.case];
        if !ended(mesh, &s.eid, deadline).await {
            let events = events_of(mesh, &s.eid).await.unwrap_or_default();
            let header = mesh.exec_header(&s.eid).await.ok().flatten();
            if header.is_none() && events.is_empty() {
                anomalies.push(format!(
                    "{} {}: lost: its submission was acknowledged, yet neither a header nor an \
                     event of it exists",
                    case.name, s.eid
                ));
                continue;
            }
            let last: Vec<String> = events
                .iter()
                .rev()
                .take(6)
                .map(|e| format!("{} {}", e.event_type, e.step))
                .collect();
            anomalies.push(format!(
                "{} {}: still running when the run's settle time ran out (last events: {last:?})",
                case.name, s.eid
            ));
            continue;
        }
        let header: Option<ExecHeader> =
            patiently("read a header", || mesh.exec_header(&s.eid)).await;
        let summary: Option<ExecSummary> =
            patiently("read a summary", || mesh.exec_summary(&s.eid)).await;
        let events = patiently("read events", || events_of(mesh, &s.eid)).await;
        let calls = sink.calls.of(&s.eid);
        let rows = crate::rows::of(&s.eid).await;
        let v = check::check(
            case,
            &check::Observed {
                header: header.as_ref(),
                summary: summary.as_ref(),
                events: &events,
                calls: &calls,
                rows: &rows,
            },
        );
        repeated_calls += v.repeated_calls;
        anomalies.extend(
            v.anomalies
                .into_iter()
                .chain(replays_unequal(mesh, &s.eid).await)
                .map(|a| format!("{} {}: {a}", case.name, s.eid)),
        );
    }
    (anomalies, repeated_calls)
}

/// The log is the truth: what the events of ended execution `eid`
/// determine must equal what the engine stored (`noetl exec replay`),
/// once the records a purge took after the services last needed them are
/// written back, as `noetl admin rebuild` would. `None` when equal.
async fn replays_unequal(mesh: &Mesh, eid: &str) -> Option<String> {
    use noetl_mesh::rebuild::{rebuild, Mode};
    let _ = rebuild(mesh, eid, Mode::Missing).await;
    match noetl_mesh::replay::check(mesh, eid).await {
        Ok(r) if r.equal => None,
        Ok(r) => {
            let d = &r.differences[0];
            Some(format!(
                "the log does not replay equal ({} differences over {} events); first: {}: \
                 from the events {}, stored {}, event {:?}",
                r.differences.len(),
                r.events,
                d.what,
                d.from_events,
                d.stored,
                d.event
            ))
        }
        Err(e) => Some(format!("the log could not be replayed: {e}")),
    }
}

/// The end of a campaign's report, from each run's `(seed, services that
/// exited on their own, had anomalies)`: the exits printed by run, then a
/// panic naming the seeds of the runs with anomalies.
pub fn conclude<'a>(suite: &str, runs: impl Iterator<Item = (u64, &'a [String], bool)>) {
    let mut total = 0;
    let mut failing = Vec::new();
    for (seed, exits, failed) in runs {
        total += 1;
        if !exits.is_empty() {
            println!("seed {seed:#x}: exited on their own: {exits:?}");
        }
        if failed {
            failing.push(format!("{seed:#x}"));
        }
    }
    assert!(
        failing.is_empty(),
        "{} of {total} {suite} runs had anomalies; seeds: {failing:?}",
        failing.len(),
    );
}

/// Run `seeds` one after the other (on a runtime of two workers, beside
/// one [`Sink`]): each run's seed is printed before it starts (a run that
/// panics is replayed from it), `summary` of its result after it.
pub fn run_seeds<R, Fut>(
    suite: &str,
    seeds: &[u64],
    run: impl Fn(u64, Sink) -> Fut,
    summary: impl Fn(&R) -> String,
) -> Vec<R>
where
    Fut: std::future::Future<Output = R>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let sink = Sink::start().await;
        let mut reports = Vec::new();
        for (i, seed) in seeds.iter().enumerate() {
            eprint!("{suite} run {}/{} seed {seed:#x}: ", i + 1, seeds.len());
            let r = run(*seed, sink.clone()).await;
            eprintln!("{}", summary(&r));
            reports.push(r);
        }
        reports
    })
}
