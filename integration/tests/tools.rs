//! Tools end to end: the canonical pagination of docs/dsl.md (fetch_page → store →
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

#[cfg(feature = "duckdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_queries_earlier_results_and_local_files() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("prices.csv");
    std::fs::write(&csv, "sku,price\na,1.5\nb,2.25\nc,4\n").unwrap();
    let cluster = Cluster::start().await;
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: duckdb_over_results }
workload: { csv: "" }
workflow:
  - step: orders
    tool:
      - name: make
        kind: python
        code: "result = {'rows': [{'sku': s, 'qty': q} for s, q in [('a', 2), ('b', 1), ('a', 3), ('c', 1)]]}"
    next:
      arcs:
        - step: report
  - step: report
    tool:
      - name: totals
        kind: duckdb
        tables: { orders: "{{ orders.rows }}" }
        command: >-
          select o.sku, sum(o.qty) as qty, sum(o.qty * p.price) as amount
          from orders o join read_csv('{{ workload.csv }}') p using (sku)
          group by o.sku order by o.sku
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { report: "{{ outcome.result.rows }}" } }
"#;
    let eid = cluster
        .submit(
            yaml,
            "duckdb.yaml",
            json!({"csv": csv.display().to_string()}),
        )
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(
        s.ctx["report"],
        json!([
            {"sku": "a", "qty": 5, "amount": 7.5},
            {"sku": "b", "qty": 1, "amount": 2.25},
            {"sku": "c", "qty": 1, "amount": 4.0},
        ])
    );
    cluster.stop().await;
}

/// Every tracing record of this test binary, at debug level, with the
/// `log` records of dependencies (reqwest, hyper, tokio-postgres) bridged.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: std::sync::OnceLock<Arc<Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_ansi(false)
            .with_writer(move || LogSink(sink.clone()))
            .try_init()
            .expect("the only subscriber of this test binary");
        buf
    })
    .clone()
}

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A server that shows what it received: `/echo` answers with the request's
/// `Authorization` / `X-API-Key` headers and query string, `/hop` redirects
/// there keeping the query, `/fail` is a 500 quoting the query.
async fn start_echo() -> String {
    async fn echo(headers: HeaderMap, uri: axum::http::Uri) -> axum::response::Response {
        let h = |k: &str| {
            headers
                .get(k)
                .map(|v| v.to_str().unwrap_or("").to_string())
                .unwrap_or_default()
        };
        Json(json!({
            "authorization": h("authorization"),
            "x-api-key": h("x-api-key"),
            "query": uri.query().unwrap_or(""),
        }))
        .into_response()
    }
    async fn hop(uri: axum::http::Uri) -> axum::response::Response {
        let to = format!("/echo?{}", uri.query().unwrap_or(""));
        (StatusCode::FOUND, [("location", to)]).into_response()
    }
    async fn fail(uri: axum::http::Uri) -> axum::response::Response {
        let body = format!("refused {}", uri.query().unwrap_or(""));
        (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
    }
    let app = Router::new()
        .route("/echo", get(echo))
        .route("/hop", get(hop))
        .route("/fail", get(fail));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

const NO_LEAK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: no_leak }
keychain:
  - { name: bearer_cred, kind: bearer }
  - { name: basic_cred, kind: basic }
  - { name: key_header, kind: api_key }
  - { name: key_query, kind: api_key }
  - { name: pg_cred, kind: postgres_credential }
workload: { api: "" }
workflow:
  - step: calls
    tool:
      - name: bearer
        kind: http
        url: "{{ workload.api }}/echo"
        auth: bearer_cred
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { bearer: "{{ outcome.result.data }}" } } } } ] } }
      - name: basic
        kind: http
        url: "{{ workload.api }}/echo"
        auth: basic_cred
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { basic: "{{ outcome.result.data }}" } } } } ] } }
      - name: header
        kind: http
        url: "{{ workload.api }}/echo"
        auth: key_header
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { header: "{{ outcome.result.data }}" } } } } ] } }
      - name: query_through_redirect
        kind: http
        url: "{{ workload.api }}/hop"
        params: { page: 1 }
        auth: key_query
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { query: "{{ outcome.result.data }}", query_url: "{{ outcome.http.url }}" } } } } ] } }
      - name: failing
        kind: http
        url: "{{ workload.api }}/fail"
        auth: key_query
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { failed: "{{ outcome.error.message }}", failed_body: "{{ outcome.result.data }}" } } } } ] } }
      - name: refused
        kind: http
        url: "http://127.0.0.1:9/nothing"
        auth: key_query
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { refused: "{{ outcome.error.message }}" } } } } ] } }
      - name: db
        kind: postgres
        auth: pg_cred
        command: "SELECT current_user AS who, $1::text AS echoed"
        params: ["{{ keychain.pg_cred.password }}"]
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { db: "{{ outcome.result.rows[0] }}" } } } } ] } }
      - name: child_with_own_keychain
        kind: playbook
        playbook: |
          apiVersion: noetl.io/v2
          kind: Playbook
          metadata: { name: own_keychain }
          keychain: [ { name: bearer_cred, kind: bearer } ]
          workflow:
            - step: start
              tool:
                - name: use
                  kind: python
                  args: { token: "{{ keychain.bearer_cred.token }}" }
                  code: "result = {'len': len(token), 'echo': 'seen ' + token}"
                  spec:
                    policy:
                      rules:
                        - else:
                            then: { do: continue, set_ctx: { len: "{{ outcome.result.len }}", echo: "{{ outcome.result.echo }}" } }
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { own: "{{ outcome.result }}" } } } } ] } }
"#;

/// The project rule: no secret value ever appears in events, KV state,
/// logs or error messages — for every credential kind, through redirects,
/// error paths, child executions and policy errors. Everything the server
/// holds (every stream, so every event and KV entry) and every log record
/// at debug level (dependencies included) is searched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_events_kv_logs_or_errors() {
    let logs = captured_logs();
    let api = start_echo().await;
    let cluster = Cluster::start().await;
    let bearer = "tok-Bearer-44170";
    let basic_pw = "pw-Basic-55210";
    let header_key = "key-Header-66301";
    let query_key = "key-Query-77420";
    let pg_pw = "pw-Pg-88531";
    let vault = cluster.mesh.vault();
    for (name, kind, data) in [
        ("bearer_cred", "bearer", json!({"token": bearer})),
        (
            "basic_cred",
            "basic",
            json!({"username": "app", "password": basic_pw}),
        ),
        ("key_header", "api_key", json!({"key": header_key})),
        (
            "key_query",
            "api_key",
            json!({"key": query_key, "in": "query", "name": "api_key"}),
        ),
        (
            "pg_cred",
            "postgres_credential",
            json!({"host": "127.0.0.1", "port": 5432, "user": "postgres",
                   "password": pg_pw, "database": "test"}),
        ),
    ] {
        vault
            .put(&Credential {
                name: name.into(),
                kind: kind.into(),
                data,
            })
            .await
            .unwrap();
    }
    let eid = cluster
        .submit(NO_LEAK, "no_leak.yaml", json!({"api": api}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    let ctx = &s.ctx;
    // Every credential reached its request...
    assert_eq!(ctx["bearer"]["authorization"], "Bearer [redacted]", "{ctx}");
    assert_eq!(ctx["basic"]["authorization"], "Basic [redacted]", "{ctx}");
    assert_eq!(ctx["header"]["x-api-key"], "[redacted]", "{ctx}");
    assert_eq!(ctx["query"]["query"], "page=1&api_key=[redacted]", "{ctx}");
    assert!(
        ctx["query_url"].as_str().unwrap().ends_with("/echo"),
        "{ctx}"
    );
    assert!(
        ctx["failed"].as_str().unwrap().contains("returned 500"),
        "{ctx}"
    );
    assert!(!ctx["refused"].as_str().unwrap().is_empty(), "{ctx}");
    assert_eq!(ctx["db"]["who"], "postgres", "{ctx}");
    assert_eq!(ctx["db"]["echoed"], "[redacted]", "{ctx}");
    // ...a child that declares the credential gets the real value, while
    // one handed a credential value in its fields is refused with the
    // playbook, before anything runs (`noetl validate`'s E004), told how
    // to get it instead (below).
    assert_eq!(ctx["own"]["len"], bearer.len(), "{ctx}");
    assert_eq!(ctx["own"]["echo"], "seen [redacted]", "{ctx}");

    let given = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: given }
keychain: [ { name: bearer_cred, kind: bearer } ]
workflow:
  - step: start
    tool:
      - name: child_given_the_token
        kind: playbook
        args: { token: "{{ keychain.bearer_cred.token }}" }
        path: tests/given
"#;
    let eid = cluster.submit(given, "given.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let why = s.error.clone().unwrap_or_default();
    assert!(
        why.contains("error[E004]")
            && why.contains("`args` of task `child_given_the_token`")
            && why.contains("credential values are not passed to child executions"),
        "{why}"
    );
    assert!(!why.contains(bearer), "{why}");

    // A policy whose template quotes a secret in its error.
    let policy = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: policy_error }
keychain: [ { name: bearer_cred, kind: bearer } ]
workflow:
  - step: start
    tool:
      - name: flaky
        kind: python
        code: "raise ValueError('no')"
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: retry, attempts: 3, delay: "{{ keychain.bearer_cred.token }}" }
"#;
    let eid2 = cluster.submit(policy, "policy.yaml", json!({})).await;
    let s2 = cluster.wait(&eid2, Duration::from_secs(60)).await;
    assert_eq!(s2.status, ExecStatus::Failed, "{s2:?}");
    let err = s2.error.clone().unwrap_or_default();
    assert!(
        err.contains("then.delay") && err.contains("[redacted]"),
        "{err}"
    );

    cluster.settled_events(&eid).await;
    cluster.settled_events(&eid2).await;
    let mut haystack = noetl_integration::every_stream(&cluster.mesh).await;
    haystack.push_str(&format!("{s:?}{s2:?}"));
    let stored = haystack.len();
    haystack.push_str(&String::from_utf8_lossy(&logs.lock().unwrap()));
    let wire_basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("app:{basic_pw}"))
    };
    for secret in [bearer, basic_pw, header_key, query_key, pg_pw, &wire_basic] {
        if let Some(at) = haystack.find(secret) {
            let bytes = haystack.as_bytes();
            let around = &bytes[at.saturating_sub(300)..(at + 100).min(bytes.len())];
            let place = if at < stored {
                "the server"
            } else {
                "the logs"
            };
            panic!(
                "secret {secret:?} leaked into {place}: ...{}...",
                String::from_utf8_lossy(around)
            );
        }
    }
    // The search covered what it claims to.
    assert!(haystack[..stored].contains("task.done"));
    assert!(haystack[..stored].contains("noetl_ctx"), "KV was searched");
    let logs = &haystack[stored..];
    assert!(logs.contains("task finished"), "our debug records");
    assert!(
        logs.contains("starting new connection"),
        "reqwest's debug records"
    );
    cluster.stop().await;
}

/// Every kind an executor of this build serves has an entry under
/// `executors` in the Helm chart's values, or its tasks would wait for an
/// executor that never comes. What the chart renders from those entries is
/// checked by `charts/noetl/tests/check_chart.py` (`make check-deploy`).
#[test]
fn the_helm_chart_has_an_executor_entry_for_every_tool_kind() {
    let values = std::fs::read_to_string(repo_root().join("charts/noetl/values.yaml")).unwrap();
    let values = noetl_core::yaml::to_json(&noetl_core::yaml::parse(&values).unwrap());
    let executors = values["executors"].as_object().expect("executors by kind");
    for tool in noetl_integration::all_tools(&noetl_mesh::MeshConfig::default()) {
        assert!(
            executors.get(tool.kind()).is_some_and(|e| e.is_object()),
            "charts/noetl/values.yaml has no executors.{} entry (has {:?})",
            tool.kind(),
            executors.keys().collect::<Vec<_>>()
        );
    }
}

/// NoETL's `script` (docs/tools.md, "Scripts"): SQL from a file where the
/// executor runs; a missing file and a failed fetch are `script` errors
/// naming the file, and the URL without its query string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_load_from_files_and_their_failures_name_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("answer.sql");
    std::fs::write(&sql, "SELECT 6 * 7 AS answer").unwrap();
    let py = dir.path().join("greet.py");
    std::fs::write(&py, "result = {'hi': who.upper()}").unwrap();
    let echo = noetl_integration::echo::start_echo().await;
    let cluster = Cluster::start().await;
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: script_files }
workload: { sql: "", py: "", api: "" }
workflow:
  - step: start
    tool:
      - name: pg
        kind: postgres
        connection: "host=127.0.0.1 port=5432 user=postgres dbname=test"
        script: { uri: "{{ workload.sql }}", source: { type: file } }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { answer: "{{ outcome.result.rows[0].answer }}" } }
      - name: greet
        kind: python
        args: { who: ada }
        script: { uri: "{{ workload.py }}" }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { hi: "{{ outcome.result.hi }}" } }
      - name: missing
        kind: python
        script: { uri: "{{ workload.py }}.gone", source: { type: file } }
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: continue, set_ctx: { missing: "{{ outcome.error }}" } }
      - name: refused
        kind: python
        script:
          uri: x.py
          source: { type: http, endpoint: "{{ workload.api }}/text?status=404&key=s3cr3t" }
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: continue, set_ctx: { refused: "{{ outcome.error }}" } }
"#;
    let workload = json!({
        "sql": sql.display().to_string(),
        "py": py.display().to_string(),
        "api": echo,
    });
    let eid = cluster.submit(yaml, "script_files.yaml", workload).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["answer"], 42);
    assert_eq!(s.ctx["hi"], "ADA");
    let missing = &s.ctx["missing"];
    assert_eq!(missing["kind"], "script", "{missing}");
    let message = missing["message"].as_str().unwrap();
    assert!(message.contains("greet.py.gone"), "{message}");
    let refused = &s.ctx["refused"];
    assert_eq!(refused["kind"], "script", "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("404") && message.contains("/text"),
        "{message}"
    );
    assert!(
        !message.contains("s3cr3t"),
        "the query string leaked: {message}"
    );
    cluster.stop().await;
}
