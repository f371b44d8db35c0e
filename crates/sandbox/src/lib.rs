//! noetl-sandbox: how the tools that start processes (`python`, `shell`)
//! seal them off from the executor. A process starts with an empty
//! environment plus an explicit allow-list of the executor's variables
//! ([`child_env`]): the executor's secret key, its file path and the NATS
//! and object-store credentials are never in it, whatever an operator lists
//! (`NOETL_PYTHON_ENV`, `NOETL_SHELL_ENV`). The executor itself is
//! non-dumpable ([`seal_process`]) and its own copy of those variables is
//! wiped from `/proc/<pid>/environ` ([`scrub_environ`]); a child put in
//! its own process group dies with the executor ([`die_with_parent`]).

use std::ffi::{OsStr, OsString};

/// Variables passed from the executor's environment when set: what an
/// interpreter needs to find itself, its packages and the system's
/// certificates, and to format text and times.
pub const ALLOWED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH",
    "PYTHONUTF8",
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "VIRTUAL_ENV",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
];

/// Prefixes of variables passed when set (the locale categories).
pub const ALLOWED_PREFIXES: &[&str] = &["LC_"];

/// Prefixes of variables that are never passed, even when listed in
/// `NOETL_PYTHON_ENV`: the credentials' secret key and its file
/// (`NOETL_SECRET_KEY*`), NATS settings and credentials (`NOETL_NATS_*`,
/// `NATS_*`), object-store settings and cloud credentials (`NOETL_S3_*`,
/// `AWS_*`), and the API's bootstrap token (`NOETL_API_*`).
pub const NEVER_PREFIXES: &[&str] = &[
    "NOETL_SECRET_KEY",
    "NOETL_API_",
    "NOETL_NATS_",
    "NATS_",
    "NOETL_S3_",
    "AWS_",
];

/// True when `name` may never reach a tool's process.
pub fn is_never_passed(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    NEVER_PREFIXES.iter().any(|p| upper.starts_with(p))
}

/// What [`child_env`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChildEnv {
    /// The variables the process starts with, sorted by name.
    pub vars: Vec<(OsString, OsString)>,
    /// Names an operator listed that are never passed (to warn about).
    pub refused: Vec<String>,
}

/// The environment of a tool's process: the names in [`ALLOWED`] and
/// [`ALLOWED_PREFIXES`], plus `extra` (each an exact name, or a prefix
/// ending in `*`), taken from `parent` when set there; a name matching
/// [`NEVER_PREFIXES`] is dropped (and, when listed in `extra`, reported in
/// [`ChildEnv::refused`]). Variables whose name is not UTF-8 are dropped.
pub fn child_env<I>(parent: I, extra: &[String]) -> ChildEnv
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let mut refused: Vec<String> = extra
        .iter()
        .filter(|n| is_never_passed(n.trim_end_matches('*')))
        .cloned()
        .collect();
    // A pattern such as `NOETL_*` or `*` is not refused as a whole: the
    // variables it matches are, one by one, below.
    let listed = |name: &str| {
        extra.iter().any(|e| match e.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == e,
        })
    };
    let mut vars: Vec<(OsString, OsString)> = parent
        .into_iter()
        .filter(|(k, _)| {
            let Some(name) = k.to_str() else {
                return false;
            };
            if is_never_passed(name) {
                return false;
            }
            ALLOWED.contains(&name)
                || ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p))
                || listed(name)
        })
        .collect();
    vars.sort();
    vars.dedup_by(|a, b| a.0 == b.0);
    refused.sort();
    refused.dedup();
    ChildEnv { vars, refused }
}

/// Make this process non-dumpable (Linux `prctl(PR_SET_DUMPABLE, 0)`):
/// other processes of the same user, the interpreters it starts among
/// them, can then neither read its environment or memory through
/// `/proc/<pid>/environ` and `/proc/<pid>/mem` nor attach to it with
/// ptrace, and it leaves no core dump (which would hold decrypted
/// credentials). Children are not affected: `execve` makes them dumpable
/// again. Returns whether the flag is set (always false off Linux).
pub fn seal_process() -> bool {
    #[cfg(target_os = "linux")]
    {
        let off: libc::c_ulong = 0;
        // SAFETY: PR_SET_DUMPABLE takes integer arguments only and changes
        // nothing but this process's dumpable flag.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, off, off, off, off) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Wipe the values of the variables [`is_never_passed`] names from this
/// process's initial environment block, the bytes `/proc/<pid>/environ`
/// shows (Linux): each is first copied with `setenv`, so the process itself
/// still reads it, then its original bytes are overwritten with zeros.
/// What runs inside the process (DuckDB's `read_text('/proc/self/environ')`)
/// or as root beside it then finds no secret key, NATS or cloud credential
/// there. Call it first thing in `main`, before any other thread starts.
/// Returns the names wiped.
pub fn scrub_environ() -> Vec<String> {
    #[cfg(target_os = "linux")]
    {
        scrub_linux()
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

#[cfg(target_os = "linux")]
fn scrub_linux() -> Vec<String> {
    use std::ffi::CStr;
    use std::os::unix::ffi::OsStringExt;
    extern "C" {
        static environ: *const *mut libc::c_char;
    }
    // (start of the value's bytes, its length, name, value)
    let mut found: Vec<(*mut libc::c_char, usize, String, OsString)> = Vec::new();
    // SAFETY: `environ` is the C library's NULL-terminated array of
    // NUL-terminated strings; it is only read here, and no other thread
    // changes the environment this early (the caller's contract).
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let bytes = CStr::from_ptr(*entry).to_bytes();
            if let Some(eq) = bytes.iter().position(|&b| b == b'=') {
                if let Ok(name) = std::str::from_utf8(&bytes[..eq]) {
                    if is_never_passed(name) && eq + 1 < bytes.len() {
                        found.push((
                            (*entry).add(eq + 1),
                            bytes.len() - eq - 1,
                            name.to_string(),
                            OsString::from_vec(bytes[eq + 1..].to_vec()),
                        ));
                    }
                }
            }
            entry = entry.add(1);
        }
    }
    let mut wiped = Vec::new();
    for (value_at, len, name, value) in found {
        // A fresh copy the process keeps reading...
        std::env::set_var(&name, &value);
        let Ok(cname) = std::ffi::CString::new(name.as_str()) else {
            continue;
        };
        // SAFETY: getenv reads the environment, which only this thread
        // touches now.
        let now = unsafe { libc::getenv(cname.as_ptr()) };
        if now.is_null() || now == value_at {
            continue; // not copied: wiping would erase the value itself
        }
        // ...then the original bytes, no longer referenced by the
        // environment, are wiped.
        // SAFETY: `value_at..value_at + len` are the bytes of the original
        // entry's value (measured above), writable process memory that
        // `environ` no longer points at.
        unsafe { std::ptr::write_bytes(value_at, 0, len) };
        wiped.push(name);
    }
    wiped
}

/// Prepare a child process, between `fork` and `exec`: it leads a new
/// process group (so a timeout can kill it with everything it started:
/// `kill(-pid, SIGKILL)`), and the kernel sends it `SIGKILL` when the
/// thread that started it (the executor) dies (`PR_SET_PDEATHSIG`), so it
/// never outlives a crashed executor. `parent` is the executor's process
/// id, taken before the fork (`std::process::id()`): a child whose parent
/// is already another process is not started. Linux only; elsewhere a
/// no-op. `PR_SET_PDEATHSIG` holds across `exec` but not for the processes
/// the child starts in turn: those are killed with the group on timeout or
/// when the command ends, not when the executor dies.
///
/// # Safety
///
/// Call it only in the child between `fork` and `exec` (a `pre_exec`
/// hook): it makes async-signal-safe system calls only.
pub unsafe fn die_with_parent(parent: u32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: setpgid, prctl and getppid are async-signal-safe and take
        // integer arguments only (the caller's contract: a pre_exec hook).
        unsafe {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let signal = libc::SIGKILL as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then no signal comes.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::other("the executor exited"));
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = parent;
    Ok(())
}

/// Kill the process group `pgid` (a child started with
/// [`die_with_parent`]) with `SIGKILL`: the child and every process it
/// started that stayed in its group. Returns whether the signal was sent.
pub fn kill_group(pgid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        let Ok(pgid) = i32::try_from(pgid) else {
            return false;
        };
        if pgid <= 1 {
            return false;
        }
        // SAFETY: kill takes integer arguments only; a negative pid names
        // the process group, which the caller created for this child.
        unsafe { libc::kill(-pgid, libc::SIGKILL) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pgid;
        false
    }
}

/// Parse `NOETL_PYTHON_ENV` / `NOETL_SHELL_ENV`: names separated by commas
/// (or whitespace), empty entries ignored.
pub fn parse_list(value: &OsStr) -> Vec<String> {
    value
        .to_string_lossy()
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/noetl"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C.UTF-8"),
            ("PYTHONPATH", "/opt/lib"),
            ("VIRTUAL_ENV", "/opt/venv"),
            ("NOETL_SECRET_KEY", "k"),
            ("NOETL_SECRET_KEY_FILE", "/run/key"),
            ("NOETL_NATS_PASSWORD", "pw"),
            ("NOETL_NATS_TOKEN", "t"),
            ("NOETL_NATS_CREDS", "/c"),
            ("NATS_URL", "nats://x"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_ACCESS_KEY_ID", "a"),
            ("NOETL_S3_CREDENTIAL", "minio"),
            ("DATABASE_URL", "postgres://u:p@h/db"),
            ("APP_MODE", "prod"),
            ("APP_REGION", "eu"),
            ("OTHER", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect()
    }

    fn names(e: &ChildEnv) -> Vec<&str> {
        e.vars.iter().map(|(k, _)| k.to_str().unwrap()).collect()
    }

    #[test]
    fn only_the_allow_list_passes_by_default() {
        let e = child_env(parent(), &[]);
        assert_eq!(
            names(&e),
            [
                "HOME",
                "LANG",
                "LC_ALL",
                "PATH",
                "PYTHONPATH",
                "VIRTUAL_ENV"
            ]
        );
        assert!(e.refused.is_empty());
        let home = e.vars.iter().find(|(k, _)| k == "HOME").unwrap();
        assert_eq!(home.1, "/home/noetl");
    }

    #[test]
    fn operators_add_names_and_prefixes() {
        let extra = vec!["DATABASE_URL".to_string(), "APP_*".to_string()];
        let e = child_env(parent(), &extra);
        let n = names(&e);
        for want in ["DATABASE_URL", "APP_MODE", "APP_REGION", "PATH"] {
            assert!(n.contains(&want), "{want} missing from {n:?}");
        }
        assert!(!n.contains(&"OTHER"), "{n:?}");
        assert!(e.refused.is_empty());
    }

    #[test]
    fn secrets_of_our_own_never_pass_even_when_listed() {
        let extra: Vec<String> = [
            "NOETL_SECRET_KEY",
            "NOETL_SECRET_KEY_FILE",
            "NOETL_NATS_PASSWORD",
            "NATS_URL",
            "AWS_*",
            "aws_secret_access_key",
            "NOETL_*",
            "*",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let e = child_env(parent(), &extra);
        let n = names(&e);
        for secret in [
            "NOETL_SECRET_KEY",
            "NOETL_SECRET_KEY_FILE",
            "NOETL_NATS_PASSWORD",
            "NOETL_NATS_TOKEN",
            "NOETL_NATS_CREDS",
            "NATS_URL",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
            "NOETL_S3_CREDENTIAL",
        ] {
            assert!(!n.contains(&secret), "{secret} passed: {n:?}");
        }
        // `*` passes everything else, which is the operator's choice.
        assert!(n.contains(&"OTHER"), "{n:?}");
        assert_eq!(
            e.refused,
            [
                "AWS_*",
                "NATS_URL",
                "NOETL_NATS_PASSWORD",
                "NOETL_SECRET_KEY",
                "NOETL_SECRET_KEY_FILE",
                "aws_secret_access_key"
            ]
        );
    }

    #[test]
    fn the_api_bootstrap_token_never_passes() {
        assert!(is_never_passed("NOETL_API_BOOTSTRAP_TOKEN"));
        assert!(is_never_passed("noetl_api_anything"));
        assert!(!is_never_passed("NOETL_PYTHON_ENV"));
    }

    #[test]
    fn the_list_parses_commas_and_spaces() {
        assert_eq!(
            parse_list(OsStr::new(" A,B  C,,APP_*\n")),
            ["A", "B", "C", "APP_*"]
        );
        assert!(parse_list(OsStr::new("")).is_empty());
    }
}
