//! The postgres tool against the machine's PostgreSQL (127.0.0.1:5432,
//! trust auth, database `test`), one throw-away schema per test.

use std::time::{Duration, Instant};

use noetl_core::tool::{AuthCredential, Tool, ToolCall};
use noetl_core::OutcomeStatus;
use noetl_tool_postgres::{PostgresLimits, PostgresTool};
use serde_json::{json, Value};

const PASSWORD: &str = "not-a-real-secret-123";

fn cred() -> AuthCredential {
    AuthCredential {
        name: "pg".into(),
        kind: "postgres_credential".into(),
        data: json!({"host": "127.0.0.1", "port": 5432, "user": "postgres",
                     "password": PASSWORD, "database": "test"}),
    }
}

fn call(config: Value, spec: Value) -> ToolCall {
    ToolCall {
        step: "store".into(),
        task: "sql".into(),
        spec,
        auth: Some(cred()),
        ..ToolCall::new("postgres", config.as_object().unwrap().clone())
    }
}

/// A schema dropped when the test ends.
struct Schema {
    tool: PostgresTool,
    name: String,
}

impl Schema {
    async fn new(tool: &PostgresTool) -> Self {
        let name = format!("noetl_t_{}", uuid::Uuid::new_v4().simple());
        let r = tool
            .call(call(
                json!({"command": format!("create schema {name}")}),
                Value::Null,
            ))
            .await;
        assert!(r.outcome.is_ok(), "{:?}", r.outcome.error);
        Self {
            tool: tool.clone(),
            name,
        }
    }

    async fn run(&self, command: &str, params: Value) -> noetl_core::Outcome {
        let sql = command.replace("$S", &self.name);
        let mut c = json!({"command": sql});
        if !params.is_null() {
            c["params"] = params;
        }
        let r = self.tool.call(call(c, Value::Null)).await;
        let text = serde_json::to_string(&r.outcome).unwrap();
        assert!(!text.contains(PASSWORD), "the password leaked: {text}");
        r.outcome
    }

    async fn drop_now(self) {
        let r = self
            .tool
            .call(call(
                json!({"command": format!("drop schema {} cascade", self.name)}),
                Value::Null,
            ))
            .await;
        assert!(r.outcome.is_ok());
    }
}

#[tokio::test]
async fn rows_come_back_as_typed_objects() {
    let tool = PostgresTool::new();
    let s = Schema::new(&tool).await;
    let o = s
        .run(
            "create table $S.t (id int, name text, ok bool, doc jsonb, price numeric(10,2),
                at timestamptz, uid uuid, note text, tags text[], big numeric)",
            Value::Null,
        )
        .await;
    assert!(o.is_ok(), "{:?}", o.error);
    let o = s
        .run(
            "insert into $S.t values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            json!([1, "ada", true, {"k": [1, 2]}, "12.50", "2026-11-23T10:00:00Z",
                   "6f1c1a52-8f0e-4c1e-9b7a-0a0a0a0a0a0a", null, ["x", "y"], "123456789012345678.5"]),
        )
        .await;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(o.result["row_count"], 1);
    assert_eq!(o.result["command"], "INSERT");
    let o = s.run("select * from $S.t", Value::Null).await;
    let row = &o.result["rows"][0];
    assert_eq!(row["id"], 1);
    assert_eq!(row["name"], "ada");
    assert_eq!(row["ok"], true);
    assert_eq!(row["doc"], json!({"k": [1, 2]}));
    assert_eq!(row["price"], 12.5);
    assert_eq!(row["at"], "2026-11-23T10:00:00Z");
    assert_eq!(row["uid"], "6f1c1a52-8f0e-4c1e-9b7a-0a0a0a0a0a0a");
    assert_eq!(row["note"], Value::Null);
    assert_eq!(row["tags"], json!(["x", "y"]));
    assert_eq!(row["big"], "123456789012345678.5");
    assert_eq!(o.result["columns"][0], "id");
    s.drop_now().await;
}

#[tokio::test]
async fn writes_report_affected_counts_and_batches_are_atomic() {
    let tool = PostgresTool::new();
    let s = Schema::new(&tool).await;
    let o = s
        .run(
            "create table $S.t (id int primary key, v text);
             insert into $S.t select g, 'v' || g from generate_series(1, 5) g;
             update $S.t set v = 'x' where id <= 3;
             select count(*) as n from $S.t where v = 'x'",
            Value::Null,
        )
        .await;
    assert!(o.is_ok(), "{:?}", o.error);
    let st = o.result["statements"].as_array().unwrap();
    assert_eq!(st.len(), 4);
    assert_eq!(st[1]["row_count"], 5);
    assert_eq!(st[2]["row_count"], 3);
    assert_eq!(o.result["rows"][0]["n"], 3);
    // The second statement fails: the first is rolled back.
    let o = s
        .run(
            "delete from $S.t where id = 1; insert into $S.t values (2, 'dup')",
            Value::Null,
        )
        .await;
    assert_eq!(o.status, OutcomeStatus::Error);
    let e = o.error.as_ref().unwrap();
    assert_eq!(e.kind, "postgres.sql");
    assert!(!e.retryable);
    assert!(e.message.contains("(statement 2 of 2)"), "{}", e.message);
    assert_eq!(o.helpers["pg"]["code"], "23505");
    assert_eq!(o.helpers["pg"]["sqlstate"], "23505");
    assert_eq!(o.helpers["pg"]["constraint"], "t_pkey");
    let o = s.run("select count(*) as n from $S.t", Value::Null).await;
    assert_eq!(o.result["rows"][0]["n"], 5, "the delete was rolled back");
    let o = s.run("delete from $S.t where id > $1", json!([3])).await;
    assert_eq!(o.result["row_count"], 2);
    assert_eq!(o.result["command"], "DELETE");
    s.drop_now().await;
}

#[tokio::test]
async fn serialization_failures_are_retryable_by_code() {
    let tool = PostgresTool::new();
    let o = tool
        .call(call(
            json!({"command": "do $$ begin raise exception 'conflict; retry' using errcode = '40001'; end $$"}),
            Value::Null,
        ))
        .await
        .outcome;
    let e = o.error.as_ref().unwrap();
    assert_eq!(e.kind, "postgres.sql");
    assert!(e.retryable);
    assert_eq!(o.helpers["pg"]["code"], "40001");
    assert!(
        e.message.contains("conflict; retry [40001]"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn slow_statements_are_cancelled_at_the_timeout() {
    let tool = PostgresTool::new();
    let t = Instant::now();
    let o = tool
        .call(call(
            json!({"command": "select pg_sleep(5)"}),
            json!({"timeout": 0.5}),
        ))
        .await
        .outcome;
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let e = o.error.unwrap();
    assert_eq!(e.kind, "timeout");
    assert!(e.retryable);
    // The pool still works afterwards.
    let o = tool
        .call(call(json!({"command": "select 1 as one"}), Value::Null))
        .await
        .outcome;
    assert_eq!(o.result["rows"][0]["one"], 1);
}

#[tokio::test]
async fn one_pool_per_credential_reuses_connections() {
    let tool = PostgresTool::with_limits(PostgresLimits { pool_size: 1 });
    let pid = |o: noetl_core::Outcome| o.result["rows"][0]["pid"].clone();
    let a = pid(tool
        .call(call(
            json!({"command": "select pg_backend_pid() as pid"}),
            Value::Null,
        ))
        .await
        .outcome);
    let b = pid(tool
        .call(call(
            json!({"command": "select pg_backend_pid() as pid"}),
            Value::Null,
        ))
        .await
        .outcome);
    assert_eq!(a, b);
    assert_eq!(tool.pools(), 1);
}

#[tokio::test]
async fn a_pool_is_kept_per_connect_timeout_too() {
    // The pool's waits are bounded by the connect timeout it was built
    // with: a task with other timeouts must not inherit the first one's.
    let tool = PostgresTool::new();
    for connect in [1, 7, 1] {
        let o = tool
            .call(call(
                json!({"command": "select 1 as one"}),
                json!({"timeout": {"connect": connect, "read": 30}}),
            ))
            .await
            .outcome;
        assert_eq!(o.result["rows"][0]["one"], 1, "{o:?}");
    }
    assert_eq!(tool.pools(), 2);
}

#[tokio::test]
async fn bad_credentials_and_unreachable_servers_are_clear() {
    let tool = PostgresTool::new();
    let mut c = call(json!({"command": "select 1"}), Value::Null);
    c.auth = Some(AuthCredential {
        name: "api".into(),
        kind: "bearer".into(),
        data: json!({"token": "t-123456789"}),
    });
    let e = tool.call(c).await.outcome.error.unwrap();
    assert_eq!(e.kind, "postgres.config");
    assert!(e.message.contains("postgres_credential"), "{}", e.message);

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = call(
        json!({"command": "select 1"}),
        json!({"timeout": {"connect": 2}}),
    );
    let mut cr = cred();
    cr.data["port"] = json!(port);
    c.auth = Some(cr);
    let o = tool.call(c).await.outcome;
    let e = o.error.as_ref().unwrap();
    assert_eq!(e.kind, "postgres.connect");
    assert!(e.retryable);
    assert!(
        e.message.contains(&format!("`pg` (127.0.0.1:{port}/test)")),
        "{}",
        e.message
    );
    assert!(!serde_json::to_string(&o).unwrap().contains(PASSWORD));

    let mut c = call(
        json!({"command": "select 1; select 2", "params": [1]}),
        Value::Null,
    );
    c.auth = Some(cred());
    let e = tool.call(c).await.outcome.error.unwrap();
    assert!(e.message.contains("split it into tasks"), "{}", e.message);
}
