//! The http tool against a real HTTP server started by the test.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::extract::{Query, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use noetl_core::tool::{AuthCredential, Tool, ToolCall};
use noetl_core::OutcomeStatus;
use noetl_tool_http::HttpTool;
use serde_json::{json, Value};

const TOKEN: &str = "tok-S3CRET-http-42";

async fn echo(req: Request) -> Json<Value> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let headers: HashMap<String, String> = parts
        .headers
        .iter()
        .filter(|(k, _)| k.as_str() != "authorization")
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let auth_ok = parts
        .headers
        .get("authorization")
        .map(|v| v == format!("Bearer {TOKEN}").as_str())
        .unwrap_or(false);
    Json(json!({
        "method": parts.method.as_str(),
        "query": parts.uri.query().unwrap_or(""),
        "headers": headers,
        "body": String::from_utf8_lossy(&bytes),
        "bearer_ok": auth_ok,
    }))
}

async fn items(Query(q): Query<HashMap<String, String>>) -> Json<Value> {
    let page: u64 = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
    Json(json!({
        "items": [page * 10, page * 10 + 1],
        "next_page": if page < 3 { json!(page + 1) } else { Value::Null },
    }))
}

async fn start_server() -> String {
    let app = Router::new()
        .route(
            "/json",
            get(|| async { Json(json!({"hello": "world", "n": [1, 2]})) }),
        )
        .route("/text", get(|| async { "plain words" }))
        .route("/echo", any(echo))
        .route("/items", get(items))
        .route("/missing", get(|| async { StatusCode::NOT_FOUND }))
        .route(
            "/boom",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "it broke") }),
        )
        .route(
            "/busy",
            get(|| async {
                let mut h = HeaderMap::new();
                h.insert("retry-after", "2".parse().unwrap());
                (StatusCode::TOO_MANY_REQUESTS, h, "slow down")
            }),
        )
        .route(
            "/unavailable",
            get(|| async {
                let when =
                    httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
                let mut h = HeaderMap::new();
                h.insert("retry-after", when.parse().unwrap());
                (StatusCode::SERVICE_UNAVAILABLE, h, "later")
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                "late"
            }),
        )
        .route("/moved", get(|| async { Redirect::temporary("/json") }))
        .route(
            "/big",
            get(|| async { "x".repeat(10_000).into_response() as Response }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn call(config: Value, spec: Value) -> ToolCall {
    ToolCall {
        step: "s".into(),
        task: "fetch".into(),
        spec,
        ..ToolCall::new("http", config.as_object().unwrap().clone())
    }
}

#[tokio::test]
async fn json_and_text_responses_become_data() {
    let base = start_server().await;
    let tool = HttpTool::new();
    let r = tool
        .call(call(json!({"url": format!("{base}/json")}), Value::Null))
        .await;
    assert_eq!(r.outcome.status, OutcomeStatus::Ok);
    assert_eq!(
        r.outcome.result["data"],
        json!({"hello": "world", "n": [1, 2]})
    );
    assert_eq!(r.outcome.result["status"], 200);
    assert_eq!(r.outcome.helpers["http"]["status"], 200);
    assert!(r.outcome.helpers["http"]["headers"]["content-type"]
        .as_str()
        .unwrap()
        .contains("json"));
    let r = tool
        .call(call(json!({"url": format!("{base}/text")}), Value::Null))
        .await;
    assert_eq!(r.outcome.result["data"], "plain words");
}

#[tokio::test]
async fn method_params_headers_and_bodies_are_sent() {
    let base = start_server().await;
    let tool = HttpTool::new();
    let r = tool
        .call(call(
            json!({"url": format!("{base}/echo"), "method": "post", "params": {"page": 2, "tag": ["a", "b"]},
                   "headers": {"X-Trace": "t-1"}, "json": {"k": [1, 2]}}),
            Value::Null,
        ))
        .await;
    let d = &r.outcome.result["data"];
    assert_eq!(d["method"], "POST");
    assert_eq!(d["query"], "page=2&tag=a&tag=b");
    assert_eq!(d["headers"]["x-trace"], "t-1");
    assert_eq!(d["headers"]["content-type"], "application/json");
    assert_eq!(
        serde_json::from_str::<Value>(d["body"].as_str().unwrap()).unwrap(),
        json!({"k": [1, 2]})
    );
    let r = tool
        .call(call(
            json!({"url": format!("{base}/echo"), "method": "PUT", "form": {"a": "1 2", "b": true}}),
            Value::Null,
        ))
        .await;
    let d = &r.outcome.result["data"];
    assert_eq!(d["body"], "a=1+2&b=true");
    assert_eq!(
        d["headers"]["content-type"],
        "application/x-www-form-urlencoded"
    );
    let r = tool
        .call(call(
            json!({"url": format!("{base}/echo"), "method": "POST", "body": "raw text"}),
            Value::Null,
        ))
        .await;
    assert_eq!(r.outcome.result["data"]["body"], "raw text");
}

#[tokio::test]
async fn error_statuses_are_testable_and_retry_after_is_honoured() {
    let base = start_server().await;
    let tool = HttpTool::new();
    let r = tool
        .call(call(
            json!({"url": format!("{base}/missing?key=abc")}),
            Value::Null,
        ))
        .await;
    assert_eq!(r.outcome.status, OutcomeStatus::Error);
    let e = r.outcome.error.as_ref().unwrap();
    assert_eq!(e.kind, "http.status");
    assert!(!e.retryable);
    assert_eq!(
        e.message,
        format!("GET {base}/missing returned 404 Not Found")
    );
    assert_eq!(r.outcome.helpers["http"]["status"], 404);
    assert_eq!(r.outcome.result["status"], 404);

    let r = tool
        .call(call(json!({"url": format!("{base}/boom")}), Value::Null))
        .await;
    assert!(r.outcome.error.as_ref().unwrap().retryable);
    assert_eq!(r.outcome.result["data"], "it broke");

    let r = tool
        .call(call(json!({"url": format!("{base}/busy")}), Value::Null))
        .await;
    assert_eq!(r.outcome.helpers["http"]["status"], 429);
    assert!(r.outcome.error.as_ref().unwrap().retryable);
    assert_eq!(r.retry_after, Some(Duration::from_secs(2)));

    let r = tool
        .call(call(
            json!({"url": format!("{base}/unavailable")}),
            Value::Null,
        ))
        .await;
    let wait = r.retry_after.expect("an HTTP-date Retry-After");
    assert!(
        wait > Duration::from_secs(25) && wait <= Duration::from_secs(30),
        "{wait:?}"
    );
}

#[tokio::test]
async fn slow_responses_hit_the_read_timeout() {
    let base = start_server().await;
    let tool = HttpTool::new();
    let t = Instant::now();
    let r = tool
        .call(call(
            json!({"url": format!("{base}/slow")}),
            json!({"timeout": {"read": 0.5}}),
        ))
        .await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let e = r.outcome.error.unwrap();
    assert_eq!(e.kind, "timeout");
    assert!(e.retryable);
    assert_eq!(
        e.message,
        format!("GET {base}/slow did not answer within 0.5s")
    );
}

#[tokio::test]
async fn redirects_follow_unless_told_not_to() {
    let base = start_server().await;
    let tool = HttpTool::new();
    let r = tool
        .call(call(json!({"url": format!("{base}/moved")}), Value::Null))
        .await;
    assert_eq!(r.outcome.result["data"]["hello"], "world");
    assert_eq!(r.outcome.helpers["http"]["url"], format!("{base}/json"));
    let r = tool
        .call(call(
            json!({"url": format!("{base}/moved"), "follow_redirects": false}),
            Value::Null,
        ))
        .await;
    assert_eq!(r.outcome.helpers["http"]["status"], 307);
    assert_eq!(r.outcome.error.unwrap().kind, "http.status");
}

#[tokio::test]
async fn pages_can_be_walked() {
    let base = start_server().await;
    let tool = HttpTool::new();
    let mut page = json!(1);
    let mut seen = Vec::new();
    while !page.is_null() {
        let r = tool
            .call(call(
                json!({"url": format!("{base}/items"), "params": {"page": page}}),
                Value::Null,
            ))
            .await;
        let d = &r.outcome.result["data"];
        seen.extend(d["items"].as_array().unwrap().iter().cloned());
        page = d["next_page"].clone();
    }
    assert_eq!(
        seen,
        vec![
            json!(10),
            json!(11),
            json!(20),
            json!(21),
            json!(30),
            json!(31)
        ]
    );
}

#[tokio::test]
async fn refused_connections_and_bad_fields_are_errors() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let tool = HttpTool::new();
    let r = tool
        .call(call(
            json!({"url": format!("http://127.0.0.1:{port}/x?key=SECRET")}),
            Value::Null,
        ))
        .await;
    let e = r.outcome.error.unwrap();
    assert_eq!(e.kind, "http.connect");
    assert!(e.retryable);
    assert!(
        e.message
            .starts_with(&format!("GET http://127.0.0.1:{port}/x could not connect")),
        "{}",
        e.message
    );
    assert!(!e.message.contains("SECRET"));
    let r = tool.call(call(json!({"method": "GET"}), Value::Null)).await;
    let e = r.outcome.error.unwrap();
    assert_eq!(e.kind, "http.config");
    assert_eq!(
        e.message,
        "http task \"fetch\" of step \"s\": `url` is required (a string)"
    );
}

#[tokio::test]
async fn bodies_above_the_limit_are_refused() {
    let base = start_server().await;
    let tool = HttpTool::with_limits(noetl_tool_http::HttpLimits { max_body: 1000 });
    let r = tool
        .call(call(json!({"url": format!("{base}/big")}), Value::Null))
        .await;
    assert_eq!(r.outcome.error.unwrap().kind, "http.body_too_large");
}

#[tokio::test]
async fn credentials_are_applied_and_never_echoed() {
    let base = start_server().await;
    let tool = HttpTool::new();
    let mut c = call(json!({"url": format!("{base}/echo")}), Value::Null);
    c.auth = Some(AuthCredential {
        name: "api".into(),
        kind: "bearer".into(),
        data: json!({"token": TOKEN}),
    });
    let r = tool.call(c).await;
    assert_eq!(r.outcome.result["data"]["bearer_ok"], true);
    let text = serde_json::to_string(&r.outcome).unwrap();
    assert!(!text.contains(TOKEN), "{text}");

    let mut c = call(json!({"url": format!("{base}/echo")}), Value::Null);
    c.auth = Some(AuthCredential {
        name: "key".into(),
        kind: "api_key".into(),
        data: json!({"key": "k-0987654321", "header": "X-Api-Key"}),
    });
    let r = tool.call(c).await;
    assert_eq!(
        r.outcome.result["data"]["headers"]["x-api-key"],
        "k-0987654321"
    );
}

/// An HTTPS server on 127.0.0.1 with a self-signed certificate no trust
/// store knows: it answers every request with `{"tls": "yes"}` and counts
/// the requests it answered.
fn start_self_signed_tls_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "https://127.0.0.1:{}/secure",
        listener.local_addr().unwrap().port()
    );
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(tcp) = stream else { continue };
            let config = config.clone();
            let count = count.clone();
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return, // the client refused the certificate
                    }
                }
                let body = r#"{"tls": "yes"}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                if tls.write_all(answer.as_bytes()).is_ok() {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (url, answered)
}

#[tokio::test]
async fn verify_ssl_false_accepts_a_self_signed_certificate_for_that_task_only() {
    use std::sync::atomic::Ordering;
    let (url, answered) = start_self_signed_tls_server();
    let tool = HttpTool::new();
    // Checked by default: the certificate is refused, the server answers nothing.
    let o = tool
        .call(call(json!({"url": url}), Value::Null))
        .await
        .outcome;
    assert_eq!(o.status, OutcomeStatus::Error, "{o:?}");
    let e = o.error.as_ref().unwrap();
    assert_eq!(e.kind, "http.connect", "{o:?}");
    assert!(e.message.contains("certificate"), "{}", e.message);
    assert_eq!(answered.load(Ordering::SeqCst), 0);
    // `verify_ssl: false`: the same server answers.
    let o = tool
        .call(call(json!({"url": url, "verify_ssl": false}), Value::Null))
        .await
        .outcome;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(o.result["data"], json!({"tls": "yes"}));
    assert_eq!(answered.load(Ordering::SeqCst), 1);
    // The lenient client is not reused for a task that checks.
    let o = tool
        .call(call(json!({"url": url, "verify_ssl": true}), Value::Null))
        .await
        .outcome;
    assert_eq!(
        o.error.as_ref().map(|e| e.kind.as_str()),
        Some("http.connect"),
        "{o:?}"
    );
    assert_eq!(answered.load(Ordering::SeqCst), 1);
}
