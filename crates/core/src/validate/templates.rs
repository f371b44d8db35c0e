//! The templates of the document: each parses (E036) and reads names
//! that exist where it renders (W106, W107, W108).

use std::collections::BTreeSet;

use super::{allowed_list, closest, Validator};
use crate::codes::Code;
use crate::template::RUNTIME_VARIABLES;
use crate::yaml::{escape, Node, NodeKind, Span};

impl Validator {
    /// Every string with `{{`, `{%` or `{#` must parse (a python task's own
    /// `code` excepted: it is not rendered, see `is_raw_field`).
    pub(super) fn templates(&mut self, root: &Node) {
        let mut bad = Vec::new();
        let mut unknown = Vec::new();
        collect_templates(root, "", &mut |path, node, s| {
            if let Err(e) = crate::template::check_syntax(s) {
                let msg = match e {
                    crate::template::TemplateError::Syntax { message, .. } => message,
                    other => other.to_string(),
                };
                bad.push((node.span, path.to_string(), msg));
            } else {
                let names = crate::template::unknown_names(s);
                if !names.is_empty() {
                    unknown.push((node, path.to_string(), names));
                }
            }
        });
        for (node, path, names) in unknown {
            self.unknown_filters(node, &path, &names);
        }
        for (span, path, msg) in bad {
            let one_line: String = msg.lines().next().unwrap_or("").to_string();
            self.err(
                Code::E036,
                span,
                &path,
                format!("template does not parse: {one_line}"),
                "check the `{{ }}` / `{% %}` / `{# #}` syntax (Jinja)",
            );
        }
        self.unknown_roots(root);
        self.unknown_workload_keys(root);
        self.loop_reads(root);
    }

    /// E049 for each filter or test `names` that template `node` (at
    /// `path`) applies and the engine lacks: the render fails when it
    /// reaches it.
    pub(super) fn unknown_filters(
        &mut self,
        node: &Node,
        path: &str,
        names: &[crate::template::UnknownName],
    ) {
        for n in names {
            let kind = n.kind.as_str();
            let known = match n.kind {
                crate::template::NameKind::Filter => TEMPLATE_FILTERS,
                crate::template::NameKind::Test => TEMPLATE_TESTS,
            };
            let help = match closest(&n.name, known).or_else(|| alias_of(&n.name)) {
                Some(c) => format!(
                    "did you mean `{c}`? documented {kind}s (docs/dsl.md \"Templates\"): {}",
                    known.join(", ")
                ),
                None => format!(
                    "documented {kind}s (docs/dsl.md \"Templates\"): {}",
                    known.join(", ")
                ),
            };
            self.err(
                Code::E049,
                node.span,
                path,
                format!(
                    "unknown {kind} `{}`: the template fails when it is rendered",
                    n.name
                ),
                &help,
            );
        }
    }

    /// W106: a template reads `workload.<key>` when the playbook declares
    /// its workload and `<key>` is not in it (`workload.treshold` for
    /// `threshold`): a condition reads it as undefined (false), silently.
    /// A playbook without a `workload` takes every key from the request,
    /// and is not checked.
    fn unknown_workload_keys(&mut self, root: &Node) {
        let Some(w) = root.get("workload").filter(|w| !w.entries().is_empty()) else {
            return;
        };
        let keys: Vec<&str> = w.entries().iter().map(|(k, _)| k.name.as_str()).collect();
        let mut found = Vec::new();
        collect_templates(root, "", &mut |path, node, s| {
            if path.starts_with("/workload") {
                return;
            }
            for p in crate::template::referenced_paths(s) {
                let Some(key) = p
                    .strip_prefix("workload.")
                    .map(|k| k.split('.').next().unwrap_or(k))
                else {
                    continue;
                };
                if !keys.contains(&key) && !guarded(s, key) {
                    found.push((node.span, path.to_string(), key.to_string()));
                }
            }
        });
        for (span, path, key) in found {
            let help = match closest(&key, &keys) {
                Some(c) => format!("did you mean `workload.{c}`? workload keys: {}", allowed_list(&keys)),
                None => format!("workload keys: {}; a value that only comes with the request (`--set {key}=...`): declare it in `workload` with a default", allowed_list(&keys)),
            };
            self.warn(
                Code::W106,
                span,
                &path,
                format!("template reads `workload.{key}`, and the playbook's `workload` has no key `{key}`: it is undefined (false in a condition) unless the request sets it"),
                &help,
            );
        }
    }

    /// W106: a template reads a top-level name that is neither a runtime
    /// variable nor the name of a step, nor, inside a step's pipeline, of
    /// one of its tasks (`{{ api_url }}` for `{{ workload.api_url }}`). At
    /// run time a value template fails on it and a condition reads it as
    /// undefined (false), so say so now. W108: a task reads the result of
    /// a task that cannot have run before it (docs/dsl.md "Runtime
    /// variables").
    fn unknown_roots(&mut self, root: &Node) {
        let mut known: BTreeSet<String> = RUNTIME_VARIABLES.iter().map(|v| v.to_string()).collect();
        let steps: &[Node] = root.get("workflow").map(Node::items).unwrap_or_default();
        known.extend(
            steps
                .iter()
                .filter_map(|s| s.get("step").and_then(Node::as_str))
                .map(str::to_string),
        );
        let pipelines: Vec<Pipeline> = steps.iter().map(Pipeline::of).collect();
        // A workbook task runs inside whichever pipeline calls it.
        let mut everywhere = known.clone();
        crate::names::collect_names(root, &mut everywhere);
        let unknown = unknown_reads(Reads {
            root,
            known: &known,
            everywhere: &everywhere,
            pipelines: &pipelines,
        });
        let options: Vec<&str> = known.iter().map(String::as_str).collect();
        let written: BTreeSet<String> = (root.get("workflow"))
            .map(crate::names::bare_set_keys)
            .unwrap_or_default();
        let workload: BTreeSet<&str> = root
            .get("workload")
            .map(|w| w.entries().iter().map(|(k, _)| k.name.as_str()).collect())
            .unwrap_or_default();
        for UnknownRead {
            span,
            path,
            name,
            reader,
            guarded,
        } in unknown
        {
            // Read knowing it may be missing (`x is defined`,
            // `x | default(...)`): undefined at run time, not refused; still
            // named when it looks like a typo of a known name.
            if guarded
                && (reader.is_some()
                    || (!workload.contains(name.as_str()) && !typo_of_one(&name, &options)))
            {
                continue;
            }
            if let Some(ti) = reader {
                let (si, _, _) = pipeline_position(&path).unwrap_or_default();
                let p = &pipelines[si];
                let reader = p.tasks.get(ti).map(String::as_str).unwrap_or("?");
                let what = if reader == name {
                    "its own result"
                } else {
                    "the result of a later task"
                };
                self.warn(
                    Code::W108,
                    span,
                    &path,
                    format!("task `{reader}` of step `{}` reads `{name}`, {what}: no task of the pipeline jumps, so it has not run yet and is undefined (null)", p.step),
                    "read an earlier task of the pipeline by name, `_prev` for the previous one, or `outcome.result` in the task's own policy",
                );
                continue;
            }
            if workload.contains(name.as_str()) {
                // It resolves (workload keys are readable bare, lowest
                // precedence), but the canonical spelling says where from.
                self.warn(
                    Code::W107,
                    span,
                    &path,
                    format!("template reads the workload value `{name}` bare"),
                    &format!("write `workload.{name}`: a step, task or runtime variable of that name would shadow it (`noetl migrate` rewrites it)"),
                );
                continue;
            }
            let help = HelpFor {
                steps,
                pipelines: &pipelines,
                options: &options,
                written: &written,
            }
            .help(&name, &path);
            self.warn(
                Code::W106,
                span,
                &path,
                format!("template reads `{name}`, which is not a runtime variable, step or task"),
                &help,
            );
        }
    }
}

/// A template's read of a name the validator does not know.
struct UnknownRead {
    span: Span,
    path: String,
    name: String,
    /// Inside a pipeline: the reading task, when the name is a task that
    /// cannot have run before it (W108).
    reader: Option<usize>,
    /// The template tests the name for being defined.
    guarded: bool,
}

/// What [`unknown_reads`] checks the templates against.
struct Reads<'a> {
    root: &'a Node,
    /// Runtime variables and step names.
    known: &'a BTreeSet<String>,
    /// Those and every task name (a workbook task's templates).
    everywhere: &'a BTreeSet<String>,
    pipelines: &'a [Pipeline],
}

/// Every read of a name no template may read where it is.
fn unknown_reads(r: Reads<'_>) -> Vec<UnknownRead> {
    let mut unknown = Vec::new();
    collect_templates(r.root, "", &mut |path, node, s| {
        let guarded = crate::template::guarded_roots(s);
        for name in crate::template::referenced_roots(s) {
            let at = pipeline_position(path);
            if let Some((si, ti, in_policy)) = at {
                if let Some(p) = r.pipelines.get(si) {
                    if let Some(k) = p.tasks.iter().position(|t| *t == name) {
                        // Itself in its own policy: the outcome just
                        // produced; an earlier task, or any task when a
                        // jump may run it first: a result that may be set.
                        if !(k < ti || (k == ti && in_policy) || p.jumps) {
                            let g = guarded.contains(&name);
                            unknown.push(UnknownRead {
                                span: node.span,
                                path: path.to_string(),
                                name,
                                reader: Some(ti),
                                guarded: g,
                            });
                        }
                        continue;
                    }
                }
            }
            let seen = if path.starts_with("/workbook") {
                r.everywhere
            } else {
                r.known
            };
            if !seen.contains(&name) && !super::cursor::binds(path, &name) {
                let g = guarded.contains(&name);
                unknown.push(UnknownRead {
                    span: node.span,
                    path: path.to_string(),
                    name,
                    reader: None,
                    guarded: g,
                });
            }
        }
    });
    unknown
}

/// What the W106 help line of an unknown name knows of the playbook.
struct HelpFor<'a> {
    steps: &'a [Node],
    pipelines: &'a [Pipeline],
    /// The names a template may read anywhere.
    options: &'a [&'a str],
    /// The names a `set` of the playbook writes bare.
    written: &'a BTreeSet<String>,
}

impl HelpFor<'_> {
    /// The help of unknown name `name`, read by the template at `path`.
    fn help(&self, name: &str, path: &str) -> String {
        let owner = (self.pipelines.iter()).find(|p| p.tasks.iter().any(|t| t == name));
        match (owner, closest(name, self.options)) {
            _ if iterator_of(self.steps, path) == Some(name) => format!(
                "`{name}` is the loop's iterator: its element is `iter.{name}` (`noetl migrate` rewrites the bare name)"
            ),
            _ if self.written.contains(name) => format!(
                "`{name}` is written by a `set` of the playbook into `ctx`: read it as `ctx.{name}` (`noetl migrate` rewrites the bare name)"
            ),
            _ if name == "loop_index" && iterator_of(self.steps, path).is_some() => {
                "the iteration's index is `iter.index` (or `loop.index`; `noetl migrate` rewrites NoETL's `loop_index`)".to_string()
            }
            (Some(p), _) => format!("`{name}` is a task of step `{}`: a task's result is read by name only inside its own pipeline; elsewhere read the step's result (`{}`)", p.step, p.step),
            (None, Some(c)) => format!("did you mean `{c}`? runtime variables: {}; or a step name", allowed_list(RUNTIME_VARIABLES)),
            (None, None) => format!("runtime variables: {}; or a step name (e.g. `workload.{name}` for a workload value)", allowed_list(RUNTIME_VARIABLES)),
        }
    }
}

/// Whether `name` is one slip from one of `options`: a letter added,
/// dropped or changed (names of 4 letters or more), or two swapped
/// (`wrokload`). Looser than [`closest`]'s suggestion: it decides whether
/// a name read knowing it may be missing is still worth a warning.
fn typo_of_one(name: &str, options: &[&str]) -> bool {
    options.iter().any(|o| {
        let (a, b): (Vec<char>, Vec<char>) = (name.chars().collect(), o.chars().collect());
        if a.len() == b.len() {
            let differ: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
            return match differ[..] {
                [_] => a.len() >= 4,
                [i, j] => j == i + 1 && a[i] == b[j] && a[j] == b[i],
                _ => false,
            };
        }
        a.len() >= 4 && super::distance(name, o) == 1
    })
}

/// The `loop.iterator` of the step whose task or `set` the template at
/// `path` is in (not its arcs or `loop` block, which run outside an
/// iteration).
fn iterator_of<'a>(steps: &'a [Node], path: &str) -> Option<&'a str> {
    let mut parts = path.strip_prefix("/workflow/")?.split('/');
    let step = steps.get(parts.next()?.parse::<usize>().ok()?)?;
    if !matches!(parts.next()?, "tool" | "set") {
        return None;
    }
    step.get("loop")?.get("iterator")?.as_str()
}

/// True when every read of `workload.<key>` in `src` is meant to find it
/// missing: `| default(...)`, `is defined`, `is not defined`.
fn guarded(src: &str, key: &str) -> bool {
    let name = format!("workload.{key}");
    src.match_indices(&name).all(|(at, _)| {
        let rest = &src[at + name.len()..];
        let next = rest.chars().next();
        if next.is_some_and(|c| c == '_' || c.is_ascii_alphanumeric()) {
            return true; // a longer name, read on its own
        }
        let rest = rest.trim_start();
        let filter = rest.strip_prefix('|').map(str::trim_start);
        filter.is_some_and(|f| {
            f.starts_with("default")
                || f.starts_with("d(")
                || f == "d"
                || f.starts_with("d }")
                || f.starts_with("d}")
        }) || rest.starts_with("is defined")
            || rest.starts_with("is not defined")
    })
}

/// One step's pipeline as the name checks see it.
struct Pipeline {
    step: String,
    /// Task names, in pipeline order.
    tasks: Vec<String>,
    /// Some task policy of the pipeline jumps (a task may then run again,
    /// or after a later one).
    jumps: bool,
}

impl Pipeline {
    fn of(step: &Node) -> Self {
        let tasks: &[Node] = step.get("tool").map(Node::items).unwrap_or_default();
        let jumps = tasks.iter().any(|t| {
            t.pointer("/spec/policy/rules")
                .map(Node::items)
                .unwrap_or_default()
                .iter()
                .any(|r| r.pointer("/then/do").and_then(Node::as_str) == Some("jump"))
        });
        Self {
            step: step
                .get("step")
                .and_then(Node::as_str)
                .unwrap_or("?")
                .to_string(),
            tasks: tasks
                .iter()
                .map(|t| {
                    t.get("name")
                        .and_then(Node::as_str)
                        .unwrap_or("")
                        .to_string()
                })
                .collect(),
            jumps,
        }
    }
}

/// `(step index, task index, inside the task's spec.policy)` of a JSON
/// pointer inside a pipeline task (`/workflow/<i>/tool/<j>/...`).
fn pipeline_position(path: &str) -> Option<(usize, usize, bool)> {
    let mut parts = path.strip_prefix("/workflow/")?.split('/');
    let si = parts.next()?.parse().ok()?;
    if parts.next()? != "tool" {
        return None;
    }
    let ti = parts.next()?.parse().ok()?;
    let in_policy = parts.next() == Some("spec") && parts.next() == Some("policy");
    Some((si, ti, in_policy))
}

/// True when `key` of the mapping `n` is a raw field of the task `n` is
/// ([`crate::tool::KINDS`]: python `code`, an inline child `playbook`):
/// its text is passed on unrendered, so braces in it are not templates of
/// this playbook. Every other string with `{{`, `{%` or `{#` is.
fn is_raw_field(n: &Node, key: &str) -> bool {
    let Some(kind) = n.get("kind").and_then(Node::as_str) else {
        return false;
    };
    crate::tool::raw_fields(kind).contains(&key)
}

/// The filters templates have (docs/dsl.md "Templates"), for messages.
const TEMPLATE_FILTERS: &[&str] = &[
    "default",
    "d",
    "int",
    "float",
    "string",
    "tojson",
    "fromjson",
    "length",
    "lower",
    "upper",
    "trim",
    "replace",
    "join",
    "first",
    "last",
    "list",
    "keys",
    "values",
    "items",
    "round",
    "abs",
    "min",
    "max",
    "sum",
    "unique",
    "sort",
    "b64encode",
    "b64decode",
    "urlencode",
];

/// The tests templates have (docs/dsl.md "Templates"), for messages.
const TEMPLATE_TESTS: &[&str] = &[
    "defined",
    "undefined",
    "none",
    "number",
    "string",
    "mapping",
    "sequence",
];

/// The filter a name from other template engines stands for here.
fn alias_of(name: &str) -> Option<&'static str> {
    match name {
        "to_json" | "json" | "to_nice_json" => Some("tojson"),
        "from_json" => Some("fromjson"),
        "dict2items" => Some("items"),
        "count" | "len" => Some("length"),
        _ => None,
    }
}

pub(super) fn collect_templates<'a>(
    n: &'a Node,
    path: &str,
    f: &mut dyn FnMut(&str, &'a Node, &str),
) {
    match &n.kind {
        NodeKind::Str(s) if crate::template::is_template(s) => f(path, n, s),
        NodeKind::Seq(items) => {
            for (i, x) in items.iter().enumerate() {
                collect_templates(x, &format!("{path}/{i}"), f);
            }
        }
        NodeKind::Map(entries) => {
            for (k, v) in entries {
                if is_raw_field(n, &k.name) {
                    continue;
                }
                collect_templates(v, &format!("{path}/{}", escape(&k.name)), f);
            }
        }
        _ => {}
    }
}
