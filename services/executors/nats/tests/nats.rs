//! The nats tool against real nats-servers started by each test: the
//! testkit's (the "mesh's own" server) and, for credentials, one with
//! authorization configured here.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use noetl_core::tool::{AuthCredential, Tool, ToolCall};
use noetl_core::{Outcome, OutcomeStatus};
use noetl_testkit::TestServer;
use noetl_tool_nats::{MeshServer, NatsTool};
use serde_json::{json, Value};

const PASSWORD: &str = "nats-pass-not-real-42";

fn tool_for(urls: &str) -> NatsTool {
    NatsTool::new(MeshServer {
        urls: urls.into(),
        auth: Default::default(),
        prefix: "noetl".into(),
        replicas: 1,
    })
}

async fn run(tool: &NatsTool, config: Value) -> Outcome {
    run_as(tool, config, None, Value::Null).await
}

async fn run_as(
    tool: &NatsTool,
    config: Value,
    auth: Option<AuthCredential>,
    spec: Value,
) -> Outcome {
    let call = ToolCall {
        step: "cache".into(),
        task: "kv".into(),
        spec,
        auth,
        ..ToolCall::new("nats", config.as_object().cloned().expect("object"))
    };
    let o = tool.call(call).await.outcome;
    let text = serde_json::to_string(&o).unwrap();
    assert!(!text.contains(PASSWORD), "the password leaked: {text}");
    o
}

/// Waits until the server has processed everything `client` sent before
/// (its subscriptions included): `flush` only empties the client's write
/// buffer, while a message the client receives from itself proves the
/// server got what came before it.
async fn synced(client: &async_nats::Client) {
    let inbox = client.new_inbox();
    let mut echo = client.subscribe(inbox.clone()).await.unwrap();
    client.publish(inbox, "sync".into()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), echo.next())
        .await
        .expect("the server echoes the sync message")
        .expect("the sync subscription is open");
}

fn error_kind(o: &Outcome) -> &str {
    o.error.as_ref().map(|e| e.kind.as_str()).unwrap_or("ok")
}

#[tokio::test]
async fn kv_put_get_delete_and_keys_round_trip() {
    let server = TestServer::start();
    let tool = tool_for(&server.url());
    let value = json!({"session_token": "t1", "user_id": 1, "is_active": true});
    let put = run(
        &tool,
        json!({"operation": "kv_put", "bucket": "sessions", "key": "test_session_123", "value": value}),
    )
    .await;
    assert_eq!(put.status, OutcomeStatus::Ok, "{:?}", put.error);
    assert_eq!(put.result["revision"], 1);
    // What another client sees: the JSON of the value.
    let js = async_nats::jetstream::new(server.client().await);
    let kv = js.get_key_value("sessions").await.unwrap();
    let raw = kv.get("test_session_123").await.unwrap().unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&raw).unwrap(), value);

    let got = run(
        &tool,
        json!({"operation": "kv_get", "bucket": "sessions", "key": "test_session_123"}),
    )
    .await;
    assert_eq!(got.result["found"], true);
    assert_eq!(got.result["value"], value);
    assert_eq!(got.result["revision"], 1);
    assert!(got.result["created"].as_str().unwrap().contains('T'));

    run(
        &tool,
        json!({"operation": "kv_put", "bucket": "sessions", "key": "b/2", "value": "plain"}),
    )
    .await;
    let keys = run(&tool, json!({"operation": "kv_keys", "bucket": "sessions"})).await;
    let mut names: Vec<String> = keys.result["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["b/2", "test_session_123"]);

    let del = run(
        &tool,
        json!({"operation": "kv_delete", "bucket": "sessions", "key": "test_session_123"}),
    )
    .await;
    assert!(del.is_ok(), "{:?}", del.error);
    let gone = run(
        &tool,
        json!({"operation": "kv_get", "bucket": "sessions", "key": "test_session_123"}),
    )
    .await;
    assert!(gone.is_ok());
    assert_eq!(
        (gone.result["found"].clone(), gone.result["value"].clone()),
        (json!(false), Value::Null)
    );
    let text = run(
        &tool,
        json!({"operation": "kv_get", "bucket": "sessions", "key": "b/2"}),
    )
    .await;
    assert_eq!(text.result["value"], "plain");

    let missing = run(
        &tool,
        json!({"operation": "kv_get", "bucket": "nope", "key": "k"}),
    )
    .await;
    assert_eq!(error_kind(&missing), "nats.not_found");
    assert!(missing.error.unwrap().message.contains("\"nope\""));
    // One pooled client served every task.
    assert_eq!(tool.connections(), 1);
}

#[tokio::test]
async fn publish_request_and_jetstream_publish_reach_their_subjects() {
    let server = TestServer::start();
    let tool = tool_for(&server.url());
    let client = server.client().await;
    let mut sub = client.subscribe("orders.created").await.unwrap();
    synced(&client).await;
    let o = run(
        &tool,
        json!({"operation": "publish", "subject": "orders.created", "data": {"id": 7}, "headers": {"X-Trace": "a1"}}),
    )
    .await;
    assert!(o.is_ok(), "{:?}", o.error);
    let msg = sub.next().await.unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&msg.payload).unwrap(),
        json!({"id": 7})
    );
    assert_eq!(msg.headers.unwrap().get("X-Trace").unwrap().as_str(), "a1");

    // A responder that doubles the number it is sent.
    let mut svc = client.subscribe("math.double").await.unwrap();
    let responder = client.clone();
    tokio::spawn(async move {
        while let Some(m) = svc.next().await {
            let n: i64 = serde_json::from_slice(&m.payload).unwrap();
            let reply = m.reply.unwrap();
            responder
                .publish(reply, (n * 2).to_string().into())
                .await
                .unwrap();
        }
    });
    synced(&client).await;
    let o = run(
        &tool,
        json!({"operation": "request", "subject": "math.double", "data": 21}),
    )
    .await;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(o.result["data"], 42);

    let o = run(
        &tool,
        json!({"operation": "request", "subject": "nobody.home", "data": 1}),
    )
    .await;
    assert_eq!(error_kind(&o), "nats.no_responders");
    assert!(o.error.unwrap().retryable);
    // A subscriber that never answers: the request times out.
    let mut silent = client.subscribe("slow.service").await.unwrap();
    tokio::spawn(async move { while silent.next().await.is_some() {} });
    synced(&client).await;
    let o = run_as(
        &tool,
        json!({"operation": "request", "subject": "slow.service"}),
        None,
        json!({"timeout": {"read": 0.3}}),
    )
    .await;
    assert_eq!(error_kind(&o), "timeout");

    let js = async_nats::jetstream::new(client.clone());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let o = run(
        &tool,
        json!({"operation": "js_publish", "subject": "orders.paid", "data": "x", "stream": "ORDERS"}),
    )
    .await;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(
        (o.result["stream"].clone(), o.result["seq"].clone()),
        (json!("ORDERS"), json!(1))
    );
    let o = run(
        &tool,
        json!({"operation": "js_publish", "subject": "unstored.x", "data": "x"}),
    )
    .await;
    assert_eq!(error_kind(&o), "nats.error", "{:?}", o.error);
}

#[tokio::test]
async fn objects_are_stored_and_read_back_as_text_or_base64() {
    let server = TestServer::start();
    let tool = tool_for(&server.url());
    let put = run(
        &tool,
        json!({"operation": "object_put", "bucket": "reports", "object": "r1.json", "data": {"total": 3}, "description": "daily"}),
    )
    .await;
    assert!(put.is_ok(), "{:?}", put.error);
    assert_eq!(put.result["size"], 11);
    let get = run(
        &tool,
        json!({"operation": "object_get", "bucket": "reports", "object": "r1.json"}),
    )
    .await;
    assert_eq!(get.result["data"], r#"{"total":3}"#);
    let bin = run(
        &tool,
        json!({"operation": "object_put", "bucket": "reports", "object": "bin", "data": "AP8=", "encoding": "base64"}),
    )
    .await;
    assert_eq!(bin.result["size"], 2);
    let back = run(&tool, json!({"operation": "object_get", "bucket": "reports", "object": "bin", "encoding": "base64"})).await;
    assert_eq!(back.result["data"], "AP8=");
    let as_text = run(
        &tool,
        json!({"operation": "object_get", "bucket": "reports", "object": "bin"}),
    )
    .await;
    assert!(as_text.error.unwrap().message.contains("encoding: base64"));
    let none = run(
        &tool,
        json!({"operation": "object_get", "bucket": "reports", "object": "nope"}),
    )
    .await;
    assert_eq!(error_kind(&none), "nats.not_found");
    let del = run(
        &tool,
        json!({"operation": "object_delete", "bucket": "reports", "object": "r1.json"}),
    )
    .await;
    assert!(del.is_ok(), "{:?}", del.error);
    let gone = run(
        &tool,
        json!({"operation": "object_get", "bucket": "reports", "object": "r1.json"}),
    )
    .await;
    assert_eq!(error_kind(&gone), "nats.not_found");
}

#[tokio::test]
async fn the_meshs_own_names_are_refused_before_connecting() {
    let server = TestServer::start();
    let tool = tool_for(&server.url());
    for config in [
        json!({"operation": "publish", "subject": "noetl.exec.request", "data": {}}),
        json!({"operation": "request", "subject": "$JS.API.STREAM.LIST"}),
        json!({"operation": "kv_get", "bucket": "noetl_ctx", "key": "e1"}),
        json!({"operation": "kv_put", "bucket": "NOETL_credentials", "key": "k", "value": 1}),
        json!({"operation": "js_publish", "subject": "x.y", "stream": "NOETL_WORK"}),
    ] {
        let o = run(&tool, config.clone()).await;
        assert_eq!(error_kind(&o), "nats.protected", "{config}");
        assert!(o.error.unwrap().message.contains("docs/security.md"));
    }
    // Refused before any connection was made.
    assert_eq!(tool.connections(), 0);
    let o = run(
        &tool,
        json!({"operation": "kv_get", "bucket": "b", "key": "k"}),
    )
    .await;
    assert_eq!(error_kind(&o), "nats.not_found");
    let o = run(&tool, json!({"operation": "kv_get", "bucket": "b"})).await;
    assert_eq!(error_kind(&o), "nats.config");
    assert!(o.error.unwrap().message.contains("`key` is required"));
}

/// A nats-server with user/password and nkey users, on a free port.
struct AuthServer {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn auth_server(nkey_public: &str) -> AuthServer {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            r#"
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{store}" }}
authorization {{
  users: [
    {{ user: "app", password: "{PASSWORD}" }}
    {{ nkey: "{nkey_public}" }}
  ]
}}
"#,
            store = dir.path().join("js").display()
        ),
    )
    .unwrap();
    let binary = noetl_mesh::server::find_binary(None).unwrap_or_else(|e| panic!("{e}"));
    let child = Command::new(binary)
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..300 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    AuthServer {
        child,
        url: format!("nats://127.0.0.1:{port}"),
        _dir: dir,
    }
}

fn secret(data: Value) -> AuthCredential {
    AuthCredential {
        name: "nats_credential".into(),
        kind: "secret".into(),
        data,
    }
}

#[tokio::test]
async fn credentials_and_urls_pick_the_server_and_the_identity() {
    let mesh = TestServer::start();
    let user = nkeys::KeyPair::new_user();
    let other = auth_server(&user.public_key());
    let tool = tool_for(&mesh.url());
    let put =
        |key: &str| json!({"operation": "kv_put", "bucket": "sessions", "key": key, "value": 1});

    // NoETL's credential fields: the server and the user come from it.
    let noetl_style =
        secret(json!({"nats_url": other.url, "nats_user": "app", "nats_password": PASSWORD}));
    let o = run_as(
        &tool,
        put("by_password"),
        Some(noetl_style.clone()),
        Value::Null,
    )
    .await;
    assert!(o.is_ok(), "{:?}", o.error);
    let seed = secret(json!({"url": other.url, "nkey_seed": user.seed().unwrap()}));
    let o = run_as(&tool, put("by_nkey"), Some(seed), Value::Null).await;
    assert!(o.is_ok(), "{:?}", o.error);
    // The values are on the other server, not on the mesh's.
    let theirs = async_nats::ConnectOptions::new()
        .user_and_password("app".into(), PASSWORD.into())
        .connect(other.url.as_str())
        .await
        .unwrap();
    let kv = async_nats::jetstream::new(theirs)
        .get_key_value("sessions")
        .await
        .unwrap();
    assert!(kv.get("by_password").await.unwrap().is_some());
    assert!(kv.get("by_nkey").await.unwrap().is_some());
    let ours = async_nats::jetstream::new(mesh.client().await);
    assert!(ours.get_key_value("sessions").await.is_err());

    // A wrong password is refused, without echoing it.
    let wrong =
        secret(json!({"url": other.url, "user": "app", "password": format!("{PASSWORD}-x")}));
    let o = run_as(&tool, put("k"), Some(wrong), Value::Null).await;
    assert_eq!(error_kind(&o), "nats.connect", "{:?}", o.error);
    assert!(o.error.as_ref().unwrap().retryable);
    // `url` on the task picks the server; no credential: refused there.
    let o = run(
        &tool,
        json!({"operation": "kv_get", "bucket": "sessions", "key": "k", "url": other.url}),
    )
    .await;
    assert_eq!(error_kind(&o), "nats.connect");
    // A credential of another kind is a config error.
    let pg = AuthCredential {
        name: "pg".into(),
        kind: "postgres_credential".into(),
        data: json!({"user": "u"}),
    };
    let o = run_as(&tool, put("k"), Some(pg), Value::Null).await;
    assert_eq!(error_kind(&o), "nats.config");
    // One client per server and credential that connected.
    let o = run_as(&tool, put("again"), Some(noetl_style), Value::Null).await;
    assert!(o.is_ok());
    assert_eq!(tool.connections(), 2);
}
