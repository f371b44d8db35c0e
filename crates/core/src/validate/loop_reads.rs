//! Reads of the `loop` variable (E046): `loop.done`, which is an event and
//! no variable, anywhere; `loop.*` where no loop iteration binds it (a step
//! without `loop`; a loop step's admission, `loop` block and arcs).
//! docs/dsl.md "Runtime variables".

use super::templates::collect_templates;
use super::Validator;
use crate::codes::Code;
use crate::yaml::Node;

/// What is wrong with one read of `loop` (a dotted path a template reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum LoopRead {
    /// `loop.done`: the event a loop step ends with, read as a variable.
    Done,
    /// `loop.<attr>` (or `loop`) read where no loop iteration runs.
    Unbound(String),
}

/// Where a template renders, as far as `loop` is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Place {
    /// A task (fields, args, policy) of a step with `loop`: bound.
    LoopTask,
    /// A workbook task: bound or not depending on its callers; not judged.
    Workbook,
    /// Anywhere else: `what` says where, for the message.
    Elsewhere(String),
}

/// The refused reads among the dotted `paths` a template reads at `place`.
pub(super) fn refused(paths: &[String], place: &Place) -> Vec<LoopRead> {
    let mut out = Vec::new();
    for p in paths {
        if p != "loop" && !p.starts_with("loop.") {
            continue;
        }
        let read = if p == "loop.done" || p.starts_with("loop.done.") {
            LoopRead::Done
        } else if matches!(place, Place::Elsewhere(_)) {
            LoopRead::Unbound(p.clone())
        } else {
            continue;
        };
        if !out.contains(&read) {
            out.push(read);
        }
    }
    out
}

/// The place of the template at JSON pointer `path` of `root`.
pub(super) fn place(root: &Node, path: &str) -> Place {
    if path.starts_with("/workbook") {
        return Place::Workbook;
    }
    let Some(rest) = path.strip_prefix("/workflow/") else {
        let section = path.trim_start_matches('/').split('/').next().unwrap_or("");
        return Place::Elsewhere(format!("the root section `{section}`"));
    };
    let mut parts = rest.split('/');
    let step = parts
        .next()
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| root.get("workflow").and_then(|w| w.items().get(i)));
    let Some(step) = step else {
        return Place::Elsewhere("the workflow".into());
    };
    let name = step.get("step").and_then(Node::as_str).unwrap_or("?");
    let looped = step.get("loop").is_some();
    match parts.next() {
        Some("tool") if looped => Place::LoopTask,
        Some("tool") => Place::Elsewhere(format!("a task of step `{name}`, which has no `loop`")),
        Some("next") if looped => Place::Elsewhere(format!(
            "the arcs of loop step `{name}` (they run once, when the loop has ended)"
        )),
        Some("next") => Place::Elsewhere(format!("the arcs of step `{name}`, which has no `loop`")),
        Some("loop") => Place::Elsewhere(format!(
            "the `loop` block of step `{name}` (it renders before any iteration)"
        )),
        Some("spec") => Place::Elsewhere(format!(
            "the spec of step `{name}` (admission and limits run before any iteration)"
        )),
        _ => Place::Elsewhere(format!("step `{name}`")),
    }
}

impl Validator {
    /// E046 for every refused read of `loop` in the document's templates.
    pub(super) fn loop_reads(&mut self, root: &Node) {
        let mut found = Vec::new();
        collect_templates(root, "", &mut |path, node, s| {
            let paths = crate::template::referenced_paths(s);
            if !paths.iter().any(|p| p == "loop" || p.starts_with("loop.")) {
                return;
            }
            let at = place(root, path);
            for read in refused(&paths, &at) {
                found.push((node.span, path.to_string(), read, at.clone()));
            }
        });
        for (span, path, read, at) in found {
            match read {
                LoopRead::Done => self.err(
                    Code::E046,
                    span,
                    &path,
                    "template reads `loop.done`, which is not a variable: `loop.done` is the event a loop step ends with".into(),
                    "route on it in the loop step's arcs: `when: \"{{ event.name == 'loop.done' }}\"` (its totals are `event.counts`)",
                ),
                LoopRead::Unbound(what) => {
                    let wher = match at {
                        Place::Elsewhere(w) => w,
                        _ => String::new(),
                    };
                    self.err(
                        Code::E046,
                        span,
                        &path,
                        format!("template reads `{what}` in {wher}: `loop` is bound only in the tasks of a step with `loop`, so it is undefined here"),
                        "read `loop.*` in the tasks of a loop step; in a loop step's arcs read `event.counts` (total, done, failed) and test `event.name == 'loop.done'`",
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn loop_done_is_refused_everywhere_and_loop_reads_only_outside_loop_tasks() {
        let out = Place::Elsewhere("x".into());
        let table: &[(&[&str], Place, Vec<LoopRead>)] = &[
            (&["loop.index"], Place::LoopTask, vec![]),
            (&["loop.done"], Place::LoopTask, vec![LoopRead::Done]),
            (&["loop.done"], Place::Workbook, vec![LoopRead::Done]),
            (&["loop.index"], Place::Workbook, vec![]),
            (
                &["loop.index", "ctx.a"],
                out.clone(),
                vec![LoopRead::Unbound("loop.index".into())],
            ),
            (
                &["loop"],
                out.clone(),
                vec![LoopRead::Unbound("loop".into())],
            ),
            (&["loop.done"], out.clone(), vec![LoopRead::Done]),
            (&["loops.index", "workload.loop"], out.clone(), vec![]),
        ];
        for (p, at, want) in table {
            assert_eq!(&refused(&paths(p), at), want, "{p:?} at {at:?}");
        }
    }
}
