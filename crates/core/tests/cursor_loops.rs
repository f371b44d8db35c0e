//! Cursor loops at load (docs/dsl.md, "Cursor loops"): the accepted shape,
//! and each refusal with its code and position.

use noetl_core::diagnostic::Diagnostic;
use noetl_core::load::{load_playbook, LoadError, LoadedPlaybook};
use noetl_core::{FrameProcess, LoopMode};
use serde_json::json;

fn load(src: &str) -> Result<LoadedPlaybook, LoadError> {
    load_playbook(src, "t.yaml")
}

fn diags(src: &str) -> Vec<Diagnostic> {
    match load(src) {
        Ok(l) => l.warnings.0,
        Err(e) => e.diagnostics.0,
    }
}

/// `(code, line, col, message)` of every diagnostic.
fn found(src: &str) -> Vec<(&'static str, usize, usize, String)> {
    diags(src)
        .into_iter()
        .map(|d| {
            let s = d.span.expect("positioned");
            (d.code.as_str(), s.line, s.col, d.message)
        })
        .collect()
}

/// A cursor loop step; `loop_body` is the `loop:` mapping's lines, indented
/// by 6 (the loop starts on line 8).
fn pb(loop_body: &str) -> String {
    format!(
        "apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: t }}
keychain: [{{ name: db, kind: postgres_credential }}]
workflow:
  - step: start
    loop:
{loop_body}    tool: [ {{ name: work, kind: noop }} ]
    next:
      arcs:
        - {{ step: end, when: \"{{{{ event.name == 'loop.done' }}}}\" }}
  - step: end
"
    )
}

const CLAIM: &str = "      cursor:
        kind: postgres
        auth: db
        claim: \"UPDATE q SET s = 'c', by = '{{ __frame_claim }}' WHERE id IN (SELECT id FROM q LIMIT {{ __frame_max_rows }}) RETURNING id\"
";

#[test]
fn a_cursor_loop_loads_with_its_frame_and_reads_frame_max_rows_and_claim_without_warning() {
    let src = pb(&format!(
        "{CLAIM}      iterator: job
      spec:
        mode: cursor
        max_in_flight: 4
        frame: {{ max_rows: 10, row_concurrency: 2, process: frame, max_seconds: 30, max_bytes: 1024, lease_seconds: \"{{{{ workload.lease }}}}\", heartbeat_seconds: 30 }}
"
    ));
    let l = load(&src).unwrap_or_else(|e| panic!("{e}"));
    assert!(l.warnings.is_empty(), "{:#?}", l.warnings);
    let lp = l.playbook.workflow[0].loop_.clone().expect("a loop");
    assert_eq!(lp.spec.mode, LoopMode::Cursor);
    assert!(lp.in_.is_null());
    let c = lp.cursor.expect("a cursor");
    assert_eq!((c.kind.as_str(), c.auth), ("postgres", Some(json!("db"))));
    assert!(c.claim.contains("__frame_max_rows") && c.claim.contains("__frame_claim"));
    let f = lp.spec.frame.expect("a frame");
    assert_eq!(f.max_rows, Some(json!(10)));
    assert_eq!(f.row_concurrency, Some(json!(2)));
    assert_eq!(f.process, FrameProcess::Frame);
    assert_eq!(
        f.hints.get("lease_seconds"),
        Some(&json!("{{ workload.lease }}"))
    );
}

#[test]
fn kind_defaults_to_postgres_and_process_to_row() {
    let src = pb(
        "      cursor: { auth: db, claim: \"UPDATE q SET s = 1 RETURNING id\" }
      iterator: job
      spec: { mode: cursor }
",
    );
    let l = load(&src).unwrap_or_else(|e| panic!("{e}"));
    let lp = l.playbook.workflow[0].loop_.clone().unwrap();
    assert_eq!(lp.cursor.unwrap().kind, "postgres");
    assert!(lp.spec.frame.is_none());
}

#[test]
fn e039_a_cursor_needs_mode_cursor() {
    let src = pb(&format!(
        "{CLAIM}      iterator: job\n      spec: {{ mode: parallel }}\n"
    ));
    let f = found(&src);
    assert!(
        f.iter().any(|(c, l, col, m)| *c == "E039"
            && (*l, *col) == (9, 9)
            && m.contains("has a `cursor` but its `spec.mode` is `parallel`")),
        "{f:#?}"
    );
    // No mode at all: sequential.
    let src = pb(&format!("{CLAIM}      iterator: job\n"));
    assert!(found(&src)
        .iter()
        .any(|(c, _, _, m)| *c == "E039" && m.contains("is `sequential`")));
}

#[test]
fn e039_mode_cursor_needs_a_cursor() {
    let src = pb("      in: [1, 2]
      iterator: job
      spec: { mode: cursor }
");
    let f = found(&src);
    assert!(
        f.iter().any(|(c, l, col, m)| *c == "E039"
            && (*l, *col) == (10, 21)
            && m.contains("`loop.spec.mode: cursor` of step `start` needs a `loop.cursor`")),
        "{f:#?}"
    );
    // Without `in` either: one finding, not also E032.
    let src = pb("      iterator: job\n      spec: { mode: cursor }\n");
    let codes: Vec<_> = found(&src).into_iter().map(|f| f.0).collect();
    assert!(codes.contains(&"E039"), "{codes:?}");
}

#[test]
fn e039_in_and_cursor_are_exclusive() {
    let src = pb(&format!(
        "{CLAIM}      in: [1, 2]\n      iterator: job\n      spec: {{ mode: cursor }}\n"
    ));
    let f = found(&src);
    assert!(
        f.iter().any(|(c, l, col, m)| *c == "E039"
            && (*l, *col) == (12, 11)
            && m.contains("has both `in` and `cursor`")),
        "{f:#?}"
    );
}

#[test]
fn e039_frame_belongs_to_a_cursor_loop_and_kind_is_postgres() {
    let src = pb("      in: [1, 2]
      iterator: job
      spec: { mode: parallel, frame: { max_rows: 2 } }
");
    let f = found(&src);
    assert!(
        f.iter().any(|(c, _, _, m)| *c == "E039"
            && m.contains("`loop.spec.frame` of step `start` belongs to a cursor loop")),
        "{f:#?}"
    );
    let src = pb(
        "      cursor: { kind: mysql, claim: \"UPDATE q SET s = 1 RETURNING id\" }
      iterator: job
      spec: { mode: cursor }
",
    );
    let f = found(&src);
    assert!(
        f.iter().any(|(c, l, _, m)| *c == "E039"
            && *l == 8
            && m.contains("`kind: mysql`, which is not available")),
        "{f:#?}"
    );
}

#[test]
fn e003_a_cursor_needs_a_claim_and_e004_e005_bad_fields() {
    let src = pb("      cursor: { kind: postgres, auth: db }
      iterator: job
      spec: { mode: cursor }
");
    let f = found(&src);
    assert!(
        f.iter().any(|(c, l, col, m)| *c == "E003"
            && (*l, *col) == (8, 15)
            && m.contains("has no `claim`")),
        "{f:#?}"
    );
    let src = pb("      cursor: { claim: \"UPDATE q SET s = 1 RETURNING id\", options: { timeout: 3 }, driver: x }
      iterator: job
      spec: { mode: cursor, frame: { max_rows: 0, process: batch, verify_ipc: true, lease: 3 } }
");
    let f = found(&src);
    let has = |code: &str, text: &str| f.iter().any(|(c, _, _, m)| *c == code && m.contains(text));
    assert!(
        has("E005", "unknown field `options` in `loop.cursor`"),
        "{f:#?}"
    );
    assert!(
        has("E005", "unknown field `driver` in `loop.cursor`"),
        "{f:#?}"
    );
    assert!(
        has("E004", "`frame.max_rows` must be an integer >= 1"),
        "{f:#?}"
    );
    assert!(
        has("E004", "`frame.process` must be `row` or `frame`"),
        "{f:#?}"
    );
    assert!(
        has("E005", "unknown field `verify_ipc` in `loop.spec.frame`"),
        "{f:#?}"
    );
    assert!(
        has("E005", "unknown field `lease` in `loop.spec.frame`"),
        "{f:#?}"
    );
}

#[test]
fn frame_max_rows_outside_a_claim_is_still_an_unknown_name() {
    let src = pb(&format!(
        "{CLAIM}      iterator: job\n      spec: {{ mode: cursor }}\n"
    ))
    .replace(
        "tool: [ { name: work, kind: noop } ]",
        "tool: [ { name: work, kind: noop, result: \"{{ __frame_max_rows }}\" } ]",
    );
    let f = found(&src);
    assert!(
        f.iter()
            .any(|(c, _, _, m)| *c == "W106" && m.contains("__frame_max_rows")),
        "{f:#?}"
    );
}

#[test]
fn w112_a_claim_that_does_not_read_frame_claim_is_warned_where_it_is_written() {
    // Takes pending rows and never marks them as its own: a second run of
    // the same claim would take other rows (docs/dsl.md).
    let src = pb("      cursor:
        auth: db
        claim: \"UPDATE q SET s = 'c' WHERE id IN (SELECT id FROM q WHERE s = 'p' LIMIT {{ __frame_max_rows }}) RETURNING id\"
      iterator: job
      spec: { mode: cursor }
");
    let l = load(&src).unwrap_or_else(|e| panic!("a warning, not a refusal: {e}"));
    let w: Vec<_> = l
        .warnings
        .0
        .iter()
        .filter(|d| d.code.as_str() == "W112")
        .collect();
    assert_eq!(w.len(), 1, "{:#?}", l.warnings);
    let s = w[0].span.expect("positioned");
    assert_eq!((s.line, s.col), (10, 16));
    assert!(
        w[0].message.contains("cursor loop `start`"),
        "{}",
        w[0].message
    );
    assert!(w[0].message.contains("__frame_claim"), "{}", w[0].message);
    assert!(
        w[0].help
            .as_deref()
            .unwrap_or_default()
            .contains("A claim that runs again"),
        "{:?}",
        w[0].help
    );
    // Reading it anywhere in the statement is enough (the check does not
    // parse SQL); a claim that does not parse is E036's alone.
    let marked = pb(&format!(
        "{CLAIM}      iterator: job\n      spec: {{ mode: cursor }}\n"
    ));
    assert!(
        !found(&marked).iter().any(|(c, ..)| *c == "W112"),
        "{:#?}",
        found(&marked)
    );
    let broken = pb(
        "      cursor: { auth: db, claim: \"UPDATE q SET s = '{{ oops' RETURNING id\" }
      iterator: job
      spec: { mode: cursor }
",
    );
    let codes: Vec<_> = found(&broken).into_iter().map(|(c, ..)| c).collect();
    assert!(
        codes.contains(&"E036") && !codes.contains(&"W112"),
        "{codes:?}"
    );
}
