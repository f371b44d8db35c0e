//! The rules each tool applies to its fields when a task runs, checked by
//! `noetl validate` on literal values (crates/core/src/validate/fields.rs):
//! a task that breaks one would fail every time it runs. A templated value,
//! and a field a workbook task may get from its call site, are left alone.

use noetl_core::load::load_playbook;

const HEAD: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\n";

/// A playbook whose step `a` has the one task `t` with `fields` (each line
/// indented by 8): the task's `name` is at line 8, its first field at 9.
fn task(fields: &str) -> String {
    format!("{HEAD}workflow:\n  - step: a\n    tool:\n      - name: t\n{fields}")
}

/// `(code, line, col, message)` of every E003 / E004 (the codes these
/// rules report), and the help of each.
fn diags(src: &str) -> Vec<(&'static str, usize, usize, String, String)> {
    let all = match load_playbook(src, "t.yaml") {
        Ok(l) => l.warnings.0,
        Err(e) => e.diagnostics.0,
    };
    all.into_iter()
        .filter(|d| matches!(d.code.as_str(), "E003" | "E004"))
        .map(|d| {
            let s = d.span.expect("positioned");
            (
                d.code.as_str(),
                s.line,
                s.col,
                d.message,
                d.help.unwrap_or_default(),
            )
        })
        .collect()
}

/// The one diagnostic of `src`, as `(code, line, col, message)`.
fn one(src: &str) -> (&'static str, usize, usize, String) {
    let d = diags(src);
    assert_eq!(d.len(), 1, "{d:#?}");
    let (c, l, col, m, _) = d.into_iter().next().unwrap();
    (c, l, col, m)
}

fn clean(src: &str) {
    let d = diags(src);
    assert!(d.is_empty(), "{d:#?}");
}

#[test]
fn postgres_needs_auth_or_connection_and_sql_needs_a_statement() {
    assert_eq!(
        one(&task("        kind: postgres\n        command: SELECT 1\n")),
        (
            "E003",
            8,
            9,
            "task `t` of step `a` (a postgres task) has neither `auth` nor `connection`: the postgres tool has no database to connect to".into()
        )
    );
    assert_eq!(
        one(&task(
            "        kind: postgres\n        connection: postgresql://u@h/db\n        command: \" ; \"\n"
        )),
        (
            "E004",
            11,
            18,
            "`command` of task `t` of step `a` (a postgres task) holds no SQL statement: `command` is required: one or more SQL statements (a string or a list)".into()
        )
    );
    let d = one(&task("        kind: duckdb\n        command: []\n"));
    assert_eq!((d.0, d.1, d.2), ("E004", 10, 18), "{d:?}");
    assert!(d.3.contains("a duckdb task"), "{}", d.3);
    // Templated values, an auth, a script instead of a command: quiet.
    clean(&task(
        "        kind: postgres\n        connection: \"{{ workload.dsn }}\"\n        command: \"{{ workload.sql }}\"\n",
    ));
    clean(&format!(
        "{HEAD}keychain:\n  - name: pg\n    kind: postgres_credential\nworkflow:\n  - step: a\n    tool:\n      - name: t\n        kind: postgres\n        auth: pg\n        command: [\"SELECT 1\", \"SELECT 2\"]\n"
    ));
}

#[test]
fn shell_runs_exactly_one_of_command_and_cmds_with_named_variables() {
    assert_eq!(
        one(&task("        kind: shell\n        cwd: /tmp\n")),
        (
            "E003",
            8,
            9,
            "task `t` of step `a` (a shell task) has neither `command` nor `cmds`: the shell tool runs exactly one of them".into()
        )
    );
    assert_eq!(
        one(&task(
            "        kind: shell\n        command: echo a\n        cmds: [echo b]\n"
        )),
        (
            "E004",
            11,
            15,
            "task `t` of step `a` (a shell task) has both `command` and `cmds`: the shell tool runs exactly one of them".into()
        )
    );
    let d = one(&task("        kind: shell\n        command: \"  \"\n"));
    assert_eq!((d.0, d.1, d.2), ("E004", 10, 18), "{d:?}");
    assert!(d
        .3
        .starts_with("`command` of task `t` of step `a` (a shell task) is empty"));
    assert_eq!(
        one(&task(
            "        kind: shell\n        command: env\n        env: { GOOD: 1, \"A=B\": 2 }\n"
        )),
        (
            "E004",
            11,
            25,
            "`env` of task `t` of step `a` (a shell task) sets \"A=B\", which is not a variable name: a name is not empty and holds no `=`".into()
        )
    );
    clean(&task(
        "        kind: shell\n        command: \"{{ workload.cmd }}\"\n        env: { API_URL: x }\n",
    ));
    clean(&task(
        "        kind: shell\n        cmds: [echo a, echo b]\n",
    ));
}

#[test]
fn http_sends_one_body() {
    assert_eq!(
        one(&task(
            "        kind: http\n        url: https://x.example\n        method: POST\n        json: { a: 1 }\n        form: { b: 2 }\n"
        )),
        (
            "E004",
            13,
            15,
            "task `t` of step `a` (an http task) has more than one body (`json`, `form`): the http tool sends one of `json`, `body` and `form`".into()
        )
    );
    // A templated body may render to null: quiet.
    clean(&task(
        "        kind: http\n        url: https://x.example\n        method: POST\n        json: \"{{ workload.payload }}\"\n        body: text\n",
    ));
}

#[test]
fn wait_takes_a_signal_name_and_a_positive_timeout() {
    assert_eq!(
        one(&task("        kind: wait\n        signal: \"approve.v1\"\n")),
        (
            "E004",
            10,
            17,
            "`signal` \"approve.v1\" of task `t` of step `a` (a wait task) is not a signal name: 1-128 characters of [A-Za-z0-9_-]".into()
        )
    );
    let d = one(&task(
        "        kind: wait\n        signal: approve\n        timeout_s: 0\n",
    ));
    assert_eq!((d.0, d.1, d.2), ("E004", 11, 20), "{d:?}");
    assert!(d.3.contains("above 0, found 0"), "{}", d.3);
    let d = one(&task(
        "        kind: wait\n        signal: approve\n        timeout_s: soon\n",
    ));
    assert_eq!((d.0, d.1), ("E004", 11), "{d:?}");
    clean(&task(
        "        kind: wait\n        signal: \"approve_{{ iter.id }}\"\n        timeout_s: \"1.5\"\n",
    ));
    clean(&task(
        "        kind: wait\n        signal: approve-1\n        timeout_s: \"{{ workload.t }}\"\n",
    ));
}

#[test]
fn a_child_playbook_has_one_source_and_reads_no_keychain() {
    assert_eq!(
        one(&task("        kind: playbook\n        args: { a: 1 }\n")),
        (
            "E003",
            8,
            9,
            "task `t` of step `a` (a playbook task) names no child playbook: it needs one of `path`, `playbook` and `file`".into()
        )
    );
    let d = one(&task(
        "        kind: playbook\n        path: catalog/child\n        file: child.yaml\n",
    ));
    assert_eq!((d.0, d.1, d.2), ("E004", 11, 15), "{d:?}");
    assert!(d.3.contains("more than once (`path`, `file`)"), "{}", d.3);
    let src = format!(
        "{HEAD}keychain:\n  - name: api\n    kind: bearer\nworkflow:\n  - step: a\n    tool:\n      - name: t\n        kind: playbook\n        path: catalog/child\n        args: {{ token: \"{{{{ keychain.api.token }}}}\" }}\n"
    );
    let d = diags(&src);
    let k = d
        .iter()
        .find(|d| d.3.contains("reads `keychain`"))
        .unwrap_or_else(|| panic!("{d:#?}"));
    assert_eq!(
        (k.0, k.1, k.2, k.3.as_str()),
        (
            "E004",
            14,
            15,
            "`args` of task `t` of step `a` (a playbook task) reads `keychain`: credential values are not passed to child executions"
        )
    );
    clean(&task(
        "        kind: playbook\n        path: \"{{ workload.child }}\"\n        args: { a: \"{{ workload.a }}\" }\n",
    ));
}

#[test]
fn transfer_modes_chunks_and_table_targets() {
    let d = one(&task(
        "        kind: transfer\n        source: { tool: postgres, query: q, auth: pg }\n        target: { tool: postgres, table: t, auth: pg }\n        mode: upsrt\n",
    ));
    assert_eq!((d.0, d.1, d.2), ("E004", 12, 15), "{d:?}");
    assert!(
        d.3.starts_with("`mode` \"upsrt\" of task `t` of step `a`"),
        "{}",
        d.3
    );
    let h = diags(&task(
        "        kind: transfer\n        source: { tool: postgres, query: q, auth: pg }\n        target: { tool: postgres, table: t, auth: pg }\n        mode: upsrt\n",
    ));
    assert!(h[0].4.starts_with("did you mean `upsert`?"), "{}", h[0].4);
    let d = one(&task(
        "        kind: transfer\n        source: { tool: postgres, query: q, auth: pg }\n        target: { tool: postgres, table: t, auth: pg }\n        chunk_size: 0\n",
    ));
    assert_eq!((d.0, d.1, d.2), ("E004", 12, 21), "{d:?}");
    assert_eq!(
        one(&task(
            "        kind: transfer\n        source: { tool: postgres, query: q, auth: pg }\n        target: { tool: postgres, auth: pg }\n"
        )),
        (
            "E003",
            11,
            17,
            "`target` of task `t` of step `a` (a transfer task) has no `table`: a postgres target writes rows into a table".into()
        )
    );
    let d = one(&task(
        "        kind: transfer\n        source: { tool: postgres, query: q, auth: pg }\n        target: { tool: postgres, table: \"my table\", auth: pg }\n",
    ));
    assert_eq!((d.0, d.1, d.2), ("E004", 11, 42), "{d:?}");
    let d = one(&task(
        "        kind: transfer\n        source: { tool: postgres, query: q, auth: pg }\n        target: { tool: duckdb, table: t }\n",
    ));
    assert_eq!((d.0, d.1), ("E003", 11), "{d:?}");
    assert!(d.3.contains("has no `database`"), "{}", d.3);
    clean(&task(
        "        kind: transfer\n        source: { tool: http, url: \"https://x\" }\n        target: { tool: duckdb, table: \"{{ workload.t }}\", database: /tmp/x.duckdb }\n        chunk_size: \"{{ workload.n }}\"\n        mode: append\n",
    ));
}

#[test]
fn artifact_actions_and_references() {
    let d = one(&task(
        "        kind: artifact\n        action: push\n        data: 1\n",
    ));
    assert_eq!((d.0, d.1, d.2), ("E004", 10, 17), "{d:?}");
    assert_eq!(
        d.3,
        "`action` \"push\" of task `t` of step `a` (an artifact task) must be `get` or `put`"
    );
    let d = one(&task("        kind: artifact\n        uri: s3://b/k\n"));
    assert_eq!((d.0, d.1, d.2), ("E004", 10, 14), "{d:?}");
    assert!(d
        .3
        .contains("not a reference of this engine's object store"));
    let d = one(&task(
        "        kind: artifact\n        action: put\n        data: 1\n        uri: noetl://results/x\n",
    ));
    assert_eq!((d.0, d.1, d.2), ("E004", 12, 14), "{d:?}");
    assert!(d.3.contains("`noetl://artifacts/<path>`"), "{}", d.3);
    clean(&task(
        "        kind: artifact\n        action: put\n        data: 1\n        uri: noetl://artifacts/reports/r1\n",
    ));
    clean(&task(
        "        kind: artifact\n        action: \"{{ workload.verb }}\"\n        uri: \"{{ workload.ref }}\"\n",
    ));
}

#[test]
fn nats_operations_and_their_fields() {
    let d = diags(&task(
        "        kind: nats\n        operation: publsh\n        subject: s\n",
    ));
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!((d[0].0, d[0].1, d[0].2), ("E004", 10, 20));
    assert!(d[0].4.starts_with("did you mean `publish`?"), "{}", d[0].4);
    assert_eq!(
        one(&task("        kind: nats\n        operation: request\n")),
        (
            "E003",
            8,
            9,
            "task `t` of step `a` (a nats task) has no `subject`, which `operation: request` needs"
                .into()
        )
    );
    clean(&task(
        "        kind: nats\n        operation: publish\n        subject: \"orders.{{ workload.id }}\"\n",
    ));
    clean(&task(
        "        kind: nats\n        operation: \"{{ workload.op }}\"\n",
    ));
}

#[test]
fn python_libs_are_python_names() {
    assert_eq!(
        one(&task(
            "        kind: python\n        libs: { np: numpy, my-lib: mylib }\n        code: \"result = 1\"\n"
        )),
        (
            "E004",
            10,
            28,
            "`libs.my-lib` of task `t` of step `a` (a python task) is not a Python name: the task fails with `python.libs` before its code runs".into()
        )
    );
    let d = one(&task(
        "        kind: python\n        libs: { dt: { from: datetime } }\n        code: \"result = 1\"\n",
    ));
    assert_eq!((d.0, d.1), ("E004", 10), "{d:?}");
    assert!(
        d.3.contains("needs `from` (a module) and `import`"),
        "{}",
        d.3
    );
    clean(&task(
        "        kind: python\n        libs: { os.path: os.path, dt: { from: datetime, import: datetime }, x: \"{{ workload.m }}\" }\n        code: \"result = 1\"\n",
    ));
}

#[test]
fn a_workbook_task_may_get_its_fields_from_the_call_site() {
    let src = format!(
        "{HEAD}workbook:\n  tasks:\n    q: {{ kind: postgres, command: SELECT 1 }}\n    run: {{ kind: shell }}\n    w: {{ kind: wait, signal: \"a b\" }}\nworkflow:\n  - step: a\n    tool:\n      - {{ name: t, kind: workbook, task: q, connection: \"postgresql://u@h/db\" }}\n"
    );
    let d = diags(&src);
    // Only the literal signal: missing fields may come from a call site.
    let found: Vec<(&str, usize, &str)> = d.iter().map(|d| (d.0, d.1, d.3.as_str())).collect();
    assert_eq!(
        found,
        [(
            "E004",
            9,
            "`signal` \"a b\" of workbook task `w` (a wait task) is not a signal name: 1-128 characters of [A-Za-z0-9_-]"
        )],
        "{d:#?}"
    );
}
