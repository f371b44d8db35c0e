//! The test-owned HTTP server the mix's `http` tasks call: it counts every
//! call by its key (execution, what, item, attempt), so the checks can
//! compare the calls made with the attempts the engine reports.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

/// Calls counted per key: `<eid>/<what>/<item>/<attempt>`.
#[derive(Clone, Default)]
pub struct Calls(Arc<Mutex<BTreeMap<String, u32>>>);

impl Calls {
    fn hit(&self, key: String) {
        *self.0.lock().expect("calls lock").entry(key).or_default() += 1;
    }

    /// The calls of one execution: key (without the execution id) → count.
    pub fn of(&self, eid: &str) -> BTreeMap<String, u32> {
        let prefix = format!("{eid}/");
        self.0
            .lock()
            .expect("calls lock")
            .iter()
            .filter_map(|(k, n)| k.strip_prefix(&prefix).map(|k| (k.to_string(), *n)))
            .collect()
    }
}

/// A running sink (a clone shares its counts).
#[derive(Clone)]
pub struct Sink {
    /// Base URL (`http://127.0.0.1:PORT`), the playbooks' `workload.api`.
    pub url: String,
    /// What it counted.
    pub calls: Calls,
}

/// `GET /effect/{eid}/{what}/{item}/{attempt}`: a side effect, counted.
async fn effect(
    State(calls): State<Calls>,
    Path((eid, what, item, attempt)): Path<(String, String, String, String)>,
) -> Json<Value> {
    calls.hit(format!("{eid}/{what}/{item}/{attempt}"));
    Json(json!({"ok": true, "item": item}))
}

/// `GET /page/{eid}/{endpoint}/{page}?pages=N&attempt=A`: one page of a
/// paginated API, counted.
async fn page(
    State(calls): State<Calls>,
    Path((eid, endpoint, page)): Path<(String, String, u32)>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Json<Value> {
    let attempt = q.get("attempt").cloned().unwrap_or_default();
    let pages: u32 = q.get("pages").and_then(|p| p.parse().ok()).unwrap_or(1);
    calls.hit(format!("{eid}/page/{endpoint}#{page}/{attempt}"));
    Json(json!({"items": [format!("{endpoint}#{page}")], "has_more": page < pages}))
}

/// `GET /flaky/{eid}/{attempt}`: 503 on attempts 1 and 2, then an answer;
/// counted.
async fn flaky(
    State(calls): State<Calls>,
    Path((eid, attempt)): Path<(String, u32)>,
) -> (StatusCode, Json<Value>) {
    calls.hit(format!("{eid}/flaky/-/{attempt}"));
    if attempt < 3 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "try again"})),
        )
    } else {
        (StatusCode::OK, Json(json!({"attempt": attempt})))
    }
}

impl Sink {
    /// Serve on a free loopback port for as long as the runtime lives, and
    /// create the table of the mix's PostgreSQL side effect
    /// ([`crate::rows`]).
    pub async fn start() -> Self {
        crate::rows::prepare().await;
        let calls = Calls::default();
        let app = Router::new()
            .route("/effect/{eid}/{what}/{item}/{attempt}", get(effect))
            .route("/page/{eid}/{endpoint}/{page}", get(page))
            .route("/flaky/{eid}/{attempt}", get(flaky))
            .with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the sink");
        let url = format!("http://{}", listener.local_addr().expect("sink address"));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("sink") });
        Self { url, calls }
    }
}
