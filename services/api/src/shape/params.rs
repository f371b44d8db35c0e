//! What a path parameter may be, checked before a handler touches storage:
//! an execution id and a signal name by their format, a name (a step, a
//! credential) by length and characters. Each check names what was wrong and where.

use noetl_mesh::ids::is_valid_execution_id;

/// Longest execution id.
pub const MAX_EXECUTION_ID: usize = 128;

/// Longest step name in a path.
pub const MAX_NAME: usize = 256;

/// Longest signal name ([`noetl_mesh::signal::valid_signal`]).
pub const MAX_SIGNAL_NAME: usize = 128;

/// The pattern of a signal name (as the OpenAPI document states it).
pub const SIGNAL_NAME_PATTERN: &str = "^[A-Za-z0-9_-]{1,128}$";

/// The pattern of an execution id (as the OpenAPI document states it).
pub const EXECUTION_ID_PATTERN: &str = "^[A-Za-z0-9_-]{1,128}$";

/// The pattern of a name: no control character (C0, DEL, C1).
pub const NAME_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$";

/// `text` as a message shows it: escaped, cut after 64 characters.
pub fn shown(text: &str) -> String {
    noetl_mesh::catalog::shown(text)
}

/// An execution id, or why `id` is not one (it could otherwise name
/// another KV key, or be a subject wildcard).
pub fn execution_id(id: &str) -> Result<(), String> {
    if is_valid_execution_id(id) {
        Ok(())
    } else {
        Err(format!(
            "path parameter `id`: {} is not an execution id: 1-{MAX_EXECUTION_ID} characters of [A-Za-z0-9_-]",
            shown(id)
        ))
    }
}

/// A signal name, or why `name` (the path parameter `name`) is not one:
/// the mesh keys waiters by it, so no step can wait for any other.
pub fn signal_name(name: &str) -> Result<(), String> {
    if noetl_mesh::signal::valid_signal(name) {
        Ok(())
    } else {
        Err(format!(
            "path parameter `name`: {} is not a signal name: {}",
            shown(name),
            noetl_mesh::ids::NAME_RULE
        ))
    }
}

/// A name of at most `max` characters and no control character, or why
/// `value` (the path parameter `param`) is not one.
pub fn name(param: &str, value: &str, max: usize) -> Result<(), String> {
    let n = value.chars().count();
    if n == 0 || n > max || value.chars().any(char::is_control) {
        Err(format!(
            "path parameter `{param}`: {} must be 1-{max} characters, none a control character",
            shown(value)
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execution_ids_are_checked_by_their_format() {
        assert!(execution_id("019b2c3d4e5f").is_ok());
        for bad in ["", "a.b", "a b", "\u{97}", "a*", "_mesh", &"a".repeat(129)] {
            let e = execution_id(bad).unwrap_err();
            assert!(e.contains("path parameter `id`"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let e = execution_id("x.step.start").unwrap_err();
        assert!(e.contains("\"x.step.start\""), "{e}");
    }

    #[test]
    fn signal_names_are_checked_by_the_format_the_mesh_keys_them_by() {
        assert!(signal_name("approval").is_ok());
        assert!(signal_name("go-ahead_2").is_ok());
        for bad in ["", "approval.v2", "a b", "*", "a\nb", &"s".repeat(129)] {
            let e = signal_name(bad).unwrap_err();
            assert!(e.contains("path parameter `name`"), "{e}");
            assert!(e.contains("1-128 characters of [A-Za-z0-9_-]"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(signal_name("approval.v2")
            .unwrap_err()
            .contains("\"approval.v2\""));
    }

    #[test]
    fn names_are_checked_by_length_and_characters() {
        assert!(name("step", "fetch page", MAX_NAME).is_ok());
        assert!(name("step", "a.b/c", MAX_NAME).is_ok());
        assert!(name("step", &"é".repeat(MAX_NAME), MAX_NAME).is_ok());
        for bad in ["", "a\nb", "a\u{97}", "a\u{7f}"] {
            let e = name("step", bad, MAX_NAME).unwrap_err();
            assert!(e.contains("path parameter `step`"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let long = name("signal", &"s".repeat(MAX_NAME + 1), MAX_NAME).unwrap_err();
        assert!(long.contains("1-256 characters"), "{long}");
        assert!(long.len() < 300, "{long}");
    }
}
