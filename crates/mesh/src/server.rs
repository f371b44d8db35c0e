//! Launching a private `nats-server -js` on a loopback port: used by
//! `noetl run` (the embedded default) and by the test harness.
//!
//! The binary is looked up as: an explicit path, `$NOETL_NATS_SERVER`,
//! `nats-server` on `PATH`, then `.venv/bin/nats-server` under the current
//! directory and its parents (where `make setup` installs it). Versions older
//! than 2.10 (Debian ships 2.9) are refused: JetStream features we rely on
//! (multi-filter consumers) need 2.10+.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The oldest server version we accept.
pub const MIN_VERSION: (u32, u32) = (2, 10);

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// No binary was found.
    #[error("nats-server not found ({hint}); run `make setup` (installs nats-server 2.15 into .venv/bin) or set NOETL_NATS_SERVER")]
    NotFound {
        /// Where we looked.
        hint: String,
    },
    /// The binary is too old.
    #[error("{path} is nats-server {version}, older than 2.10; run `make setup` or set NOETL_NATS_SERVER to a newer binary")]
    TooOld {
        /// Binary.
        path: String,
        /// Its version.
        version: String,
    },
    /// The process could not be spawned.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// Binary.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The store directory could not be prepared.
    #[error("cannot use store directory {path}: {source}")]
    StoreDir {
        /// Directory.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The server did not become ready.
    #[error("nats-server did not become ready on port {port}; last log lines:\n{log_tail}")]
    NotReady {
        /// Port tried.
        port: u16,
        /// End of its log.
        log_tail: String,
    },
}

/// How to start the server.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// JetStream store directory (created if missing).
    pub store_dir: PathBuf,
    /// Port; `None` picks a free one.
    pub port: Option<u16>,
    /// Binary; `None` searches (see module docs).
    pub binary: Option<PathBuf>,
}

/// The Go runtime's soft memory limit of a private server (`noetl run`'s),
/// unless `NOETL_NATS_MEMORY_LIMIT` sets another (Go's syntax, `512MiB`;
/// `off`: none). Without it the server's heap grows with the write rate
/// long after what it holds is garbage (docs/performance.md, "Memory").
pub const DEFAULT_MEMORY_LIMIT: &str = "192MiB";

/// The `GOMEMLIMIT` a server gets, if any: a private one (`owned`) the
/// default unless `NOETL_NATS_MEMORY_LIMIT` says otherwise; any other
/// (a test's) only the one `NOETL_NATS_MEMORY_LIMIT` sets explicitly.
fn memory_limit(owned: bool) -> Option<String> {
    memory_limit_of(
        std::env::var("NOETL_NATS_MEMORY_LIMIT").ok().as_deref(),
        owned,
    )
}

/// [`memory_limit`] for a `NOETL_NATS_MEMORY_LIMIT` of `setting`.
fn memory_limit_of(setting: Option<&str>, owned: bool) -> Option<String> {
    match setting.map(str::trim) {
        Some(v) if v.eq_ignore_ascii_case("off") => None,
        Some(v) if !v.is_empty() => Some(v.to_string()),
        _ => owned.then(|| DEFAULT_MEMORY_LIMIT.to_string()),
    }
}

/// How often JetStream writes its file store to disk (`sync_interval`).
///
/// The guarantee of each is in `docs/reliability.md`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SyncPolicy {
    /// nats-server's default: an acknowledged write is in the OS page cache
    /// and flushed to disk every 2 minutes. A process crash loses nothing;
    /// a power cut or kernel crash can lose the last writes.
    #[default]
    Interval,
    /// `jetstream { sync_interval: always }`: every write is flushed to disk
    /// before it is acknowledged. Safe against power loss, several times
    /// slower for small writes.
    Always,
}

impl SyncPolicy {
    /// The server configuration file this policy needs, if any.
    pub fn config_text(self) -> Option<&'static str> {
        match self {
            SyncPolicy::Interval => None,
            SyncPolicy::Always => Some("jetstream {\n  sync_interval: always\n}\n"),
        }
    }
}

/// Name of the configuration file written into the store directory when a
/// [`SyncPolicy`] needs one.
pub const CONFIG_FILE: &str = "nats-server.conf";

/// A running `nats-server`; killed on drop.
pub struct NatsServerProcess {
    child: Option<Child>,
    port: u16,
    log_path: PathBuf,
}

impl NatsServerProcess {
    /// Start a server and wait until it accepts clients with JetStream on.
    pub fn start(opts: ServerOptions) -> Result<Self, ServerError> {
        Self::launch(opts, None, false)
    }

    /// [`start`](Self::start) with a configuration file (`-c`), e.g. a
    /// `cluster { ... }` block for a JetStream cluster node. `opts` are
    /// passed as flags; the file must not set them again (nats-server
    /// refuses a duplicate `jetstream { store_dir }`).
    pub fn start_with_config(opts: ServerOptions, config_file: &Path) -> Result<Self, ServerError> {
        Self::launch(opts, Some(config_file), false)
    }

    /// [`start_with_sync`](Self::start_with_sync) for a server this process
    /// owns alone (`noetl run`'s private one): the kernel kills it when the
    /// thread that starts it ends (`PR_SET_PDEATHSIG`, Linux), so it never
    /// outlives a `noetl run` killed with SIGKILL. Call it from a thread that
    /// lives as long as the process: the main thread.
    pub fn start_owned(opts: ServerOptions, sync: SyncPolicy) -> Result<Self, ServerError> {
        let config = sync.write_config(&opts.store_dir)?;
        Self::launch(opts, config.as_deref(), true)
    }

    fn launch(
        opts: ServerOptions,
        config_file: Option<&Path>,
        owned: bool,
    ) -> Result<Self, ServerError> {
        let binary = find_binary(opts.binary.as_deref())?;
        check_version(&binary)?;
        std::fs::create_dir_all(&opts.store_dir).map_err(|source| ServerError::StoreDir {
            path: opts.store_dir.display().to_string(),
            source,
        })?;
        let log_path = opts.store_dir.join("nats-server.log");
        let mut last_err = None;
        for _ in 0..5 {
            let port = match opts.port {
                Some(p) => p,
                None => free_port(),
            };
            // Started with an empty environment: this process's holds the
            // credentials' secret key and NATS / object-store credentials,
            // and a same-user process could read them in the server's
            // /proc/<pid>/environ.
            let mut cmd = Command::new(&binary);
            if let Some(config) = config_file {
                cmd.arg("-c").arg(config);
            }
            if owned {
                let parent = std::process::id();
                // SAFETY: `die_with_parent` makes only async-signal-safe
                // calls, as a pre_exec hook must.
                unsafe {
                    cmd.pre_exec(move || noetl_sandbox::die_with_parent(parent));
                }
            }
            cmd.env_clear()
                .envs(std::env::vars_os().filter(|(k, _)| k == "PATH" || k == "TZ"));
            if let Some(limit) = memory_limit(owned) {
                cmd.env("GOMEMLIMIT", limit);
            }
            let child = cmd
                .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
                .arg(&opts.store_dir)
                .arg("-l")
                .arg(&log_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|source| ServerError::Spawn {
                    path: binary.display().to_string(),
                    source,
                })?;
            let mut server = Self {
                child: Some(child),
                port,
                log_path: log_path.clone(),
            };
            match server.wait_ready(Duration::from_secs(15)) {
                Ok(()) => return Ok(server),
                Err(e) => {
                    server.stop();
                    last_err = Some(e);
                    if opts.port.is_some() {
                        break;
                    }
                }
            }
        }
        Err(last_err.expect("at least one attempt"))
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), ServerError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // exited: port taken or bad flags
                }
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let mut line = String::new();
                if BufReader::new(&mut s).read_line(&mut line).is_ok()
                    && line.starts_with("INFO")
                    && line.contains("\"jetstream\":true")
                {
                    let _ = s.write_all(b"CONNECT {}\r\n");
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(ServerError::NotReady {
            port: self.port,
            log_tail: self.log_tail(),
        })
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs (its CPU time is read from
    /// `/proc` by the bench).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last lines of the server log.
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log_path) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Stop the server (also done on drop).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// [`start`](Self::start) with a disk sync policy: [`SyncPolicy::Always`]
    /// writes [`CONFIG_FILE`] (`jetstream { sync_interval: always }`) into the
    /// store directory and starts the server with it.
    pub fn start_with_sync(opts: ServerOptions, sync: SyncPolicy) -> Result<Self, ServerError> {
        let config = sync.write_config(&opts.store_dir)?;
        Self::launch(opts, config.as_deref(), false)
    }
}

impl SyncPolicy {
    /// Write [`CONFIG_FILE`] into `store_dir` when this policy needs one;
    /// its path.
    fn write_config(self, store_dir: &Path) -> Result<Option<PathBuf>, ServerError> {
        let Some(text) = self.config_text() else {
            return Ok(None);
        };
        let store_err = |path: &Path, source| ServerError::StoreDir {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(store_dir).map_err(|e| store_err(store_dir, e))?;
        let config = store_dir.join(CONFIG_FILE);
        std::fs::write(&config, text).map_err(|e| store_err(&config, e))?;
        Ok(Some(config))
    }
}

impl Drop for NatsServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// Find the nats-server binary (see module docs for the order).
pub fn find_binary(explicit: Option<&Path>) -> Result<PathBuf, ServerError> {
    search_binary(&BinarySearch {
        explicit: explicit.map(Path::to_path_buf),
        env: std::env::var_os("NOETL_NATS_SERVER"),
        start_dir: std::env::current_dir().ok(),
        workspace: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/nats-server"),
        path: std::env::var_os("PATH"),
    })
}

/// Where [`search_binary`] looks, in order.
#[derive(Debug, Default)]
pub struct BinarySearch {
    /// A path given by the caller.
    pub explicit: Option<PathBuf>,
    /// `$NOETL_NATS_SERVER`.
    pub env: Option<std::ffi::OsString>,
    /// Look for `.venv/bin/nats-server` here and in its parents.
    pub start_dir: Option<PathBuf>,
    /// The workspace's own `.venv/bin/nats-server`.
    pub workspace: PathBuf,
    /// `$PATH` (only binaries new enough count).
    pub path: Option<std::ffi::OsString>,
}

/// Find the nats-server binary in the places `s` names.
pub fn search_binary(s: &BinarySearch) -> Result<PathBuf, ServerError> {
    if let Some(p) = &s.explicit {
        return Ok(p.clone());
    }
    if let Some(p) = s.env.as_ref().filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let mut looked = Vec::new();
    // Project-local install first: PATH may hold Debian's old 2.9.
    if let Some(mut dir) = s.start_dir.clone() {
        loop {
            let cand = dir.join(".venv/bin/nats-server");
            if cand.is_file() {
                return Ok(cand);
            }
            looked.push(cand.display().to_string());
            if !dir.pop() {
                break;
            }
        }
    }
    if s.workspace.is_file() {
        return Ok(s.workspace.clone());
    }
    if let Some(path) = &s.path {
        for dir in std::env::split_paths(path) {
            let cand = dir.join("nats-server");
            if cand.is_file() && check_version(&cand).is_ok() {
                return Ok(cand);
            }
        }
    }
    looked.push("PATH".into());
    Err(ServerError::NotFound {
        hint: format!("looked in {}", looked.join(", ")),
    })
}

/// Refuse servers older than [`MIN_VERSION`].
pub fn check_version(binary: &Path) -> Result<(), ServerError> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|source| ServerError::Spawn {
            path: binary.display().to_string(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text
        .split_whitespace()
        .find(|w| w.trim_start_matches('v').starts_with(char::is_numeric))
        .unwrap_or("")
        .trim_start_matches('v')
        .to_string();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < MIN_VERSION {
        return Err(ServerError::TooOld {
            path: binary.display().to_string(),
            version: if version.is_empty() {
                text.trim().to_string()
            } else {
                version
            },
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_server_gets_a_go_memory_limit_unless_turned_off() {
        assert_eq!(
            memory_limit_of(None, true).as_deref(),
            Some(DEFAULT_MEMORY_LIMIT)
        );
        assert_eq!(
            memory_limit_of(Some(" "), true).as_deref(),
            Some(DEFAULT_MEMORY_LIMIT)
        );
        assert_eq!(
            memory_limit_of(Some("512MiB"), true).as_deref(),
            Some("512MiB")
        );
        assert_eq!(memory_limit_of(Some("OFF"), true), None);
        // A test's server: only an explicit setting.
        assert_eq!(memory_limit_of(None, false), None);
        assert_eq!(
            memory_limit_of(Some("192MiB"), false).as_deref(),
            Some("192MiB")
        );
        assert_eq!(memory_limit_of(Some("off"), false), None);
    }

    #[test]
    fn the_limit_reaches_the_private_servers_environment_and_nothing_else_does() {
        if std::env::var_os("NOETL_NATS_MEMORY_LIMIT").is_some() {
            return; // set by whoever runs the tests: the default is not in use
        }
        let store = tempfile::tempdir().unwrap();
        let opts = ServerOptions {
            store_dir: store.path().to_path_buf(),
            port: None,
            binary: None,
        };
        let server = NatsServerProcess::start_owned(opts, SyncPolicy::default()).unwrap();
        let pid = server.pid().unwrap();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .filter(|v| !v.is_empty())
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        assert!(
            vars.contains(&format!("GOMEMLIMIT={DEFAULT_MEMORY_LIMIT}")),
            "{vars:?}"
        );
        assert!(
            vars.iter().all(|v| ["PATH=", "TZ=", "GOMEMLIMIT="]
                .iter()
                .any(|p| v.starts_with(p))),
            "{vars:?}"
        );
    }

    #[test]
    fn a_missing_server_names_make_setup_and_where_it_looked() {
        let empty = tempfile::tempdir().unwrap();
        let err = search_binary(&BinarySearch {
            start_dir: Some(empty.path().to_path_buf()),
            workspace: empty.path().join("none/nats-server"),
            path: Some(empty.path().as_os_str().to_owned()),
            ..Default::default()
        })
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ServerError::NotFound { .. }), "{text}");
        assert!(text.contains("run `make setup`"), "{text}");
        assert!(text.contains("NOETL_NATS_SERVER"), "{text}");
        assert!(
            text.contains(
                &empty
                    .path()
                    .join(".venv/bin/nats-server")
                    .display()
                    .to_string()
            ),
            "{text}"
        );
    }

    #[test]
    fn only_sync_always_needs_a_config_file() {
        assert_eq!(SyncPolicy::default(), SyncPolicy::Interval);
        assert_eq!(SyncPolicy::Interval.config_text(), None);
        assert!(SyncPolicy::Always
            .config_text()
            .unwrap()
            .contains("sync_interval: always"));
    }

    #[test]
    fn a_server_started_with_sync_always_loads_that_setting() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let mut server = NatsServerProcess::start_with_sync(
            ServerOptions {
                store_dir: store.clone(),
                ..Default::default()
            },
            SyncPolicy::Always,
        )
        .expect("nats-server starts (set NOETL_NATS_SERVER)");
        let config = store.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("sync_interval: always"), "{text}");
        // The server says it read that file.
        let log = std::fs::read_to_string(store.join("nats-server.log")).unwrap();
        assert!(
            log.contains(&format!("Using configuration file: {}", config.display())),
            "{log}"
        );
        server.stop();
        // The default writes no configuration file.
        let other = dir.path().join("default");
        let mut plain = NatsServerProcess::start(ServerOptions {
            store_dir: other.clone(),
            ..Default::default()
        })
        .unwrap();
        assert!(!other.join(CONFIG_FILE).exists());
        plain.stop();
    }

    #[test]
    fn the_environment_variable_wins_over_searching() {
        let got = search_binary(&BinarySearch {
            env: Some("/opt/nats/nats-server".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(got, PathBuf::from("/opt/nats/nats-server"));
    }
}
