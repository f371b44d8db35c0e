//! Tools end to end: the seeds' canonical pagination (fetch_page → store →
//! paginate) against a real HTTP server started here and the machine's
//! PostgreSQL, with the credential from the encrypted keychain.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use noetl_integration::{repo_root, Cluster};
use noetl_mesh::{credentials::Credential, state::ExecStatus};
use serde_json::json;

/// Pages per endpoint; `c` does not exist (404).
fn pages_of(path: &str) -> Option<u64> {
    match path {
        "a" => Some(3),
        "b" => Some(2),
        "d" => Some(1),
        _ => None,
    }
}

#[derive(Default)]
struct Api {
    /// (path, page) → times it was requested.
    hits: Mutex<HashMap<(String, u64), Vec<Instant>>>,
}

async fn page(
    State(api): State<Arc<Api>>,
    Path(path): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> axum::response::Response {
    let page: u64 = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
    let size: u64 = q.get("pageSize").and_then(|p| p.parse().ok()).unwrap_or(3);
    let n = {
        let mut hits = api.hits.lock().unwrap();
        let v = hits.entry((path.clone(), page)).or_default();
        v.push(Instant::now());
        v.len()
    };
    let Some(pages) = pages_of(&path) else {
        return (StatusCode::NOT_FOUND, "no such endpoint").into_response();
    };
    // First asks of some pages are refused: the playbook must retry.
    if path == "a" && page == 2 && n == 1 {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "1".parse().unwrap());
        return (StatusCode::TOO_MANY_REQUESTS, h, "slow down").into_response();
    }
    if path == "b" && page == 1 && n == 1 {
        return (StatusCode::SERVICE_UNAVAILABLE, "warming up").into_response();
    }
    let items: Vec<String> = (0..size).map(|i| format!("{path}-{page}-{i}")).collect();
    Json(json!({"data": items, "paging": {"page": page, "hasMore": page < pages}})).into_response()
}

async fn start_api() -> (String, Arc<Api>) {
    let api = Arc::new(Api::default());
    let app = Router::new()
        .route("/{path}", get(page))
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), api)
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canonical_pagination_stores_every_page_exactly_once() {
    let (api_url, api) = start_api().await;
    let db = pg().await;
    let schema = format!("noetl_t_{}", uuid::Uuid::new_v4().simple());
    db.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.results_ok (endpoint text, page int, item text,
             UNIQUE (endpoint, page, item));
         CREATE TABLE {schema}.results_not_found (endpoint text, page int);"
    ))
    .await
    .unwrap();

    let cluster = Cluster::start().await;
    cluster
        .mesh
        .vault()
        .put(&Credential {
            name: "pg_k8s".into(),
            kind: "postgres_credential".into(),
            data: json!({"host": "127.0.0.1", "port": 5432, "user": "postgres",
                         "password": "pw-never-shown-0042", "database": "test"}),
        })
        .await
        .unwrap();
    let yaml = std::fs::read_to_string(
        repo_root().join("integration/tests/fixtures/pagination_http_postgres.yaml"),
    )
    .unwrap();
    let workload = json!({
        "api_url": api_url,
        "schema": schema,
        "endpoints": [
            {"path": "/a", "page_size": 3},
            {"path": "/b", "page_size": 3},
            {"path": "/c", "page_size": 3},
            {"path": "/d", "page_size": 3},
        ],
    });
    let eid = cluster
        .submit(&yaml, "pagination_http_postgres.yaml", workload)
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(120)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.steps["validate_results"], "done");

    // Every page of every endpoint, once.
    let rows = db
        .query(
            &format!("SELECT endpoint, page, item FROM {schema}.results_ok ORDER BY 1, 2, 3"),
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, i32, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut want = Vec::new();
    for (path, pages) in [("a", 3), ("b", 2), ("d", 1)] {
        for p in 1..=pages {
            for i in 0..3 {
                want.push((format!("/{path}"), p, format!("{path}-{p}-{i}")));
            }
        }
    }
    want.sort();
    assert_eq!(got, want);
    assert_eq!(s.ctx["stored"], 18);
    assert_eq!(s.ctx["distinct"], 18);
    assert_eq!(
        s.ctx["pages"], 6,
        "the pages reducer counts each stored page once"
    );
    let nf = db
        .query(
            &format!("SELECT endpoint, page FROM {schema}.results_not_found"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(nf.len(), 1);
    assert_eq!(nf[0].get::<_, String>(0), "/c");

    // The 429 was retried no sooner than its Retry-After (1 s), although
    // the policy's own delay is 0.05 s; the 503 was retried.
    let hits = api.hits.lock().unwrap().clone();
    let a2 = &hits[&("a".to_string(), 2)];
    assert_eq!(a2.len(), 2);
    assert!(
        a2[1] - a2[0] >= Duration::from_millis(950),
        "{:?}",
        a2[1] - a2[0]
    );
    assert_eq!(hits[&("b".to_string(), 1)].len(), 2);
    // Each page fetched successfully exactly once.
    assert_eq!(hits[&("a".to_string(), 1)].len(), 1);
    assert_eq!(hits[&("a".to_string(), 3)].len(), 1);

    // The password went nowhere: not in events, not in the summary.
    let events = cluster.settled_events(&eid).await;
    let all = format!("{:?}{s:?}", events);
    assert!(!all.contains("pw-never-shown-0042"));
    cluster.stop().await;
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serialization_failure_is_retried_by_its_sqlstate() {
    let db = pg().await;
    let schema = format!("noetl_t_{}", uuid::Uuid::new_v4().simple());
    db.batch_execute(&format!(
        "CREATE SCHEMA {schema}; CREATE SEQUENCE {schema}.tries;"
    ))
    .await
    .unwrap();
    let cluster = Cluster::start().await;
    cluster
        .mesh
        .vault()
        .put(&Credential {
            name: "db".into(),
            kind: "postgres_credential".into(),
            data: json!({"user": "postgres", "database": "test"}),
        })
        .await
        .unwrap();
    // A sequence is not transactional: the first attempt raises 40001,
    // the retry goes through.
    let yaml = format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: serialization_retry }}
keychain: [{{ name: db, kind: postgres_credential }}]
workflow:
  - step: start
    tool:
      - name: write
        kind: postgres
        auth: db
        command: >-
          DO $$ BEGIN IF nextval('{schema}.tries') = 1 THEN
          RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001';
          END IF; END $$
        spec:
          policy:
            rules:
              - when: "{{{{ outcome.status == 'error' and outcome.pg.code in ['40001', '40P01'] }}}}"
                then: {{ do: retry, attempts: 5, backoff: exponential, delay: 0.05 }}
              - when: "{{{{ outcome.status == 'error' }}}}"
                then: {{ do: fail }}
              - else:
                  then: {{ do: continue, set_ctx: {{ attempts: "{{{{ outcome.meta.attempt }}}}" }} }}
"#
    );
    let eid = cluster.submit(&yaml, "serialization.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["attempts"], 2);
    let events = cluster.settled_events(&eid).await;
    let failed_attempt = events.iter().any(|e| {
        e.event_type == "task.done" && String::from_utf8_lossy(&e.payload_json).contains("40001")
    });
    assert!(
        failed_attempt,
        "the first attempt's 40001 is in the event log"
    );
    cluster.stop().await;
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
