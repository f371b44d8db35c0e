//! The keys of concurrency and rate limits (docs/dsl.md, "Concurrency and
//! rate limits"): a `key` template rendered with the scope it names, or a
//! default that makes one key per playbook (executions) or per step of a
//! playbook (task calls). Plain functions; the mesh enforces the limits.

use crate::model::{Playbook, Step};
use crate::template::{render_text, Scope, TemplateError};

/// The default key of an execution's concurrency: the playbook's catalog
/// path, else its name.
pub fn default_execution_key(playbook: &Playbook) -> String {
    playbook
        .metadata
        .path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| playbook.metadata.name.clone())
}

/// The default key of a step's concurrency or rate: the playbook's path
/// (else its name) and the step's name (`examples/hotels/fetch`).
pub fn default_step_key(playbook: &Playbook, step: &Step) -> String {
    format!("{}/{}", default_execution_key(playbook), step.step)
}

/// The key a limit applies to: `template` rendered with `scope` (plain
/// text is used as written), else `default`.
pub fn render_key(
    template: Option<&str>,
    default: impl FnOnce() -> String,
    scope: &Scope,
) -> Result<String, TemplateError> {
    match template {
        Some(t) => render_text(t, scope),
        None => Ok(default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn playbook(path: Option<&str>) -> Playbook {
        let mut v = json!({
            "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "hotels"},
            "workflow": [{"step": "fetch"}],
        });
        if let Some(p) = path {
            v["metadata"]["path"] = json!(p);
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn keys_default_to_the_playbook_path_or_name_and_the_step() {
        let p = playbook(Some("examples/hotels"));
        assert_eq!(default_execution_key(&p), "examples/hotels");
        assert_eq!(
            default_step_key(&p, &p.workflow[0]),
            "examples/hotels/fetch"
        );
        let p = playbook(None);
        assert_eq!(default_execution_key(&p), "hotels");
        assert_eq!(default_step_key(&p, &p.workflow[0]), "hotels/fetch");
    }

    #[test]
    fn a_key_template_renders_with_its_scope() {
        let scope = Scope::new().workload(json!({"customer": "acme"}));
        let k = render_key(Some("cust-{{ workload.customer }}"), || "d".into(), &scope);
        assert_eq!(k.unwrap(), "cust-acme");
        assert_eq!(
            render_key(Some("api"), || "d".into(), &scope).unwrap(),
            "api"
        );
        assert_eq!(render_key(None, || "d".into(), &scope).unwrap(), "d");
        assert!(render_key(Some("{{ workload. }}"), || "d".into(), &scope).is_err());
    }
}
