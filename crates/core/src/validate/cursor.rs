//! Cursor loops (docs/dsl.md, "Cursor loops"): `loop.cursor` and
//! `loop.spec.frame`, checked where the rest of the loop is.

use super::{escape, Node, NodeKind, Validator};
use crate::codes::Code;

const CURSOR_KEYS: &[&str] = &["kind", "auth", "claim"];
/// `max_rows`, `row_concurrency` and `process` take effect; the others are
/// NoETL's lease and sizing hints, accepted and ignored.
const FRAME_KEYS: &[&str] = &[
    "max_rows",
    "row_concurrency",
    "process",
    "max_seconds",
    "max_bytes",
    "lease_seconds",
    "heartbeat_seconds",
];
/// NoETL's Python engine's frame recovery knobs: no counterpart here.
const FRAME_RECOVERY: &[&str] = &["verify_ipc", "retry_mode", "max_attempts"];

/// The variable a claim reads for its batch size.
pub(crate) const FRAME_MAX_ROWS: &str = "__frame_max_rows";
/// The variable a claim reads for its own identity (the same when the
/// same claim runs again).
pub(crate) const FRAME_CLAIM: &str = "__frame_claim";

/// True when `name` is bound where the template at `path` renders: a
/// claim reads `__frame_max_rows` and `__frame_claim`.
pub(super) fn binds(path: &str, name: &str) -> bool {
    (name == FRAME_MAX_ROWS || name == FRAME_CLAIM) && path.ends_with("/loop/cursor/claim")
}

impl Validator {
    /// `loop.cursor` goes with `spec.mode: cursor` and without `in`;
    /// `spec.frame` only with it.
    pub(super) fn cursor_loop(&mut self, l: &Node, path: &str, step: &str) {
        let mode = l.pointer("/spec/mode");
        let cursor_mode = mode.and_then(Node::as_str) == Some("cursor");
        let cursor = l.get("cursor");
        match (cursor, mode) {
            (Some(c), _) if !cursor_mode => {
                let m = mode.and_then(Node::as_str).unwrap_or("sequential");
                self.err(
                    Code::E039,
                    c.span,
                    &format!("{path}/cursor"),
                    format!("loop of step `{step}` has a `cursor` but its `spec.mode` is `{m}`"),
                    "a cursor loop is `spec: { mode: cursor }`; a collection loop has `in` instead of `cursor`",
                );
            }
            (None, Some(m)) if cursor_mode => self.err(
                Code::E039,
                m.span,
                &format!("{path}/spec/mode"),
                format!("`loop.spec.mode: cursor` of step `{step}` needs a `loop.cursor` with a `claim`"),
                "add `cursor: { kind: postgres, auth: <keychain entry>, claim: \"UPDATE ... RETURNING ...\" }`",
            ),
            _ => {}
        }
        if let (Some(_), Some(i)) = (cursor, l.get("in")) {
            self.err(
                Code::E039,
                i.span,
                &format!("{path}/in"),
                format!("loop of step `{step}` has both `in` and `cursor`"),
                "`in` iterates a collection, `cursor` claims rows until none is left: keep one",
            );
        }
        if let Some(c) = cursor {
            self.cursor_block(c, &format!("{path}/cursor"), step);
        }
        if let Some(f) = l.pointer("/spec/frame") {
            let fp = format!("{path}/spec/frame");
            if !cursor_mode {
                self.err(
                    Code::E039,
                    f.span,
                    &fp,
                    format!("`loop.spec.frame` of step `{step}` belongs to a cursor loop"),
                    "`frame` sizes the claims of `spec.mode: cursor`; remove it here",
                );
            }
            self.frame(f, &fp);
        }
    }

    fn cursor_block(&mut self, c: &Node, path: &str, step: &str) {
        if !self.expect_map(c, path, "`loop.cursor`") {
            return;
        }
        for (k, _) in c.entries() {
            if k.name == "options" {
                self.err(
                    Code::E005,
                    k.span,
                    &format!("{path}/options"),
                    "unknown field `options` in `loop.cursor`".into(),
                    "driver options of NoETL's Python engine have no counterpart here: write timeouts and reclaiming into the claim (and `spec.timeout`)",
                );
            }
        }
        let known: Vec<(crate::yaml::Key, Node)> = c
            .entries()
            .iter()
            .filter(|(k, _)| k.name != "options")
            .cloned()
            .collect();
        self.unknown_keys(
            &Node {
                kind: NodeKind::Map(known),
                span: c.span,
            },
            path,
            "`loop.cursor`",
            CURSOR_KEYS,
        );
        if let Some(k) = c.get("kind") {
            if k.as_str() != Some("postgres") {
                let what = k.as_str().unwrap_or("?");
                self.err(
                    Code::E039,
                    k.span,
                    &format!("{path}/kind"),
                    format!("cursor loop of step `{step}` claims with `kind: {what}`, which is not available"),
                    "a claim runs on the postgres executor: `kind: postgres` (the default)",
                );
            }
        }
        match c.get("claim") {
            None => self.err(
                Code::E003,
                c.span,
                path,
                format!("`loop.cursor` of step `{step}` has no `claim`"),
                "`claim:` one SQL statement that claims rows and returns them (`UPDATE ... RETURNING ...`)",
            ),
            Some(n) if n.as_str().is_none_or(|s| s.trim().is_empty()) => self.err(
                Code::E004,
                n.span,
                &format!("{path}/claim"),
                format!("`loop.cursor.claim` of step `{step}` must be SQL text"),
                "one statement that claims rows and returns them (`UPDATE ... RETURNING ...`)",
            ),
            Some(n) => {
                let sql = n.as_str().unwrap_or_default();
                if !marks_its_rows(sql) {
                    self.warn(
                        Code::W112,
                        n.span,
                        &format!("{path}/claim"),
                        format!(
                            "the claim of cursor loop `{step}` does not read `{FRAME_CLAIM}`: \
                             a claim can run twice, and a second run would take other rows, \
                             left `claimed` with no iteration for them"
                        ),
                        "mark the rows a claim takes with `'{{ __frame_claim }}'` and return the rows so marked, \
                         whatever their status, before taking others (docs/dsl.md, \"A claim that runs again takes the same rows\")",
                    );
                }
            }
        }
        if let Some(a) = c.get("auth") {
            if a.as_str().is_none() {
                self.err(
                    Code::E004,
                    a.span,
                    &format!("{path}/auth"),
                    "`loop.cursor.auth` must name a keychain entry".into(),
                    "write `auth: pg_main` (a `postgres_credential` of the root `keychain`)",
                );
            }
        }
    }

    fn frame(&mut self, f: &Node, path: &str) {
        if !self.expect_map(f, path, "`loop.spec.frame`") {
            return;
        }
        for (k, v) in f.entries() {
            let kp = format!("{path}/{}", escape(&k.name));
            match k.name.as_str() {
                "max_rows" | "row_concurrency" if !positive_or_template(v) => self.err(
                    Code::E004,
                    v.span,
                    &kp,
                    format!("`frame.{}` must be an integer >= 1 (or a template)", k.name),
                    "e.g. `max_rows: 50`",
                ),
                "process" if !matches!(v.as_str(), Some("row" | "frame")) => self.err(
                    Code::E004,
                    v.span,
                    &kp,
                    "`frame.process` must be `row` or `frame`".into(),
                    "row (default): one iteration per claimed row; frame: one per claim, over its rows",
                ),
                name if FRAME_RECOVERY.contains(&name) => self.err(
                    Code::E005,
                    k.span,
                    &kp,
                    format!("unknown field `{name}` in `loop.spec.frame`"),
                    "NoETL's Python engine's frame recovery has no counterpart here: a failed claim fails the loop step, a failed iteration counts as failed; remove it",
                ),
                _ => {}
            }
        }
        let known: Vec<(crate::yaml::Key, Node)> = f
            .entries()
            .iter()
            .filter(|(k, _)| !FRAME_RECOVERY.contains(&k.name.as_str()))
            .cloned()
            .collect();
        self.unknown_keys(
            &Node {
                kind: NodeKind::Map(known),
                span: f.span,
            },
            path,
            "`loop.spec.frame`",
            FRAME_KEYS,
        );
    }
}

/// Whether claim `sql` reads its own identity, `__frame_claim`, which is
/// what lets a claim that runs again find the rows it took (W112). A claim
/// whose template does not parse is left to E036.
fn marks_its_rows(sql: &str) -> bool {
    crate::template::check_syntax(sql).is_err()
        || crate::template::referenced_roots(sql)
            .iter()
            .any(|r| r == FRAME_CLAIM)
}

/// An integer >= 1, or a template giving one at run time.
pub(super) fn positive_or_template(n: &Node) -> bool {
    if let Some(s) = n.as_str() {
        return crate::template::is_template(s) || s.trim().parse::<u64>().is_ok_and(|v| v >= 1);
    }
    matches!(n.kind, NodeKind::Int(v) if v >= 1)
}

#[cfg(test)]
mod tests {
    use super::marks_its_rows;

    #[test]
    fn a_claim_marks_its_rows_when_its_template_reads_frame_claim() {
        assert!(marks_its_rows(
            "UPDATE q SET by = '{{ __frame_claim }}' WHERE by IS NULL RETURNING id"
        ));
        // Through a filter, or beside other names, it still reads it.
        assert!(marks_its_rows(
            "SELECT id FROM q WHERE by = '{{ __frame_claim | upper }}' LIMIT {{ __frame_max_rows }}"
        ));
        assert!(!marks_its_rows("UPDATE q SET s = 'c' RETURNING id"));
        assert!(!marks_its_rows(
            "UPDATE q SET s = 'c' WHERE id IN (SELECT id FROM q LIMIT {{ __frame_max_rows }}) RETURNING id"
        ));
        // The name in SQL text, not read by the template, is not a mark.
        assert!(!marks_its_rows(
            "UPDATE q SET by = '__frame_claim' RETURNING id"
        ));
        // A template that does not parse is E036's to report.
        assert!(marks_its_rows("UPDATE q SET s = '{{ oops' RETURNING id"));
    }
}
