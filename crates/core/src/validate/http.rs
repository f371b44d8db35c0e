//! An http task's literal `url` and `method`, checked as the http tool
//! reads them, as warnings: a URL that is no http(s) URL (W111: the task
//! would fail with `http.config` whenever it runs; not refused, so a
//! playbook with a placeholder still loads), a method that is no standard
//! one (W110: HTTP allows extension methods, but a typo is likelier). A
//! value with a template is left to run time, and `...` (the spec's
//! examples' elision) is not checked.

use super::{closest, Validator};
use crate::codes::Code;
use crate::yaml::{escape, Node};

/// The methods the http tool documents (docs/tools.md).
const METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];

/// Why a literal `url` is refused, or `None` when it is an http(s) URL.
pub(crate) fn bad_url(raw: &str) -> Option<String> {
    match url::Url::parse(raw) {
        Err(e) => Some(e.to_string()),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            Some(format!("scheme {:?} is not http or https", u.scheme()))
        }
        Ok(_) => None,
    }
}

/// The standard method `raw` stands for (any case), else `None`.
fn standard(raw: &str) -> Option<&'static str> {
    let upper = raw.trim().to_ascii_uppercase();
    METHODS.iter().copied().find(|m| *m == upper)
}

impl Validator {
    /// W111 and W110 for task `t` at `tp` (of `whose`).
    pub(super) fn http_literals(&mut self, t: &Node, tp: &str, whose: &str) {
        let literal = |key: &str| {
            t.get(key)
                .and_then(|n| n.as_str().map(|s| (n, s)))
                // The spec's examples elide a value as `...`.
                .filter(|(_, s)| !crate::template::is_template(s) && s.trim() != "...")
        };
        if let Some((node, raw)) = literal("url") {
            if let Some(why) = bad_url(raw) {
                self.warn(
                    Code::W111,
                    node.span,
                    &format!("{tp}/{}", escape("url")),
                    format!(
                        "`url` {raw:?} of {whose} is not an http(s) URL ({why}): the task \
                         fails with `http.config` whenever it runs"
                    ),
                    "write it whole, scheme and host included: `https://api.example.com/items`",
                );
            }
        }
        if let Some((node, raw)) = literal("method") {
            if standard(raw).is_none() {
                let help = match closest(&raw.trim().to_ascii_uppercase(), &METHODS) {
                    Some(m) => format!("did you mean `{m}`? methods: {}", METHODS.join(", ")),
                    None => format!(
                        "methods: {}; any other is sent as written",
                        METHODS.join(", ")
                    ),
                };
                self.warn(
                    Code::W110,
                    node.span,
                    &format!("{tp}/{}", escape("method")),
                    format!("`method` {raw:?} of {whose} is not a standard HTTP method"),
                    &help,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{bad_url, standard};

    #[test]
    fn a_url_is_refused_as_the_http_tool_refuses_it() {
        assert_eq!(bad_url("https://api.example.com/x?y=1"), None);
        assert_eq!(bad_url("http://localhost:8080"), None);
        assert!(bad_url("htp//example.com")
            .unwrap()
            .contains("relative URL"));
        assert!(bad_url("ftp://example.com").unwrap().contains("\"ftp\""));
        // A host and port without a scheme parses as the scheme `localhost`.
        assert!(bad_url("localhost:8080/x")
            .unwrap()
            .contains("\"localhost\""));
    }

    #[test]
    fn methods_in_any_case() {
        assert_eq!(standard("post"), Some("POST"));
        assert_eq!(standard(" Get "), Some("GET"));
        assert_eq!(standard("GETT"), None);
        assert_eq!(standard("PROPFIND"), None);
    }
}
