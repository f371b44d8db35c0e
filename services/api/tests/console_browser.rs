//! The web console in a real headless Chromium over WebDriver, against the
//! API on a real mesh (a private nats-server, every service in process):
//! the token asked once and kept out of the URL, a playbook started from
//! the catalog page whose graph turns completed while its loop's progress
//! moves, a long execution paused (shown PAUSED, on its page and in the
//! list) and cancelled from its page, a failed step's error with its task
//! and attempt, a handled error beside its done step, what a viewer is not offered, the
//! executions list's filters, and credentials shown by name and kind only.
//! A failing test leaves a screenshot in `$CARGO_TARGET_DIR/console-screenshots/`.
//! With `NOETL_CONSOLE_DOC_SCREENSHOT=docs/console-execution.png` the first
//! test also saves the execution page there (the picture in docs/console.md).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod support;
use support::Api;

mod console_support;
use console_support::{screenshot_dir, Browser};

/// Three steps, the middle one a sequential loop whose iterations each
/// sleep, so its progress can be watched.
const LOOP_FLOW: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: console_loop
  path: tests/console_loop
  description: fetch, square each item slowly, report
workload:
  items: 3
  pause: 0.1
workflow:
  - step: start
    desc: make the list
    tool:
      - name: make
        kind: noop
        result: "{{ range(workload.items) | list }}"
    next:
      arcs:
        - step: square_each
  - step: square_each
    loop:
      in: "{{ range(workload.items) | list }}"
      iterator: n
      spec:
        mode: sequential
    tool:
      - name: square
        kind: python
        args: { n: "{{ iter.n }}", pause: "{{ workload.pause }}" }
        code: |
          import time
          time.sleep(float(pause))
          result = n * n
    next:
      arcs:
        - step: report
          when: "{{ event.name == 'loop.done' }}"
          args:
            counts: "{{ event.counts }}"
  - step: report
    tool:
      - name: keep
        kind: noop
        result: "squared {{ args.counts.done }} items"
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { squared: "{{ args.counts.done }}" } }
"#;

/// One step that sleeps `{{ workload.seconds }}` seconds.
const NAP: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: console_nap
  path: tests/console_nap
workload:
  seconds: 1
workflow:
  - step: nap
    tool:
      - name: sleep
        kind: python
        args: { seconds: "{{ workload.seconds }}" }
        code: |
          import time
          time.sleep(float(seconds))
          result = {"slept": seconds}
"#;

/// A step whose task fails twice (two attempts), failing the execution.
const FAILS: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: console_fails
  path: tests/console_fails
workflow:
  - step: start
    tool:
      - name: ready
        kind: noop
    next:
      arcs:
        - step: call_upstream
  - step: call_upstream
    tool:
      - name: fetch
        kind: python
        code: |
          raise TimeoutError("upstream is down")
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: retry, attempts: 2, backoff: none, delay: 0.01 }
"#;

/// A python task's error a catch-all rule continues after (issue 40): the
/// step is done, and its error shows beside it.
const HANDLED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: console_handled
  path: tests/console_handled
workflow:
  - step: compute
    tool:
      - name: calc
        kind: python
        code: |
          result = [1, 2, totl]
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue }
      - name: after
        kind: noop
        result: 7
"#;

/// Enter `token` in the token form and wait for the role it has.
async fn sign_in(b: &Browser, token: &str, role: &str) {
    b.wait_for("the token form", "document.querySelector('#token-input')")
        .await;
    b.type_into("#token-input", token).await;
    b.click("#token-submit").await;
    b.wait_for(
        &format!("the {role} role in the header"),
        &format!("document.querySelector('#who-role')?.textContent === {role:?}"),
    )
    .await;
}

/// The graph's steps and their statuses, as drawn.
async fn drawn_steps(b: &Browser) -> Value {
    b.js(
        "return Object.fromEntries([...document.querySelectorAll('#graph-svg g.node')]\
          .map(n => [n.dataset.step, n.dataset.status]));",
    )
    .await
}

/// With `NOETL_CONSOLE_DOC_SCREENSHOT` set, save the top of the page there
/// (docs/console-execution.png: an execution with its loop half done).
async fn doc_screenshot(b: &Browser) {
    if let Some(path) = std::env::var_os("NOETL_CONSOLE_DOC_SCREENSHOT") {
        b.js("window.scrollTo(0, 0); return 1;").await;
        b.screenshot_to(std::path::Path::new(&path)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_playbook_started_from_the_catalog_turns_completed_while_its_loop_progress_moves() {
    let (api, keys) = Api::start().await;
    api.register(Some(&keys.admin), LOOP_FLOW).await;
    let b = Browser::start(&api.base).await;
    b.check("run_from_catalog", async {
        b.open("#/catalog").await;
        sign_in(&b, &keys.operator, "operator").await;
        // The token is kept for the tab, and never in the URL.
        let kept = b.js("return sessionStorage.getItem('noetl.console.token');").await;
        assert_eq!(kept, json!(keys.operator));
        assert!(!b.url().await.contains(&keys.operator));

        // The catalog page: the playbook, its YAML, a run form.
        b.click("tr.catalog-row[data-path='tests/console_loop']").await;
        b.wait_for("the YAML", "document.querySelector('#catalog-yaml')?.textContent.includes('square_each')")
            .await;
        let workload = b.js("return JSON.parse(document.querySelector('#workload-input').value);").await;
        assert_eq!(workload, json!({"items": 3, "pause": 0.1}));
        b.type_into("#workload-input", r#"{"items": 8, "pause": 0.4}"#).await;
        b.click("#run-button").await;
        let hash = b
            .wait_for("the execution page", "location.hash.startsWith('#/executions/') && location.hash")
            .await;
        let id = hash.as_str().unwrap().trim_start_matches("#/executions/").to_string();
        assert!(!id.is_empty());

        // The graph, drawn from the plan's arcs in layers.
        b.wait_for("the three steps", "document.querySelectorAll('#graph-svg g.node').length === 3").await;
        let layers = b
            .js("return [...document.querySelectorAll('#graph-svg g.node')].map(n => \
                 [n.dataset.step, n.getAttribute('transform')]);")
            .await;
        let xs: Vec<f64> = layers
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_str().unwrap()[10..].split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(xs[0] < xs[1] && xs[1] < xs[2], "one layer each, left to right: {layers}");

        // The loop's progress moves: some count strictly between 0 and 8 is
        // shown before all 8 are.
        let mut seen = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let done = b
                .js("const l = document.querySelector(\".loop[data-step='square_each']\"); \
                     return l ? [Number(l.dataset.done), Number(l.dataset.total)] : null;")
                .await;
            if let Some(pair) = done.as_array() {
                let (d, t) = (pair[0].as_u64().unwrap(), pair[1].as_u64().unwrap());
                if (3..8).contains(&d) && !seen.iter().any(|s| *s >= 3) {
                    doc_screenshot(&b).await;
                }
                seen.insert(d);
                if t == 8 && d == 8 {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the loop did not finish; counts seen {seen:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            seen.iter().any(|d| *d > 0 && *d < 8),
            "the progress should move through the middle: {seen:?}"
        );

        // Completed: every step done, the status badge, the same as the API.
        b.wait_for(
            "every step done",
            "[...document.querySelectorAll('#graph-svg g.node')].every(n => n.dataset.status === 'done')",
        )
        .await;
        b.wait_for("COMPLETED", "document.querySelector('#exec-status')?.dataset.status === 'COMPLETED'")
            .await;
        assert_eq!(
            drawn_steps(&b).await,
            json!({"start": "done", "square_each": "done", "report": "done"})
        );
        let api_status = api.get(&format!("/api/executions/{id}/status"), Some(&keys.viewer)).await;
        assert_eq!(api_status.json["status"], "COMPLETED");
        // No cancel for an execution that has ended.
        assert_eq!(b.js("return document.querySelector('#cancel') === null;").await, json!(true));

        // The timeline has a row per step-run with its task attempts; the
        // ctx, the events with their payloads, a result loaded on demand.
        b.wait_for("timeline rows", "document.querySelectorAll('.tl-row').length >= 3").await;
        b.wait_for("the task bars", "document.querySelector(\".tl-row[data-step='report'] .tl-task[data-task='keep']\")")
            .await;
        b.wait_for("ctx", "document.querySelector('#ctx')?.textContent.includes('\"squared\": 8')").await;
        b.wait_for(
            "the terminal event",
            "document.querySelector(\"tr.event-row[data-type='execution.completed']\")",
        )
        .await;
        b.click("tr.event-row[data-type='playbook.initialized']").await;
        b.wait_for(
            "the event's payload",
            "document.querySelector('tr.payload-row')?.textContent.includes('console_loop')",
        )
        .await;
        b.click("button.load-result[data-step='report']").await;
        b.wait_for(
            "the loaded result",
            "document.querySelector(\".loaded-result[data-step='report']\")?.textContent.includes('squared 8 items')",
        )
        .await;

        // Time travel: the scrubber at the first event shows the execution
        // just started (no step done, no `squared` in ctx); back at the
        // last, completed with every step done; the same as the API's
        // `state?at=`.
        b.wait_for(
            "the scrubber over every event",
            "Number(document.querySelector('#scrubber')?.max) >= 10 && document.querySelector('#history-status')?.dataset.status === 'COMPLETED'",
        )
        .await;
        let scrub_to = |position: &str| {
            format!(
                "const s = document.querySelector('#scrubber'); s.value = {position}; s.dispatchEvent(new Event('input')); return Number(s.value);"
            )
        };
        // Before its first event of the router's, not started; at
        // `playbook.initialized`, running with nothing done.
        b.js(&scrub_to("s.min")).await;
        b.wait_for(
            "the state before the router's first event",
            "document.querySelector('#history-status')?.dataset.status === 'NOT STARTED' \
             && document.querySelector('#history-steps').textContent.includes('no step yet')",
        )
        .await;
        let whole = api
            .get(&format!("/api/executions/{id}/state"), Some(&keys.viewer))
            .await;
        let started = whole.json["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .position(|e| e["event_type"] == "playbook.initialized")
            .expect("playbook.initialized in the timeline");
        b.js(&scrub_to(&started.to_string())).await;
        let first_seq = b
            .wait_for(
                "the state at playbook.initialized",
                "(e => e && e.dataset.status === 'RUNNING' && Number(e.dataset.seq)) (document.querySelector('#history-status'))",
            )
            .await;
        let ctx_then = b.js("return document.querySelector('#history-ctx').textContent;").await;
        assert!(!ctx_then.as_str().unwrap().contains("squared"), "{ctx_then}");
        let done_then = b
            .js("return document.querySelectorAll(\"tr.history-step[data-status='done']\").length;")
            .await;
        assert_eq!(done_then, json!(0));
        let at = api
            .get(
                &format!("/api/executions/{id}/state?at={first_seq}"),
                Some(&keys.viewer),
            )
            .await;
        assert_eq!(at.json["status"], "RUNNING", "{}", at.text);
        assert_eq!(at.json["at_seq"], first_seq);
        b.js(&scrub_to("s.max")).await;
        b.wait_for(
            "the state at the last event",
            "document.querySelector('#history-status')?.dataset.status === 'COMPLETED' && document.querySelector('#history-ctx').textContent.includes('\"squared\": 8') && document.querySelectorAll(\"tr.history-step[data-status='done']\").length === 3",
        )
        .await;
        // A position left while its state is still being read: that read
        // is given up (each is a whole log read on the server), and only
        // the last position's state is drawn, with no error. The page's
        // state reads are held 1.5 s here, so the first is still running
        // when the second starts.
        b.js(
            "window.__asked = 0; window.__aborted = 0; const f = window.fetch; \
             window.fetch = (u, init) => { if (!String(u).includes('/state?at=')) return f(u, init); \
               window.__asked++; init.signal.addEventListener('abort', () => window.__aborted++); \
               return new Promise(r => setTimeout(r, 1500)).then(() => f(u, init)); }; return 1;",
        )
        .await;
        b.js(&scrub_to(&started.to_string())).await;
        b.wait_for("the first position's read asked", "window.__asked === 1")
            .await;
        b.js(&scrub_to("s.min")).await;
        b.wait_for(
            "the later position's state, the earlier read given up",
            "window.__asked === 2 && window.__aborted === 1 \
             && document.querySelector('#history-status')?.dataset.status === 'NOT STARTED'",
        )
        .await;
        // Past the moment the given-up read would have answered.
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let after = b
            .js("return [document.querySelector('#history-status').dataset.status, document.querySelector('#history-message').textContent];")
            .await;
        assert_eq!(after, json!(["NOT STARTED", ""]), "the given-up read drew nothing");
        b.js(&scrub_to("s.max")).await;
        b.wait_for(
            "the last event's state again",
            "document.querySelector('#history-status')?.dataset.status === 'COMPLETED'",
        )
        .await;
        b.js("window.scrollTo(0, 0); return 1;").await;
        b.screenshot_to(&screenshot_dir().join("execution-completed.png")).await;
    })
    .await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_cancels_a_long_execution_and_a_viewer_is_not_offered_to() {
    let (api, keys) = Api::start().await;
    let admin = Some(keys.admin.as_str());
    api.register(admin, NAP).await;
    api.register(admin, FAILS).await;
    api.register(admin, HANDLED).await;
    let handled = api.execute(admin, "tests/console_handled", json!({})).await;
    let long = api
        .execute(admin, "tests/console_nap", json!({"seconds": 120}))
        .await;
    let failed = api.execute(admin, "tests/console_fails", json!({})).await;
    api.wait_status(&failed, admin, "FAILED").await;
    let b = Browser::start(&api.base).await;
    b.check("cancel", async {
        // A viewer sees the running execution, without a Cancel button.
        b.open(&format!("#/executions/{long}")).await;
        sign_in(&b, &keys.viewer, "viewer").await;
        b.wait_for("the running step", "document.querySelector(\"#graph-svg g.node[data-step='nap']\")?.dataset.status === 'running'")
            .await;
        b.wait_for("RUNNING", "document.querySelector('#exec-status')?.dataset.status === 'RUNNING'").await;
        assert_eq!(b.js("return document.querySelector('#cancel') === null;").await, json!(true));

        // A failed step shows its error with the task and attempt that failed it.
        b.open(&format!("#/executions/{failed}")).await;
        b.wait_for("FAILED", "document.querySelector('#exec-status')?.dataset.status === 'FAILED'").await;
        let error = b
            .wait_for(
                "the step's error with its task",
                "(e => e && e.dataset.task && [e.dataset.task, e.dataset.attempt, e.textContent])\
                 (document.querySelector(\"tr.step-row[data-step='call_upstream'] .step-error\"))",
            )
            .await;
        assert_eq!((error[0].as_str(), error[1].as_str()), (Some("fetch"), Some("2")), "{error}");
        assert!(error[2].as_str().unwrap().contains("upstream is down"), "{error}");
        assert!(error[2].as_str().unwrap().contains("failed in task fetch, attempt 2"), "{error}");
        assert_eq!(
            drawn_steps(&b).await,
            json!({"start": "done", "call_upstream": "failed"})
        );

        // A handled error shows beside its done step (issue 40), as the
        // graph API gives it from the step's record.
        api.wait_status(&handled, admin, "COMPLETED").await;
        let graph = api
            .get(&format!("/api/console/executions/{handled}/graph"), admin)
            .await
            .json;
        let step = &graph["steps"][0];
        assert_eq!((&step["name"], &step["status"]), (&json!("compute"), &json!("done")), "{graph}");
        assert_eq!(step["handled"][0]["task"], "calc", "{graph}");
        assert_eq!(step["handled"][0]["action"], "continue", "{graph}");
        b.open(&format!("#/executions/{handled}")).await;
        let shown = b
            .wait_for(
                "the handled error",
                "(e => e && [e.dataset.task, e.dataset.action, e.textContent])\
                 (document.querySelector(\"tr.step-row[data-step='compute'] .handled-error\"))",
            )
            .await;
        assert_eq!((shown[0].as_str(), shown[1].as_str()), (Some("calc"), Some("continue")), "{shown}");
        let text = shown[2].as_str().unwrap();
        assert!(text.contains("handled error in task calc"), "{text}");
        assert!(text.contains("python.exception: NameError: name 'totl' is not defined"), "{text}");

        // Forget the viewer token; an operator cancels the long one.
        b.click("#signout").await;
        sign_in(&b, &keys.operator, "operator").await;
        b.open(&format!("#/executions/{long}")).await;
        // A pause shows as PAUSED (issue 40), and Cancel stays offered.
        let paused = api
            .post(&format!("/api/executions/{long}/pause"), admin, &json!({}))
            .await;
        assert_eq!(paused.json["paused"], true, "{}", paused.text);
        b.wait_for_within(
            "PAUSED",
            Duration::from_secs(30),
            "document.querySelector('#exec-status')?.dataset.status === 'PAUSED'",
        )
        .await;
        // The list says so too: the API with `is_paused`, the page PAUSED.
        let list = api.get("/api/executions?status=RUNNING", admin).await.json;
        let row = list
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["execution_id"] == long.as_str())
            .unwrap_or_else(|| panic!("{list}"))
            .clone();
        assert_eq!((&row["status"], &row["is_paused"]), (&json!("RUNNING"), &json!(true)), "{row}");
        b.open("#/executions").await;
        b.wait_for(
            "the paused row",
            &format!(
                "document.querySelector(\"tr.execution-row[data-execution-id='{long}']\")?.dataset.status === 'PAUSED'"
            ),
        )
        .await;
        b.open(&format!("#/executions/{long}")).await;
        b.wait_for("PAUSED again", "document.querySelector('#exec-status')?.dataset.status === 'PAUSED'").await;
        b.click("#cancel").await;
        b.click("#cancel-confirm").await;
        b.wait_for_within(
            "CANCELLED",
            Duration::from_secs(30),
            "document.querySelector('#exec-status')?.dataset.status === 'CANCELLED'",
        )
        .await;
        b.wait_for("the Cancel button gone", "document.querySelector('#cancel') === null").await;
        let status = api.get(&format!("/api/executions/{long}/status"), admin).await;
        assert_eq!(status.json["status"], "CANCELLED");
        assert_eq!(status.json["is_cancelled"], true);
    })
    .await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_executions_list_filters_and_credentials_show_names_and_kinds_only() {
    let (api, keys) = Api::start().await;
    let admin = Some(keys.admin.as_str());
    api.register(admin, NAP).await;
    api.register(admin, FAILS).await;
    let napped = api
        .execute(admin, "tests/console_nap", json!({"seconds": 0}))
        .await;
    let failed = api.execute(admin, "tests/console_fails", json!({})).await;
    api.wait_status(&napped, admin, "COMPLETED").await;
    api.wait_status(&failed, admin, "FAILED").await;
    let secret = "s3cr3t-console-value";
    let created = api
        .post(
            "/api/credentials",
            admin,
            &json!({"name": "warehouse_db", "type": "postgres_credential",
                    "data": {"user": "etl", "password": secret}}),
        )
        .await;
    assert!(created.status < 300, "{}", created.text);
    let b = Browser::start(&api.base).await;
    b.check("lists", async {
        // A refused token is said so, and the form asks again.
        b.open("#/executions").await;
        b.type_into("#token-input", "not-a-token").await;
        b.click("#token-submit").await;
        b.wait_for("the refusal", "document.querySelector('#token-status')?.textContent.includes('refused')")
            .await;
        sign_in(&b, &keys.viewer, "viewer").await;

        // The event-stream reader (the console's own, not EventSource):
        // comments skipped, data lines joined, CRLF read, a partial event
        // kept for the next chunk.
        let parsed = b
            .client
            .execute_async(
                "const done = arguments[arguments.length - 1];\
                 import('/console/js/api.js').then(m => done(m.parseEvents(\
                   ': keep-alive\\n\\nid: 7\\nevent: step.done\\ndata: {\"a\":\\ndata: 1}\\r\\n\\r\\nid: 8\\ndata: {')));",
                vec![],
            )
            .await
            .expect("the parser runs");
        assert_eq!(
            parsed,
            json!({"events": [{"id": "7", "event": "step.done", "data": "{\"a\":\n1}"}],
                   "rest": "id: 8\ndata: {"})
        );

        let rows = "[...document.querySelectorAll('tr.execution-row')].map(r => r.dataset.executionId)";
        b.wait_for("both executions", &format!("{rows}.length === 2")).await;
        let mut select = String::from("const s = document.querySelector('#filter-status'); ");
        select.push_str("s.value = 'FAILED'; s.dispatchEvent(new Event('change')); return 1;");
        b.js(&select).await;
        b.wait_for("only the failed one", &format!("(r => r.length === 1 && r[0] === {failed:?})({rows})"))
            .await;
        assert!(b.url().await.contains("status=FAILED"));
        b.js("const s = document.querySelector('#filter-status'); s.value = ''; \
              s.dispatchEvent(new Event('change')); return 1;")
            .await;
        b.wait_for("both again", &format!("{rows}.length === 2")).await;
        b.type_into("#filter-playbook", "console_nap").await;
        b.wait_for("only the nap", &format!("(r => r.length === 1 && r[0] === {napped:?})({rows})"))
            .await;
        // Search by id opens the execution.
        b.type_into("#search-id", &failed).await;
        b.click("#search-form button").await;
        b.wait_for("its page", &format!("document.querySelector('#exec-id')?.textContent === {failed:?}"))
            .await;

        // An id that is no execution says so.
        b.open("#/executions/no-such-execution").await;
        b.wait_for(
            "the not-found message",
            "document.querySelector('#exec-message')?.textContent.includes('No execution no-such-execution')",
        )
        .await;

        // Credentials: the name and kind, never the data.
        b.open("#/credentials").await;
        b.wait_for(
            "the credential",
            "document.querySelector(\"tr.credential-row[data-name='warehouse_db']\")?.textContent.includes('postgres_credential')",
        )
        .await;
        let page = b.client.source().await.expect("the page source");
        assert!(!page.contains(secret), "a credential's data reached the page");
    })
    .await;
    b.close().await;
}
