//! Rules the tools apply to their fields, stated once: each tool checks
//! its task with them when it runs, and `noetl validate` checks the
//! playbook's literal values with the same ones (docs/errors.md, E003 and
//! E004), so the two cannot drift apart. Also how a URL is shown in
//! messages, which every tool that prints one shares.

/// The `nats` tool's operations, by their `operation` value.
pub const NATS_OPERATIONS: &[&str] = &[
    "publish",
    "js_publish",
    "request",
    "kv_get",
    "kv_put",
    "kv_delete",
    "kv_keys",
    "object_get",
    "object_put",
    "object_delete",
];

/// A Python identifier (a `python` task's `libs` alias or imported name).
pub fn python_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f == '_' || f.is_alphabetic())
        && c.all(|ch| ch == '_' || ch.is_alphanumeric())
}

/// A dotted Python module name (`os.path`).
pub fn python_module(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(python_identifier)
}

/// A `python` task's `libs` entry as the tool imports it: `module`, and
/// `name` for `alias: {from: module, import: name}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonImport {
    /// The module (dotted path).
    pub module: String,
    /// `from module import name`, when set.
    pub name: Option<String>,
}

/// Which part of a `libs` entry cannot be imported, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibsEntryError {
    /// The alias is not a Python name.
    Alias,
    /// The value is not a module, nor `{from, import}`; why.
    Value(&'static str),
}

impl LibsEntryError {
    /// Why, as messages say it after the entry's name.
    pub fn why(self) -> &'static str {
        match self {
            LibsEntryError::Alias => "is not a Python name",
            LibsEntryError::Value(why) => why,
        }
    }
}

/// `libs` entry `alias: v` (`alias: module`, or `alias: {from: module,
/// import: name}`; an alias may be a dotted module imported as itself).
pub fn python_import(alias: &str, v: &serde_json::Value) -> Result<PythonImport, LibsEntryError> {
    use serde_json::Value;
    let plain = v.as_str() == Some(alias) && python_module(alias);
    if !python_identifier(alias) && !plain {
        return Err(LibsEntryError::Alias);
    }
    match v {
        Value::String(module) if python_module(module) => Ok(PythonImport {
            module: module.clone(),
            name: None,
        }),
        Value::Object(m) => {
            let from = m
                .get("from")
                .and_then(Value::as_str)
                .filter(|s| python_module(s));
            let name = m
                .get("import")
                .and_then(Value::as_str)
                .filter(|s| python_identifier(s));
            match (from, name) {
                (Some(from), Some(name)) => Ok(PythonImport {
                    module: from.to_string(),
                    name: Some(name.to_string()),
                }),
                _ => Err(LibsEntryError::Value(
                    "needs `from` (a module) and `import` (a name)",
                )),
            }
        }
        _ => Err(LibsEntryError::Value("is not a module name")),
    }
}

/// What replaces a URL's password, or a user name alone (a token, as in
/// `https://TOKEN@host/`), in [`shown_url`].
const HIDDEN: &str = "***";

/// `url` as messages and results show it: without its query and fragment
/// (a query string may carry a key), and with its user info's password,
/// or a user name alone, written `***` (the `url` crate leaves `$&+,` raw
/// in user info, so no encoded form of a password would be redacted).
pub fn shown_url(url: &url::Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    if u.password().is_some() {
        let _ = u.set_password(Some(HIDDEN));
    } else if !u.username().is_empty() {
        let _ = u.set_username(HIDDEN);
    }
    u.to_string()
}

/// Text given as a URL, shown as [`shown_url`] shows it: as written when
/// it parses and has nothing to hide; text that does not parse is cut at
/// its first `?` or `#`, and what comes before an `@` in its authority is
/// written `***`.
pub fn shown_url_text(raw: &str) -> String {
    if let Ok(u) = url::Url::parse(raw) {
        let hides = !u.username().is_empty()
            || u.password().is_some()
            || u.query().is_some()
            || u.fragment().is_some();
        return if hides {
            shown_url(&u)
        } else {
            raw.to_string()
        };
    }
    let end = raw.find(['?', '#']).unwrap_or(raw.len());
    let raw = &raw[..end];
    let start = raw.find("://").map_or(0, |i| i + 3);
    let authority_end = raw[start..].find('/').map_or(raw.len(), |i| start + i);
    match raw[start..authority_end].rfind('@') {
        Some(at) => format!("{}{HIDDEN}{}", &raw[..start], &raw[start + at..]),
        None => raw.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_names() {
        assert!(python_module("os.path") && python_identifier("_x1") && python_identifier("é"));
        assert!(
            !python_module("os..path") && !python_identifier("1x") && !python_identifier("a-b")
        );
    }

    #[test]
    fn shown_urls_carry_no_password_query_or_token() {
        let shown = |raw: &str| shown_url(&url::Url::parse(raw).unwrap());
        assert_eq!(
            shown("https://app:pa$s&w+r,d@api.example/v1?key=k3y#f"),
            "https://app:***@api.example/v1"
        );
        assert_eq!(
            shown("https://ghp_t0ken@api.example/repo"),
            "https://***@api.example/repo"
        );
        assert_eq!(
            shown_url_text("https://idp.example/token?client_secret=s3cret#frag"),
            "https://idp.example/token"
        );
        assert_eq!(
            shown_url_text("http://127.0.0.1:4566"),
            "http://127.0.0.1:4566"
        );
        assert_eq!(shown_url_text("not a url?key=s3cret"), "not a url");
        assert_eq!(
            shown_url_text("https://u:p w@host name/x?k=1"),
            "https://***@host name/x"
        );
    }
}
