//! The console's routes over real HTTP on a real mesh: the app at `/` and
//! its files without a token, with a strict Content-Security-Policy and
//! ETags; `whoami` naming the token's name and role (never the token);
//! the step graph of an execution laid out with each step's status, and a
//! running loop's progress read live.

use std::time::{Duration, Instant};

use noetl_integration::Cluster;
use serde_json::{json, Value};

mod support;
use support::{assert_error, Api, FLOW};

/// A loop step whose 6 iterations sleep 0.3 s each, one at a time.
const SLOW_LOOP: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: console_slow_loop
  path: tests/console_slow_loop
workflow:
  - step: start
    loop:
      in: [1, 2, 3, 4, 5, 6]
      iterator: n
    tool:
      - name: nap
        kind: python
        args: { n: "{{ iter.n }}" }
        code: |
          import time
          time.sleep(0.3)
          result = n
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_app_and_its_files_are_served_without_a_token_under_a_strict_policy() {
    let (api, _keys) = Api::start().await;
    let r = api.http.get(format!("{}/", api.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let csp = h["content-security-policy"].to_str().unwrap();
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["x-frame-options"], "DENY");
    let html = r.text().await.unwrap();
    assert!(
        html.contains(r#"<script type="module" src="/console/js/main.js"></script>"#),
        "{html}"
    );
    assert_eq!(html.matches("<script").count(), 1, "no inline script");

    // Every module main.js reaches is served as JavaScript.
    for file in ["js/main.js", "js/execution.js", "js/graph.js", "app.css"] {
        let r = api
            .http
            .get(format!("{}/console/{file}", api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{file}");
        let kind = r.headers()["content-type"].to_str().unwrap().to_string();
        let want = if file.ends_with(".css") {
            "text/css"
        } else {
            "text/javascript"
        };
        assert!(kind.starts_with(want), "{file}: {kind}");
        // Revalidation: the same ETag back is 304 with no body.
        let tag = r.headers()["etag"].clone();
        let again = api
            .http
            .get(format!("{}/console/{file}", api.base))
            .header("if-none-match", tag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status().as_u16(), 304, "{file}");
        assert!(again.text().await.unwrap().is_empty());
    }
    let missing = api.get("/console/js/nope.js", None).await;
    assert_error(&missing, 404, "no file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whoami_names_the_token_and_its_role_and_never_the_token() {
    let (api, keys) = Api::start().await;
    assert_error(
        &api.get("/api/console/whoami", None).await,
        401,
        "bearer token",
    );
    assert_error(
        &api.get("/api/console/whoami", Some("nope")).await,
        401,
        "not known",
    );
    for (token, name, role) in [
        (&keys.viewer, "dashboard", "viewer"),
        (&keys.operator, "ops-bot", "operator"),
        (&keys.admin, "alice", "admin"),
    ] {
        let a = api.get("/api/console/whoami", Some(token)).await;
        assert_eq!(a.status, 200, "{}", a.text);
        assert_eq!(
            a.json,
            json!({"name": name, "role": role, "auth_required": true})
        );
        assert!(!a.text.contains(token.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_tokens_on_loopback_the_console_asks_for_none() {
    let api = Api::serve(Cluster::start().await, None).await;
    let a = api.get("/api/console/whoami", None).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(
        a.json,
        json!({"name": "anonymous", "role": "admin", "auth_required": false})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_graph_of_an_execution_is_its_plan_laid_out_with_each_steps_status() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    api.register(admin, FLOW).await;
    let id = api.execute(admin, "tests/api_flow", json!({})).await;
    api.wait_status(&id, viewer, "COMPLETED").await;
    let path = format!("/api/console/executions/{id}/graph");
    assert_error(&api.get(&path, None).await, 401, "bearer token");
    let g = api.get(&path, viewer).await;
    assert_eq!(g.status, 200, "{}", g.text);
    let g = g.json;
    assert_eq!(
        (g["status"].as_str(), g["planned"].as_bool()),
        (Some("COMPLETED"), Some(true))
    );
    assert_eq!(
        (g["entry"].as_str(), g["layers"].as_u64()),
        (Some("start"), Some(2))
    );
    let steps: Vec<(&str, u64, &str)> = g["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap(),
                s["layer"].as_u64().unwrap(),
                s["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(steps, vec![("start", 0, "done"), ("finish", 1, "done")]);
    assert_eq!(
        g["steps"][0]["tasks"],
        json!([{"name": "make", "kind": "noop"}])
    );
    assert_eq!(
        g["arcs"],
        json!([{"from": "start", "to": "finish", "index": 0, "when": null, "back": false}])
    );
    assert!(g["steps"][1]["step_run_id"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    let missing = api.get("/api/console/executions/nope/graph", viewer).await;
    assert_error(&missing, 404, "Execution not found: nope");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_loop_shows_its_progress_in_the_graph_until_it_ends() {
    let (api, keys) = Api::start().await;
    let admin = Some(keys.admin.as_str());
    api.register(admin, SLOW_LOOP).await;
    let id = api
        .execute(admin, "tests/console_slow_loop", json!({}))
        .await;
    let path = format!("/api/console/executions/{id}/graph");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut live: Vec<Value> = Vec::new();
    let last = loop {
        let g = api.get(&path, admin).await.json;
        let p = g["steps"][0]["loop_progress"].clone();
        if p["running"] == true {
            assert_eq!(g["steps"][0]["status"], "running", "{g}");
            live.push(p);
        }
        if g["status"] == "COMPLETED" {
            break g;
        }
        assert!(Instant::now() < deadline, "not completed: {g}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        live.iter()
            .any(|p| p["total"] == 6 && p["done"].as_u64().is_some_and(|d| d > 0 && d < 6)),
        "the running loop's counts move: {live:?}"
    );
    assert!(
        live.iter().all(|p| p["in_flight"].as_u64().unwrap() <= 1),
        "sequential: {live:?}"
    );
    let step = &last["steps"][0];
    assert_eq!(step["loop_mode"], "sequential");
    assert_eq!(
        step["loop_progress"],
        json!({"total": 6, "done": 6, "failed": 0, "in_flight": 0, "running": false})
    );
}
