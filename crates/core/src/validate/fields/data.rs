//! The field rules of the tools that move data (`transfer`, `artifact`,
//! `nats`), as [`super`] checks the others: literal values only, each
//! rule the executor's, citing its source.

use super::*;
use crate::field_rules::NATS_OPERATIONS;

impl Validator {
    /// `transfer`: `mode`, `chunk_size`, a table target's `table` (and a
    /// DuckDB one's `database`), a query source's `query`, an http source's
    /// `url` (services/executors/transfer/src/plan.rs: `mode`,
    /// `chunk_size`, `target_table`, `target_fields`, `source_fields`). The
    /// sides' tools and object sides are `transfer_sides`'.
    pub(super) fn transfer_fields(&mut self, task: &Task) {
        const MODES: [&str; 5] = ["insert", "append", "upsert", "replace", "overwrite"];
        let t = task.t;
        if let Some((node, raw)) = literal(t, "mode") {
            if !MODES.contains(&raw.trim()) {
                self.err(
                    Code::E004,
                    node.span,
                    &task.path("mode"),
                    format!(
                        "`mode` {raw:?} of {} (a transfer task) is not a mode: insert (append), upsert or replace (overwrite)",
                        task.whose
                    ),
                    &did_you_mean(raw.trim(), &MODES),
                );
            }
        }
        if let Some(v) = given(t, "chunk_size") {
            let rows = match &v.kind {
                NodeKind::Int(n) => Some(u64::try_from(*n).ok()),
                NodeKind::Float(_) => Some(None),
                NodeKind::Str(s) if is_template(s) => None,
                NodeKind::Str(s) => Some(s.trim().parse::<u64>().ok()),
                _ => None, // the type check's
            };
            // `None`: not judged here; `Some(None)`: no number of rows.
            if rows.is_some_and(|r| r.is_none_or(|n| n == 0)) {
                self.err(
                    Code::E004,
                    v.span,
                    &task.path("chunk_size"),
                    format!(
                        "`chunk_size` of {} (a transfer task) must be a positive number of rows, found {}",
                        task.whose,
                        crate::validate::flow(v)
                    ),
                    "write rows per batch, e.g. `chunk_size: 1000` (the default)",
                );
            }
        }
        self.transfer_target(task);
        self.transfer_source(task);
    }

    fn transfer_target(&mut self, task: &Task) {
        use crate::transfer::TargetKind;
        let Some(tgt) = task.t.get("target").filter(|n| n.is_map()) else {
            return;
        };
        let Some(map) = tgt.to_json().as_object().cloned() else {
            return;
        };
        let Ok(kind @ (TargetKind::Postgres | TargetKind::Duckdb)) =
            crate::transfer::target_kind(&map)
        else {
            return;
        };
        let tp = format!("{}/target", task.tp);
        let tool = kind.name();
        match tgt.get("table") {
            Some(n) if !n.is_null() => match n.as_str() {
                Some(s) if is_template(s) => {}
                Some(s) if !crate::transfer::is_table_name(s.trim()) => self.err(
                    Code::E004,
                    n.span,
                    &format!("{tp}/table"),
                    format!(
                        "`target.table` {s:?} of {} (a transfer task) is not a table name: `name` or `schema.name`, identifiers of [A-Za-z_][A-Za-z0-9_$]*",
                        task.whose
                    ),
                    "write the table as the database names it, e.g. `table: public.orders`",
                ),
                Some(_) => {}
                None => self.err(
                    Code::E004,
                    n.span,
                    &format!("{tp}/table"),
                    format!(
                        "`target.table` of {} (a transfer task) must be a table name, found {}",
                        task.whose,
                        n.type_name()
                    ),
                    "write the table as the database names it, e.g. `table: public.orders`",
                ),
            },
            _ if task.workbook => {}
            _ => self.err(
                Code::E003,
                tgt.span,
                &tp,
                format!(
                    "`target` of {} (a transfer task) has no `table`: a {tool} target writes rows into a table",
                    task.whose
                ),
                "add `table: <name>` (or `schema.name`)",
            ),
        }
        if kind == TargetKind::Duckdb && tgt.get("database").is_none() && !task.workbook {
            self.err(
                Code::E003,
                tgt.span,
                &tp,
                format!(
                    "`target` of {} (a transfer task) has no `database`: a duckdb target writes into a DuckDB file",
                    task.whose
                ),
                "add `database: <path of the DuckDB file>`",
            );
        }
    }

    fn transfer_source(&mut self, task: &Task) {
        use crate::transfer::SourceKind;
        if task.workbook {
            return;
        }
        let Some(src) = task.t.get("source").filter(|n| n.is_map()) else {
            return;
        };
        let Some(map) = src.to_json().as_object().cloned() else {
            return;
        };
        let (field, about) = match crate::transfer::source_kind(&map) {
            Ok(SourceKind::Postgres | SourceKind::Duckdb) => {
                if src.get("query").is_some() || src.get("command").is_some() {
                    return;
                }
                ("query", "add `query: SELECT ...`: the rows to transfer")
            }
            Ok(SourceKind::Http) => {
                if src.get("url").is_some() {
                    return;
                }
                ("url", "add `url: https://...`: the JSON rows to transfer")
            }
            _ => return,
        };
        let tool = crate::transfer::tool_of(&map);
        self.err(
            Code::E003,
            src.span,
            &format!("{}/source", task.tp),
            format!(
                "`source` of {} (a transfer task) has no `{field}`: a {tool} source needs it",
                task.whose
            ),
            about,
        );
    }

    /// `artifact`: `action` get or put; a literal reference is a
    /// `noetl://` one, a put's under `noetl://artifacts/`; each action's
    /// fields (services/executors/artifact/src/lib.rs: `action`, `path_of`,
    /// `put_name`).
    pub(super) fn artifact_fields(&mut self, task: &Task) {
        let t = task.t;
        let verb = match given(t, "action") {
            None => Some("get"),
            Some(n) => match n.as_str() {
                Some(s) if is_template(s) => None,
                Some(s @ ("get" | "put")) => Some(s),
                Some(s) => {
                    self.err(
                        Code::E004,
                        n.span,
                        &task.path("action"),
                        format!(
                            "`action` {s:?} of {} (an artifact task) must be `get` or `put`",
                            task.whose
                        ),
                        &did_you_mean(s, &["get", "put"]),
                    );
                    return;
                }
                None => return, // the type check's
            },
        };
        for field in ["uri", "result_ref"] {
            let Some((node, raw)) = literal(t, field) else {
                continue;
            };
            if field == "result_ref" && verb != Some("get") {
                continue;
            }
            let why = artifact_reference(raw, field == "uri" && verb == Some("put"));
            if let Some(why) = why {
                self.err(
                    Code::E004,
                    node.span,
                    &task.path(field),
                    format!(
                        "`{field}` {raw:?} of {} (an artifact task) {why}",
                        task.whose
                    ),
                    "a get reads `noetl://...` (what a put returned); a put stores under `noetl://artifacts/<path>`",
                );
            }
        }
        if task.workbook {
            return;
        }
        let misplaced = match verb {
            Some("put") => "result_ref",
            Some(_) => "data",
            None => return,
        };
        let verb = verb.unwrap_or_default();
        if let Some(n) = surely_given(t, misplaced) {
            self.err(
                Code::E004,
                n.span,
                &task.path(misplaced),
                format!(
                    "`{misplaced}` is not a field of an artifact {verb} ({}): the task fails with `artifact.config`",
                    task.whose
                ),
                "a put takes `data` (and `uri`); a get takes `uri` or `result_ref`",
            );
        }
        let missing = match verb {
            "put" if given(t, "data").is_none() => {
                Some("an artifact put needs `data`: the value to store")
            }
            "get" if given(t, "uri").is_none() && given(t, "result_ref").is_none() => {
                Some("an artifact get needs `uri` or `result_ref`: the reference to read")
            }
            _ => None,
        };
        if let Some(why) = missing {
            self.err(
                Code::E003,
                t.span,
                task.tp,
                format!("{} (an artifact task) cannot run: {why}", task.whose),
                "`action: put` with `data`, or a get with `uri: noetl://...` / `result_ref`",
            );
        }
    }

    /// `nats`: a known `operation`, and the fields it needs
    /// (services/executors/nats/src/config.rs: `OPERATIONS`, `operation`,
    /// `need`).
    pub(super) fn nats_fields(&mut self, task: &Task) {
        let t = task.t;
        let Some((node, raw)) = literal(t, "operation") else {
            return;
        };
        let op = raw.trim();
        if !NATS_OPERATIONS.contains(&op) {
            self.err(
                Code::E004,
                node.span,
                &task.path("operation"),
                format!(
                    "`operation` {raw:?} of {} (a nats task) is not an operation of the nats tool",
                    task.whose
                ),
                &did_you_mean(op, NATS_OPERATIONS),
            );
            return;
        }
        let needs: &[&str] = match op {
            "publish" | "js_publish" | "request" => &["subject"],
            "kv_get" | "kv_put" | "kv_delete" => &["bucket", "key"],
            "kv_keys" => &["bucket"],
            _ => &["bucket", "object"],
        };
        for field in needs {
            match given(t, field) {
                None if task.workbook => {}
                None => self.err(
                    Code::E003,
                    t.span,
                    task.tp,
                    format!(
                        "{} (a nats task) has no `{field}`, which `operation: {op}` needs",
                        task.whose
                    ),
                    &format!("add `{field}:`"),
                ),
                Some(n) if n.as_str().is_some_and(|s| s.trim().is_empty()) => self.err(
                    Code::E004,
                    n.span,
                    &task.path(field),
                    format!(
                        "`{field}` of {} (a nats task) is empty, and `operation: {op}` needs it",
                        task.whose
                    ),
                    &format!("write the {field}'s name"),
                ),
                Some(_) => {}
            }
        }
    }
}
