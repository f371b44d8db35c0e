//! The API over a real mesh (a private nats-server, every service in
//! process) and real HTTP: a NoETL client's flow, every route, the roles,
//! bad input, and credentials that never come back out.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

mod support;
use support::{assert_error, read_sse, Api, FLOW, SLOW};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_noetl_client_registers_executes_polls_and_reads_events_and_results() {
    let (api, keys) = Api::start().await;
    let (admin, operator, viewer) = (
        Some(keys.admin.as_str()),
        Some(keys.operator.as_str()),
        Some(keys.viewer.as_str()),
    );
    // Register: NoETL's answer, with this engine's catalog id.
    let reg = api.register(admin, FLOW).await;
    assert_eq!(reg["status"], "success");
    assert_eq!(reg["path"], "tests/api_flow");
    assert_eq!(reg["version"], 1);
    assert_eq!(reg["catalog_id"], "tests/api_flow@v1");
    assert_eq!(reg["kind"], "playbook");
    assert_eq!(
        reg["message"],
        "Resource 'tests/api_flow' version '1' registered."
    );

    // Execute by path, with a payload over the workload.
    let started = api
        .post(
            "/api/execute",
            operator,
            &json!({"path": "tests/api_flow", "payload": {"n": 5}}),
        )
        .await;
    assert_eq!(started.status, 200, "{}", started.text);
    assert_eq!(started.json["status"], "started");
    assert_eq!(started.json["catalog_id"], "tests/api_flow@v1");
    let id = started.json["execution_id"].as_str().unwrap().to_string();

    // Poll the status until COMPLETED, as NoETL's CLI does.
    let status = api.wait_status(&id, viewer, "COMPLETED").await;
    assert_eq!(status["execution_id"], id.as_str());
    assert_eq!(status["is_cancelled"], false);
    assert_eq!(status["current_step"], Value::Null);
    assert_eq!(
        status["progress"],
        json!({"total_steps": 2, "completed_steps": 2, "running_steps": 0, "failed_steps": 0})
    );
    assert_eq!(status["steps"], json!({"finish": "done", "start": "done"}));

    // The execution with its events, oldest first, ending completed.
    let detail = api.get(&format!("/api/executions/{id}"), viewer).await;
    assert_eq!(detail.status, 200, "{}", detail.text);
    let d = &detail.json;
    assert_eq!(d["status"], "COMPLETED");
    assert_eq!(d["catalog_id"], "tests/api_flow@v1");
    assert_eq!(d["path"], "tests/api_flow");
    assert_eq!(d["workload"]["n"], 5);
    assert!(d["completed_at"].is_string());
    let events = d["events"].as_array().unwrap();
    assert_eq!(d["event_count"], events.len());
    let types: Vec<&str> = events
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .collect();
    // The start's audit event is filed under the execution, before or
    // after the router's first event.
    assert_eq!(
        types.iter().filter(|t| **t == "audit").count(),
        1,
        "{types:?}"
    );
    let engine: Vec<&&str> = types.iter().filter(|t| **t != "audit").collect();
    assert_eq!(engine.first(), Some(&&"playbook.initialized"), "{types:?}");
    assert!(types.contains(&"step.done"), "{types:?}");
    let last = events
        .iter()
        .find(|e| e["event_type"] == "execution.completed")
        .unwrap();
    assert_eq!(last["status"], "COMPLETED");
    // In stream order; a step's end and the last task's `task.done` it
    // carries share the end's sequence, the `task.done` first, and so do
    // a `next.selected` (or the entry's `token.created`) and the
    // `step.started` of a step-run the router started, which rides in it,
    // the `next.selected` (`token.created`) first.
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        events.windows(2).all(|w| {
            let (a, b) = (w[0]["seq"].as_u64(), w[1]["seq"].as_u64());
            let pair = (w[0]["event_type"].as_str(), w[1]["event_type"].as_str());
            a < b
                || (a == b
                    && matches!(
                        pair,
                        (Some("task.done"), Some("step.done"))
                            | (Some("next.selected"), Some("step.started"))
                            | (Some("token.created"), Some("step.started"))
                    ))
        }),
        "in stream order: {seqs:?} {types:?}"
    );
    assert!(
        events.windows(2).any(|w| w[0]["seq"] == w[1]["seq"]
            && w[1]["event_type"] == "step.started"
            && w[1]["node_name"] != w[0]["node_name"]),
        "a step-run the router started reads back its own step.started: {types:?}"
    );
    assert!(
        events.windows(2).any(|w| w[0]["seq"] == w[1]["seq"]
            && w[0]["event_type"] == "token.created"
            && w[1]["event_type"] == "step.started"),
        "the entry step-run reads back its own step.started: {types:?}"
    );
    assert!(types.contains(&"task.done"), "{types:?}");
    // A type filter finds every `task.done`, those stored inside their
    // step's end too; those are sent without an `id:` (a client that
    // reconnects after one gets it again with its end).
    let r = api
        .http
        .get(format!("{}/api/events?type=task.done&limit=1000", api.base))
        .bearer_auth(&keys.viewer)
        .send()
        .await
        .unwrap();
    let task_ends = read_sse(r, Duration::from_secs(10)).await;
    let mine: Vec<_> = task_ends
        .iter()
        .filter(|e| e.data["execution_id"] == id.as_str())
        .collect();
    let listed = types.iter().filter(|t| **t == "task.done").count();
    assert_eq!(mine.len(), listed, "{task_ends:?}");
    assert!(task_ends.iter().all(|e| e.event == "task.done"));
    assert!(mine.iter().any(|e| !e.resumable), "{mine:?}");
    let finish = events
        .iter()
        .find(|e| e["event_type"] == "step.done" && e["node_name"] == "finish")
        .unwrap();
    assert_eq!(finish["result"], "n=5");

    // A step's result: inline, and one stored by reference, read back
    // from the object store whole.
    let inline = api
        .get(&format!("/api/executions/{id}/results/finish"), viewer)
        .await;
    assert_eq!(inline.status, 200, "{}", inline.text);
    assert_eq!(inline.json["result"], "n=5");
    assert_eq!(inline.json["by_reference"], false);
    let big = api
        .get(&format!("/api/executions/{id}/results/start"), viewer)
        .await;
    assert_eq!(big.status, 200, "{}", big.text);
    assert_eq!(big.json["by_reference"], true);
    assert_eq!(big.json["result"]["rows"].as_array().unwrap().len(), 9);
    assert_eq!(big.json["result"]["rows"][8], "india");

    // The list: newest first, with NoETL's fields and filters.
    let listed = api
        .get("/api/executions?status=completed&path=API_FLOW", viewer)
        .await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let rows = listed.json.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["execution_id"], id.as_str());
    assert_eq!(rows[0]["status"], "COMPLETED");
    assert_eq!(rows[0]["playbook"], "api_flow");
    let by_name = api.get("/api/executions?playbook=Api_Fl", viewer).await;
    assert_eq!(
        by_name.json.as_array().map(Vec::len),
        Some(1),
        "{}",
        by_name.text
    );
    let other = api.get("/api/executions?playbook=nightly", viewer).await;
    assert_eq!(other.json, json!([]));
    let none = api.get("/api/executions?status=RUNNING", viewer).await;
    assert_eq!(none.json, json!([]));
    let page = api.get("/api/executions?limit=1&offset=1", viewer).await;
    assert_eq!(page.json, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_catalog_lists_reads_and_deletes_versions() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    api.register(admin, FLOW).await;
    let v2 = api.register(admin, &FLOW.replace("n: 3", "n: 4")).await;
    assert_eq!(v2["version"], 2);
    api.register(admin, SLOW).await;

    // The list: the latest version of each path, NoETL's entry shape.
    let list = api.post("/api/catalog/list", viewer, &json!({})).await;
    assert_eq!(list.status, 200, "{}", list.text);
    let entries = list.json["entries"].as_array().unwrap();
    let paths: Vec<(&str, u64)> = entries
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["version"].as_u64().unwrap()))
        .collect();
    assert_eq!(paths, [("tests/api_flow", 2), ("tests/api_slow", 1)]);
    let flow = &entries[0];
    assert_eq!(flow["catalog_id"], "tests/api_flow@v2");
    assert_eq!(flow["payload"], json!({"n": 4}));
    assert_eq!(flow["layout"][0]["step"], "start");
    assert!(flow["content"].as_str().unwrap().contains("n: 4"));
    let tools = api
        .post(
            "/api/catalog/list",
            viewer,
            &json!({"resource_type": "Tool"}),
        )
        .await;
    assert_eq!(tools.json["entries"], json!([]));
    let no_body = api
        .call(Method::POST, "/api/catalog/list", viewer, None)
        .await;
    assert_eq!(no_body.json["entries"].as_array().unwrap().len(), 2);

    // One version: by path (latest, a number, "latest"), by catalog id.
    let api = &api;
    let resource =
        |body: Value| async move { api.post("/api/catalog/resource", viewer, &body).await };
    assert_eq!(
        resource(json!({"path": "tests/api_flow"})).await.json["version"],
        2
    );
    assert_eq!(
        resource(json!({"path": "tests/api_flow", "version": 1}))
            .await
            .json["version"],
        1
    );
    assert_eq!(
        resource(json!({"path": "tests/api_flow", "version": "latest"}))
            .await
            .json["version"],
        2
    );
    let by_id = resource(json!({"catalog_id": "tests/api_flow@v1"})).await;
    assert_eq!(by_id.json["payload"], json!({"n": 3}));
    assert_error(
        &resource(json!({"path": "tests/nope"})).await,
        404,
        "tests/nope",
    );

    // Delete the latest version: "latest" is the one before.
    let del = api
        .post(
            "/api/catalog/delete",
            admin,
            &json!({"path": "tests/api_flow", "version": 2}),
        )
        .await;
    assert_eq!(del.status, 200, "{}", del.text);
    assert_eq!(del.json["count"], 1);
    assert_eq!(
        del.json["deleted"],
        json!([{"catalog_id": "tests/api_flow@v2", "version": 2}])
    );
    assert_eq!(
        resource(json!({"path": "tests/api_flow"})).await.json["version"],
        1
    );
    assert_error(
        &resource(json!({"path": "tests/api_flow", "version": 2})).await,
        404,
        "version 2",
    );
    // Delete every version: gone, idempotent, and a new registration
    // never reuses a number.
    let all = api
        .post(
            "/api/catalog/delete",
            admin,
            &json!({"path": "tests/api_flow"}),
        )
        .await;
    assert_eq!(all.json["count"], 1);
    assert_error(
        &resource(json!({"path": "tests/api_flow"})).await,
        404,
        "tests/api_flow",
    );
    let again = api
        .post(
            "/api/catalog/delete",
            admin,
            &json!({"path": "tests/api_flow"}),
        )
        .await;
    assert_eq!((again.status, again.json["count"].as_u64()), (200, Some(0)));
    let paths = api.post("/api/catalog/list", viewer, &json!({})).await;
    assert_eq!(paths.json["entries"].as_array().unwrap().len(), 1);
    assert_eq!(api.register(admin, FLOW).await["version"], 3);
    // Executing a deleted version is a 404 naming it.
    let gone = api
        .post(
            "/api/execute",
            admin,
            &json!({"catalog_id": "tests/api_flow@v2"}),
        )
        .await;
    assert_error(&gone, 404, "version 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_role_may_do_what_it_includes_and_no_more() {
    let (api, keys) = Api::start().await;
    let (admin, operator, viewer) = (
        Some(keys.admin.as_str()),
        Some(keys.operator.as_str()),
        Some(keys.viewer.as_str()),
    );
    // Probes and the document need no token.
    for path in ["/health", "/api/health", "/api/openapi.json"] {
        assert_eq!(api.get(path, None).await.status, 200, "{path}");
    }
    // No token, or an unknown one: 401 asking for a bearer token.
    let none = api.get("/api/executions", None).await;
    assert_error(&none, 401, "Bearer");
    let r = api
        .http
        .get(format!("{}/api/executions", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_error(
        &api.get("/api/executions", Some("noetl_forged")).await,
        401,
        "not known",
    );
    let basic = api
        .http
        .get(format!("{}/api/executions", api.base))
        .basic_auth("u", Some("p"))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status().as_u16(), 401);

    // A viewer reads, and may neither register, start nor cancel.
    assert_eq!(api.get("/api/executions", viewer).await.status, 200);
    assert_eq!(api.get("/api/credentials", viewer).await.status, 200);
    let reg = api
        .post("/api/catalog/register", viewer, &json!({"content": FLOW}))
        .await;
    assert_error(&reg, 403, "needs admin");
    assert_eq!(api.register(admin, SLOW).await["version"], 1);
    let start = api
        .post("/api/execute", viewer, &json!({"path": "tests/api_slow"}))
        .await;
    assert_error(&start, 403, "needs operator");

    // An operator starts and cancels, and may not change the catalog or
    // the credentials.
    let id = api
        .execute(operator, "tests/api_slow", json!({"seconds": 20}))
        .await;
    // Pause and unpause: an operator may, a viewer may not; the status
    // says it is paused.
    let pause = api
        .post(&format!("/api/executions/{id}/pause"), viewer, &json!({}))
        .await;
    assert_error(&pause, 403, "has role viewer");
    let pause = api
        .post(
            &format!("/api/executions/{id}/pause"),
            operator,
            &json!({"reason": "look first"}),
        )
        .await;
    assert_eq!(
        pause.json,
        json!({"execution_id": id, "paused": true, "changed": true}),
        "{}",
        pause.text
    );
    let mut paused = json!(null);
    for _ in 0..100 {
        paused = api
            .get(&format!("/api/executions/{id}/status"), viewer)
            .await
            .json;
        if paused["is_paused"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(paused["is_paused"], true, "{paused}");
    // The execution's detail (what the console draws) says so too.
    let detail = api.get(&format!("/api/executions/{id}"), viewer).await.json;
    assert_eq!(detail["status"], "RUNNING", "{detail}");
    assert_eq!(detail["is_paused"], true, "{detail}");
    let unpause = api
        .post(
            &format!("/api/executions/{id}/unpause"),
            operator,
            &json!({}),
        )
        .await;
    assert_eq!(unpause.json["paused"], false, "{}", unpause.text);
    assert_error(
        &api.post("/api/executions/nope/pause", operator, &json!({}))
            .await,
        404,
        "nope",
    );
    let cancel = api
        .post(&format!("/api/executions/{id}/cancel"), viewer, &json!({}))
        .await;
    assert_error(&cancel, 403, "has role viewer");
    let cancel = api
        .post(
            &format!("/api/executions/{id}/cancel"),
            operator,
            &json!({"reason": "test"}),
        )
        .await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    assert_eq!(
        cancel.json,
        json!({"execution_id": id, "status": "cancelled", "message": "Execution cancellation requested",
               "cancelled_executions": [id]})
    );
    let status = api.wait_status(&id, viewer, "CANCELLED").await;
    assert_eq!(status["is_cancelled"], true);
    assert!(
        status["error"].as_str().unwrap().contains("test"),
        "{status}"
    );
    let again = api
        .post(
            &format!("/api/executions/{id}/cancel"),
            operator,
            &json!({}),
        )
        .await;
    assert_error(&again, 422, "Cannot cancel execution in CANCELLED state");
    let reg = api
        .post("/api/catalog/register", operator, &json!({"content": FLOW}))
        .await;
    assert_error(&reg, 403, "needs admin");
    let put = api
        .post(
            "/api/credentials",
            operator,
            &json!({"name": "x", "type": "bearer", "data": {"token": "abcdefgh"}}),
        )
        .await;
    assert_error(&put, 403, "needs admin");

    // An admin registers and stores credentials.
    let put = api
        .post(
            "/api/credentials",
            admin,
            &json!({"name": "x", "type": "bearer", "data": {"token": "abcdefgh"}}),
        )
        .await;
    assert_eq!(put.status, 200, "{}", put.text);
    let del = api
        .call(Method::DELETE, "/api/credentials/x", operator, None)
        .await;
    assert_error(&del, 403, "needs admin");

    // Each change is an `audit` event naming who did what, filed under
    // the execution it acted on (or `_mesh`), never with a secret; a
    // request refused for its role changed nothing and is not one.
    let url = format!("{}/api/events?type=audit&limit=100", api.base);
    let r = api.http.get(url).bearer_auth(keys.viewer.as_str());
    let audits = read_sse(r.send().await.unwrap(), Duration::from_secs(10)).await;
    let seen: Vec<(String, String, String, String)> = audits
        .iter()
        .map(|e| {
            let p = &e.data["payload"];
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e.data["execution_id"]),
                s(&p["principal"]),
                s(&p["action"]),
                s(&p["outcome"]),
            )
        })
        .collect();
    let row = |scope: &str, who: &str, action: &str, outcome: &str| {
        (
            scope.to_string(),
            who.to_string(),
            action.to_string(),
            outcome.to_string(),
        )
    };
    assert_eq!(
        seen,
        [
            row("_mesh", "alice", "catalog.register", "ok"),
            row(&id, "ops-bot", "execution.start", "ok"),
            row(&id, "ops-bot", "execution.pause", "ok"),
            row(&id, "ops-bot", "execution.unpause", "ok"),
            row(
                "nope",
                "ops-bot",
                "execution.pause",
                "refused (404): Execution not found: nope"
            ),
            row(&id, "ops-bot", "execution.cancel", "ok"),
            row(
                &id,
                "ops-bot",
                "execution.cancel",
                "refused (422): Cannot cancel execution in CANCELLED state"
            ),
            row("_mesh", "alice", "credential.put", "ok"),
        ]
    );
    assert!(audits
        .iter()
        .all(|e| !e.data.to_string().contains("abcdefgh")));
    assert_eq!(audits[0].data["payload"]["role"], "admin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_a_4xx_naming_what_is_wrong() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    assert_error(
        &api.post_raw("/api/catalog/register", admin, "{content: ")
            .await,
        400,
        "not JSON",
    );
    assert_error(
        &api.post_raw("/api/catalog/register", admin, "").await,
        400,
        "JSON request body",
    );
    assert_error(
        &api.post("/api/catalog/register", admin, &json!({})).await,
        422,
        "missing field `content`",
    );
    // `curl -d` sends no JSON content type: the body is read all the same.
    let curl = api
        .post_raw(
            "/api/catalog/register",
            admin,
            &json!({"content": FLOW}).to_string(),
        )
        .await;
    assert_eq!(curl.status, 200, "{}", curl.text);

    // A playbook that does not load: 422 with the loader's diagnostics.
    let bad = api
        .post(
            "/api/catalog/register",
            admin,
            &json!({"content": FLOW.replace("kind: noop", "kind: pyhton")}),
        )
        .await;
    assert_error(&bad, 422, "E006");
    assert_eq!(bad.json["diagnostics"][0]["code"], "E006");
    // Python code that does not compile: refused as `noetl validate` and
    // `noetl playbook register` refuse it (E048), at its line, and not
    // stored (before, it was stored and failed when a run reached it).
    let broken = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: broken, path: tests/broken }\nworkflow:\n  - step: start\n    tool:\n      - name: t\n        kind: python\n        code: |\n          x = 1\n          def main(:\n";
    let bad = api
        .post("/api/catalog/register", admin, &json!({"content": broken}))
        .await;
    assert_error(&bad, 422, "E048");
    let d = &bad.json["diagnostics"][0];
    assert_eq!(
        (&d["code"], &d["line"]),
        (&json!("E048"), &json!(11)),
        "{d}"
    );
    assert!(
        d["message"]
            .as_str()
            .unwrap_or_default()
            .contains("task `t` of step `start`"),
        "{d}"
    );
    assert_eq!(
        api.post(
            "/api/catalog/resource",
            viewer,
            &json!({"path": "tests/broken"})
        )
        .await
        .status,
        404
    );
    let tool = api
        .post(
            "/api/catalog/register",
            admin,
            &json!({"content": FLOW, "resource_type": "Tool"}),
        )
        .await;
    assert_error(&tool, 422, "playbooks only");

    // Time travel: the id is checked first, then `at`; no event is 404.
    assert_error(
        &api.get("/api/executions/a.b/state", viewer).await,
        400,
        "execution id",
    );
    assert_error(
        &api.get("/api/executions/nope/state?at=soon", viewer).await,
        422,
        "at \"soon\"",
    );
    assert_error(
        &api.get("/api/executions/nope/state?at=3", viewer).await,
        404,
        "nope",
    );
    // A refused action on an unknown id files its audit record under that
    // id; that record makes no execution of it.
    assert_error(
        &api.post("/api/executions/ghost-1/cancel", admin, &json!({}))
            .await,
        404,
        "ghost-1",
    );
    for tail in ["state", "state?at=1", "status"] {
        assert_error(
            &api.get(&format!("/api/executions/ghost-1/{tail}"), viewer)
                .await,
            404,
            "Execution not found: ghost-1",
        );
    }

    // Execute: what it names must be one thing, and exist.
    let both = api
        .post(
            "/api/execute",
            admin,
            &json!({"path": "tests/api_flow", "catalog_id": "tests/api_flow@v1"}),
        )
        .await;
    assert_error(&both, 422, "not both");
    assert_error(
        &api.post("/api/execute", admin, &json!({})).await,
        422,
        "'path' or 'catalog_id'",
    );
    let numeric = api
        .post("/api/execute", admin, &json!({"catalog_id": 123}))
        .await;
    assert_error(&numeric, 422, "<path>@v<N>");
    let missing = api
        .post("/api/execute", admin, &json!({"path": "tests/none"}))
        .await;
    assert_error(&missing, 404, "tests/none");
    let bad_id = api
        .post(
            "/api/execute",
            admin,
            &json!({"path": "tests/api_flow", "execution_id": "a b"}),
        )
        .await;
    assert_error(&bad_id, 422, "execution_id");
    let bad_version = api
        .post(
            "/api/execute",
            admin,
            &json!({"path": "tests/api_flow", "version": "v1"}),
        )
        .await;
    assert_error(&bad_version, 422, "not a version");
    let payload = api
        .post(
            "/api/execute",
            admin,
            &json!({"path": "tests/api_flow", "payload": [1]}),
        )
        .await;
    assert_error(&payload, 422, "payload");
    let empty = api
        .post("/api/execute/batch", admin, &json!({"executions": []}))
        .await;
    assert_error(&empty, 422, "1-1000");

    // Executions: unknown ids and steps, filters that are not ones.
    assert_error(
        &api.get("/api/executions/nope", viewer).await,
        404,
        "Execution not found: nope",
    );
    assert_error(
        &api.get("/api/executions/nope/status", viewer).await,
        404,
        "nope",
    );
    assert_error(
        &api.get("/api/executions/nope/events", viewer).await,
        404,
        "nope",
    );
    assert_error(
        &api.get("/api/executions/nope/results/start", viewer).await,
        404,
        "nope",
    );
    assert_error(
        &api.get("/api/executions?status=done", viewer).await,
        422,
        "RUNNING, COMPLETED",
    );
    assert_error(
        &api.get("/api/executions?limit=-1", viewer).await,
        400,
        "limit",
    );
    let id = api.execute(admin, "tests/api_flow", json!({})).await;
    api.wait_status(&id, viewer, "COMPLETED").await;
    let step = api
        .get(&format!("/api/executions/{id}/results/nostep"), viewer)
        .await;
    assert_error(&step, 404, "no step `nostep`");
    let done = api
        .post(&format!("/api/executions/{id}/cancel"), admin, &json!({}))
        .await;
    assert_error(&done, 422, "COMPLETED state");
    let r = api
        .http
        .get(format!("{}/api/executions/{id}/events", api.base))
        .bearer_auth(&keys.viewer)
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_error(
        &api.get("/api/events?type=step.d*", viewer).await,
        400,
        "type",
    );

    // Routes and methods that are not there.
    assert_error(
        &api.get("/api/nothing", viewer).await,
        404,
        "no route GET /api/nothing",
    );
    assert_error(
        &api.call(Method::PUT, "/api/execute", admin, None).await,
        405,
        "does not take PUT",
    );

    // Catalog requests that name nothing.
    assert_error(
        &api.post("/api/catalog/resource", viewer, &json!({})).await,
        422,
        "'catalog_id' or 'path'",
    );
    assert_error(
        &api.post("/api/catalog/resource", viewer, &json!({"catalog_id": "x"}))
            .await,
        422,
        "Invalid catalog_id",
    );
    assert_error(
        &api.post("/api/catalog/delete", admin, &json!({"path": " "}))
            .await,
        422,
        "non-empty 'path'",
    );
    assert_error(
        &api.post(
            "/api/catalog/delete",
            admin,
            &json!({"path": "a", "version": 0}),
        )
        .await,
        422,
        "version 0",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_credentials_secret_goes_in_and_never_comes_out() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    let secret = "tok-9f3a7c2e51d04b8a";
    let put = api
        .post(
            "/api/credentials",
            admin,
            &json!({"name": "api_token", "type": "bearer", "data": {"token": secret}, "description": "d"}),
        )
        .await;
    assert_eq!(put.status, 200, "{}", put.text);
    assert_eq!(put.json["id"], "api_token");
    assert_eq!(put.json["type"], "bearer");
    assert!(put.json.get("data").is_none());
    api.post(
        "/api/credentials",
        admin,
        &json!({"name": "pg", "type": "postgres_credential", "data": {"user": "u", "password": secret}}),
    )
    .await;

    let list = api.get("/api/credentials", viewer).await;
    assert_eq!(list.status, 200);
    let names: Vec<&str> = list.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api_token", "pg"]);
    let bearer = api.get("/api/credentials?type=bearer", viewer).await;
    assert_eq!(bearer.json["items"].as_array().unwrap().len(), 1);
    assert_eq!(bearer.json["filter"]["type"], "bearer");
    let one = api.get("/api/credentials/api_token", viewer).await;
    assert_eq!(
        (one.status, one.json["type"].as_str()),
        (200, Some("bearer"))
    );
    // NoETL's client always asks for the data: the name and kind, and why
    // the data is not there.
    let asked = api
        .get("/api/credentials/api_token?include_data=true", admin)
        .await;
    assert_eq!(asked.status, 200, "{}", asked.text);
    assert_eq!(asked.json["type"], "bearer");
    assert!(asked.json["data"].is_null(), "{}", asked.text);
    assert!(
        asked.json["data_withheld"]
            .as_str()
            .unwrap()
            .contains("never returns credential data"),
        "{}",
        asked.text
    );
    // NoETL's `type: postgres` with `db_*` fields is ours, renamed.
    let noetl_pg = api
        .post(
            "/api/credentials",
            admin,
            &json!({"name": "pg_noetl", "type": "postgres",
                    "data": {"db_host": "127.0.0.1", "db_port": 5432, "db_user": "u",
                             "db_password": secret, "db_name": "test"}}),
        )
        .await;
    assert_eq!(noetl_pg.status, 200, "{}", noetl_pg.text);
    assert_eq!(noetl_pg.json["type"], "postgres_credential");
    let stored = api.cluster.mesh.vault().get("pg_noetl").await.unwrap();
    assert_eq!(stored.data["user"], "u");
    assert_eq!(stored.data["database"], "test");
    assert_error(&api.get("/api/credentials/nope", viewer).await, 404, "nope");
    // Refusals do not echo the data either.
    let bad = api
        .post(
            "/api/credentials",
            admin,
            &json!({"name": "b", "type": "bearer", "data": {"tok": secret}}),
        )
        .await;
    assert_error(&bad, 422, "token");
    let bad = api
        .post(
            "/api/credentials",
            admin,
            &json!({"name": "b", "type": "oauth", "data": {"token": secret}}),
        )
        .await;
    assert_error(&bad, 422, "oauth");

    // The vault holds ciphertext only.
    let raw = api
        .cluster
        .mesh
        .js()
        .get_key_value("noetl_credentials")
        .await
        .unwrap()
        .get("api_token")
        .await
        .unwrap()
        .unwrap();
    assert!(!String::from_utf8_lossy(&raw).contains(secret));

    let del = api
        .call(Method::DELETE, "/api/credentials/api_token", admin, None)
        .await;
    assert_eq!(
        del.json,
        json!({"message": "Credential deleted successfully", "id": "api_token"})
    );
    assert_error(
        &api.call(Method::DELETE, "/api/credentials/api_token", admin, None)
            .await,
        404,
        "not stored",
    );

    let seen = api.seen.lock().unwrap();
    assert!(seen.len() >= 9);
    for body in seen.iter() {
        assert!(
            !body.contains(secret),
            "a response holds the secret: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_and_dedup_keys_start_each_execution_once() {
    let (api, keys) = Api::start().await;
    let (admin, operator) = (Some(keys.admin.as_str()), Some(keys.operator.as_str()));
    api.register(admin, FLOW).await;
    let batch = api
        .post(
            "/api/execute/batch",
            operator,
            &json!({"executions": [
                {"path": "tests/api_flow"},
                {"path": "tests/missing"},
                {"catalog_id": "tests/api_flow@v1", "payload": {"n": 9}},
            ]}),
        )
        .await;
    assert_eq!(batch.status, 200, "{}", batch.text);
    let b = &batch.json;
    assert_eq!(
        (
            b["count"].as_u64(),
            b["started"].as_u64(),
            b["failed"].as_u64()
        ),
        (Some(3), Some(2), Some(1))
    );
    assert_eq!(b["results"][1]["status"], "error");
    assert!(b["results"][1]["error"]
        .as_str()
        .unwrap()
        .contains("tests/missing"));
    let third = b["results"][2]["execution_id"].as_str().unwrap();
    api.wait_status(third, operator, "COMPLETED").await;
    let n = api
        .get(&format!("/api/executions/{third}/results/finish"), operator)
        .await;
    assert_eq!(n.json["result"], "n=9");

    // The same dedup key: one execution, the second request a duplicate.
    let body = json!({"path": "tests/api_flow", "dedup": {"key": "order-42", "window_secs": 60}});
    let first = api.post("/api/execute", operator, &body).await;
    let second = api.post("/api/execute", operator, &body).await;
    assert_eq!(first.json["status"], "started", "{}", first.text);
    assert_eq!(second.json["status"], "duplicate", "{}", second.text);
    assert_eq!(first.json["execution_id"], second.json["execution_id"]);
    // A caller's own execution id, likewise.
    let own = json!({"path": "tests/api_flow", "execution_id": "my-run-1"});
    assert_eq!(
        api.post("/api/execute", operator, &own).await.json["execution_id"],
        "my-run-1"
    );
    assert_eq!(
        api.post("/api/execute", operator, &own).await.json["status"],
        "duplicate"
    );
    // A request is accepted after its answer (the router writes the
    // header): list once every execution started here has ended.
    let started = [
        b["results"][0]["execution_id"].as_str().unwrap(),
        third,
        first.json["execution_id"].as_str().unwrap(),
        "my-run-1",
    ];
    for id in started {
        api.wait_status(id, operator, "COMPLETED").await;
    }
    let rows = api.get("/api/executions?path=api_flow", operator).await;
    assert_eq!(rows.json.as_array().unwrap().len(), 4, "{}", rows.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_openapi_document_describes_every_route() {
    let (api, _keys) = Api::start().await;
    let doc = api.get("/api/openapi.json", None).await;
    assert_eq!(doc.status, 200);
    let d = &doc.json;
    assert!(
        d["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        d["openapi"]
    );
    let want = [
        ("/health", "get"),
        ("/api/health", "get"),
        ("/api/catalog/register", "post"),
        ("/api/catalog/list", "post"),
        ("/api/catalog/resource", "post"),
        ("/api/catalog/delete", "post"),
        ("/api/execute", "post"),
        ("/api/execute/batch", "post"),
        ("/api/executions", "get"),
        ("/api/executions/{id}", "get"),
        ("/api/executions/{id}/status", "get"),
        ("/api/executions/{id}/cancel", "post"),
        ("/api/executions/{id}/pause", "post"),
        ("/api/executions/{id}/unpause", "post"),
        ("/api/executions/{id}/resume", "post"),
        ("/api/executions/{id}/signals/{name}", "post"),
        ("/api/executions/{id}/events", "get"),
        ("/api/executions/{id}/results/{step}", "get"),
        ("/api/executions/{id}/state", "get"),
        ("/api/events", "get"),
        ("/api/credentials", "get"),
        ("/api/credentials", "post"),
        ("/api/credentials/{name}", "get"),
        ("/api/credentials/{name}", "delete"),
        ("/api/catalog/register/batch", "post"),
        ("/api/executions/{id}/rerun", "post"),
        ("/api/executions/cleanup", "post"),
        ("/api/ehdb/executions", "get"),
        ("/api/ehdb/executions/{id}", "get"),
        ("/api/ehdb/executions/{id}/events", "get"),
    ];
    for (path, method) in want {
        assert!(
            d["paths"][path][method].is_object(),
            "{method} {path} missing"
        );
    }
    let paths = d["paths"].as_object().unwrap();
    let operations: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
    assert_eq!(
        operations,
        want.len(),
        "no undocumented extra: {:?}",
        paths.keys()
    );
    assert_eq!(
        d["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for schema in [
        "ExecuteRequest",
        "ExecutionStatus",
        "CatalogRegisterResponse",
        "ErrorBody",
        "StreamedEvent",
    ] {
        assert!(d["components"]["schemas"][schema].is_object(), "{schema}");
    }
    // The document says what the layers answer: ids by their pattern,
    // optional bodies optional, 401/413/422 where they apply, streams as text.
    let cancel = &d["paths"]["/api/executions/{id}/cancel"]["post"];
    assert_eq!(
        cancel["parameters"][0]["schema"]["pattern"],
        "^[A-Za-z0-9_-]{1,128}$"
    );
    assert_eq!(cancel["requestBody"]["required"], false);
    for status in ["400", "401", "413", "422", "503"] {
        assert!(cancel["responses"][status].is_object(), "cancel {status}");
    }
    let register = &d["paths"]["/api/catalog/register"]["post"];
    assert_ne!(register["requestBody"]["required"], false);
    let stream = &d["paths"]["/api/events"]["get"]["responses"]["200"]["content"]
        ["text/event-stream"]["schema"];
    assert_eq!(stream["type"], "string", "{stream}");
    // Credential data is write-only: no response schema has a `data` field.
    let cred = &d["components"]["schemas"]["CredentialResponse"]["properties"];
    assert!(cred["data"].is_null() && cred["name"].is_object(), "{cred}");
}

const WAIT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: api_wait, path: tests/api_wait }
workflow:
  - step: start
    tool:
      - name: approve
        kind: wait
        signal: approval
        schema: { type: object, required: [approved], properties: { approved: { type: boolean } } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signal_continues_a_wait_once_and_data_that_does_not_fit_is_422() {
    let (api, keys) = Api::start().await;
    let (admin, operator, viewer) = (
        Some(keys.admin.as_str()),
        Some(keys.operator.as_str()),
        Some(keys.viewer.as_str()),
    );
    api.register(admin, WAIT).await;
    let id = api.execute(operator, "tests/api_wait", json!({})).await;
    let url = format!("/api/executions/{id}/signals/approval");
    let mut answer = api.post(&url, operator, &json!({"approved": "yes"})).await;
    // Until the waiter is stored, no step waits: 404.
    for _ in 0..200 {
        if answer.status != 404 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        answer = api.post(&url, operator, &json!({"approved": "yes"})).await;
    }
    assert_error(&answer, 422, "$.approved: expected boolean");
    assert_error(
        &api.post(&url, viewer, &json!({"approved": true})).await,
        403,
        "has role viewer",
    );
    let ok = api.post(&url, operator, &json!({"approved": true})).await;
    assert_eq!(
        ok.json,
        json!({"execution_id": id, "signal": "approval", "step": "start", "task": "approve"}),
        "{}",
        ok.text
    );
    assert_error(
        &api.post(&url, operator, &json!({"approved": true})).await,
        404,
        "waits for signal `approval`",
    );
    api.wait_status(&id, viewer, "COMPLETED").await;
}

const FLAKY: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: api_resume, path: tests/api_resume }
workload: { fixed: false }
workflow:
  - step: start
    tool:
      - name: check
        kind: noop
        result: "{{ workload.fixed }}"
        spec:
          policy:
            rules:
              - when: "{{ not outcome.result }}"
                then: { do: fail }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_execution_resumes_through_the_api_and_a_refusal_is_422() {
    let (api, keys) = Api::start().await;
    let (admin, operator, viewer) = (
        Some(keys.admin.as_str()),
        Some(keys.operator.as_str()),
        Some(keys.viewer.as_str()),
    );
    api.register(admin, FLAKY).await;
    let id = api.execute(operator, "tests/api_resume", json!({})).await;
    api.wait_status(&id, viewer, "FAILED").await;
    let url = format!("/api/executions/{id}/resume");
    assert_error(
        &api.post(&url, viewer, &json!({})).await,
        403,
        "has role viewer",
    );
    assert_error(
        &api.post(&url, operator, &json!({"from": "nope"})).await,
        422,
        "`--from nope` names no step",
    );
    let ok = api
        .post(&url, operator, &json!({"set": {"fixed": true}}))
        .await;
    assert_eq!(
        ok.json,
        json!({"execution_id": id, "resumes": 1, "steps": ["start"], "superseded": []}),
        "{}",
        ok.text
    );
    api.wait_status(&id, viewer, "COMPLETED").await;
    assert_error(
        &api.post(&url, operator, &json!({})).await,
        422,
        "only a failed or cancelled execution can be resumed",
    );
    assert_error(
        &api.post("/api/executions/nope/resume", operator, &json!({}))
            .await,
        404,
        "nope",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn noetls_client_finds_its_fields_and_routes() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    // `catalog load`: one request, each item alone.
    let b64 = base64_of(FLOW);
    let batch = api
        .post(
            "/api/catalog/register/batch",
            admin,
            &json!({"items": [
                {"content": b64, "resource_type": "Playbook"},
                {"content": FLOW.replace("kind: noop", "kind: pyhton")},
                {"content": SLOW},
            ]}),
        )
        .await;
    assert_eq!(batch.status, 200, "{}", batch.text);
    assert_eq!(batch.json["status"], "partial");
    assert_eq!(
        (
            batch.json["registered"].as_u64(),
            batch.json["failed"].as_u64()
        ),
        (Some(2), Some(1))
    );
    assert_eq!(batch.json["results"][0]["catalog_id"], "tests/api_flow@v1");
    assert_eq!(batch.json["results"][1]["diagnostics"][0]["code"], "E006");

    // The status NoETL's `status` prints.
    let id = api.execute(admin, "tests/api_flow", json!({"n": 5})).await;
    let st = api.wait_status(&id, viewer, "COMPLETED").await;
    assert_eq!(
        (st["completed"].as_bool(), st["failed"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(st["completed_steps"], json!(["start", "finish"]));
    assert!(st["variables"].is_object(), "{st}");
    assert!(
        st["start_time"].is_string() && st["end_time"].is_string(),
        "{st}"
    );
    assert!(st["duration_seconds"].as_f64().unwrap() >= 0.0, "{st}");
    assert!(
        st["duration_human"].as_str().unwrap().ends_with('s'),
        "{st}"
    );

    // `ehdb query executions | execution | events`.
    let list = api
        .get("/api/ehdb/executions?status=COMPLETED", viewer)
        .await;
    assert_eq!(
        list.json["executions"][0]["execution_id"],
        id.as_str(),
        "{}",
        list.text
    );
    let one = api.get(&format!("/api/ehdb/executions/{id}"), viewer).await;
    assert_eq!(one.json["exists"], true, "{}", one.text);
    assert_eq!(one.json["state"]["status"], "COMPLETED");
    let count = one.json["state"]["event_count"].as_u64().unwrap();
    assert!(count > 3, "{}", one.text);
    let events = api
        .get(&format!("/api/ehdb/executions/{id}/events?limit=3"), viewer)
        .await;
    let evs = events.json["events"].as_array().unwrap();
    assert_eq!(evs.len(), 3, "{}", events.text);
    assert!(
        evs[0]["seq"].as_u64() > evs[1]["seq"].as_u64(),
        "newest first"
    );
    let all = api
        .get(
            &format!("/api/ehdb/executions/{id}/events?limit=1000"),
            viewer,
        )
        .await;
    let all = all.json["events"].as_array().unwrap();
    assert_eq!(all.len() as u64, count);
    assert!(all.iter().any(|e| e["event_type"] == "execution.completed"));

    // `execute rerun`: the same playbook and workload, the body's over it.
    let again = api
        .post(
            &format!("/api/executions/{id}/rerun"),
            admin,
            &json!({"workload": {"n": 7}, "resource_kind": "playbook"}),
        )
        .await;
    assert_eq!(again.status, 200, "{}", again.text);
    let new_id = again.json["execution_id"].as_str().unwrap().to_string();
    assert_ne!(new_id, id);
    assert_eq!(again.json["source_execution_id"], id.as_str());
    api.wait_status(&new_id, viewer, "COMPLETED").await;
    let result = api
        .get(&format!("/api/executions/{new_id}/results/finish"), viewer)
        .await;
    assert_eq!(result.json["result"], "n=7", "{}", result.text);

    // `cancel`: the cancelled executions listed; errors carry `message`.
    let slow = api
        .execute(admin, "tests/api_slow", json!({"seconds": 30}))
        .await;
    // Its header purged while it runs: the status NoETL's client polls
    // is the one its events give, not 404, and the list still shows it.
    let mesh = &api.cluster.mesh;
    let header_key = noetl_mesh::keys::Keys::header(&slow);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while mesh.exec_header(&slow).await.unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "no header");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    mesh.exec_kv().purge(&header_key).await.unwrap();
    let running = api
        .get(&format!("/api/executions/{slow}/status"), viewer)
        .await;
    assert_eq!(running.status, 200, "{}", running.text);
    assert_eq!(running.json["completed"], false, "{}", running.text);
    let listed = api.get("/api/executions?status=RUNNING", viewer).await;
    assert!(
        listed
            .json
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["execution_id"] == slow.as_str()),
        "listed while its header is purged: {}",
        listed.text
    );
    let cancel = api
        .post(
            &format!("/api/executions/{slow}/cancel"),
            admin,
            &json!({"cascade": true}),
        )
        .await;
    assert_eq!(
        cancel.json["cancelled_executions"],
        json!([slow]),
        "{}",
        cancel.text
    );
    api.wait_status(&slow, viewer, "CANCELLED").await;
    let again = api
        .post(&format!("/api/executions/{slow}/cancel"), admin, &json!({}))
        .await;
    assert_eq!(again.json["message"], again.json["error"], "{}", again.text);

    // `cleanup`: a dry run removes nothing; then the KV state goes, the
    // events stay.
    let dry = api
        .post(
            "/api/executions/cleanup",
            admin,
            &json!({"older_than_minutes": 0, "dry_run": true}),
        )
        .await;
    assert_eq!(dry.status, 200, "{}", dry.text);
    assert_eq!(
        dry.json["execution_ids"].as_array().unwrap().len(),
        3,
        "{}",
        dry.text
    );
    assert_eq!(
        api.get(&format!("/api/executions/{id}/status"), viewer)
            .await
            .status,
        200
    );
    let viewer_try = api
        .post("/api/executions/cleanup", viewer, &json!({}))
        .await;
    assert_eq!(viewer_try.status, 403);
    let done = api
        .post(
            "/api/executions/cleanup",
            admin,
            &json!({"older_than_minutes": 0}),
        )
        .await;
    assert_eq!(done.json["cancelled_count"], 3, "{}", done.text);
    assert_error(
        &api.get(&format!("/api/executions/{id}/status"), viewer)
            .await,
        404,
        "its events remain",
    );
    // Its id asked again: a duplicate, not a second run under it.
    let own = json!({"path": "tests/api_flow", "execution_id": id});
    let dup = api.post("/api/execute", admin, &own).await;
    assert_eq!(dup.json["status"], "duplicate", "{}", dup.text);
    // Compacted, it still runs again: from its events.
    let again = api
        .post(&format!("/api/executions/{id}/rerun"), admin, &json!({}))
        .await;
    assert_eq!(again.status, 200, "{}", again.text);
    let new_id = again.json["execution_id"].as_str().unwrap().to_string();
    api.wait_status(&new_id, viewer, "COMPLETED").await;
    let r = api
        .http
        .get(format!("{}/api/events?type=execution.completed", api.base))
        .bearer_auth(&keys.viewer)
        .send()
        .await
        .unwrap();
    let kept = read_sse(r, Duration::from_secs(10)).await;
    assert!(
        kept.iter().any(|e| e.data["execution_id"] == id.as_str()),
        "the events stay"
    );
}

/// `text` as base64 (as NoETL's client sends a playbook).
fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A playbook that naps, then sets `ctx.stage`.
const CTX_LATER: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: api_ctx_later
  path: tests/api_ctx_later
workflow:
  - step: start
    tool:
      - name: first
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { stage: "napping" } }
    next:
      arcs:
        - step: nap
  - step: nap
    tool:
      - name: sleep
        kind: python
        code: |
          import time
          time.sleep(1.5)
          result = {"slept": True}
    next:
      arcs:
        - step: finish
  - step: finish
    tool:
      - name: last
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { stage: "done" } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_variables_follow_ctx_after_the_first_read() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    api.register(admin, CTX_LATER).await;
    let id = api.execute(admin, "tests/api_ctx_later", json!({})).await;
    // Read while it naps: the replica reads `ctx` once, then follows it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let st = api
            .get(&format!("/api/executions/{id}/status"), viewer)
            .await;
        if st.json["variables"]["stage"] == "napping" {
            assert_eq!(st.json["status"], "RUNNING", "{}", st.text);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never saw ctx.stage = napping: {}",
            st.text
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The write after the first read reaches the answer: the first answer
    // that says COMPLETED has the final `ctx`.
    let st = api.wait_status(&id, viewer, "COMPLETED").await;
    assert_eq!(st["variables"], json!({"stage": "done"}), "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupt_plan_is_500_naming_its_key_not_no_plan() {
    use noetl_mesh::keys::Keys;
    use noetl_mesh::kv;
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    api.register(admin, FLOW).await;
    let done = api.execute(admin, "tests/api_flow", json!({})).await;
    api.wait_status(&done, viewer, "COMPLETED").await;
    // A header of another id (no replica has its plan cached), and
    // garbage where its plan is kept.
    let mesh = &api.cluster.mesh;
    let mut h = mesh.exec_header(&done).await.unwrap().unwrap();
    let id = "corrupt-plan-1";
    h.execution_id = id.into();
    kv::put(mesh.exec_kv(), &Keys::header(id), &h)
        .await
        .unwrap();
    let plan_key = Keys::plan(id);
    kv::put_bytes(mesh.exec_kv(), &plan_key, b"{not a plan".to_vec())
        .await
        .unwrap();
    let rerun = api
        .post(&format!("/api/executions/{id}/rerun"), admin, &json!({}))
        .await;
    assert_error(&rerun, 500, &plan_key);
    assert_error(&rerun, 500, "corrupt");
    for tail in ["/status", "", "/results/start"] {
        let a = api
            .get(&format!("/api/executions/{id}{tail}"), viewer)
            .await;
        assert_error(&a, 500, &plan_key);
    }
    let graph = api
        .get(&format!("/api/console/executions/{id}/graph"), viewer)
        .await;
    assert_error(&graph, 500, &plan_key);
    // No plan at all is still "refused before it started": 422.
    mesh.exec_kv().delete(&plan_key).await.unwrap();
    let none = api
        .post(&format!("/api/executions/{id}/rerun"), admin, &json!({}))
        .await;
    assert_error(&none, 422, "has no stored plan");
}

/// Time travel over a log longer than a chunk of the reader's (800
/// iterations one at a time: more than 1,600 stored messages, 2,400
/// events): the answer is the fold of the events up to `at`, the
/// timeline the log's last 2,000 events, and once the execution's KV
/// state is compacted the log alone still gives it. The API reads the log
/// a chunk at a time and never holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn time_travel_over_a_long_log_answers_its_fold_and_its_last_events() {
    use noetl_mesh::replay::{fold_log, read_log, Until};
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    api.register(
        admin,
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: long_log, path: tests/long_log }
workflow:
  - step: each
    loop:
      in: "{{ range(800) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 1
        policy: { reducers: { total: sum } }
    tool:
      - name: one
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { total: 1 } }
"#,
    )
    .await;
    let id = api.execute(admin, "tests/long_log", json!({})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let s = api
            .get(&format!("/api/executions/{id}/status"), viewer)
            .await;
        if s.json["status"] == "COMPLETED" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", s.text);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mesh = &api.cluster.mesh;
    let log = read_log(mesh, &id, Until::End).await.unwrap();
    assert!(log.len() > 2_000, "{} events", log.len());

    let whole = api
        .get(&format!("/api/executions/{id}/state"), viewer)
        .await;
    assert_eq!(whole.status, 200, "{}", whole.text);
    assert_eq!(whole.json["status"], "COMPLETED");
    assert_eq!(whole.json["ctx"]["total"], 800);
    assert_eq!(whole.json["events"], log.len());
    assert_eq!(whole.json["at_seq"], log.last().unwrap().seq);
    assert_eq!(whole.json["timeline_truncated"], true);
    let timeline = whole.json["timeline"].as_array().unwrap();
    let last: Vec<_> = log[log.len() - 2_000..]
        .iter()
        .map(|l| (json!(l.seq), json!(l.event.event_type)))
        .collect();
    let shown: Vec<_> = timeline
        .iter()
        .map(|e| (e["seq"].clone(), e["event_type"].clone()))
        .collect();
    assert_eq!(shown, last, "the timeline is the log's last 2,000 events");

    // As of an event in the middle: the fold of the events up to it.
    let middle = log[log.len() / 2 + 3].seq;
    let at = api
        .get(&format!("/api/executions/{id}/state?at={middle}"), viewer)
        .await;
    let folded = fold_log(mesh, &id, Until::Seq(middle)).await.unwrap();
    assert_eq!(at.json["status"], "RUNNING", "{}", at.text);
    assert_eq!(at.json["at_seq"], folded.last_seq);
    assert_eq!(at.json["events"], folded.events);
    assert_eq!(at.json["ctx"], json!(folded.ctx));
    let steps: serde_json::Map<String, Value> = folded
        .steps
        .iter()
        .map(|(k, r)| (k.clone(), noetl_mesh::payloads::to_value(r)))
        .collect();
    assert_eq!(at.json["steps"], Value::Object(steps));

    // Compacted: no header in KV, the log gives the same answer.
    mesh.forget_execution(&id).await.unwrap();
    assert!(mesh.exec_header(&id).await.unwrap().is_none());
    let compacted = api
        .get(&format!("/api/executions/{id}/state"), viewer)
        .await;
    assert_eq!(compacted.status, 200, "{}", compacted.text);
    assert_eq!(compacted.json, whole.json);

    // Five asked at once (a console scrubbing): the replica reads
    // `LOG_FOLDS` logs at a time, each read one consumer at a time on the
    // events stream; every answer is the same.
    let stream = mesh.subjects().events_stream();
    let consumers = || async {
        let mut s = mesh.js().get_stream(&stream).await.unwrap();
        s.info().await.unwrap().state.consumer_count
    };
    let mut before = 0;
    for _ in 0..10 {
        before = before.max(consumers().await);
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let path = format!("/api/executions/{id}/state");
    let (answers, most) = tokio::join!(
        async {
            let answers = futures::future::join_all((0..5).map(|_| api.get(&path, viewer))).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            answers
        },
        async {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(consumers().await);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            most
        }
    );
    for a in &answers {
        assert_eq!(a.json, whole.json, "{}", a.text);
    }
    let reading = most.saturating_sub(before);
    assert!(
        (1..=noetl_api::state::LOG_FOLDS).contains(&reading),
        "{reading} logs read at once (consumers on the events stream: {before} before, {most} at most)"
    );
}
