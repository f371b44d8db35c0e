//! The diagnostic codes (`E0xx` errors refuse a playbook, `W1xx` warnings
//! do not), each declared once with its title. `docs/errors.md` has a
//! section per code headed `## <code> — <title>` (a test keeps the two the
//! same), and every diagnostic links to it ([`Code::doc_anchor`]).

use serde::{Serialize, Serializer};

macro_rules! codes {
    ($($code:ident => $title:literal,)+) => {
        /// One diagnostic code.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $(
                #[doc = $title]
                $code,
            )+
        }

        impl Code {
            /// Every code, in order.
            pub const ALL: &'static [Code] = &[$(Code::$code),+];

            /// The code as written (`E004`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$code => stringify!($code),)+
                }
            }

            /// Its title in `docs/errors.md`.
            pub const fn title(self) -> &'static str {
                match self {
                    $(Code::$code => $title,)+
                }
            }
        }
    };
}

codes! {
    E001 => "YAML syntax",
    E002 => "unknown root section",
    E003 => "missing required field",
    E004 => "wrong type or shape",
    E005 => "unknown field",
    E006 => "unknown tool kind",
    E007 => "tool kind not available",
    E010 => "`step.when`",
    E011 => "legacy `eval`",
    E012 => "`expr`",
    E013 => "step-level `case`",
    E014 => "`pipe`",
    E015 => "legacy `next`",
    E016 => "`sink`",
    E017 => "step-level `vars`",
    E020 => "task policy shape",
    E021 => "control action outside task policy",
    E022 => "unknown jump target",
    E023 => "bad `attempts`",
    E024 => "bad `backoff`",
    E025 => "unknown action",
    E026 => "jump without `to`",
    E030 => "unknown arc target",
    E031 => "no entry step",
    E032 => "loop without `in`",
    E033 => "loop without `iterator`",
    E034 => "duplicate task name",
    E035 => "duplicate step name",
    E036 => "template does not parse",
    E037 => "empty `tool`",
    E038 => "unknown workbook task",
    E039 => "cursor loop shape",
    E040 => "playbook too large",
    E041 => "YAML nested too deep",
    E042 => "aliases expand too much",
    E043 => "too many steps",
    E044 => "too many arcs",
    E045 => "unknown reducer",
    E046 => "`loop` read where no loop runs",
    E047 => "authoring sugar",
    E048 => "python code does not compile",
    E049 => "unknown filter or test",
    W101 => "`then.set` alias",
    W102 => "unreachable step",
    W103 => "arc that can never fire",
    W104 => "`set_ctx` in a parallel loop",
    W105 => "loop arcs never test `loop.done`",
    W106 => "template reads an unknown variable",
    W107 => "a workload value read bare",
    W108 => "a task reads a task that has not run",
    W109 => "an `else` rule continues on errors",
    W110 => "http `method` is not a standard one",
    W111 => "http `url` is not an http(s) URL",
    W112 => "a cursor claim that does not read `__frame_claim`",
    W113 => "a condition that renders as text",
}

impl Code {
    /// Whether it is a warning (`W…`): the playbook still runs.
    pub fn is_warning(self) -> bool {
        self.as_str().starts_with('W')
    }

    /// Where `docs/errors.md` explains it (`docs/errors.md#e004`).
    pub fn doc_anchor(self) -> String {
        format!("docs/errors.md#{}", self.as_str().to_ascii_lowercase())
    }

    /// The code written `text`, if there is one.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == text)
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for Code {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/errors.md` has one section per code, titled as declared here,
    /// and no section for a code that is not.
    #[test]
    fn the_registry_and_docs_errors_md_agree() {
        let doc = include_str!("../../../docs/errors.md");
        let mut headed: Vec<(String, String)> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("## "))
            .filter_map(|l| l.split_once(" — "))
            .filter(|(c, _)| Code::parse(c).is_some() || c.len() == 4)
            .map(|(c, t)| (c.to_string(), t.to_string()))
            .collect();
        headed.sort();
        let declared: Vec<(String, String)> = Code::ALL
            .iter()
            .map(|c| (c.as_str().to_string(), c.title().to_string()))
            .collect();
        assert_eq!(headed, declared);
    }

    #[test]
    fn codes_read_as_written() {
        assert_eq!(Code::parse("E004"), Some(Code::E004));
        assert_eq!(Code::E004, "E004");
        assert!(Code::W101.is_warning() && !Code::E001.is_warning());
        assert_eq!(Code::E041.doc_anchor(), "docs/errors.md#e041");
        assert_eq!(serde_json::to_value(Code::W108).unwrap(), "W108");
        assert_eq!(Code::parse("E999"), None);
    }
}
