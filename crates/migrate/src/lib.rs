//! `noetl migrate`: legacy NoETL playbooks rewritten into canonical v10
//! (docs/migrate.md has the table of constructs).
//!
//! The rewrite edits the YAML *text* where each construct is, found through
//! the positioned tree ([`noetl_core::yaml`]), so comments, key order, quoting
//! and everything not migrated stay as written. It runs in five passes,
//! each on a fresh parse of the previous one's output: NoETL's nestings
//! undone (a workbook task's `tool:`, then tool fields under `spec`; these
//! move and delete lines and say where each went), key renames, template
//! rewrites, then structural rewrites (which add lines). Every change is
//! reported at its line in the original file. What cannot be rewritten
//! safely is left as written and reported as a [`Refusal`] naming why.

use noetl_core::yaml::Node;

mod edits;
mod inline_auth;
mod keychain;
mod lines;
mod renames;
mod shape_structure;
mod shapes;
mod snippets;
mod structure;
mod templates;
mod tool_fields;
mod walk;

use edits::{Edits, LineOrder};
use renames::renames;
use structure::structure;
use templates::templates;

/// One rewrite, at its line of the original file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// 1-based line.
    pub line: usize,
    /// What was rewritten, e.g. "task `t`: `input` → `args`".
    pub summary: String,
}

/// A legacy construct left as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 1-based line.
    pub line: usize,
    /// Why, and what to write instead.
    pub why: String,
}

/// The result of [`migrate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The rewritten text (the input when nothing changed).
    pub text: String,
    /// Every rewrite, in file order.
    pub changes: Vec<Change>,
    /// What was left as written, in file order.
    pub refusals: Vec<Refusal>,
    /// For each line of `text` (index `n - 1` for line `n`), its line in
    /// the file as written.
    lines: Vec<usize>,
}

impl Migration {
    /// Every change and refusal as `(line, text)` in file order; a
    /// refusal's text starts with `refused: `.
    pub fn report(&self) -> Vec<(usize, String)> {
        let mut lines: Vec<(usize, String)> = self
            .changes
            .iter()
            .map(|c| (c.line, c.summary.clone()))
            .chain(
                self.refusals
                    .iter()
                    .map(|r| (r.line, format!("refused: {}", r.why))),
            )
            .collect();
        lines.sort_by_key(|(l, _)| *l);
        lines
    }

    /// The line of the file as written that line `line` of the migrated
    /// text comes from (a line a rewrite wrote: the line it replaced), so
    /// a diagnostic of the migrated text can name the line the user wrote.
    pub fn original_line(&self, line: usize) -> usize {
        self.lines
            .get(line.wrapping_sub(1))
            .copied()
            .unwrap_or_else(|| line.min(self.lines.last().copied().unwrap_or(line)))
    }
}

/// Why a file cannot be migrated at all.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// It is not YAML (or not one the loader reads).
    #[error("{line}:{col}: {message}")]
    Yaml {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong.
        message: String,
    },
}

/// Rewrite the legacy constructs of the playbook `src`.
pub fn migrate(src: &str) -> Result<Migration, MigrateError> {
    let mut m = Migration {
        text: src.to_string(),
        changes: Vec::new(),
        refusals: Vec::new(),
        lines: (1..=src.lines().count()).collect(),
    };
    // Passes 0 and 1 (NoETL's nesting undone: workbook tasks' `tool:`,
    // then tool fields under `spec` and an artifact's `input`) delete and
    // move lines, saying which ([`LineOrder`]); every pass reports its
    // lines in the original file through `origin`.
    // A workbook task's `tool:` is unwrapped before its `spec` is read.
    let passes: [fn(&Node, &mut Edits); 5] = [
        shapes::unwrap,
        shapes::unnest,
        renames,
        templates,
        structure,
    ];
    let mut origin: Option<Vec<usize>> = None;
    for (i, pass) in passes.into_iter().enumerate() {
        let root = noetl_core::yaml::parse(&m.text).map_err(|e| MigrateError::Yaml {
            line: e.span.line,
            col: e.span.col,
            message: e.message,
        })?;
        let mut edits = Edits::new(&m.text);
        pass(&root, &mut edits);
        let lines = m.text.lines().count();
        let (text, mut changes, mut refusals, orders, moved) = edits.apply();
        m.lines = lines::compose(&m.lines, &moved);
        let to_original = |line: usize| match &origin {
            Some(o) => o.get(line - 1).copied().unwrap_or(line),
            None => line,
        };
        for c in &mut changes {
            c.line = to_original(c.line);
        }
        for r in &mut refusals {
            r.line = to_original(r.line);
        }
        if i < 2 {
            let moved = LineOrder::origin(lines, &orders);
            origin = Some(match &origin {
                None => moved,
                Some(before) => moved
                    .iter()
                    .map(|&l| before.get(l - 1).copied().unwrap_or(l))
                    .collect(),
            });
        }
        m.text = text;
        m.changes.extend(changes);
        m.refusals.extend(refusals);
    }
    m.changes.sort_by_key(|c| c.line);
    m.refusals.sort_by_key(|r| r.line);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::entry_end;
    use crate::templates::{rewrite_expression, Names, Place};

    fn names(workload: &[&str], shadowing: &[&str]) -> Names {
        Names {
            iterator: None,
            workload: workload.iter().map(|s| s.to_string()).collect(),
            shadowing: shadowing.iter().map(|s| s.to_string()).collect(),
            ctx_keys: Default::default(),
        }
    }

    fn rewrite(expr: &str, place: Place) -> String {
        rewrite_expression(
            expr,
            place,
            &names(&["numbers", "limit", "length"], &["fetch"]),
        )
        .0
    }

    #[test]
    fn an_entry_holds_a_sequence_written_at_its_own_indentation() {
        let text = "    libs:\n    - psycopg2-binary\n    - requests\n    code: x\n";
        let end = entry_end(text, 4);
        assert_eq!(&text[end..], "    code: x\n");
        // A scalar value ends at its own line, even before a `- ` line.
        let text = "  - a: 1\n  - b: 2\n";
        assert_eq!(&text[entry_end(text, 4)..], "  - b: 2\n");
    }

    #[test]
    fn only_roots_are_rewritten() {
        assert_eq!(
            rewrite("{{ numbers }}", Place::Other),
            "{{ workload.numbers }}"
        );
        assert_eq!(
            rewrite("{{ fetch.numbers | length > limit }}", Place::Other),
            "{{ fetch.numbers | length > workload.limit }}",
            "attributes and filters are not roots"
        );
        assert_eq!(
            rewrite("{{ 'numbers' ~ \"limit\" }}", Place::Other),
            "{{ 'numbers' ~ \"limit\" }}",
            "string literals are left alone"
        );
        assert_eq!(
            rewrite("{{ numbers is defined }}", Place::Other),
            "{{ workload.numbers is defined }}"
        );
        assert_eq!(
            rewrite(
                "{% for numbers in ctx.rows %}{{ numbers }}{% endfor %}",
                Place::Other
            ),
            "{% for numbers in ctx.rows %}{{ numbers }}{% endfor %}",
            "a loop variable shadows"
        );
        assert_eq!(
            rewrite("{{ range(limit) | list }}", Place::Other),
            "{{ range(workload.limit) | list }}"
        );
        assert_eq!(
            rewrite("{{ x | default(limit=1) }}", Place::Other),
            "{{ x | default(limit=1) }}"
        );
    }

    #[test]
    fn a_loop_s_bare_element_is_read_from_iter_in_its_tasks() {
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkload:\n  slots: [1, 2]\nworkflow:\n  - step: start\n    loop:\n      in: \"{{ workload.slots }}\"\n      iterator: slot\n    tool:\n      - name: claim\n        kind: noop\n        result: \"{{ slot }} of {{ loop.length }}\"\n        spec:\n          policy:\n            rules:\n              - when: \"{{ slot.x is defined }}\"\n                then: { do: continue }\n    next:\n      arcs:\n        - step: end\n          when: \"{{ slot }}\"\n  - step: end\n    tool: { kind: noop }\n";
        let m = migrate(src).unwrap();
        assert!(
            m.text
                .contains("result: \"{{ iter.slot }} of {{ loop.length }}\""),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("when: \"{{ iter.slot.x is defined }}\""),
            "{}",
            m.text
        );
        // Where the element is not bound (arcs run after the loop), as written.
        assert!(
            m.text.contains("          when: \"{{ slot }}\""),
            "{}",
            m.text
        );
        assert!(
            m.report()
                .iter()
                .any(|(l, s)| *l == 14 && s == "`slot` (the loop's element) → `iter.slot`"),
            "{:?}",
            m.report()
        );
    }

    #[test]
    fn noetl_s_job_id_is_the_execution_id() {
        assert_eq!(
            rewrite("{{ job.uuid }}-{{ job.execution_id|string }}", Place::Other),
            "{{ execution_id }}-{{ execution_id|string }}"
        );
        assert_eq!(rewrite("{{ job.name }}", Place::Other), "{{ job.name }}");
    }

    #[test]
    fn a_loop_s_bare_element_in_a_step_input_is_read_from_iter_in_its_task_args() {
        // NoETL's e2e `loop_test.yaml` shape: the step's `input` becomes
        // its task's `args`, rendered per iteration.
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkload:\n  numbers: [1, 2]\nworkflow:\n  - step: start\n    loop:\n      in: \"{{ numbers }}\"\n      iterator: num\n    tool:\n      kind: python\n      input: {}\n      code: |\n        result = input_data.get('num')\n    input:\n      num: \"{{ num }}\"\n      at: \"{{ loop_index }}\"\n      n: \"{{ numbers | length }}\"\n";
        let m = migrate(src).unwrap();
        assert!(m.text.contains("num: \"{{ iter.num }}\""), "{}", m.text);
        assert!(m.text.contains("at: \"{{ iter.index }}\""), "{}", m.text);
        assert!(
            m.text.contains("n: \"{{ workload.numbers | length }}\""),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("in: \"{{ workload.numbers }}\""),
            "{}",
            m.text
        );
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
        let pb = noetl_core::load::load_playbook(&m.text, "t.yaml").expect("loads");
        assert!(
            pb.warnings.0.iter().all(|d| d.code != "W106"),
            "{:?}",
            pb.warnings.0
        );
    }

    #[test]
    fn a_name_a_set_writes_is_read_from_ctx() {
        // NoETL's pipeline fixtures: a task's `set` writes a variable a
        // later task reads bare.
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkload:\n  limit: 3\nworkflow:\n  - step: start\n    tool:\n      - name: fetch\n        kind: noop\n        result: 1\n        set:\n          fetch_result: \"{{ output.data }}\"\n          ctx.other: 2\n          limit: 4\n      - name: use\n        kind: noop\n        result: \"{{ fetch_result }} {{ fetch }} {{ other }} {{ limit }}\"\n";
        let m = migrate(src).unwrap();
        assert!(
            m.text.contains(
                "result: \"{{ ctx.fetch_result }} {{ fetch }} {{ other }} {{ workload.limit }}\""
            ),
            "a task name, a key written as a `ctx.` path and a workload key keep their reading:\n{}",
            m.text
        );
        assert!(
            m.report()
                .iter()
                .any(|(_, s)| s == "`fetch_result` (written by a `set`) → `ctx.fetch_result`"),
            "{:?}",
            m.report()
        );
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
    }

    #[test]
    fn a_v1_python_step_s_code_is_not_read_as_a_template() {
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkload:\n  slot: 1\nworkflow:\n  - step: start\n    loop:\n      in: [1, 2]\n      iterator: item\n    type: python\n    code: |\n      result = f\"{{ slot }}\"\n    args:\n      x: \"{{ item }}\"\n";
        let m = migrate(src).unwrap();
        assert!(m.text.contains("result = f\"{{ slot }}\""), "{}", m.text);
        assert!(m.text.contains("x: \"{{ iter.item }}\""), "{}", m.text);
    }

    #[test]
    fn a_step_set_reads_its_own_result_as_the_outcome_s() {
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkflow:\n  - step: plan\n    tool:\n      kind: python\n      code: \"result = {'d': [1]}\"\n    set:\n      ctx.d: \"{{ plan.d }}\"\n      ctx.n: \"{{ other.n }}\"\n    next:\n      arcs:\n        - step: other\n  - step: other\n    tool: { kind: noop }\n";
        let m = migrate(src).unwrap();
        assert!(
            m.text.contains("ctx.d: \"{{ outcome.result.d }}\""),
            "{}",
            m.text
        );
        // Another step's result is read by its name, as written.
        assert!(m.text.contains("ctx.n: \"{{ other.n }}\""), "{}", m.text);
        assert!(
            m.report()
                .iter()
                .any(|(l, s)| *l == 10 && s.contains("`plan` (its own result) → `outcome.result`")),
            "{:?}",
            m.report()
        );
    }

    #[test]
    fn output_becomes_outcome_in_policy_and_event_in_arcs() {
        assert_eq!(
            rewrite("{{ output.data.rows }} {{ output.status }}", Place::Policy),
            "{{ outcome.result.rows }} {{ outcome.status }}"
        );
        assert_eq!(
            rewrite("{{ output.status == 'ok' }}", Place::Arc),
            "{{ event.status == 'ok' }}"
        );
        assert_eq!(
            rewrite("{{ output.database }}", Place::Policy),
            "{{ outcome.database }}"
        );
        let (same, _, refused) =
            rewrite_expression("{{ output.data }}", Place::Other, &names(&[], &[]));
        assert_eq!(same, "{{ output.data }}");
        assert!(refused.is_some_and(|r| r.contains("no canonical equivalent")));
        assert_eq!(
            rewrite("{{ _index + 1 }}", Place::Other),
            "{{ iter.index + 1 }}"
        );
    }

    #[test]
    fn a_second_migration_changes_nothing_and_comments_stay() {
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkload: { n: 2 }\nworkflow:\n  - step: a\n    # the only step\n    tool:\n      - name: t\n        kind: python\n        input: { n: \"{{ n }}\" }  # keep me\n        code: \"result = n\"\n";
        let m = migrate(src).unwrap();
        assert!(
            m.text
                .contains("        args: { n: \"{{ workload.n }}\" }  # keep me\n"),
            "{}",
            m.text
        );
        assert!(m.text.contains("    # the only step\n"));
        assert_eq!(m.changes.len(), 2);
        assert!(migrate(&m.text).unwrap().changes.is_empty());
    }

    fn playbook(workflow: &str) -> String {
        format!("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{ name: t }}\nworkflow:\n{workflow}")
    }

    #[test]
    fn a_legacy_next_becomes_the_router_object() {
        let m = migrate(&playbook(
            "  - step: a\n    next: b\n  - step: b\n    next: [c, \"d\"]\n  - step: c\n    next:\n      # why\n      - step: d\n        when: \"{{ ctx.x }}\"\n        args: { y: 1 }\n      - d\n  - step: d\n",
        ))
        .unwrap();
        assert!(
            m.text
                .contains("    next:\n      arcs:\n        - step: b\n"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("    next:\n      spec: { mode: inclusive }\n      arcs:\n        - step: c\n        - step: d\n"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("      arcs:\n        # why\n        - step: d\n          when: \"{{ ctx.x }}\"\n          args: { y: 1 }\n        - step: d\n"),
            "{}",
            m.text
        );
        assert_eq!(m.changes.len(), 3, "{:?}", m.changes);
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
        noetl_core::load::load_playbook(&m.text, "t.yaml").unwrap();
        assert!(migrate(&m.text).unwrap().changes.is_empty());
    }

    #[test]
    fn a_next_with_branches_is_refused() {
        let m = migrate(&playbook(
            "  - step: a\n    next:\n      when: \"{{ ctx.x }}\"\n      then: [b]\n  - step: b\n",
        ))
        .unwrap();
        assert!(m.changes.is_empty());
        assert_eq!(m.refusals.len(), 1);
        assert!(
            m.refusals[0].why.contains("one arc per branch"),
            "{:?}",
            m.refusals
        );
    }

    #[test]
    fn a_workbook_call_without_kind_gets_one() {
        let m = migrate(&playbook(
            "  - step: a\n    tool:\n      - name: x\n        task: add\n      - task: add\n      - { name: z, task: add }\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("      - name: x\n        kind: workbook\n        task: add\n      - kind: workbook\n        task: add\n      - { name: z, kind: workbook, task: add }\n"),
            "{}",
            m.text
        );
        assert_eq!(m.changes.len(), 3);
    }

    #[test]
    fn a_v1_step_it_cannot_rewrite_safely_is_refused() {
        let m = migrate(&playbook(
            "  - step: a\n    tool: router\n    code: x\n  - step: b\n    tool: workbook\n    args: { n: 1 }\n",
        ))
        .unwrap();
        assert!(m.changes.is_empty(), "{:?}", m.changes);
        let why: Vec<&str> = m.refusals.iter().map(|r| r.why.as_str()).collect();
        assert!(
            why[0].contains("`tool: router` with task field `code`"),
            "{why:?}"
        );
        assert!(
            why[1].contains("`tool: workbook` without `name`"),
            "{why:?}"
        );
    }

    #[test]
    fn what_is_not_yaml_is_an_error_with_its_position() {
        let e = migrate("workflow: [\n").unwrap_err();
        assert!(
            matches!(
                e,
                MigrateError::Yaml { line: 2, .. } | MigrateError::Yaml { line: 1, .. }
            ),
            "{e}"
        );
    }
}
