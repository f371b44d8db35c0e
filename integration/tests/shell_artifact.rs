//! The `shell` and `artifact` kinds end to end through the mesh, and the
//! refusal of a kind no executor serves before anything runs.

use std::time::Duration;

use noetl_integration::{types, Cluster};
use noetl_mesh::{credentials::Credential, state::ExecStatus};
use serde_json::json;

const SHELL: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: shell_e2e }
workload: { who: Ada }
workflow:
  - step: start
    tool:
      - name: greet
        kind: shell
        command: "echo hello {{ workload.who }}; echo warn >&2"
        spec:
          policy:
            rules:
              - else:
                  then:
                    do: continue
                    set_ctx:
                      greeting: "{{ outcome.result.stdout | trim }}"
                      warned: "{{ outcome.result.stderr | trim }}"
      - name: argv
        kind: shell
        command: ["printf", "%s|%s", "{{ workload.who }}", "$HOME"]
        env: { UNUSED: "x" }
        spec:
          policy:
            rules:
              - else: { then: { do: continue, set_ctx: { argv: "{{ outcome.result.stdout }}" } } }
      - name: grep_nothing
        kind: shell
        cmds:
          - "echo first"
          - "exit 3"
          - "echo never"
        spec:
          policy:
            rules:
              - when: "{{ outcome.error.kind == 'shell.exit' and outcome.shell.returncode == 3 }}"
                then:
                  do: continue
                  set_ctx: { handled: "{{ outcome.result.stdout | trim }}", code: "{{ outcome.result.returncode }}" }
    next:
      arcs:
        - step: fails
  - step: fails
    tool:
      - name: boom
        kind: shell
        command: "echo oops >&2; exit 7"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_tasks_run_their_output_feeds_policy_and_a_failure_fails_the_step() {
    let cluster = Cluster::start().await;
    let eid = cluster.submit(SHELL, "shell.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    assert_eq!(s.ctx["greeting"], "hello Ada", "{}", s.ctx);
    assert_eq!(s.ctx["warned"], "warn");
    assert_eq!(s.ctx["argv"], "Ada|$HOME");
    assert_eq!(s.ctx["handled"], "first");
    assert_eq!(s.ctx["code"], 3);
    assert_eq!(s.steps.get("start").map(String::as_str), Some("done"));
    assert_eq!(s.steps.get("fails").map(String::as_str), Some("failed"));
    let error = s.error.clone().unwrap_or_default();
    assert!(
        error.contains("shell.exit") || error.contains("exited with status 7"),
        "{error}"
    );
    cluster.stop().await;
}

const PUT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: artifact_put }
workload: { n: 2000, uri: "" }
workflow:
  - step: make
    tool:
      - name: rows
        kind: python
        args: { n: "{{ workload.n }}" }
        code: "result = [{'id': i, 'pad': 'x' * 40} for i in range(n)]"
      - name: save
        kind: artifact
        action: put
        data: "{{ _prev }}"
        uri: "{{ workload.uri }}"
        spec:
          policy:
            rules:
              - else: { then: { do: continue, set_ctx: { saved: "{{ outcome.result }}" } } }
    next:
      arcs:
        - step: load
  - step: load
    tool:
      - name: back
        kind: artifact
        action: get
        result_ref: "{{ ctx.saved }}"
        spec:
          policy:
            rules:
              - else:
                  then:
                    do: continue
                    set_ctx:
                      count: "{{ outcome.result.data | length }}"
                      last: "{{ (outcome.result.data | last).id }}"
"#;

const GET: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: artifact_get }
workload: { uri: "" }
workflow:
  - step: start
    tool:
      - name: load
        kind: artifact
        uri: "{{ workload.uri }}"
        spec:
          policy:
            rules:
              - else: { then: { do: continue, set_ctx: { count: "{{ outcome.result.data | length }}" } } }
"#;

/// A put returns a reference that stays a reference in `ctx` (it is not
/// read back by itself like a large step result); a get in a later step,
/// and in another execution, reads the value back from the shared store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artifact_put_in_one_execution_is_read_by_reference_in_it_and_in_another() {
    let cluster = Cluster::start().await;
    let uri = "noetl://artifacts/shared/rows";
    let (_, s) = cluster.completed(PUT, json!({"uri": uri})).await;
    assert_eq!(s.ctx["saved"]["ref"], uri, "{}", s.ctx);
    assert_eq!(s.ctx["saved"]["store"], "local");
    assert!(
        s.ctx["saved"]["size"].as_u64().unwrap() > 64 * 1024,
        "{}",
        s.ctx
    );
    assert_eq!(s.ctx["count"], 2000);
    assert_eq!(s.ctx["last"], 1999);
    let (_, other) = cluster.completed(GET, json!({"uri": uri})).await;
    assert_eq!(other.ctx["count"], 2000, "{}", other.ctx);

    // Nothing stored there: the task fails naming the key.
    let plain = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: missing }\nworkflow:\n  - step: start\n    tool:\n      - name: load\n        kind: artifact\n        uri: noetl://artifacts/never/written\n";
    let eid = cluster.submit(plain, "missing.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Failed);
    let error = s.error.unwrap_or_default();
    assert!(error.contains("artifacts/never/written.json"), "{error}");
    cluster.stop().await;
}

/// A credential value is never stored as an artifact: the object store
/// keeps it in clear for every execution sharing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artifact_put_of_a_credential_is_refused() {
    let cluster = Cluster::start().await;
    cluster
        .mesh
        .vault()
        .put(&Credential {
            name: "api".into(),
            kind: "bearer".into(),
            data: json!({"token": "tok-never-stored-4711"}),
        })
        .await
        .unwrap();
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: artifact_secret }
keychain: [ { name: api, kind: bearer } ]
workflow:
  - step: start
    tool:
      - name: save
        kind: artifact
        action: put
        data: { token: "{{ keychain.api.token }}" }
"#;
    let eid = cluster.submit(yaml, "secret.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Failed);
    let error = s.error.unwrap_or_default();
    assert!(
        error.contains("artifact.config") || error.contains("`data` reads `keychain`"),
        "{error}"
    );
    let stored = walk(cluster.data_dir.path());
    assert!(
        !stored
            .iter()
            .any(|text| text.contains("tok-never-stored-4711")),
        "the token reached the object store"
    );
    cluster.stop().await;
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if let Ok(text) = std::fs::read_to_string(&p) {
            out.push(text);
        }
    }
    out
}

/// A typo in `kind` used to pass and then wait forever for an executor of
/// that kind; the request is refused when it is loaded, naming the kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_an_unknown_kind_fails_at_once_naming_it() {
    let cluster = Cluster::start().await;
    let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: typo }\nworkflow:\n  - step: start\n    tool:\n      - name: q\n        kind: pg\n        command: select 1\n";
    let eid = cluster.submit(yaml, "typo.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Failed);
    let error = s.error.unwrap_or_default();
    assert!(error.contains("E006") && error.contains("`pg`"), "{error}");
    assert!(
        !types(&cluster.events(&eid).await).contains(&"step.started"),
        "nothing ran"
    );
    cluster.stop().await;
}
