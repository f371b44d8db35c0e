//! `noetl migrate`: keychain declarations for the credentials a NoETL
//! playbook names by `auth` (docs/migrate.md, "Credentials").
//!
//! NoETL looks a task's `auth: pg_k8s` up on its server by name; here a
//! playbook declares the credentials it uses in its root `keychain` (only
//! declared entries are decrypted, docs/security.md). Every name a postgres
//! or nats task (a transfer's side, a cursor loop) gives, as written or
//! through a workload default (`auth: "{{ workload.pg_auth }}"`), gets an
//! entry of the kind that tool reads, appended to `keychain` (made when
//! there is none).

use std::collections::BTreeMap;

use crate::edits::{entry_end, line_start, Edits};
use crate::walk::{steps, tasks};
use noetl_core::yaml::Node;

/// The keychain kind the tool `kind` reads its `auth` as, when it reads
/// one kind only.
fn credential_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "postgres" => Some("postgres_credential"),
        "nats" => Some("secret"),
        _ => None,
    }
}

/// One credential to declare: its kind and where it was first named.
struct Wanted {
    kind: &'static str,
    line: usize,
    who: String,
}

/// The credential name an `auth` value gives before the run: the text
/// itself, or the workload default it reads (`{{ workload.x }}` or
/// `{{ x }}`). `Err` holds the template when it is computed at run time.
fn auth_name<'a>(auth: &'a Node, workload: Option<&'a Node>) -> Result<Option<&'a str>, ()> {
    let Some(text) = auth.as_str() else {
        return Ok(None); // a mapping: the validator says what it is
    };
    let text = text.trim();
    if !text.contains("{{") && !text.contains("{%") {
        return Ok((!text.is_empty()).then_some(text));
    }
    let inner = text
        .strip_prefix("{{")
        .and_then(|t| t.strip_suffix("}}"))
        .map(str::trim)
        .ok_or(())?;
    let var = inner.strip_prefix("workload.").unwrap_or(inner);
    if var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(());
    }
    match workload.and_then(|w| w.get(var)).and_then(Node::as_str) {
        Some(name) if !name.contains("{{") && !name.trim().is_empty() => Ok(Some(name.trim())),
        _ => Err(()),
    }
}

/// NoETL's `kind: credential` entry (the credential registered on its
/// server under the name `credential` gives) becomes an entry of this
/// engine's store under the entry's own name: `postgres_credential` when a
/// postgres task (a transfer's side, a cursor loop) reads it by `auth`,
/// else `secret` (any fields: `{{ keychain.NAME.field }}` reads them as
/// before). The report names the credential to store and the command.
pub(super) fn registered_credentials(root: &Node, e: &mut Edits) {
    let workload = root.get("workload");
    for entry in root.get("keychain").map(Node::items).unwrap_or_default() {
        let Some((_, kind)) = entry
            .entry("kind")
            .filter(|(_, v)| v.as_str() == Some("credential"))
        else {
            continue;
        };
        let Some(name) = entry.get("name").and_then(Node::as_str) else {
            continue; // the validator says the entry has no name
        };
        let wanted = if read_as_postgres(root, name) {
            "postgres_credential"
        } else {
            "secret"
        };
        let source = match entry.get("credential").map(|c| auth_name(c, workload)) {
            Some(Ok(Some(c))) => format!(" `{c}`"),
            _ => String::new(),
        };
        let quoted = e.text[kind.span.offset..].starts_with(['"', '\'']);
        let end = kind.span.offset + "credential".len() + if quoted { 2 } else { 0 };
        e.replace(
            (kind.span.offset, end),
            wanted.into(),
            kind.span.line,
            format!("keychain `{name}`: `kind: credential` (NoETL's registered credential{source}) → `kind: {wanted}`, read from the local store under the entry's name: store it with `noetl credential put {name} --kind {wanted}`"),
        );
    }
}

/// Whether a postgres task, a transfer's postgres side or a cursor loop
/// names the credential `name` by `auth`.
fn read_as_postgres(root: &Node, name: &str) -> bool {
    let names = |n: &Node| n.get("auth").and_then(Node::as_str).map(str::trim) == Some(name);
    let postgres = |n: &Node, field: &str| n.get(field).and_then(Node::as_str) == Some("postgres");
    tasks(root).iter().any(|(t, _)| {
        (postgres(t, "kind") && names(t))
            || ["source", "target"]
                .iter()
                .filter_map(|side| t.get(side))
                .any(|s| postgres(s, "tool") && names(s))
    }) || steps(root).any(|(s, _)| {
        s.get("loop")
            .and_then(|l| l.get("cursor"))
            .is_some_and(names)
    })
}

/// Declare in `keychain` each credential a task names by `auth` and the
/// playbook does not declare.
pub(super) fn declarations(root: &Node, e: &mut Edits) {
    let wanted = undeclared(root, e);
    let declared = Collector::new(root).declared;
    let inline = crate::inline_auth::rewrite(root, e, &declared);
    if wanted.is_empty() && inline.is_empty() {
        return;
    }
    let Some((at, header, indent)) = insertion_point(root, e) else {
        return;
    };
    let pad = " ".repeat(indent);
    for (i, entry) in inline.iter().enumerate() {
        let fields: String = entry
            .fields
            .iter()
            .map(|f| format!("{pad}  {f}\n"))
            .collect();
        e.replace_quietly(
            (at, at),
            format!(
                "{}{pad}- name: {}\n{pad}  kind: {}\n{fields}",
                if i == 0 { header.as_str() } else { "" },
                crate::snippets::yaml_scalar(&entry.name),
                entry.kind
            ),
        );
    }
    let header = if inline.is_empty() {
        header
    } else {
        String::new()
    };
    for (i, (name, w)) in wanted.iter().enumerate() {
        let entry = format!(
            "{}{pad}- name: {}\n{pad}  kind: {}\n",
            if i == 0 { header.as_str() } else { "" },
            crate::snippets::yaml_scalar(name),
            w.kind
        );
        e.replace(
            (at, at),
            entry,
            w.line,
            format!(
                "{}: `auth: {name}` → declared in `keychain` (kind {})",
                w.who, w.kind
            ),
        );
    }
}

/// The credentials the playbook's tasks and cursor loops name by `auth`
/// and `keychain` does not declare, by name. A name read as two kinds, or
/// one computed at run time, is refused instead.
fn undeclared(root: &Node, e: &mut Edits) -> BTreeMap<String, Wanted> {
    let mut collector = Collector::new(root);
    for (t, name) in tasks(root) {
        let tool = t.get("kind").and_then(Node::as_str).unwrap_or_default();
        if let (Some(kind), Some(auth)) = (credential_kind(tool), t.get("auth")) {
            collector.want(e, auth, kind, format!("task `{name}`"));
        }
        if tool == "transfer" {
            for side in ["source", "target"] {
                let Some(s) = t.get(side) else { continue };
                let side_tool = s.get("tool").and_then(Node::as_str).unwrap_or_default();
                if let (Some(kind), Some(auth)) = (credential_kind(side_tool), s.get("auth")) {
                    collector.want(e, auth, kind, format!("task `{name}` ({side})"));
                }
            }
        }
    }
    for (s, name) in steps(root) {
        if let Some(auth) = s
            .get("loop")
            .and_then(|l| l.get("cursor"))
            .and_then(|c| c.get("auth"))
        {
            collector.want(
                e,
                auth,
                "postgres_credential",
                format!("the cursor loop of step `{name}`"),
            );
        }
    }
    collector.wanted
}

/// The credentials to declare, as the tasks naming them are read.
struct Collector<'a> {
    /// The names `keychain` declares.
    declared: Vec<&'a str>,
    /// The root `workload` (defaults an `auth` template may read).
    workload: Option<&'a Node>,
    /// By name, the credentials to declare so far.
    wanted: BTreeMap<String, Wanted>,
}

impl<'a> Collector<'a> {
    fn new(root: &'a Node) -> Self {
        let declared: Vec<&str> = root
            .get("keychain")
            .map(Node::items)
            .unwrap_or_default()
            .iter()
            .filter_map(|k| k.get("name").and_then(Node::as_str))
            .collect();
        Self {
            declared,
            workload: root.get("workload"),
            wanted: BTreeMap::new(),
        }
    }

    /// The credential `auth` names, read as a `kind` by `who`.
    fn want(&mut self, e: &mut Edits, auth: &Node, kind: &'static str, who: String) {
        match auth_name(auth, self.workload) {
            Ok(Some(name)) if !self.declared.contains(&name) => match self.wanted.get(name) {
                Some(w) if w.kind != kind => e.refuse(
                    auth.span.line,
                    format!("{who}: `auth: {name}` is read as a {kind} here and as a {} by {}: declare `{name}` in `keychain` yourself", w.kind, w.who),
                ),
                Some(_) => {}
                None => {
                    self.wanted.insert(
                        name.to_string(),
                        Wanted {
                            kind,
                            line: auth.span.line,
                            who,
                        },
                    );
                }
            },
            Ok(_) => {}
            Err(()) => e.refuse(
                auth.span.line,
                format!("{who}: its `auth` names the credential at run time: declare that credential in `keychain` (`- {{name: NAME, kind: {kind}}}`)"),
            ),
        }
    }
}

/// Where the new entries go: `(offset, text before the first entry,
/// indent of an entry's dash)`. Appended to a block `keychain:` list, or a
/// list added before `workflow:`; `None` (refused, or no `workflow`) when
/// neither is possible.
fn insertion_point(root: &Node, e: &mut Edits) -> Option<(usize, String, usize)> {
    let text = e.text;
    match root.entry("keychain") {
        Some((k, v)) if v.is_seq() && !v.items().is_empty() => {
            let first = &v.items()[0];
            let dash = line_start(text, first.span.offset);
            let indent = text[dash..].len() - text[dash..].trim_start_matches(' ').len();
            if !text[dash..].trim_start_matches(' ').starts_with("- ") {
                e.refuse(k.span.line, "`keychain` is a flow list: add the entries `noetl migrate` would declare yourself".into());
                return None;
            }
            Some((entry_end(text, k.span.offset), String::new(), indent))
        }
        Some((k, _)) => {
            e.refuse(k.span.line, "`keychain` is empty or not a list: declare the credentials the tasks name by `auth` there".into());
            None
        }
        None => {
            let (w, _) = root.entry("workflow")?;
            Some((
                line_start(text, w.span.offset),
                "keychain:\n".to_string(),
                2,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::migrate;

    fn playbook(rest: &str) -> String {
        format!("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{ name: t }}\n{rest}")
    }

    #[test]
    fn credentials_named_by_auth_are_declared_with_their_tool_s_kind() {
        let m = migrate(&playbook(
            "workload:\n  pg_auth: pg_local\nworkflow:\n  - step: start\n    tool:\n      - name: q\n        kind: postgres\n        auth: \"{{ workload.pg_auth }}\"\n        command: select 1\n      - name: k\n        kind: nats\n        auth: nats_credential\n        operation: kv_get\n      - name: again\n        kind: postgres\n        auth: pg_local\n        command: select 2\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("workload:\n  pg_auth: pg_local\nkeychain:\n  - name: nats_credential\n    kind: secret\n  - name: pg_local\n    kind: postgres_credential\nworkflow:\n"),
            "{}",
            m.text
        );
        let report = m.report();
        assert!(
            report.contains(&(
                11,
                "task `q`: `auth: pg_local` → declared in `keychain` (kind postgres_credential)"
                    .into()
            )),
            "{report:?}"
        );
        assert!(
            report.contains(&(
                15,
                "task `k`: `auth: nats_credential` → declared in `keychain` (kind secret)".into()
            )),
            "{report:?}"
        );
        // A second run changes nothing.
        let again = migrate(&m.text).unwrap();
        assert_eq!(again.text, m.text);
    }

    #[test]
    fn a_registered_credential_is_read_from_the_store_under_the_entry_s_name() {
        let m = migrate(&playbook(
            "workload:\n  which: auth0_client\nkeychain:\n  - name: auth0\n    kind: credential\n    credential: \"{{ which }}\"\n  - name: pg\n    kind: credential\n    credential: pg_main\nworkflow:\n  - step: start\n    tool:\n      - name: q\n        kind: postgres\n        auth: pg\n        command: select 1\n      - name: h\n        kind: http\n        url: \"https://x/{{ keychain.auth0.client_secret }}\"\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("  - name: auth0\n    kind: secret\n")
                && m.text
                    .contains("  - name: pg\n    kind: postgres_credential\n"),
            "{}",
            m.text
        );
        let report = m.report();
        assert!(
            report.contains(&(8, "keychain `auth0`: `kind: credential` (NoETL's registered credential `auth0_client`) → `kind: secret`, read from the local store under the entry's name: store it with `noetl credential put auth0 --kind secret`".into())),
            "{report:?}"
        );
        assert!(noetl_core::load::load_playbook(&m.text, "t").is_ok());
        assert_eq!(migrate(&m.text).unwrap().text, m.text);
    }

    #[test]
    fn an_existing_keychain_gets_the_missing_entries_and_templates_are_refused() {
        let m = migrate(&playbook(
            "keychain:\n  - name: api\n    kind: bearer\nworkflow:\n  - step: start\n    tool:\n      - name: q\n        kind: postgres\n        auth: pg_k8s\n        command: select 1\n      - name: r\n        kind: postgres\n        auth: \"{{ ctx.which }}\"\n        command: select 1\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("keychain:\n  - name: api\n    kind: bearer\n  - name: pg_k8s\n    kind: postgres_credential\nworkflow:"),
            "{}",
            m.text
        );
        assert_eq!(m.refusals.len(), 1, "{:?}", m.refusals);
        assert!(m.refusals[0]
            .why
            .contains("names the credential at run time"));
    }
}
