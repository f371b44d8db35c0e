//! Log fields from what clients send (ids, names, paths, messages that
//! quote them): control characters escaped, so a newline in an id cannot
//! forge a log line (an audit line included).

use std::borrow::Cow;

/// `text` with every control character escaped as Rust does (`\n`,
/// `\u{97}`); unchanged (and not copied) when it has none.
pub fn field(text: &str) -> Cow<'_, str> {
    if text.chars().any(char::is_control) {
        Cow::Owned(
            text.chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect(),
        )
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        let forged = "e1\n2026-01-01T00:00:00Z INFO audit: principal=root";
        let f = field(forged);
        assert!(!f.contains('\n'), "{f}");
        assert!(f.starts_with("e1\\n2026"), "{f}");
        assert_eq!(field("a\r\u{97}b\u{1b}"), "a\\r\\u{97}b\\u{1b}");
        assert!(matches!(field("plain é/ü"), Cow::Borrowed("plain é/ü")));
    }
}
