//! Test-owned HTTP servers the legacy http examples call
//! (`playbooks/legacy/`): an echo over plain HTTP that answers each request
//! with what it received (and `GET /text?text=T&status=S` with `T` as plain
//! text and status `S`, default 200: a script to load), and an HTTPS one whose certificate is
//! self-signed (no trust store knows it) for `verify_ssl: false`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;

use axum::extract::{Query, Request};
use axum::routing::any;
use axum::{Json, Router};
use serde_json::{json, Value};

async fn echo(Query(query): Query<BTreeMap<String, String>>, req: Request) -> Json<Value> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes).to_string();
    let body = serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::String(text));
    let content_type = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    Json(json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": query,
        "body": body,
        "content_type": content_type,
    }))
}

/// `GET /text?text=T&status=S`: `T` as plain text, with status `S`.
async fn text(Query(query): Query<BTreeMap<String, String>>) -> (axum::http::StatusCode, String) {
    let status = query
        .get("status")
        .and_then(|s| s.parse().ok())
        .and_then(|s| axum::http::StatusCode::from_u16(s).ok())
        .unwrap_or(axum::http::StatusCode::OK);
    (status, query.get("text").cloned().unwrap_or_default())
}

/// Start the plain-HTTP echo; its base URL (`http://127.0.0.1:PORT`).
pub async fn start_echo() -> String {
    let app = Router::new()
        .route("/text", axum::routing::get(text))
        .route("/{*path}", any(echo));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the echo server");
    let url = format!("http://{}", listener.local_addr().expect("echo address"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("echo server") });
    url
}

/// Start an HTTPS server on 127.0.0.1 with a fresh self-signed certificate;
/// it answers every request `{"tls": "yes", "path": ...}`. Its base URL
/// (`https://127.0.0.1:PORT`).
pub fn start_self_signed_tls() -> String {
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("certificate parameters")
        .self_signed(&key)
        .expect("a self-signed certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("the server certificate");
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the TLS server");
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().expect("TLS address").port()
    );
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return, // the client refused the certificate
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or("/");
                let body = json!({"tls": "yes", "path": path}).to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    url
}
