//! An iteration's checkpoint lost from the loop bucket and rebuilt from
//! its events (issue 35): a loop iteration pages through a real HTTP
//! server with `set_iter`, its executor is crashed while page 3 is in
//! flight, the checkpoint is purged before the command is redelivered, and
//! the server counts what is asked of it again. The same for a batch of
//! parallel iterations, whose checkpoints are all rebuilt from one read of
//! the log, counted by nats-server's advisories; and for a loop run's own
//! record, lost while every iteration's report was still to come.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use futures::StreamExt;
use noetl_integration::{Cluster, ClusterOptions};
use noetl_mesh::event_type::EventType;
use serde_json::{json, Value};

/// The last page the server has.
const PAGES: u32 = 4;
/// The page whose first request hangs (the executor is crashed then).
const HOLD: u32 = 3;

/// A paging API: `GET /page/ITEM/N` answers `{page, more, pad}` and counts
/// the request; the first request of each item's page [`HOLD`] never
/// answers.
#[derive(Clone, Default)]
struct Pages {
    /// `(item, page)` of each request, in order.
    asked: Arc<Mutex<Vec<(u32, u32)>>>,
    /// Bytes of padding in each answer (a page above the events' inline
    /// limit reaches the log only as a preview).
    pad: usize,
}

impl Pages {
    async fn serve(pad: usize) -> (Self, String) {
        let pages = Pages {
            pad,
            ..Default::default()
        };
        let app = Router::new()
            .route("/page/{item}/{n}", get(page))
            .with_state(pages.clone());
        (pages, serve(app).await)
    }

    /// Requests per page of `item`.
    fn counts(&self, item: u32) -> BTreeMap<u32, usize> {
        let mut out = BTreeMap::new();
        for (_, p) in self.asked.lock().unwrap().iter().filter(|a| a.0 == item) {
            *out.entry(*p).or_default() += 1;
        }
        out
    }

    /// Requests of `item`'s `page`.
    fn asked(&self, item: u32, page: u32) -> usize {
        self.counts(item).get(&page).copied().unwrap_or(0)
    }
}

async fn page(State(pages): State<Pages>, Path((item, n)): Path<(u32, u32)>) -> Json<Value> {
    let first = {
        let mut asked = pages.asked.lock().unwrap();
        asked.push((item, n));
        asked.iter().filter(|a| **a == (item, n)).count() == 1
    };
    if n == HOLD && first {
        std::future::pending::<()>().await;
    }
    Json(json!({"page": n, "more": n < PAGES, "pad": "x".repeat(pages.pad)}))
}

/// A loop whose iterations each page with `set_iter` through their item's
/// pages; `paginate` passes the page on as its result (`_prev` in the
/// checkpoint). `LOOP` is the rest of the loop: its `in` and `spec`.
const PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: checkpoint_pages }
workload: { api: "" }
workflow:
  - step: start
    loop:
      iterator: item
      LOOP
    tool:
      - name: init
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_iter: { page: 1 } }
      - name: fetch
        kind: http
        url: "{{ workload.api }}/page/{{ iter.item }}/{{ iter.page }}"
      - name: paginate
        kind: noop
        result: "{{ _prev.data }}"
        spec:
          policy:
            rules:
              - when: "{{ _prev.data.more }}"
                then: { do: jump, to: fetch, set_iter: { page: "{{ iter.page + 1 }}" } }
              - else:
                  then: { do: break }
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
"#;

/// What [`crash_and_purge`] saw.
struct Crashed {
    pages: Pages,
    /// Consumers created on the events stream from the purge to the
    /// execution's end: each read of a log is one.
    reads: usize,
}

/// Run [`PLAYBOOK`] over `items` items (one: a sequential loop; more: a
/// parallel loop of one batch, a quarter of `max_in_flight`) against a
/// server padding its pages with `pad` bytes: crash the executor while
/// every item asks its page 3, purge the checkpoints, let a new executor
/// take the redelivered command; once the execution completed (each
/// iteration ending once, replayed equal), the server's counts.
async fn crash_and_purge(pad: usize, items: u32) -> Crashed {
    let (pages, api) = Pages::serve(pad).await;
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        ..Default::default()
    })
    .await;
    let first = cluster.spawn_crashable_executor();
    let lp = match items {
        1 => "in: [0]".to_string(),
        n => format!(
            "in: \"{{{{ range({n}) | list }}}}\"\n      spec: {{ mode: parallel, max_in_flight: {} }}",
            4 * n
        ),
    };
    let playbook = PLAYBOOK.replace("LOOP", &lp);
    let eid = cluster
        .submit(&playbook, "checkpoint_pages.yaml", json!({ "api": api }))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (0..items).any(|item| pages.asked(item, HOLD) == 0) {
        assert!(
            Instant::now() < deadline,
            "page {HOLD} not asked of every item"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.crash();
    // The live pipeline wrote each checkpoint before asking page 3: purge
    // them.
    let store = cluster.mesh.loop_kv();
    let checkpoints: Vec<String> = store
        .keys()
        .await
        .unwrap()
        .filter_map(|k| async move { k.ok() })
        .filter(|k| std::future::ready(k.starts_with(eid.as_str()) && k.contains(".ckpt.")))
        .collect()
        .await;
    assert_eq!(checkpoints.len(), items as usize, "{checkpoints:?}");
    for key in &checkpoints {
        store.purge(key).await.unwrap();
    }
    let mut created = log_reads(&cluster).await;
    cluster.mesh.client().flush().await.unwrap();
    let _second = cluster.spawn_executor().await;
    let (_, reads) = completed(&cluster, &eid, &mut created).await;
    let ends = cluster
        .events(&eid)
        .await
        .iter()
        .filter(|e| e.event_type == EventType::LoopIterationDone.wire_name())
        .count();
    assert_eq!(ends, items as usize, "each iteration ends once");
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
    Crashed { pages, reads }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_checkpoint_is_rebuilt_from_the_log_and_earlier_pages_are_not_asked_again() {
    let counts = crash_and_purge(0, 1).await.pages.counts(0);
    assert_eq!(counts.get(&1), Some(&1), "page 1 asked once: {counts:?}");
    assert_eq!(counts.get(&2), Some(&1), "page 2 asked once: {counts:?}");
    assert_eq!(
        counts.get(&3),
        Some(&2),
        "page 3: in flight at the crash, then again: {counts:?}"
    );
    assert_eq!(counts.get(&4), Some(&1), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_the_log_has_only_as_a_preview_starts_the_iteration_over() {
    // Pages above the events' 4 KiB: `paginate`'s result, the checkpoint's
    // `_prev`, reaches the log only as a preview.
    let counts = crash_and_purge(8 * 1024, 1).await.pages.counts(0);
    assert_eq!(
        counts.get(&1),
        Some(&2),
        "started over from page 1: {counts:?}"
    );
    assert_eq!(counts.get(&2), Some(&2), "{counts:?}");
    assert_eq!(counts.get(&4), Some(&1), "{counts:?}");
}

/// Iterations of the batch.
const ITEMS: u32 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_checkpoints_were_purged_rebuilds_them_all_from_one_read_of_the_log() {
    let Crashed { pages, reads } = crash_and_purge(0, ITEMS).await;
    for item in 0..ITEMS {
        let asked: Vec<usize> = (1..=PAGES).map(|p| pages.asked(item, p)).collect();
        assert_eq!(
            asked,
            [1, 1, 2, 1],
            "item {item}: pages 1 and 2 not asked again, page 3 in flight at the crash"
        );
    }
    // The redelivered batch's one read (and the summary's, if its
    // advisory came in time); one per iteration before.
    assert!(
        (1..=2).contains(&reads),
        "{reads} reads of the log for {ITEMS} lost checkpoints"
    );
}

/// nats-server's advisories of the consumers created on the events stream
/// from now on: each read of a log is one.
async fn log_reads(cluster: &Cluster) -> async_nats::Subscriber {
    let stream = cluster.mesh.subjects().events_stream();
    cluster
        .mesh
        .client()
        .subscribe(format!("$JS.EVENT.ADVISORY.CONSUMER.CREATED.{stream}.>"))
        .await
        .unwrap()
}

/// Wait for execution `eid` to complete (it must), then count the
/// advisories `created` received ([`log_reads`]) once none came for 200
/// ms.
async fn completed(
    cluster: &Cluster,
    eid: &str,
    created: &mut async_nats::Subscriber,
) -> (noetl_mesh::state::ExecSummary, usize) {
    let s = cluster.wait(eid, Duration::from_secs(90)).await;
    let mut reads = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), created.next()).await {
        reads += 1;
    }
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    (s, reads)
}

/// Serve `app` on a free local port; its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Iterations of the loop whose run is lost, each sent and reported alone.
const HELD: usize = 16;

/// A server that holds every request until released, counting them:
/// item 0's until `last`, the others' until `released`.
#[derive(Clone)]
struct Held {
    asked: Arc<AtomicUsize>,
    released: tokio::sync::watch::Sender<bool>,
    last: tokio::sync::watch::Sender<bool>,
}

async fn held(State(h): State<Held>, Path(item): Path<u32>) -> Json<Value> {
    h.asked.fetch_add(1, Ordering::SeqCst);
    let gate = if item == 0 { &h.last } else { &h.released };
    let _ = gate.subscribe().wait_for(|r| *r).await;
    Json(json!({"ok": true}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_loop_run_is_rebuilt_from_one_read_of_the_log_for_all_its_waiting_reports() {
    let h = Held {
        asked: Arc::default(),
        released: tokio::sync::watch::channel(false).0,
        last: tokio::sync::watch::channel(false).0,
    };
    let app = Router::new()
        .route("/hold/{item}", get(held))
        .with_state(h.clone());
    let api = serve(app).await;
    // Batches of one: each iteration is reported alone, and each report
    // finds the run missing.
    let cluster = Cluster::start_with(ClusterOptions {
        loop_batch: 1,
        ..Default::default()
    })
    .await;
    let playbook = format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: lost_run }}
workload: {{ api: "" }}
workflow:
  - step: start
    loop:
      in: "{{{{ range({HELD}) | list }}}}"
      iterator: item
      spec:
        mode: parallel
        max_in_flight: {HELD}
        policy:
          reducers: {{ total: sum }}
    tool:
      - name: wait
        kind: http
        url: "{{{{ workload.api }}}}/hold/{{{{ iter.item }}}}"
        spec:
          policy:
            rules:
              - else:
                  then: {{ set_ctx: {{ total: 1 }} }}
"#
    );
    let eid = cluster
        .submit(&playbook, "lost_run.yaml", json!({ "api": api }))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.asked.load(Ordering::SeqCst) < HELD {
        assert!(Instant::now() < deadline, "not every iteration started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The run's record: `<eid>.<loop run>`.
    let store = cluster.mesh.loop_kv();
    let runs: Vec<String> = store
        .keys()
        .await
        .unwrap()
        .filter_map(|k| async move { k.ok() })
        .filter(|k| {
            let run = k.strip_prefix(&format!("{eid}.")).map(|r| !r.contains('.'));
            std::future::ready(run == Some(true))
        })
        .collect()
        .await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    store.purge(&runs[0]).await.unwrap();
    let mut created = log_reads(&cluster).await;
    cluster.mesh.client().flush().await.unwrap();
    // Every iteration but the first reports; the run, rebuilt for the
    // first report, counts them all (item 0, still in flight, keeps it
    // from ending meanwhile).
    h.released.send_replace(true);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = store.get(&runs[0]).await.unwrap();
        let done = run.and_then(|r| serde_json::from_slice::<Value>(&r).ok());
        if done.as_ref().is_some_and(|r| r["done"] == json!(HELD - 1)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reports not counted: {done:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.last.send_replace(true);
    let (s, reads) = completed(&cluster, &eid, &mut created).await;
    assert_eq!(
        s.ctx["total"],
        json!(HELD),
        "each iteration counted once: {:?}",
        s.ctx
    );
    cluster.assert_replays(&eid).await;
    // One rebuild for every report: its pass over the log for the events
    // it looks up and two over the run's own (its ends, the batches they
    // went out in); the summary's read, if its advisory came in time. One
    // whole read per report before.
    assert!(
        (3..=4).contains(&reads),
        "{reads} reads of the log for one lost run and {HELD} reports"
    );
    cluster.stop().await;
}
