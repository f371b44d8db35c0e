//! What `noetl events tail` asks the server for: its filters turned into a
//! subject and a start position, as plain functions.

use std::time::Duration;

/// An event-type glob as a subject pattern for the server (after
/// `<p>.evt.<eid>.`: `step.>`, `loop.done`, `>`): `*` in a glob matches
/// any run of characters, dots included; in a subject, `*` is one token
/// and `>` the rest. A glob with no `*` is its own subject; otherwise the
/// tokens before the first `*` narrow the subject (`step.*` is `step.>`).
/// The client checks every event against the glob: the server's subject
/// only narrows what it is sent.
pub fn type_filter(glob: &str) -> String {
    let tokens: Vec<&str> = glob.split('.').collect();
    let Some(first_star) = tokens.iter().position(|t| t.contains('*')) else {
        return glob.to_string();
    };
    let mut parts: Vec<&str> = tokens[..first_star].to_vec();
    parts.push(">");
    parts.join(".")
}

/// Where `--since` starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// This long ago (`10m`, `2h`, `30s`, `1d`).
    Ago(Duration),
    /// At this RFC 3339 time.
    At(String),
}

/// Parse `--since`: a duration with a unit (`s`, `m`, `h`, `d`) or an
/// RFC 3339 time; the error says which forms are accepted.
pub fn parse_since(s: &str) -> Result<Since, String> {
    let s = s.trim();
    let bad = || {
        format!("--since {s:?}: expected a duration such as 30s, 10m, 2h, 1d, or an RFC 3339 time such as 2026-11-23T10:00:00Z")
    };
    if s.contains('T') {
        return Ok(Since::At(s.to_string()));
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(bad()),
    };
    Ok(Since::Ago(Duration::from_secs(secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_become_subjects_the_server_can_filter_on() {
        assert_eq!(type_filter("loop.done"), "loop.done");
        assert_eq!(type_filter("step.*"), "step.>");
        assert_eq!(type_filter("loop.iteration.*"), "loop.iteration.>");
        // A `*` that is not the last whole token: narrowed, checked by the client.
        assert_eq!(type_filter("*.done"), ">");
        assert_eq!(type_filter("loop.*.done"), "loop.>");
        assert_eq!(type_filter("step*"), ">");
        assert_eq!(type_filter("*"), ">");
    }

    #[test]
    fn since_takes_durations_and_times() {
        assert_eq!(parse_since("10m"), Ok(Since::Ago(Duration::from_secs(600))));
        assert_eq!(parse_since("2h"), Ok(Since::Ago(Duration::from_secs(7200))));
        assert_eq!(
            parse_since("1d"),
            Ok(Since::Ago(Duration::from_secs(86_400)))
        );
        assert_eq!(parse_since("45s"), Ok(Since::Ago(Duration::from_secs(45))));
        assert_eq!(
            parse_since("2026-11-23T10:00:00Z"),
            Ok(Since::At("2026-11-23T10:00:00Z".into()))
        );
        for bad in ["10", "m", "10 minutes", "-5m", ""] {
            let e = parse_since(bad).unwrap_err();
            assert!(e.contains("expected a duration"), "{bad}: {e}");
        }
    }
}
