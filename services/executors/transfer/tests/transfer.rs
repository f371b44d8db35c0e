//! The transfer tool against the machine's PostgreSQL (127.0.0.1:5432,
//! trust auth, database `test`; a throw-away schema per test), DuckDB
//! files, and an HTTP server started here.

mod support;

use axum::routing::get;
use axum::{Json, Router};
use noetl_core::tool::{AuthCredential, Tool, ToolCall};
use noetl_core::Outcome;
use serde_json::{json, Value};
use support::Schema;

const PASSWORD: &str = "transfer-pw-not-real-7";

fn pg_cred() -> AuthCredential {
    AuthCredential {
        name: "pg_local".into(),
        kind: "postgres_credential".into(),
        data: json!({"host": "127.0.0.1", "port": 5432, "user": "postgres",
                     "password": PASSWORD, "database": "test"}),
    }
}

/// A throw-away schema of this suite's.
async fn schema() -> Schema {
    Schema::new("noetl_xfer", pg_cred()).await
}

async fn transfer(config: Value, auths: &[(&str, AuthCredential)]) -> Outcome {
    support::transfer(config, auths, PASSWORD).await
}

/// An API with five posts under `/posts` and the same wrapped under
/// `/wrapped` (`{"data": {"items": [...]}}`).
async fn start_api() -> String {
    fn posts() -> Value {
        Value::Array(
            (1..=5)
                .map(|i| json!({"id": i, "userId": 10 + i % 2, "title": format!("post {i}"), "meta": {"tag": format!("t{i}")}}))
                .collect(),
        )
    }
    let app = Router::new()
        .route("/posts", get(|| async { Json(posts()) }))
        .route(
            "/wrapped",
            get(|| async { Json(json!({"data": {"items": posts()}})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn http_rows_go_into_postgres_in_batches_with_a_mapping() {
    let api = start_api().await;
    let s = schema().await;
    s.sql("create table $S.posts (id serial primary key, post_id integer, user_id integer, title text, tag text)")
        .await;
    // NoETL's fixture shape: `type:` and the mapping under `target`.
    let o = transfer(
        json!({
            "source": {"type": "http", "url": format!("{api}/posts"), "method": "GET"},
            "target": {"type": "postgres", "auth": "pg_local", "table": format!("{}.posts", s.name),
                       "mapping": {"post_id": "id", "user_id": "userId", "title": "title", "tag": "meta.tag"}},
            "chunk_size": 2
        }),
        &[("target", pg_cred())],
    )
    .await;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(o.result["rows_read"], 5);
    assert_eq!(o.result["rows_written"], 5);
    assert_eq!(o.result["batches"], 3);
    assert_eq!(o.result["chunks_processed"], 3);
    assert_eq!(o.result["direction"], "http_to_postgres");
    let rows = s
        .sql("select post_id, user_id, title, tag from $S.posts order by post_id")
        .await;
    assert_eq!(rows["row_count"], 5);
    assert_eq!(
        rows["rows"][4],
        json!({"post_id": 5, "user_id": 11, "title": "post 5", "tag": "t5"})
    );

    // The rows at a path of the response; a table that is not there fails
    // with the postgres tool's own outcome, naming the side.
    let o = transfer(
        json!({
            "source": {"tool": "http", "url": format!("{api}/wrapped"), "data_path": "data.items"},
            "target": {"tool": "postgres", "auth": "pg_local", "table": format!("{}.missing", s.name)},
            "mapping": {"post_id": "id"}
        }),
        &[("target", pg_cred())],
    )
    .await;
    let e = o.error.clone().unwrap();
    assert_eq!(e.kind, "postgres.sql");
    assert!(
        e.message
            .starts_with("transfer task \"xfer\" of step \"load\": target postgres:"),
        "{}",
        e.message
    );
    assert_eq!(o.helpers["transfer"]["stage"], "target");
    assert_eq!(o.helpers["transfer"]["rows_read"], 5);
    let o = transfer(
        json!({
            "source": {"tool": "http", "url": format!("{api}/wrapped"), "data_path": "data.nothing"},
            "target": {"tool": "postgres", "auth": "pg_local", "table": "t"}
        }),
        &[("target", pg_cred())],
    )
    .await;
    assert_eq!(o.error.unwrap().kind, "transfer.source");
    s.drop_now().await;
}

#[cfg(feature = "duckdb")]
#[tokio::test]
async fn postgres_rows_upsert_into_duckdb_and_back_with_replace() {
    let s = schema().await;
    s.sql("create table $S.src (id int primary key, name text, score numeric)")
        .await;
    s.sql("insert into $S.src values (1, 'a', 1.5), (2, 'b', 2), (3, 'c', 3.25)")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.duckdb").display().to_string();
    let duck = noetl_tool_duckdb::DuckdbTool;
    let duck_sql = |command: &str| {
        let call = ToolCall::new(
            "duckdb",
            json!({"command": command, "database": db})
                .as_object()
                .cloned()
                .unwrap(),
        );
        async move {
            let o = duck.call(call).await.outcome;
            assert!(o.is_ok(), "{:?}", o.error);
            o.result
        }
    };
    duck_sql("create table people (id integer primary key, name varchar, score double)").await;
    duck_sql("insert into people values (2, 'old', 0)").await;
    let to_duck = json!({
        "source": {"tool": "postgres", "auth": "pg_local", "query": format!("select id, name, score from {}.src order by id", s.name)},
        "target": {"tool": "duckdb", "database": db, "table": "people", "key": "id"},
        "mode": "upsert",
        "chunk_size": 2
    });
    let o = transfer(to_duck.clone(), &[("source", pg_cred())]).await;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(
        (o.result["rows_read"].clone(), o.result["batches"].clone()),
        (json!(3), json!(2))
    );
    assert_eq!(o.result["columns"], json!(["id", "name", "score"]));
    let rows = duck_sql("select id, name, score from people order by id").await;
    assert_eq!(
        rows["rows"],
        json!([{"id": 1, "name": "a", "score": 1.5}, {"id": 2, "name": "b", "score": 2.0}, {"id": 3, "name": "c", "score": 3.25}])
    );
    // Run again: an upsert changes nothing.
    let o = transfer(to_duck, &[("source", pg_cred())]).await;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(
        duck_sql("select count(*) as n from people").await["rows"][0]["n"],
        3
    );

    // Back into PostgreSQL, replacing what the table held.
    s.sql("create table $S.dst (id int, name text)").await;
    s.sql("insert into $S.dst values (99, 'stale')").await;
    let o = transfer(
        json!({
            "source": {"tool": "duckdb", "database": db, "query": "select id, name from people where id >= 2 order by id"},
            "target": {"tool": "postgres", "auth": "pg_local", "table": format!("{}.dst", s.name)},
            "mode": "replace"
        }),
        &[("target", pg_cred())],
    )
    .await;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(o.result["rows_written"], 2);
    let rows = s.sql("select id, name from $S.dst order by id").await;
    assert_eq!(
        rows["rows"],
        json!([{"id": 2, "name": "b"}, {"id": 3, "name": "c"}])
    );
    s.drop_now().await;
}

#[tokio::test]
async fn wrong_fields_fail_before_anything_runs() {
    let o = transfer(
        json!({"source": {"tool": "snowflake", "query": "select 1"}, "target": {"tool": "postgres", "table": "t"}}),
        &[],
    )
    .await;
    let e = o.error.unwrap();
    assert_eq!(e.kind, "transfer.config");
    assert!(
        e.message.contains("`source.tool`") && e.message.contains("snowflake"),
        "{}",
        e.message
    );
    let o = transfer(
        json!({"source": {"tool": "postgres", "query": "select 1 as a"}, "target": {"tool": "postgres", "table": "t"}}),
        &[],
    )
    .await;
    // No credential for the source: the postgres tool says so.
    assert_eq!(o.error.unwrap().kind, "postgres.config");
}
