//! The tool fields of NoETL's `http`, `postgres`, `duckdb` and `python`
//! tasks that have a canonical equivalent (docs/migrate.md, "Tool
//! fields"): renames in pass 1 (one key each, no line added), moves under
//! `spec` and removals in pass 3. Fields a tool implements itself
//! (`verify_ssl`, python `libs`) are canonical and left alone.

use crate::edits::{
    entry_end, indent_at, line_start, next_line, remove_entry, rename, replace_entry, value_text,
    Edits,
};
use crate::snippets::reindent;
use crate::walk::tasks;
use noetl_core::yaml::{Key, Node, NodeKind};

/// NoETL's other names of a SQL task's `command` (its tools read the first
/// of them present).
const SQL_ALIASES: &[&str] = &["query", "queries", "commands", "cmd", "cmds"];

/// The kind of a task as written: `kind`, or the legacy `type` / `tool`
/// that pass 1 renames.
fn kind_of(t: &Node) -> Option<&str> {
    ["kind", "type", "tool"]
        .iter()
        .find_map(|k| t.get(k).and_then(Node::as_str))
}

/// The method of an http task when it is written out (default GET).
fn method_of(t: &Node) -> Option<String> {
    match t.get("method") {
        None => Some("GET".into()),
        Some(m) => m
            .as_str()
            .filter(|s| !s.contains("{{") && !s.contains("{%"))
            .map(|s| s.trim().to_ascii_uppercase()),
    }
}

/// Whether the task's static `Content-Type` header asks for a form.
fn form_header(t: &Node) -> bool {
    t.get("headers").is_some_and(|h| {
        h.entries().iter().any(|(k, v)| {
            k.name.eq_ignore_ascii_case("content-type")
                && v.as_str()
                    .is_some_and(|s| s.contains("application/x-www-form-urlencoded"))
        })
    })
}

/// Pass 2: NoETL's names of canonical tool fields → the canonical names.
pub(super) fn renames(root: &Node, e: &mut Edits) {
    for (t, name) in tasks(root) {
        match kind_of(t) {
            Some("postgres" | "duckdb") => sql_renames(t, &name, e),
            Some("http") => http_renames(t, &name, e),
            _ => {}
        }
    }
}

/// `query` (or `queries`, `commands`, `cmd`, `cmds`) → `command`; postgres
/// `credential` → `auth`.
fn sql_renames(t: &Node, name: &str, e: &mut Edits) {
    let present: Vec<&Key> = SQL_ALIASES
        .iter()
        .filter_map(|a| t.entry(a).map(|(k, _)| k))
        .collect();
    match (t.get("command"), present.as_slice()) {
        (_, []) => {}
        (None, [k]) => rename(
            e,
            k,
            "command",
            format!("task `{name}`: `{}` → `command`", k.name),
        ),
        (_, keys) => {
            let mut names: Vec<String> = keys.iter().map(|k| format!("`{}`", k.name)).collect();
            if t.get("command").is_some() {
                names.push("`command`".into());
            }
            e.refuse(
                keys[0].span.line,
                format!(
                    "task `{name}`: {} together: keep the SQL in one `command`",
                    names.join(", ")
                ),
            );
        }
    }
    if kind_of(t) == Some("postgres") {
        if let Some((k, _)) = t.entry("credential") {
            if t.get("auth").is_none() {
                rename(
                    e,
                    k,
                    "auth",
                    format!("task `{name}`: `credential` → `auth`"),
                );
            } else {
                e.refuse(
                    k.span.line,
                    format!("task `{name}`: `credential` beside `auth`: keep one `auth`"),
                );
            }
        }
    }
    if kind_of(t) == Some("duckdb") {
        if let Some((k, v)) = t.entry("auth") {
            if v.is_map() {
                e.refuse(k.span.line, format!("task `{name}`: duckdb `auth` (databases and cloud secrets to attach): `ATTACH` them in `command`; cloud storage is not available"));
            }
        }
    }
}

/// `endpoint` → `url`, `verify` → `verify_ssl`, and the body fields by
/// NoETL's rules: `data` is the query string of a GET or DELETE and the
/// body of any other method; `payload` and a mapping `body` are a JSON
/// body (a form when the `Content-Type` header says so).
fn http_renames(t: &Node, name: &str, e: &mut Edits) {
    for (old, new) in [("endpoint", "url"), ("verify", "verify_ssl")] {
        if let Some((k, _)) = t.entry(old) {
            if t.get(new).is_none() {
                rename(e, k, new, format!("task `{name}`: `{old}` → `{new}`"));
            } else {
                e.refuse(
                    k.span.line,
                    format!("task `{name}`: `{old}` beside `{new}`: keep one `{new}`"),
                );
            }
        }
    }
    let method = method_of(t);
    let body_key = if form_header(t) { "form" } else { "json" };
    let structured_body = t.get("body").is_some_and(|b| b.is_map() || b.is_seq());
    let legacy: Vec<&Key> = ["data", "payload", "body"]
        .iter()
        .filter_map(|f| t.entry(f))
        .filter(|(k, _)| k.name != "body" || structured_body)
        .map(|(k, _)| k)
        .collect();
    let Some(k) = legacy.first() else {
        return;
    };
    let line = k.span.line;
    if legacy.len() > 1 {
        let names: Vec<String> = legacy.iter().map(|k| format!("`{}`", k.name)).collect();
        e.refuse(
            line,
            format!(
                "task `{name}`: {} together: NoETL sends only the first; keep that one",
                names.join(" and ")
            ),
        );
        return;
    }
    let value = t.get(&k.name).expect("the entry exists");
    let Some(method) = method else {
        e.refuse(line, format!("task `{name}`: `{}` with a templated `method`: write it as `params` (GET, DELETE) or `json` (other methods)", k.name));
        return;
    };
    if k.name == "data" && (value.get("query").is_some() || value.get("body").is_some()) {
        e.refuse(
            line,
            format!("task `{name}`: `data` with `query`/`body`: write `query` as `params` and `body` as `json`"),
        );
        return;
    }
    if k.name == "data" && !value.is_map() {
        e.refuse(line, format!("task `{name}`: `data` that is not a mapping: write it as `params` (GET, DELETE) or `json`"));
        return;
    }
    let target = match (k.name.as_str(), method.as_str()) {
        ("data", "GET" | "DELETE") => "params",
        (_, "GET" | "DELETE") => {
            e.refuse(line, format!("task `{name}`: `{}` on a {method}: NoETL sends no body with it; drop it or move its values to `params`", k.name));
            return;
        }
        _ => body_key,
    };
    let taken: Vec<&str> = if target == "params" {
        vec!["params"]
    } else {
        vec!["json", "form", "body"]
    };
    let taken: Vec<&str> = taken
        .into_iter()
        .filter(|f| *f != k.name && t.get(f).is_some())
        .collect();
    if let Some(other) = taken.first() {
        e.refuse(
            line,
            format!(
                "task `{name}`: `{}` beside `{other}`: merge them into one `{target}`",
                k.name
            ),
        );
        return;
    }
    let why = match (k.name.as_str(), target) {
        ("data", "params") => format!("(the query string of a {method})"),
        (_, "form") => "(a form: the `Content-Type` header says so)".into(),
        _ => "(a JSON body)".into(),
    };
    rename(
        e,
        k,
        target,
        format!("task `{name}`: `{}` → `{target}` {why}", k.name),
    );
}

/// Pass 4: an http task's `timeout` / `timeout_seconds` → `spec.timeout`;
/// `output_select` and postgres `pool` removed (what they tuned is
/// automatic here).
pub(super) fn structure(root: &Node, e: &mut Edits) {
    for (t, name) in tasks(root) {
        let kind = kind_of(t);
        if kind == Some("http") {
            http_timeout(t, &name, e);
        }
        for (field, why) in [
            ("output_select", "a result over `max_payload_bytes` travels by reference and templates read into it (docs/tools.md)"),
            ("pool", "connections are pooled per credential (docs/tools.md)"),
        ] {
            if field == "pool" && kind != Some("postgres") {
                continue;
            }
            if let Some((k, _)) = t.entry(field) {
                replace_entry(
                    e,
                    k.span.offset,
                    String::new(),
                    k.span.line,
                    format!("task `{name}`: `{field}` removed: {why}"),
                );
            }
        }
    }
}

/// `timeout: 30` (or `timeout_seconds`) on an http task → `spec: {timeout: 30}`.
fn http_timeout(t: &Node, name: &str, e: &mut Edits) {
    let found: Vec<(&Key, &Node)> = ["timeout", "timeout_seconds"]
        .iter()
        .filter_map(|f| t.entry(f))
        .collect();
    let Some(&(k, v)) = found.first() else {
        return;
    };
    let line = k.span.line;
    let summary = format!("task `{name}`: `{}` → `spec.timeout`", k.name);
    let text = e.text;
    let scalar = matches!(
        v.kind,
        NodeKind::Int(_) | NodeKind::Float(_) | NodeKind::Str(_)
    );
    if found.len() > 1 || !scalar || v.span.offset >= next_line(text, k.span.offset) {
        e.refuse(
            line,
            format!("{summary}: write one number of seconds under `spec.timeout` by hand"),
        );
        return;
    }
    let value = value_text(text, k.span.offset, v);
    let pad = " ".repeat(k.span.offset - line_start(text, k.span.offset));
    match t.entry("spec") {
        None if t.get("set").is_some() => e.refuse(
            line,
            format!("{summary}: the task's `set` becomes its `spec` in this run; move `timeout` under it by hand"),
        ),
        None => replace_entry(
            e,
            k.span.offset,
            format!("{pad}spec:\n{pad}  timeout: {value}\n"),
            line,
            summary,
        ),
        Some((_, spec)) if spec.get("timeout").is_some() => e.refuse(
            line,
            format!("{summary}: the task has a `spec.timeout` already; keep one"),
        ),
        Some((sk, spec)) => {
            let Some(child) = block_child_indent(text, sk, spec) else {
                e.refuse(
                    line,
                    format!("{summary}: `spec` is in flow style; add `timeout` to it by hand"),
                );
                return;
            };
            let at = next_line(text, sk.span.offset);
            e.replace(
                (at, at),
                format!("{}timeout: {value}\n", " ".repeat(child)),
                line,
                summary,
            );
            remove_entry(e, k.span.offset);
        }
    }
}

/// The column of the entries of the block mapping `v` (the value of key
/// `k`); `None` when it is not a block mapping with entries.
fn block_child_indent(text: &str, k: &Key, v: &Node) -> Option<usize> {
    let (first, _) = v.entries().first()?;
    (first.span.offset >= next_line(text, k.span.offset))
        .then(|| first.span.offset - line_start(text, first.span.offset))
}

/// A task-level `set` beside a `spec`: its values join the task's policy
/// as `set_ctx` (or `set`, for `ctx.`/`iter.` paths) of the fallback rule
/// (`else`), which runs when no other rule matched; a policy without a
/// fallback rule gets one (`do: continue`), after the error case
/// ([`ERROR_FAILS`]) unless its rules test `outcome.status` already, so
/// that the values are set when the task ended well and an error still
/// fails it, as before. Called by `task_set` for tasks with a `spec`.
pub(super) fn set_beside_spec(t: &Node, whose: &str, (k, v): (&Key, &Node), e: &mut Edits) {
    let line = k.span.line;
    let text = e.text;
    let dotted = v
        .entries()
        .iter()
        .any(|(k, _)| k.name.starts_with("ctx.") || k.name.starts_with("iter."));
    let field = if dotted { "set" } else { "set_ctx" };
    let summary = format!("{whose} → `{field}` of its `spec.policy` fallback rule");
    let by_hand = |e: &mut Edits, why: &str| {
        e.refuse(
            line,
            format!("{whose} next to a `spec` {why}: add `set_ctx` to a rule of its `spec.policy` by hand"),
        );
    };
    let Some((sk, spec)) = t.entry("spec") else {
        return;
    };
    let Some(spec_indent) = block_child_indent(text, sk, spec) else {
        return by_hand(e, "in flow style");
    };
    // (where to insert, column of the `set_ctx` key, text before it)
    let (at, col, head) = match spec.entry("policy") {
        None => {
            let p = " ".repeat(spec_indent);
            (
                entry_end(text, sk.span.offset),
                spec_indent + 10,
                format!("{p}policy:\n{p}  rules:\n{p}    {ERROR_FAILS}\n{p}      then: {{ do: fail }}\n{p}    - else:\n{p}        then:\n{p}          do: continue\n"),
            )
        }
        Some((pk, policy)) => {
            let Some(policy_indent) = block_child_indent(text, pk, policy) else {
                return by_hand(e, "whose `policy` is in flow style");
            };
            match policy.entry("rules") {
                None => {
                    let p = " ".repeat(policy_indent);
                    (
                        entry_end(text, pk.span.offset),
                        policy_indent + 8,
                        format!(
                            "{p}rules:\n{p}  {ERROR_FAILS}\n{p}    then: {{ do: fail }}\n{p}  - else:\n{p}      then:\n{p}        do: continue\n"
                        ),
                    )
                }
                Some((rk, rules)) => match fallback_place(text, rk, rules) {
                    Ok(Insert::Block(at, col, head)) => (at, col, head),
                    Ok(Insert::Flow(at)) => {
                        // `then: { do: continue }`: the values join it as
                        // a flow mapping (JSON is YAML).
                        let values = v.to_json().to_string();
                        e.replace((at, at), format!(", {field}: {values}"), line, summary);
                        remove_entry(e, k.span.offset);
                        return;
                    }
                    Err(why) => return by_hand(e, why),
                },
            }
        }
    };
    let value = value_text(text, k.span.offset, v);
    let value = if value.contains('\n') {
        let from = indent_at(text, next_line(text, k.span.offset));
        format!("\n{}", reindent(value, from, col + 2))
    } else {
        format!(" {value}\n")
    };
    e.replace(
        (at, at),
        format!("{head}{}{field}:{value}", " ".repeat(col)),
        line,
        summary,
    );
    remove_entry(e, k.span.offset);
}

/// The first line of the rule a generated fallback rule follows: an error
/// fails the task, as it did without a policy (`then: { do: fail }` on the
/// next line). The fallback (`else`) rule matches every outcome, errors
/// included, so without it the task's `set` would swallow its errors.
pub(super) const ERROR_FAILS: &str = "- when: \"{{ outcome.status == 'error' }}\"";

/// Where a task `set`'s values go.
enum Insert {
    /// At this offset, as a `set_ctx:` key at this column, after this text.
    Block(usize, usize, String),
    /// Into the flow mapping whose last entry ends at this offset.
    Flow(usize),
}

/// Where the values of a task `set` go in the block list `rules`: inside
/// the last rule when it is the fallback (`else`), else in a new fallback
/// rule after it.
fn fallback_place(text: &str, rk: &Key, rules: &Node) -> Result<Insert, &'static str> {
    let Some(last) = rules.items().last() else {
        return Err("with an empty `rules`");
    };
    if last.span.offset < next_line(text, rk.span.offset) {
        return Err("whose `rules` are in flow style");
    }
    let dash = indent_at(text, line_start(text, last.span.offset));
    let Some((ek, ev)) = last.entry("else") else {
        let p = " ".repeat(dash);
        // Rules that do not tell errors apart get the error case first:
        // the new fallback rule is for a task that ended well.
        let reads_status = rules.items().iter().any(|r| {
            r.get("when")
                .and_then(Node::as_str)
                .is_some_and(noetl_core::outcome::reads_status)
        });
        let errors = match reads_status {
            true => String::new(),
            false => format!("{p}{ERROR_FAILS}\n{p}  then: {{ do: fail }}\n"),
        };
        return Ok(Insert::Block(
            entry_end(text, rk.span.offset),
            dash + 6,
            format!("{errors}{p}- else:\n{p}    then:\n{p}      do: continue\n"),
        ));
    };
    let Some(else_indent) = block_child_indent(text, ek, ev) else {
        return Err("whose fallback rule is in flow style");
    };
    match ev.entry("then") {
        // `- else: {do: continue}` without `then`: `else_without_then`
        // indents the action under a new `then:` in this pass; the value
        // goes where that puts the action's keys.
        None if last.get("then").is_none() => {
            if ev.get("set_ctx").is_some() || ev.get("set").is_some() {
                return Err("whose fallback rule sets values already");
            }
            Ok(Insert::Block(
                entry_end(text, ek.span.offset),
                else_indent + 2,
                String::new(),
            ))
        }
        None => Err("whose fallback rule is not `else: {then: ...}`"),
        Some((tk, then)) => {
            if then.get("set_ctx").is_some() || then.get("set").is_some() {
                return Err("whose fallback rule sets values already");
            }
            if let Some(then_indent) = block_child_indent(text, tk, then) {
                return Ok(Insert::Block(
                    entry_end(text, tk.span.offset),
                    then_indent,
                    String::new(),
                ));
            }
            // A flow `then: { do: continue }` on the key's line.
            let close = (then.is_map() && then.span.offset < next_line(text, tk.span.offset))
                .then(|| crate::edits::flow_end(text, then.span.offset))
                .flatten()
                .filter(|end| text[..*end].ends_with('}'));
            match close {
                Some(end) if !then.entries().is_empty() => {
                    Ok(Insert::Flow(text[..end - 1].trim_end().len()))
                }
                _ => Err("whose fallback rule's `then` is not a mapping"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::migrate;

    const HEAD: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\nworkflow:\n  - step: start\n    tool:\n";

    /// The task lines (at 6 spaces) migrated: the task's text and the report.
    fn run(task: &str) -> (String, Vec<String>) {
        let m = migrate(&format!("{HEAD}{task}")).expect("YAML");
        let text = m.text.strip_prefix(HEAD).expect("head kept").to_string();
        let report = m
            .report()
            .into_iter()
            .map(|(l, s)| format!("{l}: {s}"))
            .collect();
        (text, report)
    }

    #[test]
    fn sql_aliases_become_command_and_credential_auth() {
        let m = migrate(&format!("{HEAD}      - name: q\n        kind: postgres\n        credential: pg\n        query: select 1\n")).unwrap();
        // The credential is declared too (migrate/keychain.rs).
        let head = HEAD.replace(
            "workflow:",
            "keychain:\n  - name: pg\n    kind: postgres_credential\nworkflow:",
        );
        assert_eq!(m.text, format!("{head}      - name: q\n        kind: postgres\n        auth: pg\n        command: select 1\n"));
        let r: Vec<String> = m
            .report()
            .into_iter()
            .map(|(l, s)| format!("{l}: {s}"))
            .collect();
        assert_eq!(
            r,
            [
                "10: task `q`: `credential` → `auth`",
                "10: task `q`: `auth: pg` → declared in `keychain` (kind postgres_credential)",
                "11: task `q`: `query` → `command`"
            ]
        );
        let (t, r) = run("      - name: q\n        kind: duckdb\n        query: select 1\n        command: select 2\n");
        assert!(t.contains("query: select 1"), "{t}");
        assert!(
            r[0].contains("refused: task `q`: `query`, `command` together"),
            "{r:?}"
        );
    }

    #[test]
    fn http_bodies_follow_the_method() {
        let get = "      - name: h\n        kind: http\n        endpoint: http://x\n        data: {q: 1}\n";
        let (t, r) = run(get);
        assert_eq!(
            t,
            "      - name: h\n        kind: http\n        url: http://x\n        params: {q: 1}\n"
        );
        assert_eq!(
            r[1],
            "11: task `h`: `data` → `params` (the query string of a GET)"
        );
        let (t, _) = run("      - name: h\n        kind: http\n        url: http://x\n        method: post\n        data: {q: 1}\n");
        assert!(t.ends_with("        json: {q: 1}\n"), "{t}");
        let (t, _) = run("      - name: h\n        kind: http\n        url: http://x\n        method: POST\n        headers: {Content-Type: application/x-www-form-urlencoded}\n        payload: {q: 1}\n");
        assert!(t.ends_with("        form: {q: 1}\n"), "{t}");
        let (t, _) = run("      - name: h\n        kind: http\n        url: http://x\n        method: PUT\n        body: {q: 1}\n");
        assert!(t.ends_with("        json: {q: 1}\n"), "{t}");
        // A text body is canonical; NoETL sends no body with a GET.
        let (t, r) = run("      - name: h\n        kind: http\n        url: http://x\n        method: POST\n        body: \"a=1\"\n");
        assert!(t.ends_with("body: \"a=1\"\n") && r.is_empty(), "{t} {r:?}");
        let (_, r) = run(
            "      - name: h\n        kind: http\n        url: http://x\n        payload: {q: 1}\n",
        );
        assert!(
            r[0].contains("refused: task `h`: `payload` on a GET"),
            "{r:?}"
        );
        let (_, r) = run("      - name: h\n        kind: http\n        url: http://x\n        method: \"{{ workload.m }}\"\n        data: {q: 1}\n");
        assert!(r[0].contains("templated `method`"), "{r:?}");
        let (_, r) = run("      - name: h\n        kind: http\n        url: http://x\n        method: POST\n        data: {q: 1}\n        json: {r: 2}\n");
        assert!(r[0].contains("`data` beside `json`"), "{r:?}");
    }

    #[test]
    fn timeouts_move_under_spec() {
        let (t, r) = run("      - name: h\n        kind: http\n        url: http://x\n        timeout_seconds: 7\n");
        assert_eq!(t, "      - name: h\n        kind: http\n        url: http://x\n        spec:\n          timeout: 7\n");
        assert_eq!(r, ["11: task `h`: `timeout_seconds` → `spec.timeout`"]);
        let (t, _) = run("      - name: h\n        kind: http\n        url: http://x\n        timeout: 7\n        spec:\n          policy: {}\n");
        assert_eq!(t, "      - name: h\n        kind: http\n        url: http://x\n        spec:\n          timeout: 7\n          policy: {}\n");
        let (_, r) = run("      - name: h\n        kind: http\n        url: http://x\n        timeout: 7\n        spec: {timeout: 3}\n");
        assert!(
            r[0].contains("refused") && r[0].contains("keep one"),
            "{r:?}"
        );
    }

    #[test]
    fn a_set_beside_a_spec_joins_the_fallback_rule() {
        let into_else = "      - name: h\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - when: \"{{ outcome.status == 'error' }}\"\n                then:\n                  do: fail\n              - else:\n                  then:\n                    do: continue\n        set:\n          got: \"{{ outcome.result }}\"\n";
        let (t, r) = run(into_else);
        assert_eq!(t, "      - name: h\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - when: \"{{ outcome.status == 'error' }}\"\n                then:\n                  do: fail\n              - else:\n                  then:\n                    do: continue\n                    set_ctx:\n                      got: \"{{ outcome.result }}\"\n");
        assert_eq!(
            r,
            ["19: task `h`: `set` → `set_ctx` of its `spec.policy` fallback rule"]
        );
        // No fallback rule: one is added; ctx paths keep `set`.
        let (t, _) = run("      - name: h\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - when: \"{{ outcome.status == 'error' }}\"\n                then: { do: fail }\n        set:\n          ctx.got: 1\n");
        assert!(t.ends_with("                then: { do: fail }\n              - else:\n                  then:\n                    do: continue\n                    set:\n                      ctx.got: 1\n"), "{t}");
        // A spec without a policy.
        let (t, _) = run("      - name: h\n        kind: noop\n        spec:\n          timeout: 3\n        set: { got: 1 }\n");
        // A new policy: the error case first, then the fallback rule.
        assert_eq!(t, "      - name: h\n        kind: noop\n        spec:\n          timeout: 3\n          policy:\n            rules:\n              - when: \"{{ outcome.status == 'error' }}\"\n                then: { do: fail }\n              - else:\n                  then:\n                    do: continue\n                    set_ctx: { got: 1 }\n");
        // Rules that do not test the status: the error case before the new
        // fallback rule.
        let (t, _) = run("      - name: h\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - when: \"{{ outcome.result == 1 }}\"\n                then: { do: break }\n        set: { got: 1 }\n");
        assert!(t.ends_with("                then: { do: break }\n              - when: \"{{ outcome.status == 'error' }}\"\n                then: { do: fail }\n              - else:\n                  then:\n                    do: continue\n                    set_ctx: { got: 1 }\n"), "{t}");
        // A flow `then`: the values join it as a flow mapping.
        let (t, _) = run("      - name: h\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - else:\n                  then: { do: continue }\n        set:\n          got: \"{{ outcome.result }}\"\n");
        assert!(t.ends_with("                  then: { do: continue, set_ctx: {\"got\":\"{{ outcome.result }}\"} }\n"), "{t}");
        // A fallback rule that already sets values: by hand.
        let (_, r) = run("      - name: h\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - else:\n                  then:\n                    set_ctx: { a: 1 }\n        set: { got: 1 }\n");
        assert!(
            r[0].contains("refused") && r[0].contains("sets values already"),
            "{r:?}"
        );
    }

    #[test]
    fn a_libs_list_that_cannot_become_imports_is_removed() {
        let (t, r) = run("      - name: p\n        kind: python\n        libs:\n          - psycopg2-binary\n        code: \"import json\\nresult = 1\"\n");
        assert_eq!(
            t,
            "      - name: p\n        kind: python\n        code: \"import json\\nresult = 1\"\n"
        );
        assert!(r[0].contains("`libs` list removed"), "{r:?}");
    }

    #[test]
    fn output_select_and_pool_are_removed() {
        let (t, r) = run("      - name: q\n        kind: postgres\n        command: select 1\n        pool:\n          max: 2\n        output_select: [rows]\n");
        assert_eq!(
            t,
            "      - name: q\n        kind: postgres\n        command: select 1\n"
        );
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].starts_with("11: task `q`: `pool` removed"), "{r:?}");
    }
}
