//! The `nats` and `transfer` kinds end to end: nats tasks on the mesh's own
//! server (messages a test client receives and answers, KV, the mesh's own
//! names refused), a transfer from an HTTP server started here into the
//! machine's PostgreSQL with the credential from the encrypted keychain,
//! and PostgreSQL rows through an s3s-fs object (`make setup`) and back,
//! each side with its own keychain entry.

use std::time::Duration;

use axum::routing::get;
use axum::{Json, Router};
use futures::StreamExt;
use noetl_integration::Cluster;
use noetl_mesh::{credentials::Credential, state::ExecStatus};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_tasks_message_and_store_on_the_meshs_server_but_never_touch_its_own() {
    let cluster = Cluster::start().await;
    let client = cluster.mesh.client().clone();
    let mut orders = client.subscribe("orders.created").await.unwrap();
    let mut svc = client.subscribe("prices.quote").await.unwrap();
    let responder = client.clone();
    tokio::spawn(async move {
        while let Some(m) = svc.next().await {
            let q: Value = serde_json::from_slice(&m.payload).unwrap();
            let price = json!({"sku": q["sku"], "price": 12.5});
            let reply = m.reply.unwrap();
            responder
                .publish(reply, price.to_string().into())
                .await
                .unwrap();
        }
    });
    client.flush().await.unwrap();
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: nats_e2e }
workload: { sku: A-1 }
workflow:
  - step: start
    tool:
      - name: quote
        kind: nats
        operation: request
        subject: prices.quote
        data: { sku: "{{ workload.sku }}" }
        spec:
          timeout: { read: 10 }
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { quote: "{{ outcome.result.data }}" } }
      - name: announce
        kind: nats
        operation: publish
        subject: orders.created
        data: { sku: "{{ workload.sku }}", price: "{{ ctx.quote.price }}" }
      - name: remember
        kind: nats
        operation: kv_put
        bucket: orders
        key: "{{ workload.sku }}"
        value: "{{ ctx.quote }}"
      - name: recall
        kind: nats
        operation: kv_get
        bucket: orders
        key: "{{ workload.sku }}"
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { recalled: "{{ outcome.result.value }}" } }
      - name: peek_at_the_mesh
        kind: nats
        operation: kv_get
        bucket: noetl_ctx
        key: "{{ execution_id }}"
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' and outcome.error.kind == 'nats.protected' }}"
                then: { do: continue, set_ctx: { refused: true } }
"#;
    let (_, s) = cluster.completed(yaml, Value::Null).await;
    assert_eq!(s.ctx["recalled"], json!({"sku": "A-1", "price": 12.5}));
    assert_eq!(s.ctx["refused"], true);
    let msg = tokio::time::timeout(Duration::from_secs(10), orders.next())
        .await
        .expect("the published order")
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&msg.payload).unwrap(),
        json!({"sku": "A-1", "price": 12.5})
    );
    cluster.stop().await;
}

const PASSWORD: &str = "pw-transfer-never-shown-77";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_moves_http_rows_into_postgres_with_a_keychain_credential() {
    let posts: Value = (1..=7)
        .map(|i| json!({"id": i, "userId": 100 + i % 3, "title": format!("post {i}")}))
        .collect();
    let app = Router::new().route("/posts", get(move || async move { Json(posts.clone()) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let schema = format!("noetl_xfer_{}", uuid::Uuid::new_v4().simple());

    let cluster = Cluster::start().await;
    cluster
        .mesh
        .vault()
        .put(&Credential {
            name: "pg_local".into(),
            kind: "postgres_credential".into(),
            data: json!({"host": "127.0.0.1", "port": 5432, "user": "postgres",
                         "password": PASSWORD, "database": "test"}),
        })
        .await
        .unwrap();
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: http_to_postgres_transfer }
keychain:
  - { name: pg_local, kind: postgres_credential }
workflow:
  - step: start
    tool:
      - name: create_table
        kind: postgres
        auth: pg_local
        command: |
          CREATE SCHEMA {{ workload.schema }};
          CREATE TABLE {{ workload.schema }}.posts (
            id SERIAL PRIMARY KEY, post_id INTEGER UNIQUE, user_id INTEGER, title TEXT)
      - name: load
        kind: transfer
        source: { tool: http, url: "{{ workload.api }}/posts" }
        target:
          tool: postgres
          auth: pg_local
          table: "{{ workload.schema }}.posts"
          key: post_id
        mapping: { post_id: id, user_id: userId, title: title }
        chunk_size: 3
        mode: upsert
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { moved: "{{ outcome.result }}" } }
      - name: count
        kind: postgres
        auth: pg_local
        command: "SELECT count(*) AS n, sum(user_id) AS users FROM {{ workload.schema }}.posts"
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { stored: "{{ outcome.result.rows[0] }}" } }
      - name: drop
        kind: postgres
        auth: pg_local
        command: "DROP SCHEMA {{ workload.schema }} CASCADE"
"#;
    let (eid, s) = cluster
        .completed(yaml, json!({"api": api, "schema": schema}))
        .await;
    let moved = &s.ctx["moved"];
    assert_eq!(moved["rows_read"], 7);
    assert_eq!(moved["rows_written"], 7);
    assert_eq!(moved["batches"], 3);
    assert_eq!(moved["direction"], "http_to_postgres");
    // 101, 102, 100, 101, 102, 100, 101
    assert_eq!(s.ctx["stored"], json!({"n": 7, "users": 707}));
    for e in cluster.settled_events(&eid).await {
        let payload = String::from_utf8_lossy(&e.payload_json);
        assert!(
            !payload.contains(PASSWORD),
            "{} holds the password",
            e.event_type
        );
    }
    assert_eq!(s.status, ExecStatus::Completed);
    cluster.stop().await;
}

const S3_PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: postgres_s3_round_trip }
keychain:
  - { name: pg_local, kind: postgres_credential }
  - { name: s3_main, kind: secret }
workflow:
  - step: start
    tool:
      - name: create
        kind: postgres
        auth: pg_local
        command: |
          CREATE SCHEMA {{ workload.schema }};
          CREATE TABLE {{ workload.schema }}.src (id INT PRIMARY KEY, name TEXT);
          INSERT INTO {{ workload.schema }}.src VALUES (1, 'ada'), (2, 'bo, jr');
          CREATE TABLE {{ workload.schema }}.dst (id INT PRIMARY KEY, name TEXT)
      - name: export
        kind: transfer
        source: { tool: postgres, auth: pg_local, query: "SELECT id, name FROM {{ workload.schema }}.src ORDER BY id" }
        target: { tool: s3, auth: s3_main, url: "s3://exports/{{ execution_id }}/src.csv" }
      - name: import
        kind: transfer
        source: { tool: s3, auth: s3_main, url: "s3://exports/{{ execution_id }}/src.csv" }
        target: { tool: postgres, auth: pg_local, table: "{{ workload.schema }}.dst" }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { moved: "{{ outcome.result }}" } }
      - name: read
        kind: postgres
        auth: pg_local
        command: "SELECT id, name FROM {{ workload.schema }}.dst ORDER BY id"
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { stored: "{{ outcome.result.rows }}" } }
      - name: drop
        kind: postgres
        auth: pg_local
        command: "DROP SCHEMA {{ workload.schema }} CASCADE"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_round_trips_postgres_rows_through_s3_with_keychain_entries() {
    use noetl_testkit::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
    let s3 = S3Server::start("exports");
    let schema = format!("noetl_xs3_{}", uuid::Uuid::new_v4().simple());
    let cluster = Cluster::start().await;
    let vault = cluster.mesh.vault();
    for (name, kind, data) in [
        (
            "pg_local",
            "postgres_credential",
            json!({"host": "127.0.0.1", "port": 5432, "user": "postgres",
                   "password": PASSWORD, "database": "test"}),
        ),
        (
            "s3_main",
            "secret",
            json!({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                   "endpoint": s3.endpoint(), "region": "us-east-1"}),
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
    let (eid, s) = cluster
        .completed(S3_PLAYBOOK, json!({"schema": schema}))
        .await;
    assert_eq!(s.ctx["moved"]["direction"], "s3_to_postgres", "{s:?}");
    assert_eq!(s.ctx["moved"]["source_format"], "csv");
    assert_eq!(
        s.ctx["stored"],
        json!([{"id": 1, "name": "ada"}, {"id": 2, "name": "bo, jr"}])
    );
    let stored = std::fs::read_to_string(s3.dir().join(format!("exports/{eid}/src.csv"))).unwrap();
    assert_eq!(stored, "id,name\n1,ada\n2,\"bo, jr\"\n");
    for e in cluster.settled_events(&eid).await {
        let payload = String::from_utf8_lossy(&e.payload_json);
        assert!(
            !payload.contains(SECRET_KEY) && !payload.contains(PASSWORD),
            "{} holds a secret",
            e.event_type
        );
    }
    cluster.stop().await;
}
