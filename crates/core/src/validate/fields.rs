//! The rules each tool applies to its fields when a task runs, checked on
//! the playbook as written, as errors: a task that breaks one fails with
//! the tool's `<kind>.config` error every time it runs. Only literal values
//! are judged: a value holding a template (`{{ ... }}`, `{% ... %}`) is
//! left to run time, and a string that is a template counts as "maybe
//! absent" where a rule forbids two fields together (it may render to
//! null). A workbook task's body may get any field from the call site
//! (docs/tools.md, "workbook"), so a field it lacks, or two it has, are not
//! reported there; its literal values are.
//!
//! Each rule is the executor's, reproduced exactly, and cites its source;
//! the SQL `command` rule and the transfer sides are shared with the tools
//! (`crate::sql`, `crate::transfer`). Field types are `tool_fields`'
//! (E004): a value of the wrong type is not looked at again here.

use super::{allowed_list, closest, Validator};
use crate::codes::Code;
use crate::field_rules::{python_import, LibsEntryError};
use crate::yaml::{escape, Node, NodeKind, Span};

mod data;

/// Whether a string holds a template.
fn is_template(s: &str) -> bool {
    crate::template::is_template(s)
}

/// Whether any string inside `n` holds a template.
fn has_template(n: &Node) -> bool {
    match &n.kind {
        NodeKind::Str(s) => is_template(s),
        NodeKind::Seq(items) => items.iter().any(has_template),
        NodeKind::Map(entries) => entries
            .iter()
            .any(|(k, v)| is_template(&k.name) || has_template(v)),
        _ => false,
    }
}

/// `key` of `t` when it has a value (not absent, not null).
fn given<'a>(t: &'a Node, key: &str) -> Option<&'a Node> {
    t.get(key).filter(|n| !n.is_null())
}

/// `key` of `t` when it has a value that cannot render to null: anything
/// but null and a string holding a template.
fn surely_given<'a>(t: &'a Node, key: &str) -> Option<&'a Node> {
    given(t, key).filter(|n| !n.as_str().is_some_and(is_template))
}

/// `key` of `t` as a literal string (no template).
fn literal<'a>(t: &'a Node, key: &str) -> Option<(&'a Node, &'a str)> {
    t.get(key)
        .and_then(|n| n.as_str().map(|s| (n, s)))
        .filter(|(_, s)| !is_template(s))
}

/// The help line's "did you mean" over `names`.
fn did_you_mean(raw: &str, names: &[&str]) -> String {
    match closest(raw, names) {
        Some(c) => format!("did you mean `{c}`? allowed: {}", allowed_list(names)),
        None => format!("allowed: {}", allowed_list(names)),
    }
}

/// What a field check needs of its task.
struct Task<'a> {
    t: &'a Node,
    tp: &'a str,
    whose: &'a str,
    /// A root `workbook` body: fields may come from the call site.
    workbook: bool,
}

impl Task<'_> {
    fn path(&self, key: &str) -> String {
        format!("{}/{}", self.tp, escape(key))
    }
}

impl Validator {
    /// The field rules of a task of the built-in kind `kind` (docs/tools.md);
    /// `workbook` for a body of the root `workbook`.
    pub(super) fn field_rules(
        &mut self,
        t: &Node,
        tp: &str,
        whose: &str,
        kind: &str,
        workbook: bool,
    ) {
        let task = Task {
            t,
            tp,
            whose,
            workbook,
        };
        match kind {
            "postgres" => self.postgres_fields(&task),
            "duckdb" => self.sql_command(&task, "duckdb"),
            "shell" => self.shell_fields(&task),
            "http" => self.http_fields(&task),
            "wait" => self.wait_fields(&task),
            "playbook" => self.playbook_fields(&task),
            "transfer" => self.transfer_fields(&task),
            "artifact" => self.artifact_fields(&task),
            "nats" => self.nats_fields(&task),
            "python" => self.python_fields(&task),
            _ => {}
        }
    }

    /// `postgres`: `auth` or `connection` (services/executors/postgres/src/
    /// config.rs, `target`: `ConfigError::NoTarget`), and a `command` with
    /// a statement.
    fn postgres_fields(&mut self, task: &Task) {
        let t = task.t;
        if !task.workbook && given(t, "auth").is_none() && given(t, "connection").is_none() {
            self.err(
                Code::E003,
                t.span,
                task.tp,
                format!(
                    "{} (a postgres task) has neither `auth` nor `connection`: the postgres tool has no database to connect to",
                    task.whose
                ),
                "name a keychain entry of kind postgres_credential, `auth: pg` (declared in `keychain`), or write `connection: postgresql://user@host:5432/db`",
            );
        }
        self.sql_command(task, "postgres");
    }

    /// `postgres` / `duckdb`: a literal `command` with no SQL statement
    /// (`crate::sql::command_statements`, `CommandError::NoCommand`, which
    /// both tools call).
    fn sql_command(&mut self, task: &Task, kind: &str) {
        let Some(command) = task.t.get("command") else {
            return;
        };
        let literal = match &command.kind {
            NodeKind::Str(s) => !is_template(s),
            NodeKind::Seq(items) => items
                .iter()
                .all(|i| i.as_str().is_some_and(|s| !is_template(s))),
            _ => false,
        };
        if !literal {
            return;
        }
        let mut config = serde_json::Map::new();
        config.insert("command".into(), command.to_json());
        if let Err(e) = crate::sql::command_statements(&config) {
            self.err(
                Code::E004,
                command.span,
                &task.path("command"),
                format!(
                    "`command` of {} (a {kind} task) holds no SQL statement: {e}",
                    task.whose
                ),
                "write the SQL to run, e.g. `command: SELECT 1`, or a list of statements",
            );
        }
    }

    /// `shell`: exactly one of `command` and `cmds`, not empty; `env`
    /// names a variable can have (services/executors/shell/src/config.rs,
    /// `ShellTask::from_config`, `env_of`).
    fn shell_fields(&mut self, task: &Task) {
        let t = task.t;
        let help = "write `command: <script>` (run by /bin/sh -c) or `command: [program, arg...]`, or NoETL's `cmds: [<script>, ...]`";
        match (given(t, "command"), given(t, "cmds")) {
            (None, None) if !task.workbook => self.err(
                Code::E003,
                t.span,
                task.tp,
                format!(
                    "{} (a shell task) has neither `command` nor `cmds`: the shell tool runs exactly one of them",
                    task.whose
                ),
                help,
            ),
            (Some(_), Some(_)) => {
                if let (false, Some(_), Some(cmds)) = (
                    task.workbook,
                    surely_given(t, "command"),
                    surely_given(t, "cmds"),
                ) {
                    self.err(
                        Code::E004,
                        cmds.span,
                        &task.path("cmds"),
                        format!(
                            "{} (a shell task) has both `command` and `cmds`: the shell tool runs exactly one of them",
                            task.whose
                        ),
                        "keep one: `command` for one script or program, `cmds` for scripts run one after another",
                    );
                }
            }
            (Some(v), None) | (None, Some(v)) => {
                let field = if given(t, "command").is_some() {
                    "command"
                } else {
                    "cmds"
                };
                let empty = match &v.kind {
                    NodeKind::Str(s) => s.trim().is_empty(),
                    NodeKind::Seq(items) => items.is_empty(),
                    _ => false,
                };
                if empty {
                    self.err(
                        Code::E004,
                        v.span,
                        &task.path(field),
                        format!(
                            "`{field}` of {} (a shell task) is empty: the shell tool needs a script or a non-empty list",
                            task.whose
                        ),
                        help,
                    );
                }
            }
            _ => {}
        }
        if let Some(env) = t.get("env").filter(|e| e.is_map()) {
            for (k, _) in env.entries() {
                let name = &k.name;
                if is_template(name) {
                    continue;
                }
                if name.is_empty() || name.contains('=') || name.contains('\0') {
                    self.err(
                        Code::E004,
                        k.span,
                        &format!("{}/env/{}", task.tp, escape(name)),
                        format!(
                            "`env` of {} (a shell task) sets {name:?}, which is not a variable name: a name is not empty and holds no `=`",
                            task.whose
                        ),
                        "name the variable, e.g. `env: { API_URL: https://api.example.com }`",
                    );
                }
            }
        }
    }

    /// `http`: at most one of `json`, `body` and `form`
    /// (services/executors/http/src/request.rs, `body`:
    /// `ConfigError::SeveralBodies`).
    fn http_fields(&mut self, task: &Task) {
        if task.workbook {
            return;
        }
        let present: Vec<(&str, &Node)> = ["json", "body", "form"]
            .into_iter()
            .filter_map(|k| surely_given(task.t, k).map(|n| (k, n)))
            .collect();
        if let [(_, _), (second, node), ..] = present.as_slice() {
            let names: Vec<String> = present.iter().map(|(k, _)| format!("`{k}`")).collect();
            self.err(
                Code::E004,
                node.span,
                &task.path(second),
                format!(
                    "{} (an http task) has more than one body ({}): the http tool sends one of `json`, `body` and `form`",
                    task.whose,
                    names.join(", ")
                ),
                "keep one: `json` (a JSON body), `body` (text sent as is) or `form` (URL-encoded)",
            );
        }
    }

    /// `wait`: a signal name of 1-128 characters of [A-Za-z0-9_-] and a
    /// positive `timeout_s` (services/executor/src/wait.rs, `config`, with
    /// `noetl_mesh::signal::valid_signal`).
    fn wait_fields(&mut self, task: &Task) {
        if let Some((node, raw)) = literal(task.t, "signal") {
            let valid = !raw.is_empty()
                && raw.len() <= 128
                && raw
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid {
                self.err(
                    Code::E004,
                    node.span,
                    &task.path("signal"),
                    format!(
                        "`signal` {raw:?} of {} (a wait task) is not a signal name: 1-128 characters of [A-Za-z0-9_-]",
                        task.whose
                    ),
                    "e.g. `signal: approval` (sent by `noetl exec signal ID approval --data JSON`)",
                );
            }
        }
        if let Some(v) = given(task.t, "timeout_s") {
            let seconds = match &v.kind {
                NodeKind::Int(n) => Some(*n as f64),
                NodeKind::Float(f) => Some(*f),
                NodeKind::Str(s) if is_template(s) => return,
                NodeKind::Str(s) => Some(s.trim().parse::<f64>().unwrap_or(f64::NAN)),
                _ => None, // the type check's
            };
            if seconds.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
                self.err(
                    Code::E004,
                    v.span,
                    &task.path("timeout_s"),
                    format!(
                        "`timeout_s` of {} (a wait task) must be a number of seconds above 0, found {}",
                        task.whose,
                        super::flow(v)
                    ),
                    "write seconds, e.g. `timeout_s: 3600`, or leave it out to wait without a deadline",
                );
            }
        }
    }

    /// `playbook`: exactly one of `path`, `playbook` and `file`, and no
    /// field but the inline `playbook` reading `keychain`
    /// (services/executor/src/child.rs, `request`: `ChildError::Source`,
    /// `ChildError::Keychain`).
    fn playbook_fields(&mut self, task: &Task) {
        let t = task.t;
        const SOURCES: [&str; 3] = ["path", "playbook", "file"];
        // The executor takes a source when it is a non-empty string.
        let maybe: Vec<&str> = SOURCES
            .into_iter()
            .filter(|k| {
                t.get(k)
                    .and_then(Node::as_str)
                    .is_some_and(|s| !s.is_empty())
            })
            .collect();
        let sure: Vec<(&str, &Node)> = SOURCES
            .into_iter()
            .filter_map(|k| literal(t, k).map(|(n, s)| (k, n, s)))
            .filter(|(_, _, s)| !s.is_empty())
            .map(|(k, n, _)| (k, n))
            .collect();
        if !task.workbook && maybe.is_empty() {
            self.err(
                Code::E003,
                t.span,
                task.tp,
                format!(
                    "{} (a playbook task) names no child playbook: it needs one of `path`, `playbook` and `file`",
                    task.whose
                ),
                "add `path: <catalog path>` (a registered playbook), `playbook: <inline YAML>` or `file: <playbook file>`",
            );
        }
        if let (false, [_, (second, node), ..]) = (task.workbook, sure.as_slice()) {
            let names: Vec<String> = sure.iter().map(|(k, _)| format!("`{k}`")).collect();
            self.err(
                Code::E004,
                node.span,
                &task.path(second),
                format!(
                    "{} (a playbook task) names its child playbook more than once ({}): it takes exactly one of `path`, `playbook` and `file`",
                    task.whose,
                    names.join(", ")
                ),
                "keep one source: `path` (catalog), `playbook` (inline) or `file`",
            );
        }
        for (k, v) in t.entries() {
            if matches!(k.name.as_str(), "name" | "kind" | "spec" | "playbook") {
                continue;
            }
            let mut reads = false;
            v.walk("", &mut |_, n| {
                if let Some(s) = n.as_str() {
                    reads |= crate::template::referenced_roots(s)
                        .iter()
                        .any(|r| r == "keychain");
                }
            });
            if reads {
                self.err(
                    Code::E004,
                    v.span,
                    &task.path(&k.name),
                    format!(
                        "`{}` of {} (a playbook task) reads `keychain`: credential values are not passed to child executions",
                        k.name, task.whose
                    ),
                    "declare the credential in the child playbook's own `keychain` and read it there as `{{ keychain.<name>.<field> }}`",
                );
            }
        }
    }

    /// `python`: each `libs` entry `alias: module` or `alias: {from,
    /// import}` with Python names (services/executors/python/src/config.rs,
    /// `imports`).
    fn python_fields(&mut self, task: &Task) {
        let Some(libs) = task.t.get("libs").filter(|l| l.is_map()) else {
            return;
        };
        let help = "write `alias: module` (`np: numpy`) or `alias: {from: module, import: name}`";
        for (k, v) in libs.entries() {
            if is_template(&k.name) || has_template(v) {
                continue;
            }
            let alias = k.name.as_str();
            let path = format!("{}/libs/{}", task.tp, escape(alias));
            let (span, why) = match python_import(alias, &v.to_json()) {
                Ok(_) => continue,
                Err(e @ LibsEntryError::Alias) => (k.span, e.why()),
                Err(e) => (v.span, e.why()),
            };
            self.libs_error(span, &path, alias, why, task.whose, help);
        }
    }

    fn libs_error(
        &mut self,
        span: Span,
        path: &str,
        alias: &str,
        why: &str,
        whose: &str,
        help: &str,
    ) {
        self.err(
            Code::E004,
            span,
            path,
            format!("`libs.{alias}` of {whose} (a python task) {why}: the task fails with `python.libs` before its code runs"),
            help,
        );
    }
}

/// Why a literal artifact reference is refused, else `None`; `put` for a
/// put's `uri` (services/executors/artifact/src/lib.rs, `path_of`,
/// `put_name`).
fn artifact_reference(raw: &str, put: bool) -> Option<String> {
    let Some(path) = raw.strip_prefix("noetl://") else {
        return Some(
            "is not a reference of this engine's object store (`noetl://...`); other stores (s3://, gs://, file://) are not read by the artifact tool"
                .into(),
        );
    };
    let path = path.trim_end_matches(".json");
    if path
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Some("is not a usable reference: empty, `.` or `..` segments".into());
    }
    match path
        .strip_prefix("artifacts")
        .and_then(|p| p.strip_prefix('/'))
    {
        Some(rest) if !rest.is_empty() => None,
        _ if put => Some("is not where a put stores: `noetl://artifacts/<path>`".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::artifact_reference;

    #[test]
    fn artifact_references_as_the_tool_reads_them() {
        assert_eq!(artifact_reference("noetl://artifacts/e1/x", true), None);
        assert_eq!(artifact_reference("noetl://results/e1/x.json", false), None);
        assert!(artifact_reference("s3://b/k", false).is_some());
        assert!(artifact_reference("noetl://a//b", false).is_some());
        assert!(artifact_reference("noetl://results/x", true).is_some());
        assert!(artifact_reference("noetl://artifacts/", true).is_some());
    }
}
