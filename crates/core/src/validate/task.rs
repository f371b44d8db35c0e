//! A step's `tool` pipeline and each task body (pipeline and workbook
//! tasks alike): its `kind`, the fields its tool reads, its `script`, its
//! `spec`; the policy has a module of its own.

use std::collections::HashMap;

use super::task_policy::PolicyScope;
use super::{allowed_list, closest, Validator};
use crate::codes::Code;
use crate::yaml::{escape, Node, NodeKind};

/// Task keys of older DSLs, refused with their own codes (E011-E016).
const LEGACY_TASK_KEYS: &[&str] = &["eval", "expr", "sink", "case"];

/// Names people write for a tool kind, and the kind they mean.
const KIND_ALIASES: &[(&str, &str)] = &[
    ("pg", "postgres"),
    ("postgresql", "postgres"),
    ("psql", "postgres"),
    ("py", "python"),
    ("python3", "python"),
    ("sh", "shell"),
    ("bash", "shell"),
    ("https", "http"),
    ("rest", "http"),
    ("duck", "duckdb"),
];

/// The known kind an unknown `kind` most likely means: a common alias,
/// the closest name, or the one it begins.
fn kind_suggestion<'a>(kind: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = kind.to_ascii_lowercase();
    KIND_ALIASES
        .iter()
        .find(|(alias, _)| *alias == lower)
        .and_then(|(_, k)| known.iter().find(|x| *x == k).copied())
        .or_else(|| closest(&lower, known))
        .or_else(|| {
            known
                .iter()
                .find(|k| lower.len() >= 2 && (k.starts_with(&lower) || lower.starts_with(**k)))
                .copied()
        })
}

impl Validator {
    /// A step's `tool`: a non-empty list of uniquely named tasks (E034,
    /// E037), each valid. `parallel`: `Some(reduced ctx keys)` inside a
    /// parallel loop.
    pub(super) fn tool(
        &mut self,
        tool: &Node,
        path: &str,
        step: &str,
        parallel: Option<&[String]>,
    ) {
        let tasks = match &tool.kind {
            NodeKind::Seq(t) => t,
            NodeKind::Null => {
                self.err(
                    Code::E037,
                    tool.span,
                    path,
                    format!("step `{step}` has an empty `tool`"),
                    "add a task, or remove `tool` for a routing-only step",
                );
                return;
            }
            _ => {
                self.err(Code::E004, tool.span, path, format!("`tool` of step `{step}` must be a list of tasks or one task with `kind`, found {}", tool.type_name()), "write `tool: [ {name: t, kind: noop} ]`");
                return;
            }
        };
        if tasks.is_empty() {
            self.err(
                Code::E037,
                tool.span,
                path,
                format!("step `{step}` has an empty `tool` list"),
                "add a task, or remove `tool` for a routing-only step",
            );
            return;
        }
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, t) in tasks.iter().enumerate() {
            if let Some(n) = t.get("name").and_then(Node::as_str) {
                if let Some(first) = names.get(n) {
                    let line = tasks[*first].span.line;
                    self.err(
                        Code::E034,
                        t.get("name").map(|x| x.span).unwrap_or(t.span),
                        &format!("{path}/{i}/name"),
                        format!(
                            "duplicate task name `{n}` in step `{step}` (first at line {line})"
                        ),
                        "task names are jump targets: make them unique in the pipeline",
                    );
                } else {
                    names.insert(n.to_string(), i);
                }
            }
        }
        // In pipeline order (the help lists them).
        let mut ordered: Vec<(&str, usize)> = names.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        ordered.sort_by_key(|(_, i)| *i);
        let labels: Vec<&str> = ordered.into_iter().map(|(k, _)| k).collect();
        for (i, t) in tasks.iter().enumerate() {
            let tp = format!("{path}/{i}");
            let tname = t.get("name").and_then(Node::as_str).unwrap_or("?");
            self.task(
                t,
                &tp,
                tname,
                &format!("task `{tname}` of step `{step}`"),
                Some(&labels),
                parallel,
            );
        }
    }

    /// One task body (a pipeline task or a root `workbook` task): a mapping
    /// with a tool `kind`, no legacy keys, a valid policy. `name` is its
    /// name when the body has no `name:` (a workbook `tasks:` key), `whose`
    /// names it in messages; `labels` are the jump targets (`None` for
    /// workbook tasks, whose targets are checked at each call site).
    pub(super) fn task(
        &mut self,
        t: &Node,
        tp: &str,
        name: &str,
        whose: &str,
        labels: Option<&[&str]>,
        parallel: Option<&[String]>,
    ) {
        if !self.expect_map(t, tp, "a task") {
            return;
        }
        let tname = t.get("name").and_then(Node::as_str).unwrap_or(name);
        let workbook_task = labels.is_none();
        if t.get("kind").is_none() {
            if let Some((k, _)) = t.entries().iter().find(|(k, _)| sugar(&k.name).is_some()) {
                let (msg, help) = sugar(&k.name).unwrap_or_default();
                self.err(Code::E047, k.span, &format!("{tp}/{}", escape(&k.name)), format!("{whose} uses the authoring sugar `{}` ({msg}), which this engine does not compile", k.name), help);
                return;
            }
        }
        match t.get("kind") {
            None => self.err(Code::E003, t.span, tp, format!("{whose} has no `kind`"), "add `kind: noop` (or python, http, postgres...)"),
            Some(k) => match k.as_str() {
                Some("sink") => self.err(Code::E016, k.span, &format!("{tp}/kind"), "`sink` is not a tool kind in v10".into(), "storage is just a tool (postgres, http...) that writes and returns a reference"),
                Some("workbook") if workbook_task => self.err(Code::E004, k.span, &format!("{tp}/kind"), format!("{whose} has kind `workbook`: a workbook task cannot call another"), "give it the tool kind that does the work, e.g. `kind: python`"),
                Some(s) if !s.is_empty() => self.tool_kind(s, k.span, &format!("{tp}/kind"), whose),
                _ => self.err(Code::E004, k.span, &format!("{tp}/kind"), "`kind` must be a tool kind name".into(), "e.g. `kind: python`"),
            },
        }
        for (k, _) in t.entries() {
            let kp = format!("{tp}/{}", escape(&k.name));
            match k.name.as_str() {
                "eval" => self.err(
                    Code::E011,
                    k.span,
                    &kp,
                    format!("legacy `eval` in {whose}"),
                    "use `spec.policy.rules` (`- when: ... then: {do: ...}`)",
                ),
                "expr" => self.err(
                    Code::E012,
                    k.span,
                    &kp,
                    format!("`expr` in {whose}"),
                    "use `when` inside `spec.policy.rules`",
                ),
                "sink" => self.err(
                    Code::E016,
                    k.span,
                    &kp,
                    format!("`sink` in {whose} is not a special block in v10"),
                    "add a storage tool task that writes and returns a reference",
                ),
                "case" => self.err(
                    Code::E013,
                    k.span,
                    &kp,
                    format!("`case` in {whose}"),
                    "use `spec.policy.rules`",
                ),
                _ => {}
            }
        }
        if let Some(k) = t
            .get("kind")
            .and_then(Node::as_str)
            .and_then(crate::tool::kind)
        {
            self.tool_fields(t, tp, whose, k);
            self.field_rules(t, tp, whose, k.name, workbook_task);
            if k.name == "http" {
                self.http_literals(t, tp, whose);
            }
        }
        if let Some(spec) = t.get("spec") {
            if self.expect_map(spec, &format!("{tp}/spec"), "`task.spec`") {
                if let Some(timeout) = spec.get("timeout") {
                    self.task_timeout(timeout, &format!("{tp}/spec/timeout"));
                }
                if let Some(policy) = spec.get("policy") {
                    let scope = PolicyScope {
                        task: tname,
                        kind: t.get("kind").and_then(Node::as_str),
                        labels,
                        parallel,
                    };
                    self.task_policy(policy, &format!("{tp}/spec/policy"), &scope);
                }
            }
        }
    }

    /// A task's `kind` names a kind this engine runs: one NoETL has that
    /// needs a cloud service is refused saying so (E007), any other
    /// unknown name with the closest known kind (E006). Either would
    /// otherwise wait at run time for an executor that never comes.
    fn tool_kind(&mut self, kind: &str, span: crate::yaml::Span, path: &str, whose: &str) {
        if crate::tool::task_kinds().any(|k| k == kind) {
            return;
        }
        if let Some(u) = crate::tool::unavailable(kind) {
            self.err(
                Code::E007,
                span,
                path,
                format!(
                    "tool kind `{kind}` of {whose} is not available in this engine: it needs {}",
                    u.needs
                ),
                u.instead,
            );
            return;
        }
        let known: Vec<&str> = crate::tool::task_kinds().collect();
        let kinds = allowed_list(&known);
        let help = match kind_suggestion(kind, &known) {
            Some(k) => format!("did you mean `{k}`? tool kinds: {kinds} (docs/tools.md)"),
            None => format!("tool kinds: {kinds} (docs/tools.md)"),
        };
        self.err(
            Code::E006,
            span,
            path,
            format!("unknown tool kind `{kind}` in {whose}"),
            &help,
        );
    }

    /// The fields of a task of the built-in kind `k` (docs/tools.md): none
    /// the tool does not read (E005), each of its type (E004, a template
    /// passes for any type), and the required ones present (E003).
    fn tool_fields(&mut self, t: &Node, tp: &str, whose: &str, k: &crate::tool::Kind) {
        use crate::tool::{fits, TASK_FIELDS};
        let known: Vec<&str> = TASK_FIELDS
            .iter()
            .copied()
            .chain(k.fields.iter().map(|f| f.name))
            .collect();
        for (key, value) in t.entries() {
            let name = key.name.as_str();
            let kp = format!("{tp}/{}", escape(name));
            if name == "auth" && value.is_map() {
                let service = super::seeds::cloud_auth(&value.to_json());
                let (code, message, help) = match service {
                    Some(service) => (Code::E007, format!("`auth` of {whose} resolves from {service}, which this engine does not reach"), "store the credential with `noetl credential put NAME` and name it: `auth: NAME` (declared in `keychain`)"),
                    None => (Code::E004, format!("`auth` of {whose} must be the name of a keychain entry, found a mapping"), "declare the credential in the root `keychain` and name it: `auth: NAME`"),
                };
                self.err(code, value.span, &kp, message, help);
                continue;
            }
            if let Some(f) = k.fields.iter().find(|f| f.name == name) {
                let v = value.to_json();
                if !v.is_null() && !fits(f.ty, &v) {
                    self.err(
                        Code::E004,
                        value.span,
                        &kp,
                        format!(
                            "`{name}` of {whose} must be {}, found {}",
                            f.ty.describe(),
                            value.type_name()
                        ),
                        &format!("`{name}` of a {} task: {}", k.name, f.about),
                    );
                }
                continue;
            }
            // Task keys of other DSLs are reported above with their own codes.
            if TASK_FIELDS.contains(&name) || LEGACY_TASK_KEYS.contains(&name) {
                continue;
            }
            let fields = allowed_list(&known);
            let help = match (name, closest(name, &known)) {
                _ if crate::noetl_fields::tool_field_hint(k.name, name).is_some() => {
                    let hint =
                        crate::noetl_fields::tool_field_hint(k.name, name).unwrap_or_default();
                    format!("{hint}; fields of a {} task: {fields}", k.name)
                }
                ("input" | "inputs" | "with", _) if known.contains(&"args") => {
                    format!(
                        "a {} task takes its inputs as `args` (`noetl migrate` rewrites `{name}`)",
                        k.name
                    )
                }
                (_, Some(c)) => {
                    format!("did you mean `{c}`? fields of a {} task: {fields}", k.name)
                }
                (_, None) => format!("fields of a {} task: {fields} (docs/tools.md)", k.name),
            };
            self.err(
                Code::E005,
                key.span,
                &kp,
                format!("unknown field `{name}` in {whose} (a {} task)", k.name),
                &help,
            );
        }
        let target = crate::script::script_target(k.name);
        if let Some((sk, script)) = t.entry("script").filter(|_| target.is_some()) {
            self.task_script(script, &format!("{tp}/script"), whose, k.name);
            if let Some(field) = target.filter(|f| t.get(f).is_some()) {
                self.err(
                    Code::E004,
                    sk.span,
                    &format!("{tp}/script"),
                    format!("{whose} has both `{field}` and `script`"),
                    &format!("keep one: `script` loads the `{field}` when the task runs"),
                );
            }
        }
        if k.name == "transfer" {
            self.transfer_sides(t, tp, whose);
        }
        for f in k.fields.iter().filter(|f| f.required) {
            let by_script = target == Some(f.name) && t.get("script").is_some();
            if t.get(f.name).is_none() && !by_script {
                self.err(
                    Code::E003,
                    t.span,
                    tp,
                    format!("{whose} (a {} task) has no `{}`", k.name, f.name),
                    &format!("add `{}`: {}", f.name, f.about),
                );
            }
        }
    }

    /// A task's `script` (docs/tools.md, "Scripts"): a source this engine
    /// loads (E004), not one in a cloud store (E007).
    fn task_script(&mut self, script: &Node, path: &str, whose: &str, kind: &str) {
        let Err(e) = crate::script::script_kind(&script.to_json()) else {
            return;
        };
        let code = match e {
            crate::script::ScriptError::Cloud { .. } => Code::E007,
            crate::script::ScriptError::Shape(_) => Code::E004,
        };
        self.err(
            code,
            script.span,
            path,
            format!("{e} ({whose}, a {kind} task)"),
            e.hint(),
        );
    }
}

impl Validator {
    /// A transfer task's sides as written (docs/tools.md, "transfer"): an
    /// unknown tool (E004; one that needs a service this engine does not
    /// reach, E007), an object side's url, format or fields (E004, a
    /// missing one E003), an upsert into an object (E004). Each is reported
    /// at the field it names, else at the nearest node above it.
    fn transfer_sides(&mut self, t: &Node, tp: &str, whose: &str) {
        let Some(config) = t.to_json().as_object().cloned() else {
            return;
        };
        for e in crate::transfer::check_sides(&config) {
            let field = e.field();
            let mut node = t;
            let mut path = tp.to_string();
            for part in field.split('.') {
                match node.get(part) {
                    Some(n) => {
                        node = n;
                        path = format!("{path}/{}", escape(part));
                    }
                    None => break,
                }
            }
            let unavailable = match &e {
                crate::transfer::SideError::Tool { got, .. } => {
                    crate::tool::UNAVAILABLE.iter().find(|u| u.name == got)
                }
                _ => None,
            };
            let (code, help) = match (&e, unavailable) {
                (_, Some(u)) => (
                    Code::E007,
                    format!("a {} side needs {}: {}", u.name, u.needs, u.instead),
                ),
                (crate::transfer::SideError::Missing { .. }, _) => (
                    Code::E003,
                    "an s3 or gcs side names its object: `url: s3://bucket/key.jsonl` (docs/tools.md, \"transfer\")".into(),
                ),
                _ => (
                    Code::E004,
                    format!(
                        "sources: {}; targets: {}; an s3 or gcs side takes url, format (jsonl, json, csv), auth, region, endpoint (docs/tools.md, \"transfer\")",
                        crate::transfer::SOURCE_TOOLS,
                        crate::transfer::TARGET_TOOLS
                    ),
                ),
            };
            self.err(
                code,
                node.span,
                &path,
                format!("{e} ({whose}, a transfer task)"),
                &help,
            );
        }
    }
}

/// The spec's authoring sugar (docs/errors.md#e047): what it is and the
/// canonical form to write instead, or `None` for any other key.
pub(super) fn sugar(key: &str) -> Option<(&'static str, &'static str)> {
    match key {
        "choose" => Some(("a when/then/else ladder", "write a `noop` task whose `spec.policy.rules` `jump` to each branch's first task, each branch ending with a `jump` to the task after the ladder (docs/errors.md#e047)")),
        "while" => Some(("a pre-check loop", "write a `noop` check task whose rule `jump`s past the body when the condition is false, and end the body with a `jump` back to the check (docs/errors.md#e047)")),
        "until" => Some(("a post-check loop", "end the body with a task whose rule `jump`s back to its first task until the condition holds, then `do: continue` (docs/errors.md#e047)")),
        _ => None,
    }
}
